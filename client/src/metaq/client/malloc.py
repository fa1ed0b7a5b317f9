"""glibc's malloc, set once for a process that consumes: freed memory is kept for reuse.

A consumer allocates and frees hundreds of megabytes a second: every pull's answer
arrives in chunks of up to 256 KiB, and every message body is a bytes object of its own.
glibc's defaults hand that memory back to the kernel at once (a chunk over
``M_MMAP_THRESHOLD``, 128 KiB until the first such free raises it, is mapped and
unmapped on its own; a free top of the heap over ``M_TRIM_THRESHOLD`` is trimmed), so
the next pull's buffers are fresh pages, each a page fault: a consumer draining a
backlog spent a large share of its CPU in the kernel faulting them in. Buffers under
4 MiB now come from the heap, and up to 64 MiB freed at its top stay there for the next
allocations, which made a warm drain faster and cheaper a message (the figures are in
docs/benchmarks.md, ``make bench-accumulation``).

The price is memory the process holds on to: at most the 64 MiB above, plus what the
heap keeps between buffers. An environment that sets glibc's malloc itself
(``GLIBC_TUNABLES`` naming malloc, or a ``MALLOC_*_`` variable) is left alone, and so is
a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Final

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD_BYTES: Final = 4 * 1024 * 1024
TRIM_THRESHOLD_BYTES: Final = 64 * 1024 * 1024

_done = False


def keep_freed_memory() -> bool:
    """Set the two thresholds, once per process; whether this call set them."""
    global _done
    if _done:
        return False
    _done = True
    if "malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(
        name.startswith("MALLOC_") and name.endswith("_") for name in os.environ
    ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    ):
        log.debug("mallopt refused the consumer's malloc thresholds; glibc's defaults stay")
        return False
    return True
