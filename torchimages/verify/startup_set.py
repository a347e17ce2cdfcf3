"""The start-up set of an image (issue 58): which bytes of which files, in which layers, a cold start reads before its
first op. A lazily pulled image needs exactly these first; the rest can come while the job runs.

One container of the image: the page cache of its files is dropped (checks/startup_probe.py, as root), the start runs
as the image's user (`import torch` and a first op: a matmul and a convolution; on GPUs also `torch.cuda.init()`, a
bf16 matmul and a cuDNN convolution), then the pages in the cache are read back with `mincore` (what the start read,
and what the kernel read ahead around it: what a lazy pull fetches too). How far the kernel reads ahead is the disk's
setting; with `binds` (snapshotter_view.py) /usr and /opt are read from a loop device that reads ahead as a lazy-pull
snapshotter's mount does. Each file is the topmost layer's that holds it, read from a `docker save` of the image (its
file lists only).
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from ..build.reproducible import ChunkReader
from ..checks import startup_probe
from ..model import ImageSpec, PeerError

PROBE_PATH = "/tmp/torchimages-startup-probe.py"
START_CPU = ("import torch; x = torch.randn(256, 256); (x @ x).sum().item(); "
             "torch.nn.functional.conv2d(torch.randn(1, 3, 64, 64), torch.randn(8, 3, 3, 3)).sum().item()")
START_GPU = START_CPU + ("; torch.cuda.init(); y = torch.randn(256, 256, device='cuda', dtype=torch.bfloat16); "
                         "(y @ y).float().sum().item(); torch.backends.cudnn.benchmark = False; "
                         "torch.nn.functional.conv2d(torch.randn(1, 3, 64, 64, device='cuda'), "
                         "torch.randn(8, 3, 3, 3, device='cuda')).sum().item()")
WHITEOUT, OPAQUE = ".wh.", ".wh..wh..opq"  # OCI whiteouts: a path removed, a folder's lower contents removed
START_TIMEOUT_S = 600


@dataclass
class StartupSet:
    image_id: str
    start: str
    start_s: float
    readahead_kib: int | None = None  # the loop copy's read-ahead (snapshotter_view.py); None: the engine's disk's
    files: dict[str, dict] = field(default_factory=dict)  # path -> {size, ranges, layer}
    layers: list[dict] = field(default_factory=list)  # bottom first: {diff_id, bytes, read}

    @property
    def read_bytes(self) -> int:
        return sum(end - start for entry in self.files.values() for start, end in entry["ranges"])

    @property
    def image_bytes(self) -> int:
        return sum(layer["bytes"] for layer in self.layers)

    def to_json(self) -> dict:
        return {"image_id": self.image_id, "start": self.start, "start_s": self.start_s,
                "readahead_kib": self.readahead_kib,
                "read_bytes": self.read_bytes, "image_bytes": self.image_bytes, "layers": self.layers,
                "files": self.files}


def measure(docker_client: docker.DockerClient, image: str, spec: ImageSpec,
            device_requests: list | None = None, binds: dict | None = None,
            readahead_kib: int | None = None) -> StartupSet:
    """device_requests: the GPUs to give the container (none: the CPU start); binds: read-only folders over the
    image's own (snapshotter_view.loop_copy's, whose read-ahead is readahead_kib)."""
    api = docker_client.api
    image_id = api.inspect_image(image)["Id"]
    start = START_GPU if device_requests else START_CPU
    requests = device_requests or None
    container = api.create_container(image, ["sleep", "infinity"], entrypoint=[], network_disabled=True,
                                     host_config=api.create_host_config(network_mode="none", device_requests=requests,
                                                                       binds=binds or None))
    try:
        api.start(container)
        api.put_archive(container, "/tmp", _probe_archive())
        python = "/opt/venv/bin/python"
        _exec(api, container, [python, PROBE_PATH, "evict"], "0")
        began = time.monotonic()
        _exec(api, container, [python, "-c", start], str(spec.user.uid) if spec.user else "")
        start_s = round(time.monotonic() - began, 2)
        resident = json.loads(_exec(api, container, [python, PROBE_PATH, "resident"], "0"))["files"]
    finally:
        api.remove_container(container, force=True)
    result = StartupSet(image_id, start, start_s, readahead_kib)
    owners, result.layers = layer_files(api.get_image(image_id))
    for path, entry in sorted(resident.items()):
        layer = owners.get(path.lstrip("/"))
        if layer is None:  # a file the container made (none in a start that writes nothing) or a mount
            continue
        result.files[path] = {**entry, "layer": layer}
        result.layers[layer]["read"] += sum(end - begin for begin, end in entry["ranges"])
    return result


def _probe_archive() -> bytes:
    stream = io.BytesIO()
    content = Path(startup_probe.__file__).read_bytes()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        info = tarfile.TarInfo(PROBE_PATH.removeprefix("/tmp/"))
        info.size, info.mode = len(content), 0o644
        archive.addfile(info, io.BytesIO(content))
    return stream.getvalue()


def _exec(api: docker.APIClient, container, command: list[str], user: str) -> str:
    run = api.exec_create(container, command, user=user)
    output = api.exec_start(run["Id"], demux=True)
    code = api.exec_inspect(run["Id"])["ExitCode"]
    stdout, stderr = (part.decode(errors="replace") if part else "" for part in output)
    if code != 0:
        tail = " | ".join(stderr.strip().splitlines()[-5:])
        raise PeerError(f"`{command[-1] if command[1] != '-c' else 'the start'}` exited {code} in the container: {tail}")
    return stdout


def layer_files(chunks) -> tuple[dict[str, int], list[dict]]:
    """From a `docker save` stream: which layer (index, bottom first) each path comes from (the topmost that writes it,
    none where a later whiteout removed it), and each layer's diff id and bytes (its tar's size). The stream's members
    come in any order: each layer's file list is kept, and manifest.json orders them."""
    listed: dict[str, tuple[str, int, list[str]]] = {}  # member name -> diff id, size, paths
    manifest = None
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:
        for member in archive:
            if member.name == "manifest.json":
                reader = archive.extractfile(member)
                manifest = json.loads(reader.read()) if reader else None
                continue
            if not member.isfile() or not (member.name.endswith("/layer.tar") or member.name.startswith("blobs/")):
                continue
            reader = archive.extractfile(member)
            if reader is None:
                continue
            digest = hashlib.sha256()
            tee = _Hashing(reader, digest)
            try:
                with tarfile.open(fileobj=tee, mode="r|") as layer:
                    paths = [entry.name.removeprefix("./") for entry in layer]
                tee.drain()
            except tarfile.TarError:  # a config or another blob of the OCI layout
                continue
            listed[member.name] = (f"sha256:{digest.hexdigest()}", member.size, paths)
    if not manifest:
        raise PeerError("the engine's `docker save` stream held no manifest")
    owners: dict[str, int] = {}
    layers = []
    for index, name in enumerate(manifest[0]["Layers"]):
        diff_id, size, paths = listed[name]
        layers.append({"diff_id": diff_id, "bytes": size, "read": 0})
        for path in paths:
            folder, _, base = path.rpartition("/")
            if base == OPAQUE:  # the folder's lower contents are gone, its own stay
                owners = {key: value for key, value in owners.items()
                          if not key.startswith(folder + "/") or value == index}
            elif base.startswith(WHITEOUT):
                gone = f"{folder}/{base[len(WHITEOUT):]}".lstrip("/")
                owners = {key: value for key, value in owners.items() if key != gone and not key.startswith(gone + "/")}
            else:
                owners[path] = index
    return owners, layers


class _Hashing(io.RawIOBase):
    """A reader that hashes what passes through it (the layer's diff id while its file list is read)."""

    def __init__(self, reader, digest):
        self._reader, self._digest = reader, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._reader.read(len(buffer))
        self._digest.update(data)
        buffer[:len(data)] = data
        return len(data)

    def drain(self) -> None:
        """The rest of the layer's tar (its end blocks), hashed too."""
        while data := self._reader.read(1 << 20):
            self._digest.update(data)
