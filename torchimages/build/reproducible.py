"""Same inputs, same image: the date a build carries comes from its inputs, and what the classic builder
writes into an image's config that depends on the run is rewritten after the build.

The layers are made reproducible where they are written (templates/macros.j2: the venv's file time, the OS steps'
os_step_begin/os_step_end). What remains is the image config: the classic builder dates it and every history entry
with the clock and names the container that committed it (Docker 20.10 has no SOURCE_DATE_EPOCH for it). The config
is read from the engine, the cheapest way that works (the engine's own store, where this host can read it; else its
inspect and history, where the classic builder made the image; else a `docker save` stream, read through), rewritten
here (pure), and loaded back with the
layers the engine already holds: `docker load` takes a layer it has by its chain id, so the archive loaded carries
the config and manifest alone. The image built keeps its parent chain in the engine, untagged, so that the next build
takes its steps from the cache and settles to the same image again.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import subprocess
import tarfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import docker

from ..model import TorchImagesError

# The time every file of every layer carries (templates/macros.j2 file_time; the build context's files get it too).
FILE_TIME = 946684800
# The date of a row that no commit holds unchanged (a scratch project, an edited Dockerfile): still the same twice.
UNCOMMITTED_EPOCH = FILE_TIME
UNCOMMITTED = "unknown"  # the revision label of such a row (attestations.py leaves it out of the provenance)
# Written by the committing container, never by an input: the container's id, its config (the parent image's id, the
# container's hostname), the engine's version.
RUN_DEPENDENT_KEYS = ("container", "container_config", "docker_version")
# BuildKit's inline cache in the config (the builder asks for it: a fresh runner's build takes layers from the image)
INLINE_CACHE_KEY = "moby.buildkit.cache.v0"
MAX_CONFIG_BYTES = 4 << 20  # an image config is kilobytes (a history entry per step); a layer blob is not read
FULL_IMAGE_ID = re.compile(r"sha256:([0-9a-f]{64})", re.ASCII)


@dataclass(frozen=True)
class SourceDate:
    """The commit that holds a row's folder as it is (or UNCOMMITTED) and the date builds of it carry."""
    commit: str
    epoch: int

    @property
    def timestamp(self) -> str:
        return iso_time(self.epoch)


class SettleFailed(TorchImagesError):
    pass


def iso_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def source_date(row_folder: Path) -> SourceDate:
    """The last commit of the row's folder and its commit time, when the folder is committed as it is; otherwise
    UNCOMMITTED and UNCOMMITTED_EPOCH (a build from uncommitted files cannot be rebuilt from a commit)."""
    changed = _git(row_folder, "status", "--porcelain", "--untracked-files=all", "--", ".")
    found = _git(row_folder, "log", "-1", "--format=%H %ct", "--", ".")
    if changed is None or changed or not found:
        return SourceDate(UNCOMMITTED, UNCOMMITTED_EPOCH)
    commit, epoch = found.split()
    return SourceDate(commit, int(epoch))


def _git(folder: Path, *arguments: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def settled_config(config: dict, created: str, from_base: int) -> dict:
    """The image config without what the build's run put there: one creation time for the image and every history
    entry the build added, no committing container, no hostname, no parent image id. The first from_base history
    entries are the base image's and stay as the base has them: the engine takes a published image as a cache source
    only where its history begins exactly as the base's does (moby's isValidParent)."""
    settled = {key: value for key, value in config.items() if key not in RUN_DEPENDENT_KEYS}
    settled["created"] = created
    history = config.get("history", [])
    settled["history"] = history[:from_base] + [{**entry, "created": created} for entry in history[from_base:]]
    settled["config"] = {key: value for key, value in (config.get("config") or {}).items()
                         if key not in ("Hostname", "Image")}
    if isinstance(config.get(INLINE_CACHE_KEY), str):
        settled[INLINE_CACHE_KEY] = _settled_inline_cache(config[INLINE_CACHE_KEY], created)
    return settled


def _settled_inline_cache(encoded: str, created: str) -> str:
    """BuildKit's inline cache (base64 JSON) dates each cached layer with the clock (createdAt): it gets the image's
    time, which changes no cache key (layers are matched by digest). Undecodable, it is left as it is."""
    try:
        records = json.loads(base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        return encoded
    return base64.b64encode(json.dumps(_dated(records, created), separators=(",", ":")).encode()).decode()


def _dated(value, created: str):
    if isinstance(value, dict):
        return {key: created if key == "createdAt" else _dated(item, created) for key, item in value.items()}
    if isinstance(value, list):
        return [_dated(item, created) for item in value]
    return value


def config_bytes(config: dict) -> bytes:
    """The config as the engine would store it for one id: sorted keys, no spaces."""
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def load_archive(config: bytes, layer_count: int, name: str) -> bytes:
    """A `docker load` archive of the config and the manifest naming it: no layer files, the engine has them."""
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name],
                            "Layers": [f"layer{index}/layer.tar" for index in range(layer_count)]}]).encode()
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for member, content in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return stream.getvalue()


def saved_config(chunks) -> dict:
    """The config of the one image a `docker save` stream holds (read through; its layers are skipped). Docker 20.10
    writes it as <hex>.json at the top; Docker 25 and later write the OCI layout, where it is blobs/sha256/<hex> among
    the layers: manifest.json names it either way, and only small files are read as candidates."""
    candidates: dict[str, bytes] = {}
    manifest = None
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:
        for member in archive:
            saved_file = member.isfile() and member.size <= MAX_CONFIG_BYTES and (
                "/" not in member.name or member.name.startswith("blobs/sha256/"))
            content = archive.extractfile(member) if saved_file else None
            if content is not None and member.name == "manifest.json":
                manifest = json.loads(content.read())
            elif content is not None and (member.name.endswith(".json") or "/" in member.name):
                candidates[member.name] = content.read()
    named = manifest[0].get("Config") if manifest else None
    if named not in candidates:
        raise SettleFailed("the engine's `docker save` stream held no image config")
    return json.loads(candidates[named])


# A history entry of an instruction that ran no command (`#(nop) ` and other than COPY or ADD): it wrote no layer.
METADATA_ONLY = re.compile(r"#\(nop\)\s+(?!COPY\b|ADD\b)[A-Z]+\b", re.ASCII)


_BASE_CONFIGS: dict[str, dict] = {}  # by image id: a config never changes under its id


def engine_config(api: docker.APIClient, image_id: str, base: str) -> dict | None:
    """The config of a classic build's image, as `docker save` would give it, from the engine's inspect and history
    and the base's own config (a save of the base alone: a small image), without saving the image: Docker 20.10
    writes a save into a folder on its disk before it streams it, the whole image again (issue 58: a CUDA row's
    6 GB). The history's empty_layer flags are read from what each step is: a metadata-only instruction wrote no
    layer, and a command that wrote a layer of no bytes is told from one that changed nothing by the count of layers.
    None where the count does not add up, or the image is not one the classic builder made on the base: the caller
    then saves it. (BuildKit's inline cache is in no inspect field: its builds are saved.)"""
    inspected = api.inspect_image(image_id)
    base_id = api.inspect_image(base)["Id"]
    if base_id not in _BASE_CONFIGS:  # every row of a run builds on one or two bases
        _BASE_CONFIGS[base_id] = saved_config(api.get_image(base_id))
    base_config = _BASE_CONFIGS[base_id]
    base_history = base_config.get("history", [])
    diff_ids = inspected["RootFS"]["Layers"]
    base_layers = base_config["rootfs"]["diff_ids"]
    history = list(reversed(api.history(image_id)))
    if diff_ids[:len(base_layers)] != base_layers or len(history) < len(base_history):
        return None
    ours = [{"created_by": entry.get("CreatedBy") or "", "comment": entry.get("Comment") or "",
             "size": entry.get("Size") or 0, "created": entry.get("Created")} for entry in history[len(base_history):]]
    writes = [not METADATA_ONLY.search(entry["created_by"]) for entry in ours]
    layers = len(diff_ids) - len(base_layers)
    if sum(writes) > layers:  # a command that changed nothing: the builder marked it empty_layer
        writes = [wrote and (entry["size"] > 0 or "#(nop)" in entry["created_by"])
                  for wrote, entry in zip(writes, ours, strict=True)]
    if sum(writes) != layers:
        return None
    entries = []
    for entry, wrote in zip(ours, writes, strict=True):
        made = {"created": iso_time(entry["created"]) if isinstance(entry["created"], int) else "",
                "created_by": entry["created_by"]}
        if entry["comment"]:
            made["comment"] = entry["comment"]
        if not wrote:
            made["empty_layer"] = True
        entries.append(made)
    config = {"architecture": inspected["Architecture"], "os": inspected["Os"], "config": inspected.get("Config") or {},
              "created": inspected.get("Created", ""), "history": base_history + entries,
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    for key, field in (("author", "Author"), ("variant", "Variant"), ("os.version", "OsVersion")):
        if inspected.get(field):
            config[key] = inspected[field]
    return config


def stored_config(api: docker.APIClient, image_id: str) -> dict | None:
    """The config as the engine keeps it, read from its image store where this host can read that folder (a local
    engine and a user who may read its root folder: root on a CI runner, as the project's own engine). An image's id
    is the sha256 of its config, so the file named by the id is checked against it, never trusted. This is the only
    read of a BuildKit build's config short of a save: its inline cache is in no inspect field. None where the folder
    is not this host's or not readable, the engine keeps images elsewhere (the containerd image store) or the file is
    not the config: the caller reads it another way."""
    matched = FULL_IMAGE_ID.fullmatch(image_id)
    info = api.info()
    root, driver = info.get("DockerRootDir"), info.get("Driver")
    if not matched or not isinstance(root, str) or not isinstance(driver, str):
        return None
    path = Path(root) / "image" / driver / "imagedb" / "content" / "sha256" / matched.group(1)
    try:
        with open(path, "rb") as stored:
            content = stored.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    if hashlib.sha256(content).hexdigest() != matched.group(1):
        return None
    try:
        config = json.loads(content)
    except ValueError:
        return None
    return config if isinstance(config, dict) and isinstance(config.get("rootfs"), dict) else None


def base_entries(api: docker.APIClient, base: str) -> int:
    """How many history entries an image built FROM base takes from it (`docker history` lists one per entry)."""
    return len(api.history(base))


def settle_image(api: docker.APIClient, image_id: str, name: str, created: str, from_base: int,
                 classic_base: str | None = None) -> str:
    """Rewrite the config of the image built (see the module's doc) and tag the result name; its id. from_base: the
    number of history entries that are its base's (base_entries). classic_base: the base of a classic build, whose
    config can be read without saving the image where the engine's store cannot (engine_config). A save is the last
    way: Docker 20.10 writes the whole image into a folder on its disk before it streams it (issue 58)."""
    config = stored_config(api, image_id) \
        or (engine_config(api, image_id, classic_base) if classic_base else None) \
        or saved_config(api.get_image(image_id))
    settled = config_bytes(settled_config(config, created, from_base))
    for answer in api.load_image(load_archive(settled, len(config["rootfs"]["diff_ids"]), name)):
        if isinstance(answer, dict) and answer.get("error"):
            raise SettleFailed(f"the engine did not load the settled config of {image_id}: {answer['error']}")
    return f"sha256:{hashlib.sha256(settled).hexdigest()}"


class ChunkReader(io.RawIOBase):
    """A file over an iterator of byte chunks (docker-py's streamed response), for tarfile's stream mode."""

    def __init__(self, chunks):
        self._chunks, self._rest = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._rest:
            self._rest = next(self._chunks, b"")
            if not self._rest:
                return 0
        size = min(len(buffer), len(self._rest))
        buffer[:size], self._rest = self._rest[:size], self._rest[size:]
        return size
