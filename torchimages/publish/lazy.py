"""`publish --lazy estargz`: beside each published image, a variant whose layers are eStargz (publish/estargz.py), under
the pinned tag plus LAZY_SUFFIX, signed and attested as the image is.

A node with the stargz snapshotter starts a container of it after fetching each layer's TOC and prefetch area (the
row's measured start-up set, `torchimages startup-set`: REPORTS/<tag>/startup-set.json) and reads the rest on demand;
any other engine pulls and unpacks it as ordinary gzip layers (each blob is one gzip stream of one tar). Its tars
hold the layer's entries plus the landmark and the TOC, so its diff ids, config and digest are its own: the variant
is another image with the same files, and its attestations (the image's SBOM, provenance and verification report)
say which image it was made from (`variant_of`).

The variant is written as skopeo's `dir:` layout (manifest.json, one file per blob named by its hex digest) and
pushed byte for byte (registry.write_artifact). The blobs are made from a `docker save` of the image: each layer tar
is spooled to a file in the work folder, recognised by its diff id, and converted.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker

from ..build.reproducible import MAX_CONFIG_BYTES, ChunkReader
from ..files import read_json_document
from ..model import PeerError
from ..trust import attestations
from . import estargz

LAZY_FORMATS = ("estargz",)
LAZY_SUFFIX = "-esgz"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
STARTUP_RECORD = "startup-set.json"  # cli/startup.py writes it into REPORTS/<tag>/
# A quarter of the Go writer's default: a start reads libraries in part, and a snapshotter fetches whole chunks. On
# the CUDA 13.0 runtime row's start-up set, 1 MiB chunks fetch 8% fewer bytes than 4 MiB ones, 256 KiB 2% fewer
# again at four times the TOC entries (docs/benchmarks-log.md, 2026-11-29).
CHUNK_SIZE = 1 << 20
# A file a start reads in part gets a chunk boundary where each run it reads begins and ends (read_cuts), runs closer
# than this joined: a snapshotter then fetches and inflates about what a start reads, not the 1 MiB around each read.
# On the CUDA 13.0 runtime row, 426 MiB read in 1,123 runs: 723 MiB inflated in 1 MiB chunks, 479 MiB with the
# cuts, joined at 256 KiB into 392 runs (docs/benchmarks-log.md, 2026-11-29, night).
CUT_GAP = 256 << 10


@dataclass(frozen=True)
class Variant:
    manifest: bytes
    digest: str  # of the manifest
    config_digest: str
    prefetched: int  # files before the landmarks, every layer together
    blob_bytes: int  # the layers' compressed bytes

    def summary(self) -> str:
        return (f"eStargz variant {self.digest} ({self.blob_bytes / 1e9:.2f} GB, {self.prefetched} files "
                "prefetched)")


def lazy_tag(pinned: str) -> str:
    return pinned + LAZY_SUFFIX


def chunks_read(size: int, ranges: Iterable[Sequence[int]], chunk_size: int = CHUNK_SIZE) -> set[int]:
    """The indexes of a file's chunks (of chunk_size, as the converter cuts it) that hold a byte of ranges."""
    touched: set[int] = set()
    for start, end in ranges:
        if end > start:
            touched.update(range(start // chunk_size, (min(end, size) - 1) // chunk_size + 1))
    return touched


def read_whole(size: int, ranges: Iterable[Sequence[int]], chunk_size: int = CHUNK_SIZE) -> bool:
    """Whether a start reads a byte of every chunk of a file: such a file goes into the prefetch area whole; of any
    other, a snapshotter fetches only the chunks a read touches, when it is read (one range request each run of
    them), so prefetching it whole would fetch chunks no start reads (a start reads 229 MB of libtorch_cpu's 414 MB
    in 19 runs, measured on the CPU runtime row)."""
    return len(chunks_read(size, ranges, chunk_size)) == max(1, -(-size // chunk_size))


def read_cuts(size: int, ranges: Iterable[Sequence[int]], gap: int = CUT_GAP) -> list[int]:
    """Where a file a start reads in part gets chunk boundaries (estargz.convert's cuts): where each run it reads
    begins and ends, runs at most gap apart joined."""
    runs: list[list[int]] = []
    for start, end in sorted((span[0], span[1]) for span in ranges):
        if end <= start:
            continue
        if runs and start - runs[-1][1] <= gap:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return sorted({at for run in runs for at in run if 0 < at < size})


def prefetch_by_layer(reports_dir: Path, tag: str, image_id: str) -> dict[str, list[str]]:
    """The files of the row's start-up set that a start reads in every chunk (read_whole), by the diff id of the layer
    each comes from: {} where none was measured, or it was measured on another image (then every layer gets the
    no-prefetch landmark)."""
    found: dict[str, list[str]] = {}
    for diff_id, path_read, size, ranges in _measured(reports_dir, tag, image_id):
        if size is None or ranges is None or read_whole(size, ranges):
            found.setdefault(diff_id, []).append(path_read)
    return found


def cuts_by_layer(reports_dir: Path, tag: str, image_id: str) -> dict[str, dict[str, list[int]]]:
    """The chunk boundaries (read_cuts) of the start-up set's files a start reads in part, by layer diff id and path:
    {} where none was measured on this image."""
    found: dict[str, dict[str, list[int]]] = {}
    for diff_id, path_read, size, ranges in _measured(reports_dir, tag, image_id):
        if size is not None and ranges is not None and not read_whole(size, ranges):
            found.setdefault(diff_id, {})[path_read] = read_cuts(size, ranges)
    return found


def _measured(reports_dir: Path, tag: str, image_id: str) -> list[tuple[str, str, int | None, list | None]]:
    """The row's start-up record on image_id: (layer diff id, path, size, the ranges read) for each file, sorted by
    path; size and ranges None where the record has none (one from before they were recorded: prefetched whole)."""
    path = reports_dir / tag / STARTUP_RECORD
    if not path.exists():
        return []
    record = read_json_document(path, f"delete it, or measure again: `torchimages startup-set {tag}`")
    if not isinstance(record, dict) or record.get("image_id") != image_id:
        return []
    layers = record.get("layers") or []
    found = []
    for path_read, entry in sorted((record.get("files") or {}).items()):
        index = entry.get("layer") if isinstance(entry, dict) else None
        if not (isinstance(index, int) and 0 <= index < len(layers)):
            continue
        size, ranges = entry.get("size"), entry.get("ranges")
        known = isinstance(size, int) and isinstance(ranges, list)
        found.append((layers[index]["diff_id"], path_read, size if known else None,
                      [span for span in ranges if isinstance(span, list) and len(span) == 2
                       and all(isinstance(at, int) for at in span)] if known else None))
    return found


def write_variant(api: docker.APIClient, image_id: str, prefetch: dict[str, list[str]], folder: Path,
                  cuts: dict[str, dict[str, list[int]]] | None = None) -> Variant:
    """The variant of image_id in skopeo's `dir:` layout in folder (its blobs, config and manifest); prefetch and
    cuts by layer diff id."""
    diff_ids = api.inspect_image(image_id)["RootFS"]["Layers"]
    converted: dict[str, estargz.Converted] = {}
    small: dict[str, bytes] = {}
    manifest = None
    with tempfile.TemporaryDirectory(prefix="torchimages-lazy-", dir=folder) as spool, \
            tarfile.open(fileobj=ChunkReader(api.get_image(image_id)), mode="r|") as saved:
        for member in saved:
            reader = saved.extractfile(member) if member.isfile() else None
            if reader is None:
                continue
            if member.name == "manifest.json":
                manifest = json.loads(reader.read())
                continue
            layer = Path(spool, "layer.tar")
            digest = hashlib.sha256()
            with open(layer, "wb") as copy:
                while chunk := reader.read(1 << 20):
                    digest.update(chunk)
                    copy.write(chunk)
            diff_id = f"sha256:{digest.hexdigest()}"
            if diff_id in diff_ids and diff_id not in converted:
                blob = Path(spool, "blob")
                done = estargz.convert(layer, blob, prefetch.get(diff_id, ()), chunk_size=CHUNK_SIZE,
                                       cuts=(cuts or {}).get(diff_id))
                blob.rename(folder / done.digest.removeprefix("sha256:"))
                converted[diff_id] = done
            elif member.size <= MAX_CONFIG_BYTES:
                small[member.name] = layer.read_bytes()
    if not manifest or manifest[0].get("Config") not in small or set(diff_ids) - set(converted):
        raise PeerError(f"the engine's `docker save` of {image_id} did not hold its config and every layer")
    config = json.loads(small[manifest[0]["Config"]])
    config["rootfs"] = {"type": "layers", "diff_ids": [converted[diff_id].diff_id for diff_id in diff_ids]}
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    (folder / config_digest.removeprefix("sha256:")).write_bytes(config_bytes)
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config_bytes)},
                       "layers": [converted[diff_id].descriptor() for diff_id in diff_ids]},
                      separators=(",", ":")).encode()
    (folder / "manifest.json").write_bytes(body)
    (folder / "version").write_text("Directory Transport Version: 1.1\n")
    return Variant(body, f"sha256:{hashlib.sha256(body).hexdigest()}", config_digest,
                   sum(len(done.prefetched) for done in converted.values()),
                   sum(done.size for done in converted.values()))


def variant_predicates(predicates: dict[str, dict], of_digest: str) -> dict[str, dict]:
    """The image's attestations for its variant: the SBOM and the provenance as they are (the same packages, the same
    build), the verification report saying which digest the variant was made from (its checks ran on that image's
    files, which the variant's layers hold). Not the VEX: its statements name the image's own digest as their product,
    and a scanner matches products by digest."""
    report = {**predicates[attestations.VERIFICATION_PREDICATE],
              "variant_of": {"digest": of_digest, "lazy": "estargz"}}
    return {attestations.SBOM_PREDICATE: predicates[attestations.SBOM_PREDICATE],
            attestations.PROVENANCE_PREDICATE: predicates[attestations.PROVENANCE_PREDICATE],
            attestations.VERIFICATION_PREDICATE: report}


def remove_work(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
