"""Base pinning: resolve every base image to a digest in bases.lock.json, and notice when one moves.

A base that came from a registry is pinned by its manifest digest (the registry's current one when it answers,
otherwise the one the engine's copy was pulled as). A base that only exists on this engine (debian:bookworm built
by debootstrap has no registry digest) is pinned by image id, and the lock says so. When the registry has a newer
digest than the engine's copy, refreshing pulls it: the builder hashes the base's image id into each row's inputs,
so exactly the rows on a moved base rebuild. `nightly` resolves without pulling: a fresh runner pulls a base only for
the rows it builds.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import docker
import docker.errors

from ..invocation import offline_base
from ..model import ImageSpec, TorchImagesError
from ..peers import engine
from ..peers.registry import RegistryClient, RegistryError, RetryPolicy
from ..peers.registry_access import RegistryAccess, registry_access
from ..peers.registry_address import Registry, image_registry
from ..redaction import redact
from ..reporting import utc_timestamp
from .bases_lock import LOCAL_ONLY_NOTE, LockedBase


@dataclass(frozen=True)
class BaseChange:
    image: str
    before: str  # the old pin ("" when the base is new to the lock)
    after: str
    rows: tuple[str, ...]


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
    Registry digests are read with skopeo, logging in and trusting CAs as publishing does (see peers/registry.py)."""

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
                try:
                    self.client.images.pull(image)
                except docker.errors.APIError as error:
                    raise UnresolvedBase(f"the engine could not pull {remote}: {redact(str(error))}") from None
                local = engine.inspect_image(self.client, image)
            engine_copy = local["Id"] if local is not None and remote in _digests(local) else None
            return LockedBase(image, remote, engine_copy, "registry", "", now)
        if local is not None:
            return LockedBase(image, _digests(local)[0], local["Id"], "local-copy",
                              f"registry not reachable ({reason}): pinned the digest the engine's copy was pulled as", now)
        raise UnresolvedBase(f"not on the engine, and its registry does not answer ({reason}): "
                             f"`docker pull {image}` where the registry is reachable, or {offline_base()}")

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


class UnresolvedBase(TorchImagesError):
    """A base image neither the registry nor the engine could pin."""


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
