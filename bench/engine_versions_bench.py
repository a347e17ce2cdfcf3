#!/usr/bin/env python3
"""Whether another Docker engine version builds the same image from the same inputs (issue 47): a row built with
`build.py build ROW --no-cache --force` on this project's engine ($DOCKER_HOST, Docker 20.10 here) and on another
engine (--other-host, for instance Debian 13's dockerd 26), one after the other, from the same checkout, wheelhouse
and base image (copied into the other engine with `docker save | docker load` when it lacks it: same base id).

Prints both engines' versions (dockerd, containerd, runc), each build's seconds and image id, each layer's diff id on
both sides (equal or differs), the settled configs' differing keys (the layer list aside) and, for the first layer
that differs, the first file whose path, size, mode, owner, time or content differs (torchimages/trust/layer_diff.py) or,
where none does, which tar header fields differ (the mode's file-type bits, the user and group names, PAX records)
and whether the two layers are the same bytes once those fields are written one way (mode: permission bits only; no
user or group name): then the engines' tar writers are the whole difference.

The builder settles an image's config from the engine's `docker save` stream; an engine that writes the OCI layout
(Docker 25 and later: blobs/sha256/..., no <id>.json) makes that step fail after the build. The raw image is tagged
by then, and this script settles it the same way itself (reading either layout) and says so.

Exits 0 with one line `skipped: ...` when --other-host is not given or no engine answers there. Leaves the two images
tagged REPOSITORY:ROW, one in each engine (--remove untags them), and the engines' build stages.

Run: `source .engine/env && python bench/engine_versions_bench.py --other-host unix:///tmp/trixie/docker.sock
[--row TAG] [--wheelhouse DIR] [--compare-only]`.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import docker
import docker.errors
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.build.reproducible import ChunkReader, base_entries, config_bytes, load_archive, settled_config  # noqa: E402
from torchimages.trust.layer_diff import FileEntry, content_id, first_differing_file, first_differing_layer  # noqa: E402

REPOSITORY = "localhost:5000/bench/engine-versions"
SETTLE_FAILED = "held no image config"  # the builder's SettleFailed on an engine whose `docker save` is an OCI layout
BASE_ARG = re.compile(r"^ARG BASE_IMAGE=(\S+)$", re.MULTILINE)
PING_TIMEOUT_S = 10
CHUNK = 1 << 20
BLOCK = 512


def answering(host: str | None) -> docker.DockerClient | None:
    if not host:
        return None
    try:
        client = docker.DockerClient(base_url=host, timeout=PING_TIMEOUT_S)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return None
    client.api.timeout = 3600
    return client


def versions(client: docker.DockerClient) -> dict[str, str]:
    answer = client.version()
    found = {"dockerd": answer.get("Version", "?"), "api": answer.get("ApiVersion", "?")}
    for component in answer.get("Components") or []:
        if component.get("Name") in ("containerd", "runc"):
            found[component["Name"]] = component.get("Version", "?")
    info = client.info()
    found["storage"] = f"{info.get('Driver')}, {dict(info.get('DriverStatus') or []).get('Native Overlay Diff', '')}"
    return found


def same_base(ours: docker.DockerClient, theirs: docker.DockerClient, base: str) -> str:
    """The base's id in both engines, copied into the other one (save | load) when it lacks it."""
    mine = ours.api.inspect_image(base)["Id"]
    try:
        other = theirs.api.inspect_image(base)["Id"]
    except docker.errors.ImageNotFound:
        for answer in theirs.api.load_image(ours.api.get_image(base)):
            if isinstance(answer, dict) and answer.get("error"):
                raise SystemExit(f"loading {base} into the other engine failed: {answer['error']}") from None
        other = theirs.api.inspect_image(base)["Id"]
    if other != mine:
        raise SystemExit(f"the engines' {base} differ ({mine} / {other}): every layer would; give both the same base")
    return mine


def build(host: str, matrix: Path, row: str, wheelhouse: Path, reports: Path) -> tuple[float, int, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "build.py"), "--matrix", str(matrix), "--images",
                           str(ROOT / "images"), "--reports", str(reports), "build", row, "--wheelhouse",
                           str(wheelhouse), "--no-cache", "--force"],
                          capture_output=True, text=True, check=False, cwd=ROOT, env={**os.environ, "DOCKER_HOST": host})
    return time.perf_counter() - started, done.returncode, done.stdout[-3000:] + done.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- `docker save` streams

def saved_image(chunks: Iterable[bytes], layer_ids: list[str]) -> tuple[dict, list[Layer]]:
    """The config and the layers (in the image's order) of the one image of a `docker save` stream, in either layout:
    Docker 20.10's (<v1 id>/layer.tar, <id>.json) or the OCI layout Docker 25 and later write (blobs/sha256/<hex>)."""
    small: dict[str, bytes] = {}
    layers: dict[str, Layer] = {}
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:
        for member in archive:
            source = archive.extractfile(member) if member.isfile() else None
            if source is None:
                continue
            if member.name.endswith("/layer.tar") or member.size > CHUNK:
                layer = read_layer(source)
                layers[layer.diff_id] = layer
            else:
                small[member.name] = source.read()
    manifest = json.loads(small["manifest.json"])[0]
    config = json.loads(small[manifest["Config"]])
    # A layer a stream holds once serves every index that names it; an empty layer is read on demand.
    return config, [layers.get(diff_id) or read_layer(io.BytesIO(small_layer(small, diff_id))) for diff_id in layer_ids]


def small_layer(small: dict[str, bytes], diff_id: str) -> bytes:
    for content in small.values():
        if f"sha256:{hashlib.sha256(content).hexdigest()}" == diff_id:
            return content
    raise SystemExit(f"the `docker save` stream holds no layer {diff_id}")


@dataclass
class Layer:
    diff_id: str
    canonical_id: str  # the digest of the same tar with the mode's type bits and the user and group names left out
    entries: list[FileEntry] = field(default_factory=list)
    headers: list[tuple[str, dict[str, object]]] = field(default_factory=list)


class _Tee(io.RawIOBase):
    """A reader that hashes what passes through it as it is and in canonical form (Canonical)."""

    def __init__(self, source) -> None:
        self.source, self.raw, self.canonical = source, hashlib.sha256(), Canonical()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.source.read(len(buffer))
        self.raw.update(chunk)
        self.canonical.update(chunk)
        buffer[:len(chunk)] = chunk
        return len(chunk)


class Canonical:
    """The sha256 of a tar stream whose headers carry the permission bits alone in the mode field and no user or group
    name (what Docker 23 and later write); everything else as it is. Fed in chunks of any size."""

    def __init__(self) -> None:
        self.digest, self.pending, self.content_blocks, self.ended = hashlib.sha256(), b"", 0, False

    def update(self, chunk: bytes) -> None:
        data = self.pending + chunk
        usable = len(data) - len(data) % BLOCK
        self.pending = data[usable:]
        for offset in range(0, usable, BLOCK):
            self.digest.update(self._block(data[offset:offset + BLOCK]))

    def _block(self, block: bytes) -> bytes:
        if self.ended or self.content_blocks:
            self.content_blocks = max(self.content_blocks - 1, 0)
            return block
        if block == bytes(BLOCK):
            self.ended = True
            return block
        header = bytearray(block)
        mode = int(bytes(header[100:107]).strip(b"\0 ") or b"0", 8)
        header[100:108] = b"%07o\0" % (mode & 0o7777)
        header[265:329] = bytes(64)  # uname, gname
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        size = int(bytes(header[124:136]).strip(b"\0 ") or b"0", 8)
        self.content_blocks = (size + BLOCK - 1) // BLOCK
        return bytes(header)

    def hexdigest(self) -> str:
        self.digest.update(self.pending)
        return self.digest.hexdigest()


def read_layer(source) -> Layer:
    tee = _Tee(source)
    entries, headers = [], []
    with tarfile.open(fileobj=io.BufferedReader(tee, CHUNK), mode="r|") as archive:
        for member in archive:
            entries.append(FileEntry(member.name, member.size, oct(member.mode & 0o7777), f"{member.uid}:{member.gid}",
                                     int(member.mtime), content_id(archive, member)))
            headers.append((member.name, {"mode": oct(member.mode), "uname": member.uname, "gname": member.gname,
                                          "pax": dict(member.pax_headers), "devmajor": member.devmajor,
                                          "devminor": member.devminor}))
    while tee.read(CHUNK):  # the end-of-archive blocks the tar reader left
        pass
    return Layer(f"sha256:{tee.raw.hexdigest()}", f"sha256:{tee.canonical.hexdigest()}", entries, headers)


def settle_here(client: docker.DockerClient, name: str, created: str, base: str) -> str:
    """What the builder's settling does (torchimages/build/reproducible.py), for an engine whose `docker save` is an OCI
    layout: the config read from either layout, settled, loaded back with the layers the engine holds."""
    image = client.api.inspect_image(name)
    config, _ = saved_image(client.api.get_image(image["Id"]), [])
    settled = config_bytes(settled_config(config, created, base_entries(client.api, base)))
    for answer in client.api.load_image(load_archive(settled, len(config["rootfs"]["diff_ids"]), name)):
        if isinstance(answer, dict) and answer.get("error"):
            raise SystemExit(f"the other engine did not load the settled config: {answer['error']}")
    return f"sha256:{hashlib.sha256(settled).hexdigest()}"


# ------------------------------------------------------------------------------------------------------ comparison

def header_differences(ours: Layer, theirs: Layer) -> tuple[Counter, str | None]:
    """How many entries differ in each header field, and the first such entry (same path, same order assumed: the
    entries are equal by then)."""
    fields: Counter = Counter()
    first = None
    for (path, mine), (_, other) in zip(ours.headers, theirs.headers, strict=False):
        differing = [key for key in mine if mine[key] != other[key]]
        fields.update(differing)
        if differing and first is None:
            first = f"{path}: " + ", ".join(f"{key} {mine[key]!r} / {other[key]!r}" for key in differing)
    return fields, first


def differing_keys(ours: dict, theirs: dict, prefix: str = "") -> Iterator[str]:
    for key in sorted(set(ours) | set(theirs)):
        if key == "rootfs" and not prefix:
            continue
        mine, other = ours.get(key), theirs.get(key)
        if isinstance(mine, dict) and isinstance(other, dict):
            yield from differing_keys(mine, other, f"{prefix}{key}.")
        elif mine != other:
            yield f"{prefix}{key}"


def compare(ours: docker.DockerClient, theirs: docker.DockerClient, name: str) -> dict:
    images = [client.api.inspect_image(name) for client in (ours, theirs)]
    layer_ids = [image["RootFS"]["Layers"] for image in images]
    index = first_differing_layer(*layer_ids)
    result: dict = {
        "same image id": images[0]["Id"] == images[1]["Id"],
        "layers": [{"layer": number + 1, "ours": mine, "theirs": other, "equal": mine == other}
                   for number, (mine, other) in enumerate(zip(*layer_ids, strict=False))],
    }
    saved = [saved_image(client.api.get_image(image["Id"]), ids)
             for client, image, ids in zip((ours, theirs), images, layer_ids, strict=True)]
    result["config keys that differ (besides rootfs)"] = list(differing_keys(saved[0][0], saved[1][0]))
    histories = zip(saved[0][0].get("history", []), saved[1][0].get("history", []), strict=False)
    result["history entries that differ"] = [f"{number}: {mine.get('created_by')!r} / {other.get('created_by')!r}"
                                             for number, (mine, other) in enumerate(histories, 1) if mine != other]
    if index is None:
        return result
    mine, other = saved[0][1], saved[1][1]
    result["first differing layer"] = index + 1
    result["first differing file"] = first_differing_file(iter(mine[index].entries), iter(other[index].entries)) or \
        "no file differs (path, size, mode, owner, time and content are equal in every entry)"
    fields, first = header_differences(mine[index], other[index])
    result["first differing tar header"] = first
    result["entries whose header field differs, per field"] = dict(fields)
    canonical = [a.canonical_id == b.canonical_id for a, b in zip(mine, other, strict=False)]
    result["layers equal once mode type bits and user/group names are written one way"] = \
        f"{sum(canonical)} of {len(canonical)}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other-host", help="the other engine's DOCKER_HOST, e.g. unix:///tmp/trixie/docker.sock")
    parser.add_argument("--host", default=os.environ.get("DOCKER_HOST"), help="this project's engine ($DOCKER_HOST)")
    parser.add_argument("--row", default="2.13.0-cpu-runtime")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--compare-only", action="store_true", help="compare the images the last run left; no build")
    parser.add_argument("--remove", action="store_true", help="untag the two images afterwards")
    args = parser.parse_args()
    if not args.other_host:
        print("skipped: no --other-host (the other engine's DOCKER_HOST)")
        return
    clients = {"ours": answering(args.host), "theirs": answering(args.other_host)}
    for side, host in (("ours", args.host), ("theirs", args.other_host)):
        if clients[side] is None:
            print(f"skipped: no Docker engine answers at {host or '$DOCKER_HOST (unset)'}")
            return
    ours, theirs = clients["ours"], clients["theirs"]
    assert ours is not None and theirs is not None
    name = f"{REPOSITORY}:{args.row}"
    dockerfile = (ROOT / "images" / args.row / "Dockerfile").read_text()
    base = BASE_ARG.search(dockerfile)
    if base is None:
        raise SystemExit(f"images/{args.row}/Dockerfile names no BASE_IMAGE")
    report: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "row": args.row,
        "engines": {"ours": {"host": args.host, **versions(ours)}, "theirs": {"host": args.other_host,
                                                                             **versions(theirs)}},
        "base": {base.group(1): same_base(ours, theirs, base.group(1))},
    }
    if not args.compare_only:
        builds = {}
        with tempfile.TemporaryDirectory(prefix="engine-versions-bench-") as folder:
            scratch = Path(folder)
            matrix = scratch / "matrix.yaml"
            matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", REPOSITORY))
            shutil.copy(ROOT / "compat.yaml", scratch / "compat.yaml")
            for side, host, client in (("ours", args.host, ours), ("theirs", args.other_host, theirs)):
                seconds, code, output = build(host, matrix, args.row, args.wheelhouse, scratch / f"reports-{side}")
                entry: dict[str, object] = {"seconds": round(seconds, 1), "exit": code}
                if code != 0 and SETTLE_FAILED in output:
                    raw = client.api.inspect_image(name)
                    created = raw["Config"]["Labels"]["org.opencontainers.image.created"]
                    entry["builder's settling"] = "failed: the engine's `docker save` is an OCI layout"
                    entry["settled by this script"] = settle_here(client, name, created, base.group(1))
                elif code != 0:
                    raise SystemExit(f"the build on {host} failed:\n{output}")
                builds[side] = entry
        report["builds"] = builds
    for side, client in (("ours", ours), ("theirs", theirs)):
        report["engines"][side]["image"] = client.api.inspect_image(name)["Id"]
    report["comparison"] = compare(ours, theirs, name)
    if args.remove:
        for client in (ours, theirs):
            client.api.remove_image(name, noprune=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
