"""Fixtures for the TLS tests: one throwaway CA and its certificates per module."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest


# Tests import in importlib mode, so this folder is not on sys.path: load certs.py by
# name (and the failover path they share) for the test modules beside it.
def _load(name: str, file: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


certs = _load("tls_certs", "certs.py")
_load("failover_path", "failover_path.py")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.make_pki(tmp_path_factory.mktemp("pki"))
