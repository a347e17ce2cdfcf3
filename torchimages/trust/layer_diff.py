"""Where two images differ: the first layer (by diff id) and, in it, the first file whose path, size, mode, owner,
time or content differs. Pure over tar streams; the caller opens them (an engine's `docker save`, a registry blob)."""
from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

CHUNK = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    mode: str
    owner: str
    time: int
    content: str  # sha256 of a file's bytes, a link's target, or the kind of entry

    def describe(self) -> str:
        return (f"{self.path}: size {self.size}, mode {self.mode}, owner {self.owner}, time {self.time}, "
                f"content {self.content}")


def first_differing_layer(ours: list[str], theirs: list[str]) -> int | None:
    """The index of the first layer (diff id) that differs, or that one image has and the other has not."""
    for index in range(max(len(ours), len(theirs))):
        if index >= len(ours) or index >= len(theirs) or ours[index] != theirs[index]:
            return index
    return None


def layer_entries(stream: IO[bytes]) -> Iterator[FileEntry]:
    """The entries of one uncompressed layer tar, in the tar's order."""
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            # The permission bits alone: Docker's tar writer also puts the file type in the mode field, which the
            # entry's type (content) already says, and other writers do not.
            yield FileEntry(member.name, member.size, oct(member.mode & 0o7777), f"{member.uid}:{member.gid}",
                            int(member.mtime), content_id(archive, member))


def content_id(archive: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    """What an entry holds, as a comparison names it: a link's target, a folder, or its bytes' sha256."""
    if member.issym() or member.islnk():
        return f"link to {member.linkname}"
    if not member.isfile():
        return "directory" if member.isdir() else "special file"
    digest = hashlib.sha256()
    source = archive.extractfile(member)
    while source is not None and (chunk := source.read(CHUNK)):
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def first_differing_file(ours: Iterator[FileEntry], theirs: Iterator[FileEntry]) -> str | None:
    """'ours: … / theirs: …' for the first entry (by path, in tar order) that differs; None when none does. Both
    layers are read in full only when they are the same."""
    mine: dict[str, FileEntry] = {}
    others: dict[str, FileEntry] = {}
    for left, right in _pairs(ours, theirs):
        if left == right:
            continue
        for entry, seen in ((left, mine), (right, others)):
            if entry is not None:
                seen[entry.path] = entry
        for path in [entry.path for entry in (left, right) if entry is not None]:
            if path in mine and path in others and mine[path] != others[path]:
                return f"ours {mine[path].describe()} / theirs {others[path].describe()}"
    for path in sorted(set(mine) ^ set(others)):
        return f"only in {'ours' if path in mine else 'theirs'}: {(mine.get(path) or others[path]).describe()}"
    return None


def _pairs(ours: Iterator[FileEntry], theirs: Iterator[FileEntry]):
    done = object()
    while True:
        left, right = next(ours, done), next(theirs, done)
        if left is done and right is done:
            return
        yield (None if left is done else left), (None if right is done else right)
