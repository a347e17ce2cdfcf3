"""The start-up set's two halves inside a container (standard library only; run as root, by verify/startup_set.py):

    python3 startup_probe.py evict      # drop the page cache of every file of the image
    python3 startup_probe.py resident   # after the start ran: which byte ranges of which files are in the page cache

Between the two the start itself runs as the image's user (`import torch` and a first op). What it read, and what the
kernel read ahead around it, is then resident: `mincore` over a shared read-only mapping of each file tells it page by
page. A layer's file is the same file on the host for every container of the image (overlayfs passes fadvise and
mappings down to it), so the eviction is real and the count is the host's. Pages of files some running process maps
cannot be evicted: the probe's own interpreter and its standard library stay, and the start reads them too.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import stat
import sys

SKIPPED = ("/proc", "/sys", "/dev", "/run")  # the kernel's and the runtime's, no image files
PAGE = mmap.PAGESIZE
PROT_READ, MAP_SHARED = 0x1, 0x01
MAP_FAILED = ctypes.c_void_p(-1).value


def image_files(root: str = "/") -> list[tuple[str, int]]:
    """Every regular, non-empty file of the container's root, with its size."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [name for name in dirs if os.path.join(folder, name) not in SKIPPED]
        for name in files:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size:
                found.append((path, info.st_size))
    return found


def evict(files: list[tuple[str, int]]) -> dict:
    failed = 0
    for path, _ in files:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            failed += 1
            continue
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)
    return {"files": len(files), "failed": failed}


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_ranges(libc, path: str, size: int) -> list[list[int]]:
    """The byte ranges [start, end) of the file that are in the page cache (whole pages, the last cut at the size)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        address = libc.mmap(None, size, PROT_READ, MAP_SHARED, descriptor, 0)
    finally:
        os.close(descriptor)
    if address in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), f"mmap {path}")
    try:
        pages = (size + PAGE - 1) // PAGE
        vector = ctypes.create_string_buffer(pages)
        if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
            raise OSError(ctypes.get_errno(), f"mincore {path}")
        ranges: list[list[int]] = []
        for page, flag in enumerate(vector.raw):
            if flag & 1:
                if ranges and ranges[-1][1] == page * PAGE:
                    ranges[-1][1] = min(size, (page + 1) * PAGE)
                else:
                    ranges.append([page * PAGE, min(size, (page + 1) * PAGE)])
        return ranges
    finally:
        libc.munmap(ctypes.c_void_p(address), size)


def resident(files: list[tuple[str, int]]) -> dict:
    libc = _libc()
    found = {}
    for path, size in files:
        try:
            ranges = resident_ranges(libc, path, size)
        except OSError:
            continue
        if ranges:
            found[path] = {"size": size, "ranges": ranges}
    return {"files": found}


def main(argv: list[str]) -> int:
    if argv[1:] not in (["evict"], ["resident"]):
        print("usage: startup_probe.py evict|resident", file=sys.stderr)
        return 2
    files = image_files()
    print(json.dumps(evict(files) if argv[1] == "evict" else resident(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
