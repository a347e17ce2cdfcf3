"""bases.lock.json: the base images pinned by digest (or, for local-only bases, by image id).

Kept apart from the `lock` command so that rendering can read pins without the engine-facing code.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import atomic_write_json, brief, read_json_document
from ..invocation import command
from ..reporting import DIGEST, DIGEST_RULE, Shape, require_schema

LOCK_NAME = "bases.lock.json"
SCHEMA = 1
LOCAL_ONLY_NOTE = ("no registry digest: the engine's copy was made locally (e.g. by debootstrap), so it is pinned "
                   "by image id; this pin holds on this engine only")
SOURCES = ("registry", "local-copy", "local-only")
# A conservative Docker reference, [host[:port]/]name[:tag]: the key is written into Dockerfiles, so no whitespace,
# quotes or anything else a reference cannot hold gets through.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                        r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?")
MAX_IMAGE_NAME = 255


@dataclass(frozen=True)
class LockedBase:
    image: str
    digest: str | None  # registry manifest digest; None for a local-only base
    image_id: str | None  # the engine's copy, which builds use
    source: str  # registry | local-copy | local-only
    note: str
    resolved_at: str

    @property
    def pin(self) -> str:
        """What identifies this base's bits: its digest, else (local-only) its image id."""
        return self.digest or self.image_id or ""

    @property
    def reference(self) -> str:
        """How a Dockerfile names the pinned base: image@digest where one exists."""
        return f"{repository_of(self.image)}@{self.digest}" if self.digest else self.image


def repository_of(image: str) -> str:
    """'nvidia/cuda:13.0.2-base-ubuntu24.04' -> 'nvidia/cuda' (a registry port is not a tag)."""
    name, _, tag = image.rpartition(":")
    return name if name and "/" not in tag else image


def read_lock(path: Path) -> dict[str, LockedBase]:
    """The pins in path (none when there is no lock yet); anything damaged is an InputError naming every bad entry."""
    recover = f"restore it with `git checkout -- {path}`, or delete it and run {command('lock')}"
    document = read_json_document(path, recover, default=None)
    if document is None:
        return {}
    require_schema(document, SCHEMA, path, "a lock file", recover)
    shape = Shape("lock")
    if shape.document(document, dict) and shape.fits(document.get("bases"), dict, ("bases",)):
        for image, entry in document["bases"].items():
            if not IMAGE_NAME.fullmatch(image) or len(image) > MAX_IMAGE_NAME:
                shape.wrong(("bases", image), "is not a base image name such as debian:bookworm or "
                                              "nvidia/cuda:13.0.2-base-ubuntu24.04")
            if shape.fits(entry, LockedBase, ("bases", image)):
                check_entry(shape, image, entry)
    shape.raise_if_wrong(path, recover)
    return {image: LockedBase(**entry) for image, entry in document["bases"].items()}


def check_entry(shape: Shape, image: str, entry: dict) -> None:
    """What is wrong with one lock entry of the right types: what renders into a Dockerfile must be a digest."""
    keys = ("bases", image)
    if entry["image"] != image:
        shape.wrong((*keys, "image"), f"must repeat the entry's name, not {brief(entry['image'])}")
    for name in ("digest", "image_id"):
        if entry[name] is not None and not DIGEST.fullmatch(entry[name]):
            shape.wrong((*keys, name), f"must be {DIGEST_RULE}, not {brief(entry[name])}")
    if entry["digest"] is None and entry["image_id"] is None:
        shape.wrong(keys, "pins nothing: it has neither a digest nor an image id")
    if entry["source"] not in SOURCES:
        shape.wrong((*keys, "source"), f"must be one of {', '.join(SOURCES)}, not {brief(entry['source'])}")


def write_lock(path: Path, bases: dict[str, LockedBase]) -> None:
    atomic_write_json(path, {"schema": SCHEMA, "bases": {image: asdict(bases[image]) for image in sorted(bases)}})
