"""Fixtures for the TLS tests: one throwaway CA and its certificates per module."""

from __future__ import annotations

import pytest

from metaq.testing import certs


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.make_pki(tmp_path_factory.mktemp("pki"))
