"""`prune`: each row's dated tags beyond the newest N deleted from the registry, with their signatures and
attestations, and forgotten in the catalog. A registry deletes a manifest with all its tags, so what a kept tag also
names stays: the plan is pure (prune_plan), the deleting is prune()."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..model import ImageSpec
from ..peers.registry import Manifest, RegistryClient
from ..trust.referrers import ReferrerStore
from ..trust.signatures import SignatureStore
from . import catalog_page, multiarch
from .catalog import (
    SIGNATURE_TAG,
    catalog_file,
    forget_pinned,
    load_catalog,
    require_folder,
    require_sbom_folder,
)
from .publisher import DATED_TAG, dated_tags


def pinned_stems(rows: list[ImageSpec]) -> list[str]:
    """The tags whose dated tags pruning keeps `retention` of: each row's tag (a multi-arch row's index, else its
    image) and each per-arch tag (multiarch.own_tag: a multi-arch row's x86_64 image is pinned as <tag>-amd64-<date>)."""
    return sorted({name for spec in rows for name in (spec.tag, multiarch.arch_tag(spec))})


def prune_lookups(rows: list[ImageSpec], matrix: list[ImageSpec], all_tags: list[str], retention: int) -> list[str]:
    """The tags whose manifests pruning rows must read: none when no row has a dated tag past retention; else the
    rows' own tags (dated, floating, aliases) and the tags no matrix row writes (a tag pushed by hand may name an
    old digest). Other rows' tags are not read: each row's images carry its own labels, so they never share a digest
    with another row's."""
    dated_by_stem = {stem: dated_tags(stem, all_tags) for stem in pinned_stems(rows)}
    if not any(names[retention:] for names in dated_by_stem.values()):
        return []
    # A multi-arch row's x86_64 image floats as <tag>-amd64 (multiarch.arch_tag): one of the row's own tags too.
    own = {name for spec in rows for name in (spec.tag, *spec.aliases, multiarch.arch_tag(spec))}
    own |= {name for names in dated_by_stem.values() for name in names}
    written = {name for spec in matrix for name in (spec.tag, *spec.aliases, multiarch.arch_tag(spec))}

    def is_foreign(tag: str) -> bool:
        dated = DATED_TAG.fullmatch(tag)
        # A signature's or attestation's tag names no image: prune removes it with the digest it is about.
        return tag not in written and not (dated and dated.group(1) in written) and not SIGNATURE_TAG.fullmatch(tag)

    present = set(all_tags)
    return sorted({name for name in own if name in present} | {tag for tag in all_tags if is_foreign(tag)})


def index_members(manifests: dict[str, Manifest]) -> dict[str, set[str]]:
    """The manifest lists among manifests (by tag): each list's digest -> the digests it names."""
    listed = {manifest.digest: multiarch.member_digests(manifest.body) for manifest in manifests.values()}
    return {digest: members for digest, members in listed.items() if members}


@dataclass(frozen=True)
class PrunePlan:
    delete: dict[str, list[str]]  # digest -> the dated tags that go with it; manifest lists before images
    kept_shared: dict[str, str]  # dated tag past retention -> a kept tag naming the same digest
    kept_in_index: dict[str, str]  # dated tag past retention -> a kept tag of a manifest list naming its digest


def prune_plan(stems: list[str], tag_digests: dict[str, str], retention: int,
               members: dict[str, set[str]]) -> PrunePlan:
    """Which digests to delete so that each stem (pinned_stems) keeps its `retention` newest dated tags.

    A registry deletes a manifest together with all its tags, so a digest that any kept tag also names (a floating
    tag, an alias, another row's tag) stays, and its old dated tag with it. A manifest list that stays keeps the
    images it names (members: list digest -> theirs), which would otherwise leave it naming manifests the registry
    no longer has; lists go first, so that a failure part-way never leaves one naming a deleted image.
    """
    doomed = {name for stem in stems for name in dated_tags(stem, list(tag_digests))[retention:]}
    kept_by_digest = {digest: tag for tag, digest in sorted(tag_digests.items()) if tag not in doomed}
    kept_by_index = {member: kept_by_digest[digest] for digest, listed in sorted(members.items())
                     if digest in kept_by_digest for member in sorted(listed)}
    delete: dict[str, list[str]] = {}
    kept_shared: dict[str, str] = {}
    kept_in_index: dict[str, str] = {}
    for name in sorted(doomed):
        digest = tag_digests[name]
        if digest in kept_by_digest:
            kept_shared[name] = kept_by_digest[digest]
        elif digest in kept_by_index:
            kept_in_index[name] = kept_by_index[digest]
        else:
            delete.setdefault(digest, []).append(name)
    lists_first = sorted(delete.items(), key=lambda item: (item[0] not in members, item[0]))
    return PrunePlan(dict(lists_first), kept_shared, kept_in_index)


@dataclass
class PruneResult:
    removed: list[str] = field(default_factory=list)
    kept_shared: dict[str, str] = field(default_factory=dict)


def prune(registry: RegistryClient, rows: list[ImageSpec], matrix: list[ImageSpec], retention: int, catalog_dir: Path,
          images_dir: Path, log: Callable[[str], None]) -> PruneResult:
    """Delete each row's dated tags beyond the `retention` newest (a multi-arch row's: its index's and each image's),
    and forget them (and their SBOMs) in the catalog.
    Reads the manifests of the tags that matter to these rows only (prune_lookups), not of the whole repository."""
    # Read and check before anything is deleted: a damaged catalog stops the run with the registry untouched.
    catalog = load_catalog(catalog_file(catalog_dir))
    require_folder(images_dir, "the images folder (--images DIR)")
    require_sbom_folder(catalog_dir)
    manifests = registry.tag_manifests(prune_lookups(rows, matrix, registry.tags(), retention))
    tag_digests = {tag: manifest.digest for tag, manifest in manifests.items()}
    plan = prune_plan(pinned_stems(rows), tag_digests, retention, index_members(manifests))
    for name, kept in sorted(plan.kept_shared.items()):
        log(f"keeping {name}: its digest is also tagged {kept}")
    for name, index in sorted(plan.kept_in_index.items()):
        log(f"keeping {name}: the manifest list {index}, which stays, names its digest")
    result = PruneResult(kept_shared=plan.kept_shared)
    signatures, bundles = SignatureStore(registry), ReferrerStore(registry)
    try:
        for digest, names in plan.delete.items():
            # Its signatures and attestations first, in both formats: a failure part-way leaves a signed image, never
            # an orphan.
            for artifact in [*signatures.remove(digest), *bundles.remove(digest)]:
                log(f"deleted {artifact}")
            registry.delete(digest)
            log(f"deleted {', '.join(names)} ({digest})")
            result.removed += names
    finally:
        # Also after a failure part-way: the catalog must not list tags that are gone.
        if result.removed:
            forget_pinned(catalog, set(result.removed), catalog_dir)
            catalog_page.save(catalog, catalog_dir, images_dir)
    result.removed.sort()
    return result
