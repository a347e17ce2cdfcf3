"""The image's layers as the layout check reads them (checks/layout.py): diff ids, what wrote each, and the compressed
size of any layer large enough to break the limit.

Diff ids and the history come from the engine's inspect and history calls, which cost nothing. Only a layer whose
files alone are over the limit needs its bytes: then the image is read through `docker save` and that layer's tar is
gzipped at level 1, counting the output: a bound from above on what the push writes (level 6, Go's default, which
skopeo uses), three times as fast. Only a layer over the limit even so is measured again at level 6, from a second
save, before the check fails it. (Docker 20.10 writes a save into a temporary folder first, so a save costs the
image's size on the engine's disk for a moment.) A layer whose files are under the limit is not compressed at all:
its gzip is not larger. A layer's gzip size is a function of its content, so each measured size is kept by diff id in
the user's cache folder (SIZES_CACHE): an image derived from one measured before (the devel row on its runtime's
layers, a nightly's unchanged layers) is not saved again.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tarfile
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import docker
import docker.errors

from ..build.reproducible import ChunkReader
from ..checks.layout import COMPRESSED_LIMIT
from ..files import atomic_write_json
from ..model import TorchImagesError

FAST_LEVEL, PUSH_LEVEL = 1, 6
SIZES_CACHE = "layer-gzip-sizes.json"  # {"<level>": {diff id: bytes}} in cache_folder()
SAVE_LOCK = "layer-gzip-sizes.lock"  # held while a save is measured (one_save_at_a_time)
SAVE_WAIT_S = 1800  # a save of a CUDA devel image and its gzip take about 2 minutes here
# `#(nop) ` marks a history entry of an instruction that ran no command; of those, only COPY and ADD write a layer.
METADATA_ONLY = re.compile(r"#\(nop\)\s+(?!COPY\b|ADD\b)[A-Z]+\b", re.ASCII)


def layer_facts(docker_client: docker.DockerClient, image_id: str, limit: int = COMPRESSED_LIMIT) -> dict:
    """{"layers": [{diff_id, size, gzip_size, created_by}], "limit"}: bottom layer first. size: the bytes of the files
    the history gives the step (None where the history could not be matched to the layers). An engine that fails the
    reads gives a probe_error, as a probe that fails does (the check then fails naming it)."""
    try:
        return _layer_facts(docker_client.api, image_id, limit)
    except (docker.errors.APIError, tarfile.TarError, OSError) as error:
        return {"probe_error": f"the engine could not give the image's layers: {error}", "stderr_tail": ""}


def _layer_facts(api: docker.APIClient, image_id: str, limit: int) -> dict:
    layers = matched_layers(api.inspect_image(image_id)["RootFS"]["Layers"], api.history(image_id))
    # A gzip of incompressible bytes adds about 0.03%: a layer just under the limit is measured too.
    large = {layer["diff_id"] for layer in layers if layer["size"] is None or layer["size"] > limit * 0.99}
    if large:
        with one_save_at_a_time():
            _measure(api, image_id, layers, large, limit)
    return {"layers": layers, "limit": limit}


def _measure(api: docker.APIClient, image_id: str, layers: list[dict], large: set[str], limit: int) -> None:
    known = cached_sizes()  # read under the lock: what a run that held it before measured
    sizes = {diff_id: known[FAST_LEVEL][diff_id] for diff_id in large if diff_id in known[FAST_LEVEL]}
    if large - set(sizes):
        sizes.update(gzip_sizes(api.get_image(image_id), large - set(sizes), limit * 0.99, FAST_LEVEL))
    over = {diff_id for diff_id, size in sizes.items() if size > limit}
    exact = {diff_id: known[PUSH_LEVEL][diff_id] for diff_id in over if diff_id in known[PUSH_LEVEL]}
    if over - set(exact):
        exact.update(gzip_sizes(api.get_image(image_id), over - set(exact), limit * 0.99, PUSH_LEVEL))
    keep_sizes({FAST_LEVEL: sizes, PUSH_LEVEL: exact})
    for layer in layers:
        layer["gzip_size"] = exact.get(layer["diff_id"], sizes.get(layer["diff_id"]))
        layer["gzip_level"] = (PUSH_LEVEL if layer["diff_id"] in exact else FAST_LEVEL) \
            if layer["diff_id"] in sizes else None


@contextlib.contextmanager
def one_save_at_a_time(wait_s: float = SAVE_WAIT_S) -> Iterator[None]:
    """One measuring save at a time for this user (a flock in the cache folder): Docker 20.10 writes each save to
    a temporary folder on the engine's disk first, so two at once hold two images' copies (the CUDA rows verified side
    by side: 12.7 GB at once, which filled a CI runner's disk; docs/benchmarks-log.md), and the second then finds the
    layers the two share measured. Past wait_s, or where the folder cannot be written, it measures anyway: the lock
    saves disk, the check never fails for it."""
    folder = cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder / SAVE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        yield
    finally:
        os.close(handle)  # the lock goes with the descriptor


def cache_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's cache folder (XDG_CACHE_HOME, else ~/.cache), as publish keeps its pushes' blob-info there."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torchimages"


def cached_sizes() -> dict[int, dict[str, int]]:
    """The gzip sizes measured before, by level and diff id; none where the file is absent or not what keep_sizes
    writes (a cache: never an error, only a measurement again)."""
    found: dict[int, dict[str, int]] = {FAST_LEVEL: {}, PUSH_LEVEL: {}}
    try:
        document = json.loads((cache_folder() / SIZES_CACHE).read_text())
    except (OSError, ValueError):
        return found
    for level in found:
        entries = document.get(str(level)) if isinstance(document, dict) else None
        if isinstance(entries, dict):
            found[level] = {key: value for key, value in entries.items()
                            if isinstance(key, str) and key.startswith("sha256:") and type(value) is int}
    return found


def keep_sizes(measured: dict[int, dict[str, int]]) -> None:
    """Add measured sizes to the cache (merged with what another run kept meanwhile); a folder that cannot be written
    is left alone: the next run measures again."""
    known = cached_sizes()
    for level, sizes in measured.items():
        known[level].update(sizes)
    folder = cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / SIZES_CACHE, {str(level): sizes for level, sizes in known.items()}, root=folder)
    except (OSError, TorchImagesError):
        pass


def matched_layers(diff_ids: list[str], history: list[dict]) -> list[dict]:
    """Each layer (bottom first) with the size and step its history entry gives: the engine lists history newest
    first, one entry per instruction, and those that ran no command (METADATA_ONLY) wrote no layer, nor did a command
    that changed nothing (size 0, marked empty_layer). Where the count of the others is not the layers' (another
    builder's history), sizes and steps are unknown: None and ""."""
    writers = [entry for entry in reversed(history) if not METADATA_ONLY.search(entry.get("CreatedBy") or "")]
    if len(writers) > len(diff_ids):  # a command that changed nothing: the builder marked its entry empty_layer
        writers = [entry for entry in writers if entry.get("Size") or "#(nop)" in (entry.get("CreatedBy") or "")]
    matched = len(writers) == len(diff_ids)
    return [{"diff_id": diff_id, "size": writers[index].get("Size") if matched else None, "gzip_size": None,
             "created_by": (writers[index].get("CreatedBy") or "") if matched else ""}
            for index, diff_id in enumerate(diff_ids)]


def gzip_sizes(chunks, wanted: set[str], over: float, level: int) -> dict[str, int]:
    """The gzip size at level of each layer tar in a `docker save` stream whose diff id is wanted (a tar under `over`
    bytes is taken as small without compressing it). Docker 20.10 saves layers as <id>/layer.tar, Docker 25+ as the OCI layout's
    blobs/sha256/<hex>: every file member over the bound is hashed, and the diff id picks it out."""
    sizes = {}
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:
        for member in archive:
            if not member.isfile() or member.size <= over:
                continue
            reader = archive.extractfile(member)
            assert reader is not None
            digest, compressor, compressed = hashlib.sha256(), zlib.compressobj(level, zlib.DEFLATED, 31), 0
            while chunk := reader.read(1 << 20):
                digest.update(chunk)
                compressed += len(compressor.compress(chunk))
            compressed += len(compressor.flush())
            diff_id = f"sha256:{digest.hexdigest()}"
            if diff_id in wanted:
                sizes[diff_id] = compressed
    return sizes
