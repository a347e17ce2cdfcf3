"""Where two images differ: the first layer (by diff id) and, in it, the first file whose path, size, mode, owner,
time, kind, link target, device numbers, extended attributes or content differs: every attribute an extraction applies.
Pure over tar streams; the caller opens them (an engine's `docker save`, a registry blob)."""
from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import IO

from ..redaction import inert

CHUNK = 1 << 20
SHOWN_CHARACTERS = 200  # of a name or value from a layer, in a message: a hostile tar's names are megabytes long
# PAX records an extraction applies to the file it makes beyond the header's own fields: extended attributes (file
# capabilities, SELinux labels) and ACLs, as GNU tar (SCHILY.*) and libarchive (LIBARCHIVE.*) write them.
APPLIED_PAX_PREFIXES = ("SCHILY.xattr.", "LIBARCHIVE.xattr.", "SCHILY.acl.")
KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.CONTTYPE: "file", tarfile.GNUTYPE_SPARSE: "file",
         tarfile.DIRTYPE: "directory", tarfile.SYMTYPE: "symbolic link", tarfile.LNKTYPE: "hard link",
         tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device", tarfile.FIFOTYPE: "fifo"}


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    mode: str
    owner: str
    time: int
    content: str  # sha256 of a file's bytes (a sparse file's: of its map and stored bytes); "" for other kinds
    kind: str = "file"
    link: str = ""  # a symbolic or hard link's target
    device: str = ""  # a device node's major:minor
    attributes: tuple[tuple[str, str], ...] = ()  # the PAX records an extraction applies (xattrs, ACLs), sorted

    def describe(self) -> str:
        described = f"{shown(self.path)}: size {self.size}, mode {self.mode}, owner {self.owner}, time {self.time}"
        if self.content:
            described += f", content {shown(self.content)}"
        if self.kind != "file":
            described += f", kind {self.kind}"
        if self.link:
            described += f", link to {shown(self.link)}"
        if self.device:
            described += f", device {self.device}"
        return described + "".join(f", {shown(name)}={shown(value)}" for name, value in self.attributes)

    def differences(self, other: FileEntry) -> list[str]:
        """The names of the attributes in which other differs (an extended attribute by its own name)."""
        named = [field.name for field in fields(self) if field.name != "attributes"
                 and getattr(self, field.name) != getattr(other, field.name)]
        mine, theirs = dict(self.attributes), dict(other.attributes)
        return named + [shown(name) for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]


def shown(text: str) -> str:
    """A name or value from a layer as a message shows it: control characters escaped (a file name must not move
    the terminal's cursor or forge a line), and cut short."""
    text = inert(text)
    return text if len(text) <= SHOWN_CHARACTERS else f"{text[:SHOWN_CHARACTERS]}... ({len(text)} characters)"


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
            # entry's kind already says, and other writers do not.
            yield FileEntry(member.name, member.size, oct(member.mode & 0o7777), f"{member.uid}:{member.gid}",
                            int(member.mtime), content_id(archive, member), KINDS.get(member.type, "special file"),
                            member.linkname if member.issym() or member.islnk() else "",
                            f"{member.devmajor}:{member.devminor}" if member.ischr() or member.isblk() else "",
                            tuple(sorted((name, value) for name, value in member.pax_headers.items()
                                         if name.startswith(APPLIED_PAX_PREFIXES))))


def content_id(archive: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    """What a file holds, as a comparison names it: its bytes' sha256 ("" for other kinds: a link's target and a
    device's numbers are compared beside it)."""
    if not member.isfile():
        return ""
    if member.issparse():
        return sparse_content_id(archive, member)
    digest = hashlib.sha256()
    source = archive.extractfile(member)
    while source is not None and (chunk := source.read(CHUNK)):
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def sparse_content_id(archive: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    """A sparse file's content, in work bounded by what the layer stores: the sha256 of its map and of its stored
    bytes, read as stored, never of the holes between them (a map may claim a terabyte of zeros, which tarfile's own
    reader makes up and hands back for ever). A map that claims more bytes than the layer stores for the entry, or
    blocks past its size, is named as damaged."""
    blocks: list[tuple[int, int]] = member.sparse or []  # type: ignore[assignment]  # typeshed says bytes too
    stored = sum(length for _, length in blocks)
    if (stored > archive.offset - member.offset_data  # the entry's data, rounded up to whole tar blocks
            or any(offset < 0 or length < 0 or offset + length > member.size for offset, length in blocks)):
        return "a damaged sparse map (it claims more than the layer stores)"
    digest = hashlib.sha256(repr(blocks).encode())
    archive.fileobj.seek(member.offset_data)  # a stream's seek: forward, by reading
    while stored > 0 and (chunk := archive.fileobj.read(min(CHUNK, stored))):
        digest.update(chunk)
        stored -= len(chunk)
    return f"sparse sha256:{digest.hexdigest()}"


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
                return (f"ours {mine[path].describe()} / theirs {others[path].describe()} (differs in "
                        f"{', '.join(mine[path].differences(others[path]))})")
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
