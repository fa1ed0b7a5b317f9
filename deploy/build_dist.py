"""Build what the Ansible roles install on hosts without internet: the project's wheels
and a wheelhouse of their pinned dependencies (the versions and hashes of uv.lock).

    python deploy/build_dist.py [--out dist] [--version 0.1.0.post1]

Output: ``<out>/wheels/*.whl`` (metaq-common, -replication, -client, -broker,
-nameserver; the Spark and test-support members are not deployed), ``<out>/wheelhouse/*.whl`` and
``<out>/requirements.txt`` (every pinned dependency, with hashes), ``<out>/bin/uv``
(the installer the roles make each release's venv with: uv.lock's ``deploy`` group),
``<out>/VERSION``, and the three folders in one ``<out>/metaq-<version>.tar`` (what the
roles copy).
``--version`` rebuilds the wheels under another version string from a copy of the
sources (the tree itself is left alone), which is what an upgrade rehearsal needs.
The wheelhouse comes from PyPI (pip's cache makes a second build quick); hosts then
install with ``uv pip install --offline --no-index --find-links`` and reach no index.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
MEMBERS: Final = ("common", "replication", "client", "broker", "nameserver")
PACKAGES: Final = tuple(f"metaq-{m}" for m in MEMBERS)
_VERSION_LINE: Final = re.compile(r'^version = "[^"]*"$', re.MULTILINE)
# A PEP 440 public version: what pip and the wheel's file name accept.
_PEP440: Final = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")


def _uv() -> str:
    for candidate in (shutil.which("uv"), str(ROOT / ".tools" / "bin" / "uv")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("build_dist: no uv on PATH and none in .tools/ (run 'make setup')")


def _pip_python() -> str:
    """An interpreter with pip: this one, else the one its venv was made from, else
    python3 on PATH (uv's venvs have no pip, and under ``uv run`` PATH starts with one)."""
    if importlib.util.find_spec("pip") is not None:
        return sys.executable
    candidates = [str(Path(sys.base_prefix) / "bin" / "python3"), shutil.which("python3")]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            probe = subprocess.run([candidate, "-c", "import pip"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    raise SystemExit("build_dist: needs pip (python3 -m pip) to fetch the wheelhouse")


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, check=False)
    if done.returncode != 0:
        raise SystemExit(f"build_dist: {' '.join(argv)} failed ({done.returncode})")


def _source_tree(version: str | None, scratch: Path) -> Path:
    """The tree to build from: the checkout, or a copy with every version rewritten."""
    if version is None:
        return ROOT
    tree = scratch / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "tests", ".pytest_cache")
    # Every workspace member, deployed or not: uv resolves the workspace before it builds.
    for member in (*MEMBERS, "spark_jobs", "testing"):
        shutil.copytree(ROOT / member, tree / member, ignore=ignore)
        pyproject = tree / member / "pyproject.toml"
        text = pyproject.read_text()
        pyproject.write_text(_VERSION_LINE.sub(f'version = "{version}"', text, count=1))
    return tree


def build(out: Path, version: str | None) -> None:
    uv = _uv()
    if out.exists():
        shutil.rmtree(out)
    wheels, wheelhouse = out / "wheels", out / "wheelhouse"
    wheels.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="metaq-dist-") as scratch:
        tree = _source_tree(version, Path(scratch))
        for package in PACKAGES:
            _run([uv, "build", "--quiet", "--wheel", "--package", package,
                  "--out-dir", str(wheels)], tree)  # fmt: skip
    requirements = out / "requirements.txt"
    export = [uv, "export", "--frozen", "--no-dev", "--no-emit-workspace", "--quiet",
              "--output-file", str(requirements)]  # fmt: skip
    for package in PACKAGES:
        export += ["--package", package]
    _run(export, ROOT)
    # pip wheel fetches the published wheels and builds the sdist-only ones (pysyncobj),
    # so build on the hosts' OS, architecture and Python (3.11).
    _run([_pip_python(), "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
          "--no-deps", "--require-hashes", "-r", str(requirements),
          "--wheel-dir", str(wheelhouse)], ROOT)  # fmt: skip
    _fetch_uv(uv, out / "bin", Path(_pip_python()))
    shown = version or _checkout_version()
    (out / "VERSION").write_text(shown + "\n")
    # One file to copy per host rather than a task round trip per wheel.
    with tarfile.open(out / f"metaq-{shown}.tar", "w") as bundle:
        for folder in (wheels, wheelhouse, out / "bin"):
            bundle.add(folder, arcname=folder.name)
    count = len(list(wheelhouse.glob("*.whl")))
    print(f"dist {shown}: {len(PACKAGES)} wheels in {wheels}, {count} in {wheelhouse}")


def _fetch_uv(uv: str, bin_dir: Path, pip_python: Path) -> None:
    """uv's binary, from the wheel uv.lock's ``deploy`` group pins (hash-checked): the
    roles install with it, in a fraction of pip's time (and no pip in the venvs)."""
    with tempfile.TemporaryDirectory(prefix="metaq-uv-") as scratch:
        requirements = Path(scratch) / "requirements.txt"
        _run([uv, "export", "--frozen", "--only-group", "deploy", "--no-emit-workspace",
              "--quiet", "--output-file", str(requirements)], ROOT)  # fmt: skip
        _run([str(pip_python), "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--only-binary", ":all:", "--require-hashes", "-r", str(requirements),
              "--dest", scratch], ROOT)  # fmt: skip
        (wheel,) = Path(scratch).glob("uv-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (member,) = [n for n in archive.namelist() if n.endswith(".data/scripts/uv")]
            bin_dir.mkdir(parents=True, exist_ok=True)
            (bin_dir / "uv").write_bytes(archive.read(member))
    (bin_dir / "uv").chmod(0o755)


def _checkout_version() -> str:
    match = _VERSION_LINE.search((ROOT / "broker" / "pyproject.toml").read_text())
    assert match is not None
    return match.group(0).split('"')[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="default: dist/")
    parser.add_argument("--version", help="build the wheels under this version string")
    args = parser.parse_args(argv)
    if args.version is not None and not _PEP440.fullmatch(args.version):
        parser.error(f"--version {args.version!r} is not a PEP 440 version such as 0.1.0.post1")
    build(args.out.resolve(), args.version)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_NO_INPUT", "1")
    sys.exit(main())
