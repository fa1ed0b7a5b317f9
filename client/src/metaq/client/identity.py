"""Who a client says it is to the brokers: its id, its library's version and language
(shown by ``metaq connections`` and the console)."""

from __future__ import annotations

import itertools
import os
import socket
import uuid
from typing import Final

from metaq.common.version import installed_version

LANGUAGE: Final = "python"
CLIENT_VERSION: Final = installed_version("metaq-client")

_client_ids = itertools.count()


def new_client_id() -> str:
    """host@pid@random: unique per client instance, readable in admin views."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}{next(_client_ids)}"
