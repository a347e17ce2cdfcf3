"""Base pinning: resolve every base image to a digest in bases.lock.json, and notice when one moves.

A base that came from a registry is pinned by its manifest digest (the registry's current one when it answers,
otherwise the one the engine's copy was pulled as). A base that only exists on this engine (debian:bookworm built
by debootstrap has no registry digest) is pinned by image id, and the lock says so. When the registry has a newer
digest than the engine's copy, refreshing pulls it: the builder hashes the base's image id into each row's inputs,
so exactly the rows on a moved base rebuild. `nightly` resolves without pulling: a fresh runner pulls a base only for
the rows it builds.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from . import engine
from .lockfile import LOCAL_ONLY_NOTE, LockedBase, read_lock, write_lock
from .model import ImageSpec
from .project import EXIT_FAILED, EXIT_OK, Project, add_selectors
from .registry import (
    Registry,
    RegistryAccess,
    RegistryClient,
    RegistryError,
    RetryPolicy,
    image_registry,
    registry_access,
)
from .reporting import utc_timestamp


@dataclass(frozen=True)
class BaseChange:
    image: str
    before: str  # the old pin ("" when the base is new to the lock)
    after: str
    rows: tuple[str, ...]


def lock_path(project: Project) -> Path:
    return project.lock_file


def changes(before: dict[str, LockedBase], after: dict[str, LockedBase], specs: list[ImageSpec]) -> list[BaseChange]:
    """Bases whose pin moved (or that are new to the lock), with the rows built on them."""
    moved = []
    for image in sorted(after):
        old = before.get(image)
        if old is None or old.pin != after[image].pin:
            rows = tuple(spec.tag for spec in specs if spec.base_image == image)
            moved.append(BaseChange(image, old.pin if old else "", after[image].pin, rows))
    return moved


class Resolver:
    """Resolves bases on one engine; pulls a base whose registry digest is newer than the engine's copy if asked.
    Registry digests are read with skopeo, logging in and trusting CAs as publishing does (see registry.py)."""

    def __init__(self, docker_client: docker.DockerClient, pull: bool, log=lambda message: None,
                 access=registry_access):
        self.client = docker_client
        self.pull = pull
        self.log = log
        self.access: Callable[[Registry], RegistryAccess] = access

    def resolve(self, image: str) -> LockedBase:
        """The lock entry for image; UnresolvedBase when neither the engine nor a registry knows it."""
        now = utc_timestamp()
        local = engine.inspect_image(self.client, image)
        if local is not None and not local.get("RepoDigests"):
            return LockedBase(image, None, local["Id"], "local-only", LOCAL_ONLY_NOTE, now)
        remote, reason = self._registry_digest(image)
        if remote is not None:
            if self.pull and (local is None or remote not in _digests(local)):
                self.log(f"{image}: pulling {remote}")
                self.client.images.pull(image)
                local = engine.inspect_image(self.client, image)
            engine_copy = local["Id"] if local is not None and remote in _digests(local) else None
            return LockedBase(image, remote, engine_copy, "registry", "", now)
        if local is not None:
            return LockedBase(image, _digests(local)[0], local["Id"], "local-copy",
                              f"registry not reachable ({reason}): pinned the digest the engine's copy was pulled as", now)
        raise UnresolvedBase(f"not on the engine, and its registry does not answer ({reason}): "
                             f"`docker pull {image}` where the registry is reachable, or `make engine` for seeded bases")

    def _registry_digest(self, image: str) -> tuple[str | None, str]:
        registry, reference = image_registry(image)
        client = RegistryClient(registry, self.access(registry), RetryPolicy(retries=1), self.log)
        try:
            digest = client.digest_of(reference)
        except RegistryError as error:
            return None, str(error)
        return (digest, "") if digest else (None, f"{registry.name} has no {reference}")


def _same_pin(first: LockedBase, second: LockedBase) -> bool:
    """The same bits from the same kind of source (an engine without a copy of the base does not move its pin)."""
    return (first.pin, first.source) == (second.pin, second.source)


def _digests(image: dict) -> list[str]:
    return [reference.partition("@")[2] for reference in image.get("RepoDigests") or []]


class UnresolvedBase(Exception):
    pass


@dataclass
class Refresh:
    bases: dict[str, LockedBase]  # the new lock: old entries of bases not refreshed, new ones of those that were
    changes: list[BaseChange]
    unresolved: dict[str, str]  # image -> why


def refresh(resolver: Resolver, specs: list[ImageSpec], current: dict[str, LockedBase], everything: bool) -> Refresh:
    """Resolve the bases of specs. With everything (all rows chosen), bases no row uses leave the lock."""
    images = sorted({spec.base_image for spec in specs})
    resolved, unresolved = {}, {}
    for image in images:
        try:
            fresh = resolver.resolve(image)
        except UnresolvedBase as error:
            unresolved[image] = str(error)
            continue
        # An unchanged base keeps its entry as it was, so an unchanged lock file is byte for byte the same.
        old = current.get(image)
        resolved[image] = old if old is not None and _same_pin(old, fresh) else fresh
    kept = {} if everything else {image: base for image, base in current.items() if image not in resolved}
    bases = {**kept, **{image: current[image] for image in unresolved if image in current}, **resolved}
    return Refresh(bases, changes(current, resolved, specs), unresolved)


# ------------------------------------------------------------------------------------------------------------- CLI

def cmd_lock(project: Project, args) -> int:
    specs = project.select(args.selectors)
    path = lock_path(project)
    current = read_lock(path)
    resolver = Resolver(engine.client(), pull=not args.check, log=lambda m: print(m, file=sys.stderr))
    result = refresh(resolver, specs, current, everything=not args.selectors)
    for image in sorted({spec.base_image for spec in specs}):
        base = result.bases.get(image)
        if image in result.unresolved:
            print(f"unresolved  {image}: {result.unresolved[image]}")
        else:
            print(f"{base.source:11} {image} -> {base.pin}" + (f"  ({base.note})" if base.note else ""))
    for change in result.changes:
        print(f"{'new' if not change.before else 'moved'}: {change.image} {change.before or '-'} -> {change.after}; "
              f"rows on it: {', '.join(change.rows)}")
    if args.check:
        stale = bool(result.changes) or set(result.bases) != set(current)
        print(f"{path} is {'stale: run `python build.py lock`' if stale else 'up to date'}")
        return EXIT_FAILED if stale or result.unresolved else EXIT_OK
    write_lock(path, result.bases)
    print(f"wrote {path} ({len(result.bases)} bases, {len(result.changes)} changed)")
    return EXIT_FAILED if result.unresolved else EXIT_OK


def add_commands(commands) -> None:
    locking = commands.add_parser("lock", help="pin every base image to a digest in bases.lock.json")
    add_selectors(locking, default="the bases of every row")
    locking.add_argument("--check", action="store_true", help="exit 1 if a base moved since the lock; write nothing")
    locking.set_defaults(handler=cmd_lock)
