"""eStargz: one image layer (an uncompressed tar) rewritten as a lazily pullable gzip blob, and the reader a lazy
puller needs (the footer, the TOC, the byte ranges of the files it reads).

The format is containerd/stargz-snapshotter's docs/estargz.md at commit 7cf47cba499264f61bc4adac00e05edd599ca48f;
where the text leaves a choice open, this module lays a blob out as that commit's Go writer does (estargz/estargz.go's
Writer.appendTar, estargz/build.go's sortEntries and moveRec, estargz/gzip.go's WriteTOCAndFooter): the same members,
entries and TOC fields as `ctr-remote images convert --estargz`, though not the same bytes (other deflate and tar
header encoders):
- every non-empty regular file's payload starts a gzip member, and a file over chunk_size (4 MiB) one per chunk; an
  entry's tar header ends the member before it (the first opens the blob), a payload's tar padding ends its own;
- the prefetch files first, in the order given, each after the directories above it that the layer holds and after a
  hard link's target; then `.prefetch.landmark` (one byte, 0x0f, in a member of its own), or `.no.prefetch.landmark`
  first when no prefetch file is in this layer; then the other entries in the layer's order;
- `stargz.index.json` (the TOC: tab-indented JSON, as Go's json.MarshalIndent writes it) as the last tar entry, with
  the tar's end (two zero blocks), in a member of its own; then the 51-byte footer, an empty gzip member whose extra
  field holds subfield "SG": "%016xSTARGZ" % the TOC's offset.
The members concatenated are one ordinary gzip stream of one ordinary tar, which a plain engine pulls and unpacks as
any tar+gzip layer: the layer's entries (names, modes, owners, times, links, xattrs, contents; headers rewritten in
PAX form) plus the landmark and the TOC. Its sha256 is the diff id.

On purpose unlike Go: a prefetch path whose parent directory has no entry in the layer is still moved (Go reports it
missing), and a layer holding none of the prefetch paths gets the no-prefetch landmark (the spec's MUST; Go writes a
prefetch landmark with nothing before it). As in Go, a repeated name keeps its last entry, and a landmark or TOC
already in the input is dropped.

Deterministic: every member's gzip header has mtime 0, no name and OS byte 255 (as Go writes it), at one deflate level
(6 by default, zlib's and Go's default; ctr-remote's is 9), so the same layer and prefetch list give the same bytes
with the same zlib. Memory stays bounded by one chunk: the layer is read from a file by offset (a stream is spooled to
a temporary file first) and the blob written as it is made; only the TOC (a few hundred bytes per entry) is held.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import math
import posixpath
import re
import shutil
import struct
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ..files import atomic_output

TOC_NAME = "stargz.index.json"
PREFETCH_LANDMARK = ".prefetch.landmark"
NO_PREFETCH_LANDMARK = ".no.prefetch.landmark"
LANDMARK_CONTENT = b"\x0f"
CHUNK_SIZE = 4 << 20  # the Go writer's default (Writer.chunkSize)
LEVEL = 6  # zlib's default; see the module's docstring
FOOTER_SIZE = 51
TOC_DIGEST_ANNOTATION = "containerd.io/snapshot/stargz/toc.digest"
UNCOMPRESSED_SIZE_ANNOTATION = "io.containers.estargz.uncompressed-size"
MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
# A TOC takes about 360 bytes an entry (a synthetic site-packages layer's), so tens of MB for a CUDA layer's ~100k
# entries; reading one stops decompressing past this, and refuses a TOC claiming more.
MAX_TOC_BYTES = 512 << 20
# Pieces a payload is copied in: one chunk is never held whole.
_PIECE = 1 << 20
_BLOCK = 512
_OS_UNKNOWN = 255
# The TOC's fields in Go's struct order (types.go's TOCEntry), so our JSON lists them as ctr-remote's does.
_FIELDS = ("name", "type", "size", "modtime", "linkName", "mode", "uid", "gid", "userName", "groupName", "offset",
           "innerOffset", "devMajor", "devMinor", "xattrs", "digest", "chunkOffset", "chunkSize", "chunkDigest")
_TYPES = {tarfile.REGTYPE: "reg", tarfile.AREGTYPE: "reg", tarfile.CONTTYPE: "reg", tarfile.LNKTYPE: "hardlink",
          tarfile.SYMTYPE: "symlink", tarfile.DIRTYPE: "dir", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block",
          tarfile.FIFOTYPE: "fifo"}
# PAX records tarfile writes again from the member's own fields (a name made longer by the directory's slash, a
# fractional mtime): the copies read from the input are dropped so the two never disagree.
_REGENERATED_PAX = {"path", "linkpath", "size", "uid", "gid", "uname", "gname", "mtime", "hdrcharset"}
_XATTR_PREFIX = "SCHILY.xattr."
_HEX16 = re.compile(rb"[0-9a-fA-F]{16}", re.ASCII)
_NUMBER_FIELDS = ("size", "offset", "innerOffset", "chunkOffset", "chunkSize", "mode", "uid", "gid")
_NUMBER_TYPES = frozenset({int, bool})


@dataclass(frozen=True)
class Converted:
    """One layer's eStargz blob and what its manifest descriptor says of it."""

    path: Path | None  # where the blob was written; None when it went to a stream
    digest: str  # sha256 of the blob
    size: int
    diff_id: str  # sha256 of the tar the blob decompresses to
    uncompressed_size: int
    toc_digest: str  # sha256 of the TOC JSON
    toc_offset: int
    prefetched: tuple[str, ...]  # the entries before the landmark, in blob order
    missed: tuple[str, ...]  # prefetch paths this layer does not hold

    def annotations(self) -> dict[str, str]:
        return {TOC_DIGEST_ANNOTATION: self.toc_digest, UNCOMPRESSED_SIZE_ANNOTATION: str(self.uncompressed_size)}

    def descriptor(self) -> dict:
        return {"mediaType": MEDIA_TYPE, "digest": self.digest, "size": self.size, "annotations": self.annotations()}


def clean_name(name: str) -> str:
    """A tar name as the TOC reader compares it (Go's cleanEntryName): relative to /, no `.`, `..` or slash at the end.
    The root directory is ''."""
    return posixpath.normpath("/" + name).lstrip("/")


def convert(layer: Path | BinaryIO, out: Path | BinaryIO, prefetch: Sequence[str] = (), *,
            chunk_size: int = CHUNK_SIZE, level: int = LEVEL, spool_dir: Path | None = None) -> Converted:
    """Write layer (an uncompressed tar: a path, or a binary stream read once) to out (a path, replaced in one step,
    or a binary stream) as an eStargz blob whose prefetch area holds the prefetch paths (absolute or relative to /)."""
    if chunk_size <= 0 or not 0 <= level <= 9:
        raise ValueError(f"chunk_size {chunk_size} and level {level}: a chunk of at least one byte, a level 0-9")
    with ExitStack() as stack:
        if isinstance(layer, Path):
            source: BinaryIO = stack.enter_context(layer.open("rb"))
        elif layer.seekable():
            source = layer
        else:
            # tarfile needs to seek to move the prefetch files forward: a stream is spooled, never held in memory.
            source = stack.enter_context(tempfile.TemporaryFile(dir=spool_dir))
            shutil.copyfileobj(layer, source, _PIECE)
            source.seek(0)
        sink: BinaryIO = stack.enter_context(atomic_output(out)) if isinstance(out, Path) else out
        return _convert(source, sink, out if isinstance(out, Path) else None, prefetch, chunk_size, level)


def convert_bytes(layer: bytes, prefetch: Sequence[str] = (), *, chunk_size: int = CHUNK_SIZE,
                  level: int = LEVEL) -> tuple[bytes, Converted]:
    """convert() for a layer small enough to hold in memory (tests, a config-sized layer): the blob and its facts."""
    out = io.BytesIO()
    converted = convert(io.BytesIO(layer), out, prefetch, chunk_size=chunk_size, level=level)
    return out.getvalue(), converted


class _Members:
    """The blob as it is written: gzip members one after another, with the sha256 of the compressed bytes and of the
    uncompressed ones (the diff id), and the offset of the next byte."""

    def __init__(self, sink: BinaryIO, level: int) -> None:
        self._sink = sink
        self._level = level
        # RFC 1952's XFL: 2 for the slowest level, 4 for the fastest, as Go's and Python's gzip writers say.
        self._xfl = 2 if level == 9 else 4 if level == 1 else 0
        self.offset = self.uncompressed = 0
        self.blob_hash, self.diff_hash = hashlib.sha256(), hashlib.sha256()
        self._deflate: zlib._Compress | None = None
        self._crc = self._length = 0

    def _emit(self, data: bytes) -> None:
        if data:
            self._sink.write(data)
            self.blob_hash.update(data)
            self.offset += len(data)

    def write(self, data: bytes) -> None:
        if self._deflate is None:
            # No name, mtime 0, OS unknown: the header says nothing about the machine that wrote it.
            self._emit(b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + bytes((self._xfl, _OS_UNKNOWN)))
            self._deflate = zlib.compressobj(self._level, zlib.DEFLATED, -zlib.MAX_WBITS)
            self._crc = self._length = 0
        self.diff_hash.update(data)
        self.uncompressed += len(data)
        self._crc = zlib.crc32(data, self._crc)
        self._length += len(data)
        self._emit(self._deflate.compress(data))

    def close_member(self) -> int:
        """End the open member, if any; the offset where the next one starts."""
        if self._deflate is not None:
            self._emit(self._deflate.flush())
            self._emit(struct.pack("<II", self._crc, self._length & 0xFFFFFFFF))
            self._deflate = None
        return self.offset

    def raw(self, data: bytes) -> None:
        """Bytes that are not tar content (the footer, itself a complete empty member)."""
        self.close_member()
        self._emit(data)


def footer(toc_offset: int) -> bytes:
    """The 51-byte footer (docs/estargz.md, "Footer"; gzip.go's gzipFooterBytes): an empty stored-block gzip member
    whose extra field is subfield "SG" holding "%016xSTARGZ" % toc_offset."""
    subfield = b"%016xSTARGZ" % toc_offset
    extra = b"SG" + struct.pack("<H", len(subfield)) + subfield
    header = b"\x1f\x8b\x08\x04\x00\x00\x00\x00\x00" + bytes((_OS_UNKNOWN,)) + struct.pack("<H", len(extra)) + extra
    return header + b"\x01\x00\x00\xff\xff" + b"\x00" * 8


def parse_footer(data: bytes) -> int:
    """The TOC's offset named by a blob's last FOOTER_SIZE bytes; ValueError for anything that is not such a footer."""
    if len(data) != FOOTER_SIZE:
        raise ValueError(f"an eStargz footer is {FOOTER_SIZE} bytes, not {len(data)}")
    if data[:4] != b"\x1f\x8b\x08\x04" or struct.unpack("<H", data[10:12])[0] != 26:
        raise ValueError("the footer is not a gzip header with a 26-byte extra field")
    if data[12:14] != b"SG" or struct.unpack("<H", data[14:16])[0] != 22 or data[32:38] != b"STARGZ":
        raise ValueError("the footer's extra field is not the SG subfield %016xSTARGZ")
    if not _HEX16.fullmatch(data[16:32]):
        raise ValueError(f"the footer's TOC offset is not 16 hex digits: {data[16:32]!r}")
    return int(data[16:32], 16)


def _modtime(mtime: float) -> str:
    """RFC 3339 in UTC, rounded to the second (Go's formatModtime); '' for the epoch, which Go writes as unknown."""
    seconds = math.floor(mtime + 0.5) if mtime >= 0 else -math.floor(-mtime + 0.5)
    if seconds == 0:
        return ""
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return ""  # a time no RFC 3339 year holds: "unknown", as the spec allows


def _ordered(fields: dict) -> dict:
    """An entry's fields in Go's order, the empty ones left out (Go's omitempty; name and type are always there)."""
    return {key: fields[key] for key in _FIELDS
            if key in fields and (key in ("name", "type") or fields[key] not in (None, "", 0, {}))}


class _Layer:
    """The input tar's entries, indexed by clean name (the last of a repeated name wins, at its own place)."""

    def __init__(self, source: BinaryIO) -> None:
        members: dict[str, tarfile.TarInfo] = {}
        with tarfile.open(fileobj=source, mode="r:") as archive:
            for info in archive:
                name = clean_name(info.name)
                if name in (TOC_NAME, PREFETCH_LANDMARK, NO_PREFETCH_LANDMARK):
                    continue
                if info.type not in _TYPES:
                    raise ValueError(f"{info.name!r}: tar entry type {info.type!r} has no eStargz form "
                                     "(a sparse or vendor entry)")
                members.pop(name, None)
                members[name] = info
        self.members = members

    def ordered(self, prefetch: Sequence[str]) -> tuple[list[tarfile.TarInfo], list[tarfile.TarInfo], list[str]]:
        """The prefetch entries (each after its parents and link target, build.go's moveRec), the others in the
        layer's order, and the prefetch paths not found."""
        picked: dict[str, tarfile.TarInfo] = {}
        missed: list[str] = []

        def move(name: str, visiting: frozenset[str]) -> None:
            if name in picked or name in visiting:
                return
            if name:
                move(clean_name(posixpath.dirname(name)), visiting | {name})
            info = self.members.get(name)
            if info is None:
                return
            if info.type == tarfile.LNKTYPE:
                move(clean_name(info.linkname), visiting | {name})
            picked.setdefault(name, info)

        for path in prefetch:
            name = clean_name(path)
            if name not in self.members:
                missed.append(path)
                continue
            move(name, frozenset())
        rest = [info for name, info in self.members.items() if name not in picked]
        return list(picked.values()), rest, missed


def _landmark(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = len(LANDMARK_CONTENT), 0, 0, tarfile.REGTYPE
    return info


def _header(info: tarfile.TarInfo) -> tuple[bytes, str]:
    """The PAX header written for an entry and its name as the TOC gives it (a directory's with its slash)."""
    out = copy.copy(info)
    out.pax_headers = {key: value for key, value in info.pax_headers.items() if key not in _REGENERATED_PAX}
    if info.type in (tarfile.AREGTYPE, tarfile.CONTTYPE):
        out.type = tarfile.REGTYPE
    if out.type != tarfile.REGTYPE:
        out.size = 0  # only a regular file carries a payload
    name = info.name.rstrip("/") + "/" if info.type == tarfile.DIRTYPE else info.name
    out.name = name
    return out.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"), name


class _Names:
    """Go's nameIfChanged: a user or group name is written when it differs from the last one given for its id."""

    def __init__(self) -> None:
        self._last: dict[int, str] = {}

    def __call__(self, ident: int, name: str) -> str:
        if not name or self._last.get(ident) == name:
            return ""
        self._last[ident] = name
        return name


def _convert(source: BinaryIO, sink: BinaryIO, path: Path | None, prefetch: Sequence[str], chunk_size: int,
             level: int) -> Converted:
    layer = _Layer(source)
    first, rest, missed = layer.ordered(prefetch)
    landmark = _landmark(PREFETCH_LANDMARK if first else NO_PREFETCH_LANDMARK)
    blob = _Members(sink, level)
    toc: list[dict] = []
    users, groups = _Names(), _Names()
    prefetched: list[str] = []
    for position, info in enumerate([*first, landmark, *rest]):
        header, name = _header(info)
        if position < len(first):
            prefetched.append(name)
        blob.write(header)
        device = info.ischr() or info.isblk()
        fields = {"name": name, "type": _TYPES[info.type], "modtime": _modtime(info.mtime), "mode": info.mode,
                  "uid": info.uid, "gid": info.gid, "userName": users(info.uid, info.uname),
                  "groupName": groups(info.gid, info.gname), "devMajor": info.devmajor if device else 0,
                  "devMinor": info.devminor if device else 0, "xattrs": _xattrs(info),
                  "linkName": info.linkname if info.issym() or info.islnk() else ""}
        if not info.isreg():
            toc.append(_ordered(fields))
            continue
        fields["size"] = info.size
        payload = io.BytesIO(LANDMARK_CONTENT) if info is landmark else source
        payload.seek(0 if info is landmark else info.offset_data)
        toc.extend(_chunks(blob, fields, payload.read, info.size, chunk_size))
        blob.write(b"\x00" * (-info.size % _BLOCK))
    toc_offset = blob.close_member()
    # ASCII JSON (\u escapes, which Go decodes alike): a name that is not UTF-8 (tarfile reads it surrogate-escaped)
    # still encodes. Nothing after the last brace: Go's reader hashes the bytes its JSON decoder reads, which may stop
    # there, so anything after it would make its TOC digest differ from ours.
    toc_json = json.dumps({"version": 1, "entries": toc}, indent="\t", ensure_ascii=True).encode()
    toc_info = tarfile.TarInfo(TOC_NAME)
    toc_info.size, toc_info.mode, toc_info.mtime = len(toc_json), 0, 0
    blob.write(toc_info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
    # The tar's end (two zero blocks, as Go's tar.Writer.Close writes) closes the TOC's member: the last tar bytes.
    blob.write(toc_json + b"\x00" * (-len(toc_json) % _BLOCK) + b"\x00" * 2 * _BLOCK)
    blob.raw(footer(toc_offset))
    return Converted(path=path, digest="sha256:" + blob.blob_hash.hexdigest(), size=blob.offset,
                     diff_id="sha256:" + blob.diff_hash.hexdigest(), uncompressed_size=blob.uncompressed,
                     toc_digest="sha256:" + hashlib.sha256(toc_json).hexdigest(), toc_offset=toc_offset,
                     prefetched=tuple(prefetched), missed=tuple(missed))


def _chunks(blob: _Members, fields: dict, read: Callable[[int], bytes], size: int, chunk_size: int) -> list[dict]:
    """A regular file's TOC entries: one per chunk, each chunk in a member of its own (none for an empty file)."""
    whole = hashlib.sha256()
    entries: list[dict] = []
    written = 0
    while written < size:
        length = min(chunk_size, size - written)
        chunk_hash = hashlib.sha256()
        entry = fields if written == 0 else {"name": fields["name"], "type": "chunk"}
        entry["offset"] = blob.close_member()
        entry["chunkOffset"] = written
        # Go sets chunkSize on every chunk but a short last one: 0 there means "to the end of the file".
        entry["chunkSize"] = chunk_size if size - written >= chunk_size else 0
        left = length
        while left:
            piece = read(min(_PIECE, left))
            if not piece:
                raise ValueError(f"{fields['name']!r}: the layer ends inside the file's {size} bytes")
            blob.write(piece)
            whole.update(piece)
            chunk_hash.update(piece)
            left -= len(piece)
        entry["chunkDigest"] = "sha256:" + chunk_hash.hexdigest()
        entries.append(entry)
        written += length
    fields["digest"] = "sha256:" + whole.hexdigest()
    return [_ordered(entry) for entry in entries] if entries else [_ordered(fields)]


def _xattrs(info: tarfile.TarInfo) -> dict[str, str]:
    """PAX xattr records as the TOC holds them: Go's map[string][]byte, each value base64."""
    return {key[len(_XATTR_PREFIX):]: base64.b64encode(value.encode("utf-8", "surrogateescape")).decode()
            for key, value in sorted(info.pax_headers.items()) if key.startswith(_XATTR_PREFIX)}


# --- reading: what a lazy puller fetches first (the footer and the TOC) and then (the members of the files it reads)


class TocEntry(NamedTuple):
    """One TOC entry, as Go's Reader.initFields completes it: a chunk named after its file, every data entry with its
    chunk's real size and the offset where its member ends. A named tuple: a CUDA layer's TOC makes tens of thousands,
    three times faster than a frozen dataclass's."""

    name: str  # clean (clean_name)
    type: str
    size: int
    offset: int  # the member holding the payload; 0 where there is none
    inner_offset: int
    chunk_offset: int
    chunk_size: int
    next_offset: int  # a data entry's: where its member ends (the next member with data, or the TOC)
    link_name: str
    mode: int
    uid: int
    gid: int
    modtime: str
    digest: str
    chunk_digest: str

    @property
    def has_data(self) -> bool:
        return self.type in ("reg", "chunk") and self.offset > 0


@dataclass(frozen=True)
class Toc:
    """A blob's TOC: its entries in blob order, the sha256 of its JSON (the toc.digest annotation), where it starts."""

    entries: tuple[TocEntry, ...]
    digest: str
    offset: int
    blob_size: int

    def __post_init__(self) -> None:
        by_name: dict[str, TocEntry] = {}
        chunks: dict[str, list[TocEntry]] = {}
        for entry in self.entries:
            if entry.type != "chunk":
                by_name[entry.name] = entry  # Go's map: a repeated name's last entry
                if entry.type == "reg":
                    chunks[entry.name] = []
            if entry.has_data:
                chunks.setdefault(entry.name, []).append(entry)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_chunks", chunks)

    def lookup(self, name: str) -> TocEntry | None:
        return self._by_name.get(clean_name(name))  # type: ignore[attr-defined]

    def resolve(self, path: str, hops: int = 40) -> str | None:
        """path with the symbolic links this layer holds followed, component by component (as the kernel would on
        the layer alone); None for a loop. A link into another layer is not followed: the caller asks that layer."""
        parts = [part for part in clean_name(path).split("/") if part]
        done = ""
        while parts:
            current = f"{done}/{parts[0]}" if done else parts[0]
            entry = self.lookup(current)
            if entry is not None and entry.type == "symlink":
                hops -= 1
                if hops < 0:
                    return None
                base = "/" if entry.link_name.startswith("/") else "/" + done
                parts = [part for part in clean_name(posixpath.join(base, entry.link_name)).split("/") if part] + \
                    parts[1:]
                done = ""
                continue
            done, parts = current, parts[1:]
        return done

    def data(self, path: str) -> list[TocEntry]:
        """The data entries (the reg entry and its chunks) holding path's content, links followed; [] for a path this
        layer holds no content for (absent, empty, not a regular file)."""
        chunks: dict[str, list[TocEntry]] = self._chunks  # type: ignore[attr-defined]
        name = self.resolve(path)
        for _ in range(40):
            entry = self.lookup(name) if name is not None else None
            if entry is None or entry.type != "hardlink":
                break
            name = clean_name(entry.link_name)
        return list(chunks.get(name, [])) if name is not None else []

    def prefetch_end(self) -> int:
        """Where the prefetch area ends: the offset of the prefetch landmark's member (stargz-snapshotter prefetches
        [0, it) in one range request); 0 when the blob has the no-prefetch landmark."""
        landmark = self.lookup(PREFETCH_LANDMARK)
        return landmark.offset if landmark is not None else 0

    def ranges(self, paths: Iterable[str]) -> list[tuple[int, int]]:
        """The (offset, length) byte ranges a lazy puller fetches to read paths: their members, and the TOC with the
        footer; sorted, touching ranges merged (one range request each). Paths this layer holds no content for add
        nothing."""
        spans = {(self.offset, self.blob_size)}
        for path in paths:
            spans.update((entry.offset, entry.next_offset) for entry in self.data(path))
        return [(start, end - start) for start, end in merge_spans(spans)]


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) spans sorted, those that touch or overlap joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def read_toc(fetch: Callable[[int, int], bytes], blob_size: int, toc_digest: str | None = None) -> Toc:
    """A blob's TOC, read as a lazy puller reads it: fetch(offset, length) gives bytes of the blob (a range request);
    the footer first, then the TOC's member. ValueError for a blob that is no eStargz, or whose TOC is not the one
    toc_digest (the layer descriptor's annotation, from a verified manifest) names."""
    if blob_size < FOOTER_SIZE:
        raise ValueError(f"a blob of {blob_size} bytes has no {FOOTER_SIZE}-byte footer")
    toc_offset = parse_footer(fetch(blob_size - FOOTER_SIZE, FOOTER_SIZE))
    if not 0 < toc_offset < blob_size - FOOTER_SIZE:
        raise ValueError(f"the footer puts the TOC at {toc_offset}, outside the blob's {blob_size} bytes")
    toc_json = toc_from_member(fetch(toc_offset, blob_size - FOOTER_SIZE - toc_offset))
    if toc_digest is not None and "sha256:" + hashlib.sha256(toc_json).hexdigest() != toc_digest:
        raise ValueError(f"the blob's TOC is not the one its descriptor names ({toc_digest})")
    return parse_toc(toc_json, toc_offset, blob_size)


def read_toc_file(path: Path) -> Toc:
    with path.open("rb") as blob:
        def fetch(offset: int, length: int) -> bytes:
            blob.seek(offset)
            return blob.read(length)

        return read_toc(fetch, path.stat().st_size)


def toc_from_member(member: bytes) -> bytes:
    """The TOC JSON in its gzip member: a tar header named stargz.index.json and its payload (gzip.go's
    decompressTOCEStargz)."""
    try:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        tar = inflate.decompress(member, MAX_TOC_BYTES + 2 * _BLOCK)
        info = tarfile.TarInfo.frombuf(tar[:_BLOCK], "utf-8", "surrogateescape")
    except (zlib.error, tarfile.HeaderError) as error:
        raise ValueError(f"the TOC's member is no gzip of a tar header: {error}") from None
    if info.name != TOC_NAME:
        raise ValueError(f"the TOC's tar entry is named {info.name!r}, not {TOC_NAME}")
    if info.size > MAX_TOC_BYTES or len(tar) < _BLOCK + info.size:
        raise ValueError(f"the TOC claims {info.size} bytes; its member holds {max(len(tar) - _BLOCK, 0)}")
    return tar[_BLOCK:_BLOCK + info.size]


def parse_toc(toc_json: bytes, toc_offset: int, blob_size: int) -> Toc:
    """The TOC JSON's entries completed as Go's Reader.initFields does (see TocEntry). One pass, newest entry first:
    a CUDA layer's TOC holds tens of thousands of entries, and a lazy puller parses every layer's before a start."""
    try:
        document = json.loads(toc_json)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"the TOC is not JSON: {error}") from None
    raw = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(raw, list) or document.get("version") != 1 or not all(isinstance(e, dict) for e in raw):
        raise ValueError("the TOC is no version 1 object with a list of entries")
    # Numbers first, in blob order: a chunk takes its file's name and, where its own is 0, the rest of its size.
    numbers: list[tuple] = []
    names: list[str] = []
    last_name, last_size = "", 0
    for entry in raw:
        get = entry.get
        values = (get("size") or 0, get("offset") or 0, get("innerOffset") or 0, get("chunkOffset") or 0,
                  get("chunkSize") or 0, get("mode") or 0, get("uid") or 0, get("gid") or 0)
        if not set(map(type, values)) <= _NUMBER_TYPES:
            key = next(key for key, value in zip(_NUMBER_FIELDS, values, strict=True) if not isinstance(value, int))
            raise ValueError(f"TOC entry {entry.get('name')!r}: {key} is not a number")
        if get("type") == "chunk":
            names.append(last_name)
            if not values[4]:
                values = (*values[:4], last_size - values[3], *values[5:])
        else:
            last_name, last_size = clean_name(str(get("name") or "")), values[0]
            names.append(last_name)
            if not values[4]:
                values = (*values[:4], values[0], *values[5:])
        numbers.append(values)
    # Each data entry's member ends where the next member starts: the next entry with its own member, or the TOC.
    entries: list[TocEntry] = [None] * len(raw)  # type: ignore[list-item]
    following = toc_offset
    for index in range(len(raw) - 1, -1, -1):
        entry, (size, offset, inner, chunk_offset, chunk_size, mode, uid, gid) = raw[index], numbers[index]
        kind = str(entry.get("type"))
        data = kind in ("reg", "chunk")
        made = TocEntry(
            name=names[index], type=kind, size=size, offset=offset, inner_offset=inner, chunk_offset=chunk_offset,
            chunk_size=chunk_size, next_offset=following if data else 0, link_name=str(entry.get("linkName") or ""),
            mode=mode, uid=uid, gid=gid, modtime=str(entry.get("modtime") or ""), digest=str(entry.get("digest") or ""),
            chunk_digest=str(entry.get("chunkDigest") or ""))
        if data and offset > 0 and not 0 < offset < following <= toc_offset:
            raise ValueError(f"TOC entry {made.name!r}: offset {offset} outside the blob's data")
        if offset and not inner:
            following = offset
        entries[index] = made
    return Toc(entries=tuple(entries), digest="sha256:" + hashlib.sha256(toc_json).hexdigest(), offset=toc_offset,
               blob_size=blob_size)


def chunk_content(member: bytes, entry: TocEntry) -> bytes:
    """A data entry's bytes out of its member (the blob's bytes from entry.offset on), checked against its
    chunkDigest where the TOC gives one."""
    wanted = entry.inner_offset + entry.chunk_size
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(member, wanted)
        while len(out) < wanted and inflate.unconsumed_tail:
            out += inflate.decompress(inflate.unconsumed_tail, wanted - len(out))
    except zlib.error as error:
        raise ValueError(f"{entry.name!r} at {entry.offset}: no gzip member there: {error}") from None
    content = out[entry.inner_offset:wanted]
    if len(content) != entry.chunk_size:
        raise ValueError(f"{entry.name!r} at {entry.offset}: {len(content)} bytes, not {entry.chunk_size}")
    if entry.chunk_digest and "sha256:" + hashlib.sha256(content).hexdigest() != entry.chunk_digest:
        raise ValueError(f"{entry.name!r} at {entry.offset}: the content does not match its chunkDigest")
    return content
