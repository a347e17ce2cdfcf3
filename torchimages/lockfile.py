"""bases.lock.json: the base images pinned by digest (or, for local-only bases, by image id).

Kept apart from the `lock` command so that rendering can read pins without the engine-facing code.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import atomic_write_json
from .model import InputError, Problem

LOCK_NAME = "bases.lock.json"
SCHEMA = 1
LOCAL_ONLY_NOTE = ("no registry digest: the engine's copy was made locally (e.g. by debootstrap), so it is pinned "
                   "by image id; this pin holds on this engine only")


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
    recover = f"restore it with `git checkout -- {path}`, or delete it and run `python build.py lock`"
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as error:
        raise InputError([Problem(str(path), error.lineno, f"not valid JSON ({error.msg}): {recover}")]) from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise InputError([Problem(str(path), 1, f"not a lock file of schema {SCHEMA}: {recover}")])
    try:
        return {image: LockedBase(**entry) for image, entry in document.get("bases", {}).items()}
    except TypeError as error:
        raise InputError([Problem(str(path), 1, f"an entry does not have the lock's fields ({error}): {recover}")]) from None


def write_lock(path: Path, bases: dict[str, LockedBase]) -> None:
    atomic_write_json(path, {"schema": SCHEMA, "bases": {image: asdict(bases[image]) for image in sorted(bases)}})
