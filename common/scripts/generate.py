"""Generate the protobuf and gRPC modules of metaq.common.v1 from common/proto, or check them.

    python common/scripts/generate.py            # rewrite common/src/metaq/common/v1/
    python common/scripts/generate.py --check    # regenerate into a temp dir and compare

The .proto files keep their proto package path (``metaq/v1/*.proto``, ``package metaq.v1``)
so descriptor names and gRPC method paths read ``metaq.v1``; only the Python modules move
into ``metaq.common.v1``. protoc derives Python imports from the proto path, so the few
lines that name the module (imports and the module name handed to the builder) are
rewritten, and anything left pointing at ``metaq.v1`` fails the run. The output depends
only on the .proto files and the locked grpcio-tools / mypy-protobuf versions.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

COMMON: Final = Path(__file__).resolve().parent.parent
PROTO_ROOT: Final = COMMON / "proto"
PROTO_DIR: Final = PROTO_ROOT / "metaq" / "v1"
OUT_DIR: Final = COMMON / "src" / "metaq" / "common" / "v1"

PROTO_MODULE: Final = "metaq.v1"
PY_MODULE: Final = "metaq.common.v1"

INIT: Final = '''"""Generated protobuf and gRPC modules for the ``metaq.v1`` proto package.

Do not edit: change ``common/proto/metaq/v1/*.proto`` and run ``make generate``.
"""
'''

_IMPORT: Final = re.compile(rf"^from {re.escape(PROTO_MODULE)} import ", re.MULTILINE)
_BUILDER_MODULE: Final = re.compile(rf"'{re.escape(PROTO_MODULE)}\.(\w+_pb2)'")
_LEFTOVER: Final = re.compile(rf"^\s*(from|import) {re.escape(PROTO_MODULE)}\b", re.MULTILINE)
_SERVICE: Final = re.compile(r"^\s*service\s+\w+", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def _protoc(args: list[str]) -> None:
    bin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        *args,
    ]
    # protoc and the plugins chat on stderr ("Writing mypy to ..."); show it only on failure.
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"protoc failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def _rewrite(text: str, path: Path) -> str:
    text = _IMPORT.sub(f"from {PY_MODULE} import ", text)
    text = _BUILDER_MODULE.sub(rf"'{PY_MODULE}.\1'", text)
    if _LEFTOVER.search(text):
        sys.exit(f"{path.name}: an import of {PROTO_MODULE} survived the rewrite; fix generate.py")
    return text


def generate(out_dir: Path) -> list[Path]:
    """Write every generated module into ``out_dir`` (created if missing); return the files."""
    protos = proto_files()
    if not protos:
        sys.exit(f"no .proto files under {PROTO_DIR}")
    rel = [str(p.relative_to(PROTO_ROOT)) for p in protos]
    # gRPC stubs only for files that define a service: the others would get empty modules.
    with_services = [
        r
        for r, p in zip(rel, protos, strict=True)
        if _SERVICE.search(p.read_text(encoding="utf-8"))
    ]
    with tempfile.TemporaryDirectory(prefix="metaq-gen-") as tmp:
        _protoc([f"--python_out={tmp}", f"--mypy_out={tmp}", *rel])
        if with_services:
            _protoc([f"--grpc_python_out={tmp}", f"--mypy_grpc_out={tmp}", *with_services])
        produced = Path(tmp) / "metaq" / "v1"
        out_dir.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for src in sorted(produced.iterdir()):
            dst = out_dir / src.name
            dst.write_text(_rewrite(src.read_text(encoding="utf-8"), src), encoding="utf-8")
            written.append(dst)
    init = out_dir / "__init__.py"
    init.write_text(INIT, encoding="utf-8")
    written.append(init)
    return sorted(written)


def _is_generated(path: Path) -> bool:
    return path.name == "__init__.py" or path.name.endswith(
        ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
    )


def clean(out_dir: Path) -> None:
    """Remove generated files (e.g. of a deleted .proto) so a regeneration leaves no orphans."""
    if out_dir.is_dir():
        for path in out_dir.iterdir():
            if path.is_file() and _is_generated(path):
                path.unlink()


def compare(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Describe every difference between two generated trees; empty when they agree."""
    problems: list[str] = []
    expected = {p.name for p in expected_dir.iterdir() if p.is_file() and _is_generated(p)}
    actual = (
        {p.name for p in actual_dir.iterdir() if p.is_file() and _is_generated(p)}
        if actual_dir.is_dir()
        else set()
    )
    for name in sorted(expected - actual):
        problems.append(f"missing: {actual_dir / name}")
    for name in sorted(actual - expected):
        problems.append(f"not generated from any .proto: {actual_dir / name}")
    for name in sorted(expected & actual):
        want = (expected_dir / name).read_text(encoding="utf-8").splitlines(keepends=True)
        have = (actual_dir / name).read_text(encoding="utf-8").splitlines(keepends=True)
        if want != have:
            diff = difflib.unified_diff(
                have, want, f"checked in: {name}", f"regenerated: {name}", n=1
            )
            lines = list(diff)
            shown = "".join(lines[:40]) + ("  ...\n" if len(lines) > 40 else "")
            problems.append(f"stale: {actual_dir / name}\n{shown}")
    return problems


def check(out_dir: Path = OUT_DIR) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="metaq-check-") as tmp:
        generate(Path(tmp))
        return compare(Path(tmp), out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temp dir and fail if the checked-in files differ",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT_DIR,
        help="directory of the generated modules (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out
    if args.check:
        problems = check(out_dir)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            print(
                f"generated code in {out_dir} is out of date with common/proto: "
                "run `make generate` and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"generated code is up to date ({len(proto_files())} .proto files)")
        return 0
    # Generate aside first: a protoc failure must leave the checked-in modules alone.
    with tempfile.TemporaryDirectory(prefix="metaq-gen-out-") as tmp:
        fresh = generate(Path(tmp))
        clean(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for src in fresh:
            dst = out_dir / src.name
            shutil.copyfile(src, dst)
            print(f"wrote {os.path.relpath(dst)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
