"""Fixtures for the TLS tests: one throwaway CA and its certificates per module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# Tests import in importlib mode, so this folder is not on sys.path: load certs.py by
# name for the test modules beside it.
_spec = importlib.util.spec_from_file_location("tls_certs", Path(__file__).with_name("certs.py"))
assert _spec is not None and _spec.loader is not None
certs = importlib.util.module_from_spec(_spec)
sys.modules["tls_certs"] = certs
_spec.loader.exec_module(certs)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.make_pki(tmp_path_factory.mktemp("pki"))
