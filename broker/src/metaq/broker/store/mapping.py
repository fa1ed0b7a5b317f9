"""Shared file mappings that keep no file descriptor, and a bound on how many stay mapped.

Every mapped store file goes through :class:`Mapping`. CPython 3.11's ``mmap.mmap``
duplicates the descriptor it maps and keeps the copy until the mapping closes (3.13's
``trackfd=False`` would not), so a broker with a hundred thousand queue files held a
hundred thousand descriptors and had none left for connections. The kernel needs no
descriptor once a file is mapped, so the mapping is made through libc's ``mmap`` and the
caller closes its descriptor when it likes.

A mapping still costs one of the process's ``vm.max_map_count`` areas (65,530 by
default). :class:`MappingPool` keeps at most ``capacity`` of the files it is given
mapped, unmapping the least recently used; such a file is mapped again when next
touched (:meth:`metaq.broker.store.segment.Segment.mapped`).

A reader's memoryview keeps its mapping alive, as with ``mmap.mmap``: :meth:`Mapping.close`
refuses (returns False) while any view of it is alive, so no reader ever meets an
unmapped page.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import threading
from collections import OrderedDict
from typing import Final, Protocol

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_madvise = _libc.madvise
_madvise.restype = ctypes.c_int
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_msync = _libc.msync
_msync.restype = ctypes.c_int
_msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_memmem = _libc.memmem
_memmem.restype = ctypes.c_void_p
_memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]

_MAP_FAILED: Final = ctypes.c_void_p(-1).value
_MS_SYNC: Final = 4  # Linux; the mmap module does not name it


def _os_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


class Mapping:
    """``size`` bytes of a file mapped shared and writable from offset 0.

    ``view`` is a writable memoryview of the bytes (format ``B``); slicing it is
    zero-copy. Calls into libc release the GIL, as ``mmap.mmap``'s ``flush`` does.
    """

    __slots__ = ("_address", "_array", "_base", "_refs", "size", "view")

    def __init__(self, fd: int, size: int) -> None:
        address = _mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            raise _os_error(f"mmap of {size} bytes failed")
        self._address: int = address
        self.size = size
        self._array: ctypes.Array[ctypes.c_ubyte] | None = (ctypes.c_ubyte * size).from_address(
            address
        )
        # Every view of the mapping (slices and views of those included) holds the array
        # through the buffer they share: references above this count are readers.
        self._refs = sys.getrefcount(self._array)
        self._open_views()

    def _open_views(self) -> None:
        self._base = memoryview(self._array)  # type: ignore[arg-type]
        self.view = self._base.cast("B")

    @property
    def closed(self) -> bool:
        return self._array is None

    def _pin(self) -> memoryview:
        """A view held while libc works on the pages, so :meth:`close` waits for it;
        ValueError once closed (as ``mmap.mmap`` raises)."""
        return self.view[0:0]

    def madvise(self, advice: int, start: int = 0, length: int | None = None) -> None:
        """``madvise`` on ``[start, start + length)``; ``start`` must be page aligned."""
        if length is None:
            length = self.size - start
        if start % mmap.PAGESIZE or start < 0 or length < 0 or start + length > self.size:
            raise ValueError(f"madvise range {start}+{length} is outside the mapping or unaligned")
        with self._pin():
            if _madvise(self._address + start, length, advice) != 0:
                raise _os_error("madvise failed")

    def flush(self) -> None:
        """Write the dirty pages back and wait (``msync(MS_SYNC)``), as ``mmap.flush``."""
        with self._pin():
            if _msync(self._address, self.size, _MS_SYNC) != 0:
                raise _os_error("msync failed")

    def find(self, needle: bytes, start: int = 0) -> int:
        """Where ``needle`` first occurs at or after ``start``, or -1 (as ``mmap.find``)."""
        if start >= self.size or not needle:
            return -1 if needle else min(start, self.size)
        with self._pin():
            hit = _memmem(self._address + start, self.size - start, needle, len(needle))
        return -1 if not hit else hit - self._address

    def close(self) -> bool:
        """Unmap unless a reader still holds a view; return whether it is unmapped.

        A refusal leaves the mapping as it was, views and all: call again later.
        """
        array = self._array
        if array is None:
            return True
        if sys.getrefcount(self.view) > 2:  # the attribute and the argument: no others
            return False
        try:
            self.view.release()
            self._base.release()
        except BufferError:  # something holds a buffer of the view itself
            self._open_views()
            return False
        # The local name holds one reference more than the count taken at creation.
        if sys.getrefcount(array) > self._refs + 1:
            self._open_views()
            return False
        self._array = None
        del array
        if _munmap(self._address, self.size) != 0:
            raise _os_error("munmap failed")
        return True


class Mapped(Protocol):
    """A file the pool can unmap, to be mapped again by its owner when next touched."""

    used: bool
    """Set by the owner on access; the pool clears it."""

    def unmap(self) -> bool:
        """Unmap now unless a reader holds a view; whether it is unmapped."""


class MappingPool:
    """Keeps at most ``capacity`` of its files mapped, unmapping the least recently used.

    Files enter with :meth:`admit` when mapped. Their owners set ``used`` on access
    (cheaper than reordering on each); a file found used when its turn to go comes is
    given another round (the clock algorithm). A file a reader holds a view of is passed
    over and tried again later, so the pool exceeds its capacity by the files in use at
    that moment. ``lock`` is held while a pooled file is mapped or unmapped.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a mapping pool needs a capacity of at least 1, not {capacity}")
        self.capacity = capacity
        self.lock = threading.RLock()
        self._files: OrderedDict[Mapped, None] = OrderedDict()
        self.mapped_again = 0
        """Files mapped again after the pool unmapped them."""
        self.unmapped = 0
        """Files the pool unmapped to stay within its capacity."""

    def __len__(self) -> int:
        return len(self._files)

    def admit(self, file: Mapped) -> None:
        """``file`` is mapped now; unmap others beyond the capacity. Call with ``lock``."""
        file.used = True
        self._files[file] = None
        self._files.move_to_end(file)
        files = self._files
        # Each file is looked at most twice: once to clear its flag, once to go.
        budget = 2 * len(files)
        while len(files) > self.capacity and budget > 0:
            budget -= 1
            oldest = next(iter(files))
            files.move_to_end(oldest)
            if oldest.used:
                oldest.used = False
            elif oldest.unmap():
                del files[oldest]
                self.unmapped += 1

    def forget(self, file: Mapped) -> None:
        """``file`` is closed for good. Call with ``lock``."""
        self._files.pop(file, None)
