"""The roles' ``metaq_acl`` filter makes the ACL the programs read, with the verifier
metaq itself derives (the control machine need not have metaq installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lab import PLAYBOOKS

from metaq.common import acl
from metaq.common.users import Verifier


def test_the_filter_makes_an_acl_whose_admin_metaq_accepts(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "metaq_acl_filter", PLAYBOOKS / "filter_plugins" / "metaq_acl.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "acl.json"
    path.write_text(module.metaq_acl("generated-admin-secret-key-0123456789", "admin"))
    loaded = acl.load(path)
    admin = loaded.user("admin")
    assert admin is not None and admin.is_admin
    assert admin.verifier == Verifier.make("admin", "generated-admin-secret-key-0123456789")
