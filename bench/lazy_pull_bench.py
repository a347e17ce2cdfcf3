#!/usr/bin/env python3
"""Lazy pulling, emulated on loopback (issue 58, item 4): a full pull of an image's layers against fetching each eStargz
layer's TOC and prefetch area and then, on demand, the files a start reads beyond it; one JSON line at the end.

A blob server on 127.0.0.1 (BlobServer), in a process of its own, serves the blobs as a registry would: whole or by
HTTP range (one range a request), each request answered after a fixed latency (5 ms) and every byte through one shared link of a fixed rate
(125 MB/s), so the clients wait on the network as a node pulling from a registry would, on any machine.
- full (full_pull): each layer's blob fetched whole, gunzipped and untarred into a folder as it arrives (whiteouts
  applied), the layers one after another as an engine applies them, the blob's digest and the tar's diff id checked
  as dockerd checks them (before 2026-11-29, evening, neither was: the full side did less than an engine does);
- lazy (lazy_pull, then on_demand): each layer's footer and TOC, then its prefetch area [0, landmark) in one range
  request, whose files are materialised from their members as the bytes arrive, every layer side by side (as
  stargz-snapshotter's Mount resolves and prefetches every layer of the manifest at once: containerd/stargz-snapshotter
  fs/fs.go, 7cf47cba, "Also resolve and cache other layers in parallel"; the start waits for each layer's prefetch,
  its Check); what an upper layer hides is not written (MergedView); then, for the files a start reads
  that no prefetch area held, their members, one range request per contiguous span (a file's chunks are contiguous):
  of a file the start reads only in part (a startup-set record's ranges), only the chunks holding a byte it reads, as
  a snapshotter fetches a chunk when a read reaches it. The other entries' metadata, which a snapshotter serves from
  the TOC in memory, are not written out.
R_emulated = lazy seconds / full seconds; B = the bytes the lazy client fetched / the bytes of the blobs it reads.

    python bench/lazy_pull_bench.py --selftest                  # a synthetic 200 MB layer made in a temporary folder
    python bench/lazy_pull_bench.py IMAGE.tar STARTUP.json      # IMAGE.tar from `docker save`

STARTUP.json: a list of the paths a start reads (all prefetched), {"prefetch": [...], "on_demand": [...]}, or the
record `torchimages startup-set TAG` writes (REPORTS/<tag>/startup-set.json), laid out as `publish --lazy` lays it
out: the files read in every chunk prefetched, the others read by chunk on demand, cut where the runs a start reads
begin and end (`--no-cuts`: chunks of the chunk size alone; `--whole-files`: all prefetched whole, as before;
`--chunk-kib`: the chunk size). The full
client pulls the layers as plain gzip (what a user pulls today), the lazy one their eStargz form; both are made here
(torchimages/publish/estargz.py), at gzip level 6. No start proxy runs in a container yet: the emulated start reads
back the files it needs, in both trees. Both clients unpack in Python (zlib, tarfile), at the same cost per byte and
per file: an engine's unpack is faster on the full side, a FUSE snapshotter's page-by-page reads slower on the lazy
one. Needs no engine.
"""
from __future__ import annotations

import argparse
import collections
import functools
import gzip
import hashlib
import http.client
import json
import multiprocessing
import os
import posixpath
import queue
import random
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.publish import estargz, estargz_reader, lazy  # noqa: E402

RATE = 125_000_000  # bytes a second: a 1 Gbit/s link
LATENCY_S = 0.005  # before the first byte of every request
PIECE = 256 << 10
RANGE = re.compile(r"bytes=(\d*)-(\d*)", re.ASCII)
WHITEOUT, OPAQUE = ".wh.", ".wh..wh..opq"


# --- the blob server


class _Link:
    """One link of a fixed rate that every response shares: a piece leaves when the link is free for its length."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0

    def send(self, size: int) -> None:
        with self._lock:
            start = max(time.perf_counter(), self._free_at)
            self._free_at = start + size / self.rate
            done = self._free_at
        time.sleep(max(0.0, done - time.perf_counter()))


class BlobServer(ThreadingHTTPServer):
    """GET and HEAD /blobs/NAME on 127.0.0.1 (an ephemeral port), honouring one `Range: bytes=` range a request; what
    it serves is counted in counters (requests, bytes), shared with the process that started it (serving())."""

    daemon_threads = True

    def __init__(self, blobs: dict[str, Path], rate: float, latency_s: float, counters: tuple) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.blobs = blobs
        self.link = _Link(rate)
        self.latency_s = latency_s
        self._counters = counters

    @property
    def port(self) -> int:
        return self.server_address[1]

    def counted(self, sent: int) -> None:
        requests, sent_bytes = self._counters
        with requests.get_lock():
            requests.value += 1
            sent_bytes.value += sent


@dataclass
class Serving:
    """A blob server running in a process of its own: its port and what it has served."""

    port: int
    counters: tuple

    @property
    def requests(self) -> int:
        return self.counters[0].value

    @property
    def bytes_sent(self) -> int:
        return self.counters[1].value


def _serve(blobs: dict[str, Path], rate: float, latency_s: float, counters: tuple, ports: multiprocessing.Queue) -> None:
    server = BlobServer(blobs, rate, latency_s, counters)
    ports.put(server.port)
    server.serve_forever(poll_interval=0.05)


@contextmanager
def serving(blobs: dict[str, Path], rate: float = RATE, latency_s: float = LATENCY_S) -> Iterator[Serving]:
    """A blob server in a process of its own, as a registry is another machine: its threads (pacing the link, reading
    the blobs, writing the sockets) share the cores with the clients but not their interpreter's lock, which would
    otherwise serialise its work with theirs (until 2026-11-29, night, it ran in the clients' process: the lazy side's
    prefetch took 0.5 s longer)."""
    context = multiprocessing.get_context("fork")
    counters = (context.Value("q", 0), context.Value("q", 0))
    ports = context.Queue()
    process = context.Process(target=_serve, args=(blobs, rate, latency_s, counters, ports), daemon=True)
    process.start()
    try:
        yield Serving(ports.get(timeout=30), counters)
    finally:
        process.terminate()
        process.join()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection, as one to a registry does
    # Headers and body leave in separate writes: with Nagle's algorithm on, each small answer would wait out the
    # client's delayed ACK (40 ms), more than the latency being emulated.
    disable_nagle_algorithm = True
    server: BlobServer

    def log_message(self, format: str, *args: object) -> None:  # the bench prints one JSON line, nothing else
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        blob = self.server.blobs.get(self.path.removeprefix("/blobs/"))
        if blob is None:
            self.send_error(404)
            return
        size = blob.stat().st_size
        start, end, status = 0, size, 200
        if header := self.headers.get("Range"):
            found = RANGE.fullmatch(header.strip())
            if not found or not (found.group(1) or found.group(2)):
                self.send_error(416)
                return
            if not found.group(1):  # bytes=-N: the last N bytes
                start = max(0, size - int(found.group(2)))
            else:
                start = int(found.group(1))
                end = min(size, int(found.group(2)) + 1) if found.group(2) else size
            if start >= end:
                self.send_error(416)
                return
            status = 206
        time.sleep(self.server.latency_s)
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        # Counted before the body leaves: a client that has read it all finds it counted.
        self.server.counted(end - start if body else 0)
        if not body:
            return
        with blob.open("rb") as source:
            source.seek(start)
            left = end - start
            while left:
                piece = source.read(min(PIECE, left))
                self.server.link.send(len(piece))
                self.wfile.write(piece)
                left -= len(piece)


# --- the clients


@dataclass
class BlobClient:
    """One keep-alive connection to a BlobServer, counting what it fetched."""

    port: int
    requests: int = 0
    fetched: int = 0
    _connection: http.client.HTTPConnection | None = field(default=None, repr=False)

    def open(self, name: str, start: int | None = None, length: int | None = None) -> http.client.HTTPResponse:
        """The response to GET NAME (a range of it when start is given); read it to its end before the next call."""
        if self._connection is None:
            self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {} if start is None else {"Range": f"bytes={start}-{'' if length is None else start + length - 1}"}
        self._connection.request("GET", f"/blobs/{name}", headers=headers)
        response = self._connection.getresponse()
        if response.status not in (200, 206):
            raise RuntimeError(f"GET {name} {headers}: HTTP {response.status}")
        self.requests += 1
        self.fetched += int(response.getheader("Content-Length") or 0)
        return response

    def get(self, name: str, start: int, length: int) -> bytes:
        return self.open(name, start, length).read()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


class Pipelined:
    """A response read ahead by a thread of its own (at most AHEAD bytes), as a puller's network reads run beside its
    unpacking: the link is not left idle while the reader decompresses and writes. Both clients read through one."""

    AHEAD = 64 << 20

    def __init__(self, response: BinaryIO, digest=None) -> None:
        """digest: a hashlib object the reading thread feeds every byte received (a puller's blob verifier)."""
        self._digest = digest
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=max(1, self.AHEAD // PIECE))
        self._piece, self._at, self._done = b"", 0, False
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._fill, args=(response,), daemon=True)
        self._thread.start()

    def _fill(self, response: BinaryIO) -> None:
        try:
            while piece := response.read(PIECE):
                if self._digest is not None:
                    self._digest.update(piece)
                self._queue.put(piece)
        except (OSError, http.client.HTTPException) as error:  # handed to the reader, which raises it
            self._error = error
        finally:
            self._queue.put(b"")

    def read(self, size: int = -1) -> bytes:
        parts, want = [], size
        while want != 0:
            if self._at >= len(self._piece):
                if self._done:
                    break
                self._piece, self._at = self._queue.get(), 0
                if not self._piece:
                    self._done = True
                    self._thread.join()
                    if self._error is not None:
                        raise self._error
                    break
            take = len(self._piece) - self._at if want < 0 else min(want, len(self._piece) - self._at)
            parts.append(self._piece[self._at:self._at + take])
            self._at += take
            want = want - take if want > 0 else want
        return b"".join(parts)

    def finish(self) -> None:
        """Read to the end (the connection is then free for the next request)."""
        while self.read(PIECE):
            pass


class Writers:
    """Chunks checked and written by a pool of threads (zlib and sha256 let go of the interpreter's lock), as a
    snapshotter decompresses the independent gzip members of an eStargz layer side by side; a plain gzip stream, one
    member, can only be inflated in order. The file of a chunk is made in the caller's thread, before any of its
    chunks is handed over (a file's chunks come in order). At most 4 chunks per worker wait."""

    def __init__(self, dest: Path, made: bool = False) -> None:
        self.dest, self.made = dest, made  # made: every file is there already (on_demand made them)
        self.workers = os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.workers)
        self._waiting: collections.deque = collections.deque()
        self.skipped = 0

    def write(self, entry: estargz_reader.TocEntry, member: bytes) -> None:
        whole = not self.made and entry.type == "reg" and entry.chunk_size == entry.size  # a file in one member
        try:
            if whole:
                target = _target(self.dest, entry.name)
            elif not self.made:
                _made(entry, self.dest)
        except OutsideTree:
            self.skipped += 1
            return
        self._waiting.append(self._pool.submit(_placed, _write_file, entry, member, target) if whole else
                             self._pool.submit(_placed, _write_chunk, entry, member, self.dest))
        while len(self._waiting) > 4 * self.workers:
            self.skipped += self._waiting.popleft().result()

    def close(self) -> int:
        while self._waiting:
            self.skipped += self._waiting.popleft().result()
        self._pool.shutdown()
        return self.skipped


class OutsideTree(Exception):
    """A path among whose folders a link leads out of the tree: nothing there is written or removed."""


_INSIDE: set[Path] = set()  # folders found inside their tree (forgotten whenever a link is made)


def _target(dest: Path, name: str) -> Path:
    """name's path in the tree at dest; OutsideTree where a link among its folders leads out of the tree (an image's
    absolute link, which a process on this machine would follow into the machine's own files)."""
    target = dest / estargz.clean_name(name)
    if target != dest and target.parent not in _INSIDE:
        if not target.parent.resolve().is_relative_to(dest.resolve()):
            raise OutsideTree(name)
        _INSIDE.add(target.parent)
    return target


def _clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _whiteout(dest: Path, name: str) -> bool:
    """Apply an OCI whiteout entry (a deleted file, or an opaque directory); False for any other entry."""
    base = posixpath.basename(estargz.clean_name(name))
    if base == OPAQUE:
        folder = _target(dest, posixpath.dirname(estargz.clean_name(name)))
        for child in folder.iterdir() if folder.is_dir() and not folder.is_symlink() else ():
            _clear(child)
        return True
    if base.startswith(WHITEOUT):
        _clear(_target(dest, posixpath.join(posixpath.dirname(estargz.clean_name(name)), base[len(WHITEOUT):])))
        return True
    return False


def apply_layer(archive: tarfile.TarFile, dest: Path) -> int:
    """Untar a layer (read as a stream) over dest as an engine applies it; the entries it could not place (a path
    through an absolute link out of dest: a real root filesystem would hold it)."""
    skipped = 0
    for member in archive:
        try:
            if _whiteout(dest, member.name):
                continue
            target = _target(dest, member.name)
            if not member.isdir() and (target.is_symlink() or target.exists()):
                _clear(target)  # a lower layer's entry replaced (a folder by a link too), never written through
            archive.extract(member, dest, filter="tar")
            if member.issym():
                _INSIDE.clear()
        except (OutsideTree, tarfile.FilterError, OSError):
            skipped += 1
    return skipped


class Digesting:
    """A reader that feeds what it reads to a digest (the diff id of the tar read through it)."""

    def __init__(self, source: BinaryIO) -> None:
        self.source, self.digest = source, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        return data


def full_pull(client: BlobClient, layers: Sequence[str], dest: Path,
              digests: Mapping[str, tuple[str, str]] | None = None) -> tuple[float, int]:
    """Each layer's blob fetched whole and unpacked into dest as it arrives: (seconds, entries skipped). With digests
    (each blob's digest and diff id), both are checked as an engine checks them: dockerd verifies a blob's digest as
    it downloads it (moby distribution/pull_v2.go, `ld.digest.Verifier()`) and computes the diff id of the tar it
    applies (layer/layer_store.go); a mismatch is an error."""
    started = time.perf_counter()
    skipped = 0
    for name in layers:
        blob_digest = hashlib.sha256() if digests else None
        response = Pipelined(client.open(name), blob_digest)
        with gzip.GzipFile(fileobj=response, mode="rb") as unzipped:  # type: ignore[arg-type]
            tar = Digesting(unzipped)  # type: ignore[arg-type]
            with tarfile.open(fileobj=tar, mode="r|") as archive:  # type: ignore[call-overload]
                skipped += apply_layer(archive, dest)
            while tar.read(PIECE):  # the tar's end blocks and padding: the diff id covers them
                pass
        response.finish()  # whatever follows the tar's end: the connection is reused
        if digests and blob_digest is not None:
            got = ("sha256:" + blob_digest.hexdigest(), "sha256:" + tar.digest.hexdigest())
            if got != tuple(digests[name]):
                raise RuntimeError(f"{name}: digest and diff id {got}, not {tuple(digests[name])}")
    return time.perf_counter() - started, skipped


@dataclass
class LazyLayer:
    name: str
    size: int
    toc: estargz_reader.Toc


def _place(entry: estargz_reader.TocEntry, dest: Path) -> None:
    """An entry without content: a directory, a link, an empty file (or whiteout) at its path."""
    target = _target(dest, entry.name)
    if _whiteout(dest, entry.name):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if entry.type == "dir":
        target.mkdir(exist_ok=True)
        return
    _clear(target)
    if entry.type == "symlink":
        target.symlink_to(entry.link_name)
        _INSIDE.clear()
    elif entry.type == "hardlink" and _target(dest, entry.link_name).is_file():
        os.link(_target(dest, entry.link_name), target)
    elif entry.type in ("reg", "hardlink"):
        target.touch()


def _made(entry: estargz_reader.TocEntry, dest: Path) -> None:
    """The file a chunk goes into, made empty at its first chunk (or where a later chunk is the first a start
    reads)."""
    target = _target(dest, entry.name)
    if entry.chunk_offset == 0 or not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        _clear(target)
        target.touch()


def _write_file(entry: estargz_reader.TocEntry, member: bytes, target: Path) -> None:
    """A file whose one member holds it whole, written in one open (most of a prefetch area's files are small): what
    stood at its name before (a link, a folder) is replaced, never written through."""
    content = estargz_reader.chunk_content(member, entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    try:
        descriptor = os.open(target, flags, 0o600)
    except OSError:
        _clear(target)
        descriptor = os.open(target, flags, 0o600)
    with open(descriptor, "wb") as out:
        out.write(content)
        os.fchmod(descriptor, entry.mode & 0o777)


def _write_chunk(entry: estargz_reader.TocEntry, member: bytes, dest: Path) -> None:
    target = _target(dest, entry.name)
    if not target.is_file():
        _made(entry, dest)
    with target.open("r+b") as out:
        out.seek(entry.chunk_offset)
        out.write(estargz_reader.chunk_content(member, entry))
    if entry.type == "reg":
        target.chmod(entry.mode & 0o777)


class Connections:
    """A keep-alive connection per thread (a BlobClient serves one request at a time), their requests and bytes
    counted on client when closed."""

    def __init__(self, client: BlobClient) -> None:
        self.client, self._local, self._all = client, threading.local(), []
        self._lock = threading.Lock()

    def get(self) -> BlobClient:
        if not hasattr(self._local, "client"):
            self._local.client = BlobClient(self.client.port)
            with self._lock:
                self._all.append(self._local.client)
        return self._local.client

    def close(self) -> None:
        for connection in self._all:
            self.client.requests += connection.requests
            self.client.fetched += connection.fetched
            connection.close()


class MergedView:
    """Which entries of a layer the layers above it hide, as overlayfs merges them: the same name above (but a folder
    over a folder, which merge), a whiteout of it or of a folder above it, an opaque folder above it, or a folder of
    its path that is no folder above. Layers materialised side by side into one tree leave out what is hidden, so the
    tree is what the layers applied in order give, whichever layer's thread writes first."""

    def __init__(self, tocs: Sequence[estargz_reader.Toc]) -> None:
        self.tocs = list(tocs)
        self._folders: dict[tuple[int, str], bool] = {}

    def hidden(self, index: int, entry: estargz_reader.TocEntry) -> bool:
        name = estargz.clean_name(entry.name)
        folder, base = posixpath.split(name)
        for upper in self.tocs[index + 1:]:
            above = upper.lookup(name)
            if above is not None and not (above.type == "dir" and entry.type == "dir"):
                return True
            if upper.lookup(posixpath.join(folder, WHITEOUT + base)) is not None:
                return True
        return self._folder_hidden(index, folder)

    def _folder_hidden(self, index: int, folder: str) -> bool:
        if folder in ("", "/", "."):
            return False
        if (index, folder) not in self._folders:
            parent, base = posixpath.split(folder)
            hidden = any((above := upper.lookup(folder)) is not None and above.type != "dir"
                         or upper.lookup(posixpath.join(parent, WHITEOUT + base)) is not None
                         or upper.lookup(posixpath.join(folder, OPAQUE)) is not None
                         for upper in self.tocs[index + 1:])
            self._folders[(index, folder)] = hidden or self._folder_hidden(index, parent)
        return self._folders[(index, folder)]


def lazy_pull(client: BlobClient, layers: Sequence[tuple[str, int, str]],
              dest: Path) -> tuple[float, list[LazyLayer], int]:
    """Each eStargz layer (name, size, TOC digest: what its descriptor says) by its footer and TOC, checked, then its
    prefetch area in one request, materialised as it arrives, every layer side by side on a connection of its own:
    (seconds, the layers with their TOCs, the entries it could not place). Each chunk is checked against its TOC
    digest (estargz_reader.chunk_content), as a snapshotter does. Whiteouts are not applied: what they hide is not written."""
    started = time.perf_counter()
    connections = Connections(client)

    def resolve(layer: tuple[str, int, str]) -> LazyLayer:
        name, size, toc_digest = layer
        return LazyLayer(name, size, estargz_reader.read_toc(functools.partial(connections.get().get, name), size, toc_digest))

    def prefetch(index: int) -> int:
        layer, skipped = mounted[index], 0
        end = layer.toc.prefetch_end()
        if not end:
            return 0
        landmark = next(at for at, entry in enumerate(layer.toc.entries) if entry.name == estargz.PREFETCH_LANDMARK)
        response = Pipelined(connections.get().open(layer.name, 0, end))
        position, writers = 0, Writers(dest)
        for entry in layer.toc.entries[:landmark]:
            if view.hidden(index, entry) or posixpath.basename(entry.name).startswith(WHITEOUT):
                continue  # read past (the area is one request), never written
            if not entry.has_data:
                skipped += _placed(_place, entry, dest)
                continue
            _skip(response, entry.offset - position)
            writers.write(entry, _read(response, entry.next_offset - entry.offset))
            position = entry.next_offset
        skipped += writers.close()
        response.finish()
        return skipped

    try:
        with ThreadPoolExecutor(max(1, len(layers))) as pool:
            mounted = list(pool.map(resolve, layers))
            view = MergedView([layer.toc for layer in mounted])
            skipped = sum(pool.map(prefetch, range(len(mounted))))
    finally:
        connections.close()
    return time.perf_counter() - started, mounted, skipped


def _placed(function: Callable[..., None], *arguments: object) -> int:
    """0 once function has placed an entry; 1 where it could not (OutsideTree), as the full pull skips it."""
    try:
        function(*arguments)
    except OutsideTree:
        return 1
    return 0


def _resolve(mounted: Sequence[LazyLayer], path: str) -> tuple[LazyLayer, estargz_reader.TocEntry, list] | None:
    """path in the merged view of the layers (the top-most entry of each name), its symbolic links followed component
    by component across layers: the layer and entry it ends at and the links on the way; None where nothing is."""
    parts = [part for part in estargz.clean_name(path).split("/") if part]
    done, found, links, hops = "", None, [], 40
    while parts:
        current = f"{done}/{parts[0]}" if done else parts[0]
        found = next(((layer, entry) for layer in reversed(mounted) if (entry := layer.toc.lookup(current))), None)
        if found is None:
            return None
        if found[1].type == "symlink" and hops:
            hops -= 1
            links.append(found[1])
            base = "/" if found[1].link_name.startswith("/") else "/" + done
            parts = [part for part in estargz.clean_name(posixpath.join(base, found[1].link_name)).split("/")
                     if part] + parts[1:]
            done = ""
            continue
        done, parts = current, parts[1:]
    return (*found, links) if found else None


# On-demand range requests in flight at once, each on a connection of its own: a client that knows the chunks a start
# reads (its record) fetches them side by side. A start that faults them in itself has about one or two in flight (a
# thread's page fault, the kernel's readahead beside it), so R is measured at 1 and 2 too (--fetchers;
# docs/benchmarks-log.md, 2026-11-29, night: the CUDA row's lazy side 8.1 s at 1, 5.6 s at 2, 4.6 s at 4).
FETCHERS = 4


def on_demand(client: BlobClient, mounted: Sequence[LazyLayer], files: Sequence[str], dest: Path,
              ranges: Mapping[str, Sequence[Sequence[int]]] | None = None,
              fetchers: int = FETCHERS) -> tuple[float, int]:
    """The members of files (each from the top-most layer holding it, the links on the way placed too), one range
    request per contiguous span, fetchers of them in flight (the link stays busy while a span's chunks are inflated):
    (seconds, entries it could not place). A file with ranges (what a start reads of it) gets only the chunks holding
    a byte of them, as a snapshotter fetches a chunk when a read reaches it. The TOCs are already here: their ranges
    are not fetched again. The requests and bytes of every connection are counted on client."""
    started, skipped = time.perf_counter(), 0
    spans: list[tuple[str, int, int, list[estargz_reader.TocEntry]]] = []
    for path in files:
        found = _resolve(mounted, path)
        if found is None:
            continue
        layer, entry, links = found
        for link in links:
            skipped += _placed(_place, link, dest)
        entries = layer.toc.data(entry.name)
        if ranges is not None and path in ranges:
            entries = [chunk for chunk in entries if any(start < chunk.chunk_offset + chunk.chunk_size and
                                                         end > chunk.chunk_offset for start, end in ranges[path])]
        if not entries:
            skipped += _placed(_place, entry, dest)
            continue
        if _placed(_fresh, entries[0].name, dest):  # made here, once: spans of one file are written side by side
            skipped += 1
            continue
        spans += [(layer.name, start, end, [chunk for chunk in entries if start <= chunk.offset < end])
                  for start, end in estargz_reader.merge_spans((chunk.offset, chunk.next_offset) for chunk in entries)]
    connections = Connections(client)

    def fetch(span: tuple[str, int, int, list[estargz_reader.TocEntry]]) -> int:
        name, start, end, chunks = span
        response, position = Pipelined(connections.get().open(name, start, end - start)), start
        writers = Writers(dest, True)
        for chunk in chunks:  # in blob order: each member written as its bytes arrive
            _skip(response, chunk.offset - position)
            writers.write(chunk, _read(response, chunk.next_offset - chunk.offset))
            position = chunk.next_offset
        response.finish()
        return writers.close()

    try:
        with ThreadPoolExecutor(fetchers) as pool:
            skipped += sum(pool.map(fetch, spans))
    finally:
        connections.close()
    return time.perf_counter() - started, skipped


def _fresh(name: str, dest: Path) -> None:
    target = _target(dest, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear(target)
    target.touch()


def _read(response: BinaryIO, size: int) -> bytes:
    data = response.read(size)
    if len(data) != size:
        raise RuntimeError(f"the server sent {len(data)} of {size} bytes")
    return data


def _skip(response: BinaryIO, size: int) -> None:
    while size > 0:
        size -= len(_read(response, min(size, PIECE)))


def inside(dest: Path, path: str) -> Path:
    """path within the tree at dest as a process chrooted there sees it: symbolic links followed, an absolute one
    from dest."""
    parts = [part for part in estargz.clean_name(path).split("/") if part]
    done: list[str] = []
    for _ in range(40 * (len(parts) + 1)):
        if not parts:
            break
        here = dest.joinpath(*done, parts[0])
        if here.is_symlink():
            target = os.readlink(here)
            parts = [part for part in estargz.clean_name(posixpath.join("/" if target.startswith("/") else
                                                                        "/" + "/".join(done), target)).split("/")
                     if part] + parts[1:]
            done = []
            continue
        done.append(parts.pop(0))
    return dest.joinpath(*done)


def read_back(dest: Path, files: Sequence[str], ranges: Mapping[str, Sequence[Sequence[int]]] | None = None) -> int:
    """The emulated start: read the files it needs (through the tree's own links), only their ranges where given;
    the bytes read."""
    total = 0
    for path in files:
        target = inside(dest, path)
        if not target.is_file() or target.is_symlink():
            continue
        if ranges is None or path not in ranges:
            total += len(target.read_bytes())
            continue
        with target.open("rb") as source:
            for start, end in ranges[path]:
                source.seek(start)
                total += len(source.read(end - start))
    return total


# --- the measurements


def gzip_blob(layer: Path, out: Path, level: int = estargz.LEVEL) -> None:
    """The layer as a plain single-member gzip (mtime 0), what a plain push uploads."""
    with layer.open("rb") as source, out.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                                         compresslevel=level) as sink:
        shutil.copyfileobj(source, sink, 1 << 20)


def measure(layers: Sequence[Path], prefetch: Sequence[str], demand: Sequence[str], work: Path,
            rate: float = RATE, latency_s: float = LATENCY_S,
            ranges: Mapping[str, Sequence[Sequence[int]]] | None = None,
            chunk_size: int = estargz.CHUNK_SIZE, cuts: Mapping[str, Sequence[int]] | None = None,
            fetchers: Sequence[int] = (FETCHERS,)) -> dict:
    """Both pulls of the same layers (uncompressed tars, bottom first) through one blob server; the facts. ranges:
    what the start reads of a demand file (all of it where absent), fetched by chunk and read back alike."""
    started = time.perf_counter()
    blobs = convert_layers(layers, prefetch, work, chunk_size, cuts)
    return pull_both(blobs, prefetch, demand, work, rate, latency_s, ranges, fetchers) | {
        "convert_s": round(time.perf_counter() - started, 1), "chunk_size": chunk_size}


@dataclass
class Blobs:
    """Each layer twice: plain gzip (what a plain push uploads) and eStargz (name, size, TOC digest), in folder."""

    folder: Path
    plain: list[str]
    lazy: list[tuple[str, int, str]]
    digests: dict[str, tuple[str, str]] = field(default_factory=dict)  # a plain blob's digest and diff id

    def paths(self) -> dict[str, Path]:
        return {name: self.folder / name for name in [*self.plain, *(name for name, _, _ in self.lazy)]}


def convert_layers(layers: Sequence[Path], prefetch: Sequence[str], folder: Path, chunk_size: int,
                   cuts: Mapping[str, Sequence[int]] | None = None) -> Blobs:
    blobs = Blobs(folder, [], [])
    for index, layer in enumerate(layers):
        gzip_blob(layer, folder / f"{index}.tar.gz")
        blobs.digests[f"{index}.tar.gz"] = (file_digest(folder / f"{index}.tar.gz"), file_digest(layer))
        converted = estargz.convert(layer, folder / f"{index}.esgz", prefetch, chunk_size=chunk_size, cuts=cuts)
        blobs.plain.append(f"{index}.tar.gz")
        blobs.lazy.append((f"{index}.esgz", converted.size, converted.toc_digest))
    return blobs


def file_digest(path: Path) -> str:
    with path.open("rb") as source:
        return "sha256:" + hashlib.file_digest(source, "sha256").hexdigest()


def pull_both(blobs: Blobs, prefetch: Sequence[str], demand: Sequence[str], work: Path, rate: float = RATE,
              latency_s: float = LATENCY_S, ranges: Mapping[str, Sequence[Sequence[int]]] | None = None,
              fetchers: Sequence[int] = (FETCHERS,)) -> dict:
    """The full pull and the lazy one of the same blobs, unpacked under work/full and work/lazy; the facts. The lazy
    pull runs once for each count of on-demand fetchers (a fresh tree each time); R_emulated is the first's."""
    plain, lazy = blobs.plain, blobs.lazy
    by_fetchers: dict[int, float] = {}
    with serving(blobs.paths(), rate, latency_s) as server:
        full_client = BlobClient(server.port)
        full_s, skipped = full_pull(full_client, plain, work / "full", blobs.digests)
        full_s += _timed(read_back, work / "full", [*prefetch, *demand], ranges)
        full_client.close()
        for count in fetchers:
            shutil.rmtree(work / "lazy", ignore_errors=True)
            client = BlobClient(server.port)
            fetched = lazy_pull(client, lazy, work / "lazy")
            demand_facts = on_demand(client, fetched[1], demand, work / "lazy", ranges, count)
            by_fetchers[count] = fetched[0] + demand_facts[0] + _timed(read_back, work / "lazy", [*prefetch, *demand],
                                                                       ranges)
            client.close()
            if len(by_fetchers) == 1:
                lazy_client, (prefetch_s, _, lazy_skipped), (demand_s, demand_skipped) = client, fetched, demand_facts
    lazy_s = by_fetchers[fetchers[0]]
    esgz_bytes = sum(size for _, size, _ in lazy)
    gzip_bytes = sum((blobs.folder / name).stat().st_size for name in plain)
    return {"full_s": round(full_s, 3), "lazy_s": round(lazy_s, 3), "R_emulated": round(lazy_s / full_s, 4),
            "B": round(lazy_client.fetched / esgz_bytes, 4), "B_of_gzip": round(lazy_client.fetched / gzip_bytes, 4),
            "prefetch_s": round(prefetch_s, 3), "on_demand_s": round(demand_s, 3), "gzip_bytes": gzip_bytes,
            "estargz_bytes": esgz_bytes, "lazy_bytes": lazy_client.fetched, "lazy_requests": lazy_client.requests,
            "full_skipped_entries": skipped, "lazy_skipped_entries": lazy_skipped + demand_skipped,
            "rate_MBps": rate / 1e6, "latency_ms": latency_s * 1000,
            "prefetch_files": len(prefetch), "on_demand_files": len(demand),
            "on_demand_by_chunk": len(ranges or {}), "fetchers": fetchers[0],
            "R_by_fetchers": {count: round(seconds / full_s, 4) for count, seconds in by_fetchers.items()}}


def _timed(function: Callable[..., object], *arguments: object) -> float:
    started = time.perf_counter()
    function(*arguments)
    return time.perf_counter() - started


def synthetic_layer(path: Path, total: int = 200 << 20, seed: int = 58) -> tuple[list[str], list[str]]:
    """A site-packages-like layer of about total bytes at path: libraries of 1-48 MB and thousands of small modules,
    each about a third random and the rest text (about 1.6x by gzip, as shared libraries go); the start-up set
    (prefetch) about 15% of the bytes, and the files a start reads beyond it (on demand) about 2%."""
    rng = random.Random(seed)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz_", k=rng.randint(2, 10))) for _ in range(4000)]
    text = b" ".join(rng.choices(words, k=200_000))

    def content(size: int) -> bytes:
        pieces, left = [], size
        while left > 0:
            take = min(left, 64 << 10)
            if rng.random() < 0.35:
                pieces.append(rng.randbytes(take))
            else:
                at = rng.randrange(len(text) - take)
                pieces.append(text[at:at + take])
            left -= take
        return b"".join(pieces)

    libraries = [48, 30, 24, 16, 12, 10, 8, 6, 5, 4, 3, 2, 2, 1, 1]
    scale = total / (sum(libraries) * (1 << 20) + 2800 * (10 << 10))
    prefetch: list[str] = []
    demand: list[str] = []
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        def add(name: str, data: bytes | None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 1_700_000_000, 0o755 if data is None else 0o644
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            archive.addfile(info, None if data is None else _BytesReader(data))

        for folder in ("usr", "usr/lib", "usr/lib/python3", "usr/lib/python3/site-packages"):
            add(folder, None)
        for index, megabytes in enumerate(libraries):
            name = f"usr/lib/python3/site-packages/lib{index:02d}.so"
            add(name, content(int(megabytes * scale * (1 << 20))))
            (prefetch if megabytes in (10, 6, 3) or index == 13 else demand if index == 11 else []).append(name)
        for index in range(2800):
            name = f"usr/lib/python3/site-packages/pkg{index // 100:02d}/mod{index % 100:02d}.py"
            if index % 100 == 0:
                add(posixpath.dirname(name), None)
            add(name, content(int(rng.randint(2 << 10, 18 << 10) * scale)))
            (prefetch if index % 3 == 0 else demand if index % 50 == 1 else []).append(name)
    return prefetch, demand


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._at + size
        piece, self._at = self._data[self._at:end], min(end, len(self._data))
        return piece


def selftest(work: Path) -> dict:
    layer = work / "layer.tar"
    prefetch, demand = synthetic_layer(layer)
    facts = measure([layer], prefetch, demand, work)
    for path in [*prefetch, *demand]:
        if (work / "lazy" / path).read_bytes() != (work / "full" / path).read_bytes():
            raise SystemExit(f"selftest: {path} differs between the lazy and the full pull")
    return facts | {"layer_bytes": layer.stat().st_size, "zlib": zlib.ZLIB_RUNTIME_VERSION}


def saved_layers(image: Path, work: Path) -> list[Path]:
    """The layers of a `docker save` archive (its manifest.json's first image), bottom first, as uncompressed tars."""
    layers = []
    with tarfile.open(image) as archive:
        listed = archive.extractfile("manifest.json")
        if listed is None:
            raise SystemExit(f"{image}: no manifest.json, not a `docker save` archive")
        for index, name in enumerate(json.load(listed)[0]["Layers"]):
            out = work / f"layer{index}.tar"
            source = archive.extractfile(name)
            if source is None:
                raise SystemExit(f"{image}: the layer {name} is not a file")
            with source, out.open("wb") as sink:
                # Docker 25+ saves an OCI layout, whose layers may be gzip: the converter takes the tar.
                gzipped = source.read(2) == b"\x1f\x8b"
                source.seek(0)
                shutil.copyfileobj(gzip.GzipFile(fileobj=source) if gzipped else source, sink, 1 << 20)
            layers.append(out)
    return layers


def split_record(files: dict[str, dict], chunk_size: int,
                 whole_files: bool = False) -> tuple[list[str], list[str], dict[str, list[list[int]]]]:
    """A `torchimages startup-set` record as publish --lazy lays it out (lazy.read_whole): (the files prefetched
    whole, those read on demand, what a start reads of each of those)."""
    if whole_files:
        return sorted(files), [], {}
    prefetch, demand, ranges = [], [], {}
    for path, entry in sorted(files.items()):
        if lazy.read_whole(entry["size"], entry["ranges"], chunk_size):
            prefetch.append(path)
        else:
            demand.append(path)
            ranges[path] = entry["ranges"]
    return prefetch, demand, ranges


def record_cuts(files: dict[str, dict], chunk_size: int, gap: int = lazy.CUT_GAP) -> dict[str, list[int]]:
    """The chunk boundaries publish --lazy gives the files of a `torchimages startup-set` record read in part
    (lazy.read_cuts)."""
    return {path: lazy.read_cuts(entry["size"], entry["ranges"], gap) for path, entry in sorted(files.items())
            if not lazy.read_whole(entry["size"], entry["ranges"], chunk_size)}


def kept_blobs(folder: Path, image: Path, prefetch: Sequence[str], chunk_size: int,
               work: Path, cuts: Mapping[str, Sequence[int]] | None = None) -> tuple[Blobs, float]:
    """The blobs kept in folder when they were made from this image file (its path, size and time), prefetch list
    and chunk size; else made there now (its old blobs removed first). (The blobs, the seconds making them took: 0.0
    when kept.)"""
    stat = image.stat()
    key = {"image": str(image.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
           "prefetch": sorted(prefetch), "chunk_size": chunk_size,
           "cuts": hashlib.sha256(json.dumps(cuts or {}, sort_keys=True).encode()).hexdigest()}
    record = folder / "blobs.json"
    if record.is_file():
        kept = json.loads(record.read_text())
        if kept.get("key") == key and "digests" in kept:
            return Blobs(folder, kept["plain"], [tuple(layer) for layer in kept["lazy"]],
                         {name: tuple(pair) for name, pair in kept["digests"].items()}), 0.0
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    blobs = convert_layers(saved_layers(image, work), prefetch, folder, chunk_size, cuts)
    record.write_text(json.dumps({"key": key, "plain": blobs.plain, "lazy": blobs.lazy, "digests": blobs.digests}))
    return blobs, round(time.perf_counter() - started, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("image", nargs="?", type=Path, help="an image saved with `docker save`")
    parser.add_argument("startup", nargs="?", type=Path, help="the start-up set: JSON (see above)")
    parser.add_argument("--selftest", action="store_true", help="a synthetic 200 MB layer instead of an image")
    parser.add_argument("--rate-mbps", type=float, default=RATE / 1e6, help="the link's MB/s (default 125)")
    parser.add_argument("--latency-ms", type=float, default=LATENCY_S * 1000, help="per request (default 5)")
    parser.add_argument("--chunk-kib", type=int, default=lazy.CHUNK_SIZE >> 10,
                        help="the eStargz chunk size in KiB (default 1024, publish --lazy's; the Go writer's: 4096)")
    parser.add_argument("--cut-gap-kib", type=int, default=lazy.CUT_GAP >> 10,
                        help="chunk boundaries where each run a start reads of a file begins and ends, runs this close "
                             "joined (default: publish --lazy's)")
    parser.add_argument("--no-cuts", action="store_true", help="chunks of the chunk size alone (as until 2026-11-29, night)")
    parser.add_argument("--fetchers", default=str(FETCHERS),
                        help="on-demand range requests in flight, or several counts (4,2,1): the lazy pull is run for "
                             "each, R_emulated is the first's (default 4)")
    parser.add_argument("--whole-files", action="store_true",
                        help="prefetch every file of a startup-set record whole (what publish did before chunks)")
    parser.add_argument("--work", type=Path, help="a folder for the blobs and unpacked trees (default: temporary)")
    parser.add_argument("--blobs", type=Path,
                        help="keep the converted blobs in this folder, and take them from there when the image, the "
                             "start-up set and the chunk size are the ones they were made from (a CUDA row's "
                             "conversion takes minutes; the pulls are what is measured)")
    options = parser.parse_args()
    if not options.selftest and not (options.image and options.startup):
        parser.error("IMAGE and STARTUP, or --selftest")
    chunk_size = options.chunk_kib << 10
    try:
        fetchers = [int(count) for count in options.fetchers.split(",")]
    except ValueError:
        parser.error(f"--fetchers {options.fetchers}: counts such as 4 or 4,2,1")
    if not fetchers or min(fetchers) < 1:
        parser.error(f"--fetchers {options.fetchers}: counts of at least 1")
    with tempfile.TemporaryDirectory(prefix="lazy-pull-", dir=options.work) as scratch:
        work = Path(scratch)
        if options.selftest:
            facts = selftest(work)
        else:
            startup = json.loads(options.startup.read_text())
            ranges, cuts = None, None
            if isinstance(startup, dict) and "files" in startup:  # `torchimages startup-set`'s record
                prefetch, demand, ranges = split_record(startup["files"], chunk_size, options.whole_files)
                if not (options.no_cuts or options.whole_files):
                    cuts = record_cuts(startup["files"], chunk_size, options.cut_gap_kib << 10)
            else:
                prefetch = startup if isinstance(startup, list) else startup.get("prefetch", [])
                demand = [] if isinstance(startup, list) else startup.get("on_demand", [])
            if options.blobs:
                blobs, made_s = kept_blobs(options.blobs, options.image, prefetch, chunk_size, work, cuts)
                facts = pull_both(blobs, prefetch, demand, work, options.rate_mbps * 1e6, options.latency_ms / 1000,
                                  ranges, fetchers) | {"convert_s": made_s, "chunk_size": chunk_size}
            else:
                facts = measure(saved_layers(options.image, work), prefetch, demand, work, options.rate_mbps * 1e6,
                                options.latency_ms / 1000, ranges, chunk_size, cuts, fetchers)
            facts["cut_files"] = len(cuts or {})
            facts["cut_gap"] = None if cuts is None else options.cut_gap_kib << 10
    print(json.dumps(facts, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
