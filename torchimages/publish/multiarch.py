"""One tag for every machine a row is built for: an OCI image index (a manifest list) over its per-arch images.

A row with `arch: [x86_64, aarch64]` makes one image per machine; each is published under a tag of its own (its
per-arch tag, which a user pins one architecture with), and the row's tag is an image index naming both digests with
their platforms, as NVIDIA's and Docker Hub's official multi-arch tags are: `docker pull TAG` on each machine gets its
own image. The x86_64 image's tag is the row's tag (the amd64-only past), so within a multi-arch row it is published
as <tag>-amd64 and the row's tag (and its aliases) go to the index.

Pinned tags follow the tags they date: an image is pinned as <its own tag>-<YYYYMMDD> (<tag>-amd64-<YYYYMMDD>,
<tag>-arm64-<YYYYMMDD>), and the index as <tag>-<YYYYMMDD>, so a pin of the row's tag is multi-arch as the tag is.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..files import brief
from ..model import ImageSpec
from ..redaction import inert
from ..reporting import DIGEST, DIGEST_RULE

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# What a multi-arch tag resolves to: OCI's index, or Docker's manifest list (what `docker buildx` and older tools push).
INDEX_TYPES = (INDEX_MEDIA_TYPE, "application/vnd.docker.distribution.manifest.list.v2+json")
# An index of ours names one image per machine of a row; `verify-image --platform all` checks every member (its
# signature, attestations and bundles: a few seconds each), so an index naming more is refused, not walked for hours.
MAX_INDEX_ENTRIES = 64
MAX_PLATFORM_NAME = 64  # os/architecture[/variant] is a few words; a longer name is cut where it is shown


@dataclass(frozen=True)
class Member:
    """One architecture's image in an index, as the registry stores it."""

    platform: str  # os/architecture, e.g. linux/arm64
    tag: str  # its per-arch tag
    digest: str
    media_type: str
    size: int  # bytes of its manifest

    def to_json(self) -> dict:
        return {"tag": self.tag, "digest": self.digest}


def groups(specs: list[ImageSpec]) -> dict[str, list[ImageSpec]]:
    """The rows among specs built for more than one machine: their tag -> each machine's spec, in matrix order."""
    by_tag: dict[str, list[ImageSpec]] = {}
    for spec in specs:
        by_tag.setdefault(spec.index_tag or spec.tag, []).append(spec)
    return {tag: members for tag, members in by_tag.items() if len({member.arch for member in members}) > 1}


def arch_tag(spec: ImageSpec) -> str:
    """The tag of one machine's image of a multi-arch row: its own tag, or <tag>-amd64 where that is the row's."""
    return f"{spec.tag}-{spec.platform.split('/')[1]}" if spec.tag == spec.index_tag else spec.tag


def own_tag(spec: ImageSpec, in_group: bool) -> str:
    """The tag an image's pinned tags are dated from: its per-arch tag within a multi-arch row, whose own tag (and
    its dated tags) name the index."""
    return arch_tag(spec) if in_group else spec.tag


def image_tags(spec: ImageSpec, in_group: bool) -> list[str]:
    """The floating tags one image is published under, its own tag first. In a multi-arch row the row's tag and
    unsuffixed aliases name the index (index_tags), so the x86_64 image keeps only its per-arch tag; the others keep
    their suffixed aliases."""
    if not in_group:
        return [spec.tag, *spec.aliases]
    return [own_tag(spec, in_group), *(() if spec.tag == spec.index_tag else spec.aliases)]


def index_tags(members: list[ImageSpec]) -> list[str]:
    """The tags the index is published under: the row's tag and the aliases its x86_64-named image would have had."""
    own = next((spec for spec in members if spec.tag == spec.index_tag), members[0])
    return [own.index_tag or own.tag, *(own.aliases if own.tag == own.index_tag else ())]


def index_body(members: list[Member]) -> bytes:
    """The image index naming each member with its platform (deterministic: the same members give the same digest)."""
    manifests = []
    for member in members:
        os_name, architecture = member.platform.split("/")[:2]
        manifests.append({"mediaType": member.media_type, "digest": member.digest, "size": member.size,
                          "platform": {"architecture": architecture, "os": os_name}})
    return json.dumps({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests},
                      separators=(",", ":")).encode()


def platforms_of(body: bytes) -> dict[str, str]:
    """An index's members as {os/architecture: digest} (what `skopeo inspect --raw` shows); {} for anything else.
    An index is a peer's unsigned word until its members are checked: its platform names are made inert (they are
    printed), and a ValueError says why one is no index to check member by member: more than MAX_INDEX_ENTRIES
    manifests (`verify-image --platform all` checks each), or a member whose digest is not a sha256 digest."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    manifests = document.get("manifests") if isinstance(document, dict) else None
    if not isinstance(manifests, list):
        return {}
    if len(manifests) > MAX_INDEX_ENTRIES:
        raise ValueError(f"an index naming {len(manifests)} manifests, more than any multi-arch tag "
                         f"({MAX_INDEX_ENTRIES})")
    members = {}
    for entry in manifests:
        if isinstance(entry, dict) and isinstance(entry.get("platform"), dict):
            digest = entry.get("digest")
            if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
                raise ValueError(f"an index member whose digest is {brief(digest)}, not {DIGEST_RULE}")
            members[_platform_name(entry["platform"])] = digest
    return members


def _platform_name(platform: dict) -> str:
    """os/architecture as an index names it, one inert line of at most MAX_PLATFORM_NAME characters."""
    name = inert(f"{platform.get('os')}/{platform.get('architecture')}")
    return name if len(name) <= MAX_PLATFORM_NAME else name[:MAX_PLATFORM_NAME] + "..."


def member_digests(body: bytes) -> set[str]:
    """The digests an index names, whatever their platforms; empty for anything that is not an index."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return set()
    manifests = document.get("manifests") if isinstance(document, dict) else None
    if not isinstance(manifests, list):
        return set()
    return {m["digest"] for m in manifests if isinstance(m, dict) and isinstance(m.get("digest"), str)}
