"""eStargz: one image layer (an uncompressed tar) rewritten as a lazily pullable gzip blob (publish/estargz_reader.py
reads it as a lazy puller does: the footer, the TOC, the members of the files it reads).

The format is containerd/stargz-snapshotter's docs/estargz.md at commit 7cf47cba499264f61bc4adac00e05edd599ca48f;
where it leaves a choice open, blobs are laid out as that commit's Go writer does (estargz/estargz.go's
Writer.appendTar, estargz/build.go's sortEntries and moveRec, estargz/gzip.go's WriteTOCAndFooter): the members, entries
and TOC fields of `ctr-remote images convert --estargz`, not its bytes (other deflate and tar header encoders):
- every non-empty regular file's payload starts a gzip member, one per chunk of chunk_size (4 MiB) and one at each of
  its cuts where given (Go's reader takes chunks of any size); an entry's tar header ends the member before it (the
  first opens the blob), a payload's tar padding ends its own;
- the prefetch files first, in the order given, each after the directories above it that the layer holds and after a
  hard link's target; then `.prefetch.landmark` (one byte, 0x0f, in a member of its own), or `.no.prefetch.landmark`
  first when no prefetch file is in this layer; then the other entries in the layer's order;
- `stargz.index.json` (the TOC: tab-indented JSON, as Go's json.MarshalIndent writes it) as the last tar entry, with
  the tar's end, in a member of its own; then the 51-byte footer, an empty gzip member whose extra field holds
  subfield "SG": "%016xSTARGZ" % the TOC's offset.
The members make one ordinary gzip stream of one ordinary tar (its sha256 the diff id), which a plain engine unpacks
as any tar+gzip layer: the layer's entries (headers rewritten in PAX form) plus the landmark and the TOC.

Unlike Go, on purpose: a prefetch path whose parent directory has no entry in the layer is still moved (Go reports it
missing), and a layer holding none of the prefetch paths gets the no-prefetch landmark (the spec's MUST). As in Go, a
repeated name keeps its last entry, and a landmark or TOC already in the input is dropped.

Deterministic: every member's gzip header has mtime 0, no name and OS byte 255 (as Go writes it), at one deflate level
(6 by default; ctr-remote's is 9): the same layer, prefetch list and cuts give the same bytes with the same zlib.
Memory stays bounded by one chunk: the layer is read by offset (a stream is spooled to a temporary file first), the
blob written as it is made; only the TOC (a few hundred bytes per entry) is held.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

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
            chunk_size: int = CHUNK_SIZE, level: int = LEVEL, spool_dir: Path | None = None,
            cuts: Mapping[str, Iterable[int]] | None = None) -> Converted:
    """Write layer (an uncompressed tar: a path, or a binary stream read once) to out (a path, replaced in one step,
    or a binary stream) as an eStargz blob whose prefetch area holds the prefetch paths (absolute or relative to /).
    cuts: for a path, the offsets in the file where a chunk starts besides every chunk_size (chunk_spans)."""
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
        cut_at = {clean_name(name): sorted(set(offsets)) for name, offsets in (cuts or {}).items()}
        return _convert(source, sink, out if isinstance(out, Path) else None, prefetch, chunk_size, level, cut_at)


def convert_bytes(layer: bytes, prefetch: Sequence[str] = (), *, chunk_size: int = CHUNK_SIZE, level: int = LEVEL,
                  cuts: Mapping[str, Iterable[int]] | None = None) -> tuple[bytes, Converted]:
    """convert() for a layer small enough to hold in memory (tests, a config-sized layer): the blob and its facts."""
    out = io.BytesIO()
    converted = convert(io.BytesIO(layer), out, prefetch, chunk_size=chunk_size, level=level, cuts=cuts)
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
             level: int, cuts: dict[str, list[int]]) -> Converted:
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
        spans = chunk_spans(info.size, chunk_size, cuts.get(clean_name(name), ()))
        toc.extend(_chunks(blob, fields, payload.read, info.size, spans, chunk_size))
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


def chunk_spans(size: int, chunk_size: int, cuts: Iterable[int] = ()) -> list[tuple[int, int]]:
    """A file's chunks, (offset, length): one starts at each cut inside the file and chunk_size bytes after the last."""
    spans: list[tuple[int, int]] = []
    start = 0
    for end in [*sorted({at for at in cuts if 0 < at < size}), size]:
        while start < end:
            spans.append((start, min(chunk_size, end - start)))
            start += spans[-1][1]
    return spans


def _chunks(blob: _Members, fields: dict, read: Callable[[int], bytes], size: int, spans: list[tuple[int, int]],
            chunk_size: int) -> list[dict]:
    """A regular file's TOC entries: one per chunk, each chunk in a member of its own (none for an empty file)."""
    whole = hashlib.sha256()
    entries: list[dict] = []
    for written, length in spans:
        chunk_hash = hashlib.sha256()
        entry = fields if written == 0 else {"name": fields["name"], "type": "chunk"}
        entry["offset"] = blob.close_member()
        entry["chunkOffset"] = written
        # Go sets chunkSize on every chunk but a short last one: 0 there means "to the end of the file".
        entry["chunkSize"] = 0 if written + length == size and length < chunk_size else length
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
    fields["digest"] = "sha256:" + whole.hexdigest()
    return [_ordered(entry) for entry in entries] if entries else [_ordered(fields)]


def _xattrs(info: tarfile.TarInfo) -> dict[str, str]:
    """PAX xattr records as the TOC holds them: Go's map[string][]byte, each value base64."""
    return {key[len(_XATTR_PREFIX):]: base64.b64encode(value.encode("utf-8", "surrogateescape")).decode()
            for key, value in sorted(info.pax_headers.items()) if key.startswith(_XATTR_PREFIX)}
