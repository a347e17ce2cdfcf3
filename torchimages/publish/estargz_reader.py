"""The reading side of eStargz (publish/estargz.py writes it): what a lazy puller fetches first, each layer's footer
and TOC, and then the members of the files it reads, each checked against the TOC's digests."""
from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .estargz import FOOTER_SIZE, MAX_TOC_BYTES, PREFETCH_LANDMARK, TOC_NAME, clean_name, parse_footer

_BLOCK = 512  # a tar block
_NUMBER_FIELDS = ("size", "offset", "innerOffset", "chunkOffset", "chunkSize", "mode", "uid", "gid")
_NUMBER_TYPES = frozenset({int, bool})


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
