"""``metaq_acl``: the ACL file (auth_acl_file) holding one admin user, made on the control
machine, which need not have metaq installed.

The verifier is derived exactly as ``metaq.common.users.Verifier.make`` does (SCRAM-SHA-256
style: PBKDF2, then ClientKey / StoredKey / ServerKey), with the standard library only;
tests/integration/deploy/test_acl_filter.py checks that the two agree. The output is
deterministic, so a re-run of the playbook changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

ITERATIONS = 4096


def metaq_acl(secret_key: str, access_key: str = "admin") -> str:
    salted = hashlib.pbkdf2_hmac(
        "sha256", secret_key.encode(), b"metaq user " + access_key.encode(), ITERATIONS
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    verifier = {
        "stored_key": base64.b64encode(hashlib.sha256(client_key).digest()).decode(),
        "server_key": base64.b64encode(server_key).decode(),
        "iterations": ITERATIONS,
    }
    acl = {
        "version": 1,
        "users": {access_key: {"verifier": verifier, "grants": ["admin cluster"], "cidrs": []}},
    }
    return json.dumps(acl, indent=2) + "\n"


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"metaq_acl": metaq_acl}
