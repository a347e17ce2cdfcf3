"""catalog.json: what is published where, by digest; and images/README.md, the table developers pull from.

The catalog lives in its own folder (default: catalog/ beside images/) with the SBOM of every pinned tag in
catalog/sbom/. It is rewritten atomically after each published row, so an interrupted publish leaves the previous
catalog plus the rows that were completely published, never half a row.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..build.builder import INPUT_HASH_LABEL
from ..files import (
    atomic_write,
    atomic_write_json,
    brief,
    folder_problems,
    inside,
    read_json_document,
    read_text,
    remove_file,
)
from ..invocation import command
from ..model import ImageSpec, InputError, Problem
from ..peers.registry import RegistryClient, RegistryError, RetryPolicy
from ..peers.registry_access import AccessSettings
from ..peers.registry_address import parse_registry
from ..project import Project
from ..redaction import inert
from ..reporting import DIGEST, TAG, Shape, require_schema, utc_timestamp
from ..security.sbom import SBOM_DIR
from ..trust.keys import PublicKey
from ..trust.signing import load_public_key

CATALOG_NAME = "catalog.json"
README_NAME = "README.md"
KEYS_DIR = "keys"  # the catalog folder's public keys, which the page links to
SCHEMA = 1
# What an SBOM path may hold: sbom/<pinned tag>.cdx.json is what publish writes; nothing that needs quoting or escaping.
SBOM_PATH = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
PREDICATE_TYPE = re.compile(r"https://[A-Za-z0-9._/-]+", re.ASCII)
SBOM_RULE = "must be a relative path inside the catalog folder, like sbom/<pinned tag>.cdx.json"
SIGNATURE_TAG = re.compile(r"sha256-[0-9a-f]{64}\.(?:sig|att)", re.ASCII)
REFERRERS_TAG = re.compile(r"sha256-[0-9a-f]{64}", re.ASCII)  # the referrers tag schema's index of the bundles


@dataclass
class PinnedTag:
    tag: str
    digest: str
    date: str  # YYYY-MM-DD the digest was first published under this tag
    sbom: str  # path relative to the catalog folder


@dataclass
class PinnedIndex:
    """One dated tag of a multi-arch tag's index; no SBOM: an index is no build of its own, its images have theirs."""

    tag: str
    digest: str
    date: str  # YYYY-MM-DD the index was first published under this tag


@dataclass
class CatalogEntry:
    tag: str
    repository: str
    digest: str  # what the floating tag and aliases name
    image_id: str
    pinned: list[PinnedTag]  # newest first; pinned[0] names `digest`, older ones are kept until pruned
    floating: list[str]  # the row's tag and its aliases
    versions: dict[str, str]
    size: int  # bytes unpacked (as `docker images` shows)
    download_size: int  # compressed bytes a pull transfers
    checks: dict  # verification: counts by status, skipped checks with reasons, verified_at
    scan: dict
    sbom: str  # SBOM of `digest`, relative to the catalog folder
    published_at: str  # when `digest` was first published
    updated_at: str
    deprecated: str | None = None
    # Entries written before these fields existed lack them; an entry without an input hash is never taken as current.
    input_hash: str = ""  # the builder's hash of everything the image was built from (its label too)
    platform: str = ""  # os/architecture[/variant], e.g. linux/amd64
    verified_on: dict = field(default_factory=dict)  # host kind (cpu-only | gpu), GPU models, driver, checks ran/skipped
    # Who signed `digest` ({} when published unsigned): the keys' fingerprints (their PEM files in catalog/keys/),
    # the signature and attestation tags, the attestations' predicate types.
    signing: dict = field(default_factory=dict)

    def pull_pinned(self) -> str:
        return f"{self.repository}:{self.pinned[0].tag}"

    def pull_digest(self) -> str:
        return f"{self.repository}@{self.digest}"

    @classmethod
    def from_json(cls, data: dict) -> CatalogEntry:
        """The entry from data of the right shape (see check_entry)."""
        values = {item.name: data[item.name] for item in dataclasses.fields(cls) if item.name in data}
        values["pinned"] = [PinnedTag(**pinned) for pinned in values["pinned"]]
        return cls(**values)


@dataclass
class ManifestList:
    """A multi-arch row's tag: the image index over its per-arch images, each also an entry of `images`."""

    tag: str
    repository: str
    digest: str  # the index's: `docker pull` of it on each machine gets that machine's image
    floating: list[str]  # the row's tag and its aliases
    platforms: dict[str, dict]  # os/architecture -> {"tag": the per-arch tag, "digest": its image, "image": its entry}
    updated_at: str
    # Who signed `digest` ({} when published unsigned): the keys' fingerprints and the signature tag. `cosign verify`
    # and admission controllers resolve the row's tag to this digest; the attestations are its images'.
    signing: dict = field(default_factory=dict)
    # Newest first: pinned[0] names `digest` on every machine, older ones are kept until pruned. Catalogs written
    # before indexes had dated tags lack it (empty); the next publish of the row pins its index.
    pinned: list[PinnedIndex] = field(default_factory=list)

    def pull_digest(self) -> str:
        return f"{self.repository}@{self.digest}"

    @classmethod
    def from_json(cls, data: dict) -> ManifestList:
        """The manifest list from data of the right shape (see check_manifest_list)."""
        return cls(**{**data, "pinned": [PinnedIndex(**pinned) for pinned in data.get("pinned", [])]})


@dataclass
class Catalog:
    images: dict[str, CatalogEntry] = field(default_factory=dict)
    updated_at: str = ""
    manifest_lists: dict[str, ManifestList] = field(default_factory=dict)

    def to_json(self) -> dict:
        document = {"schema": SCHEMA, "updated_at": self.updated_at,
                    "images": {tag: dataclasses.asdict(self.images[tag]) for tag in sorted(self.images)}}
        if self.manifest_lists:  # a catalog of single-arch rows reads as it always did
            document["manifest_lists"] = {tag: dataclasses.asdict(self.manifest_lists[tag])
                                          for tag in sorted(self.manifest_lists)}
        return document


def default_dir(project: Project) -> Path:
    return project.images.parent / "catalog"


def catalog_file(catalog_dir: Path) -> Path:
    return catalog_dir / CATALOG_NAME


def load_catalog(path: Path) -> Catalog:
    """The catalog at path (empty when there is none yet); a damaged one is an InputError naming every bad entry
    and saying how to recover."""
    recover = f"restore it with `git checkout -- {path}`, or delete it to start an empty catalog"
    require_folder(path.parent, "the catalog folder (--catalog DIR)")
    document = read_json_document(path, recover, default=None)
    if document is None:
        return Catalog()
    require_schema(document, SCHEMA, path, "a torchimages catalog", recover)
    shape = Shape("catalog")
    if (shape.document(document, dict) and shape.fits(document.get("updated_at", ""), str, ("updated_at",))
            and shape.fits(document.get("images"), dict, ("images",))):
        for tag, entry in document["images"].items():
            if shape.fits(entry, CatalogEntry, ("images", tag)):
                check_entry(shape, path.parent, tag, entry)
        if shape.fits(document.get("manifest_lists", {}), dict, ("manifest_lists",)):
            for tag, entry in document.get("manifest_lists", {}).items():
                if shape.fits(entry, ManifestList, ("manifest_lists", tag)):
                    check_manifest_list(shape, tag, entry)
    shape.raise_if_wrong(path, recover)
    images = {tag: CatalogEntry.from_json(entry) for tag, entry in document["images"].items()}
    lists = {tag: ManifestList.from_json(entry) for tag, entry in document.get("manifest_lists", {}).items()}
    return Catalog(images, document.get("updated_at", ""), lists)


def check_manifest_list(shape: Shape, tag: str, entry: dict) -> None:
    """A manifest list's names and digests go into pull commands and Markdown, as an image entry's do."""
    keys = ("manifest_lists", tag)
    if not TAG.fullmatch(tag) or entry["tag"] != tag:
        shape.wrong(keys, "must be a Docker tag, repeated as its `tag`")
    if not _is_repository(entry["repository"]):
        shape.wrong((*keys, "repository"), f"must be HOST[:PORT]/REPO, not {brief(entry['repository'])}")
    names = [*entry["floating"], *(member.get("tag") for member in entry["platforms"].values()
                                   if isinstance(member, dict))]
    digests = [entry["digest"], *(member.get("digest") for member in entry["platforms"].values()
                                  if isinstance(member, dict))]
    if not all(isinstance(name, str) and TAG.fullmatch(name) for name in names):
        shape.wrong((*keys, "floating"), "must list Docker tags (and each platform a `tag:`)")
    if len(digests) != 1 + len(entry["platforms"]) or not all(isinstance(d, str) and DIGEST.fullmatch(d)
                                                              for d in digests):
        shape.wrong((*keys, "platforms"), "must map os/architecture to {tag:, digest: sha256:..., image:}")
    for index, pinned in enumerate(entry.get("pinned", [])):
        if not TAG.fullmatch(pinned["tag"]) or not DIGEST.fullmatch(pinned["digest"]):
            shape.wrong((*keys, "pinned", index), f"must be a Docker tag and a digest sha256: with 64 lower-case hex "
                                                  f"digits, not {brief(pinned['tag'])}, {brief(pinned['digest'])}")
    signing = entry.get("signing", {})
    # A manifest list signed before indexes were attested has a signature only.
    if "attestation" in signing:
        check_signing(shape, keys, signing)
    else:
        check_signed_by(shape, keys, signing)


def check_entry(shape: Shape, folder: Path, tag: str, entry: dict) -> None:
    """What is wrong with one catalog entry of the right types: names that go into pull commands and Markdown, and
    SBOM paths that files are copied to and deleted by."""
    keys = ("images", tag)
    if not TAG.fullmatch(tag):
        shape.wrong(keys, "is not a Docker tag")
    if entry["tag"] != tag:
        shape.wrong((*keys, "tag"), f"must repeat the entry's name, not {brief(entry['tag'])}")
    if not _is_repository(entry["repository"]):
        shape.wrong((*keys, "repository"), f"must be HOST[:PORT]/REPO, not {brief(entry['repository'])}")
    if not DIGEST.fullmatch(entry["digest"]):  # it goes into pull commands, and nightly compares the registry's with it
        shape.wrong((*keys, "digest"), f"must be sha256: and 64 lower-case hex digits, not {brief(entry['digest'])}")
    for index, name in enumerate(entry["floating"]):
        if not TAG.fullmatch(name):
            shape.wrong((*keys, "floating", index), f"must be a Docker tag, not {brief(name)}")
    if not entry["pinned"]:
        shape.wrong((*keys, "pinned"), "is empty: an entry names at least the pinned tag of its digest")
    for index, pinned in enumerate(entry["pinned"]):
        if not TAG.fullmatch(pinned["tag"]):
            shape.wrong((*keys, "pinned", index, "tag"), f"must be a Docker tag, not {brief(pinned['tag'])}")
        if not DIGEST.fullmatch(pinned["digest"]):
            shape.wrong((*keys, "pinned", index, "digest"), f"must be sha256: and 64 lower-case hex digits, not "
                                                            f"{brief(pinned['digest'])}")
        if not is_sbom_path(folder, pinned["sbom"]):
            shape.wrong((*keys, "pinned", index, "sbom"), f"{SBOM_RULE}, not {brief(pinned['sbom'])}")
    if not is_sbom_path(folder, entry["sbom"]):
        shape.wrong((*keys, "sbom"), f"{SBOM_RULE}, not {brief(entry['sbom'])}")
    check_signing(shape, keys, entry.get("signing", {}))


def check_signing(shape: Shape, keys: tuple, signing: dict) -> None:
    """What goes from an image entry's signing record into images/README.md's commands: fingerprints and tags."""
    if not signing:
        return
    # Classic tags, bundle referrers, or both (publish --signature-format): a record names what was written.
    check_signed_by(shape, keys, signing, ("signature", "attestation") if "referrers" not in signing or
                    "signature" in signing else ())
    if "referrers" in signing and not (isinstance(signing["referrers"], str)
                                       and REFERRERS_TAG.fullmatch(signing["referrers"])):
        shape.wrong((*keys, "signing", "referrers"), f"must be a tag sha256-<hex>, not {brief(signing['referrers'])}")
    types = signing.get("predicate_types")
    if not isinstance(types, list) or not all(isinstance(kind, str) and PREDICATE_TYPE.fullmatch(kind) for kind in types):
        shape.wrong((*keys, "signing", "predicate_types"), "must list predicate type URLs")


def check_signed_by(shape: Shape, keys: tuple, signing: dict, artifacts: tuple[str, ...] = ("signature",)) -> None:
    """The keys' fingerprints and the artifact tags of a signing record (a manifest list's has a signature only)."""
    if not signing:
        return
    fingerprints = signing.get("keys")
    if not isinstance(fingerprints, list) or not fingerprints or not all(
            isinstance(key, str) and DIGEST.fullmatch(key) for key in fingerprints):
        shape.wrong((*keys, "signing", "keys"), "must list the signing keys' fingerprints, sha256: and 64 hex digits")
    for name in artifacts:
        if not isinstance(signing.get(name), str) or not SIGNATURE_TAG.fullmatch(signing[name]):
            shape.wrong((*keys, "signing", name), f"must be a tag sha256-<hex>.sig/.att, not {brief(signing.get(name))}")


def is_sbom_path(folder: Path, relative: str) -> bool:
    """Whether relative names a file inside folder (as inside() decides) and holds nothing a link must escape."""
    if not SBOM_PATH.fullmatch(relative):
        return False
    try:
        inside(folder, relative, "")
    except InputError:
        return False
    return True


def _is_repository(name: str) -> bool:
    """Whether name is a registry repository publish could have pushed to (HOST[:PORT]/REPO)."""
    try:
        parse_registry(name)
    except InputError:
        return False
    return True


def require_sbom_folder(catalog_dir: Path) -> None:
    """Refuse a link or file where catalog/sbom/ belongs before a registry is changed: SBOMs are written (publish)
    or deleted (prune) there afterwards."""
    problems = folder_problems(catalog_dir / SBOM_DIR, catalog_dir) + folder_problems(catalog_dir / KEYS_DIR, catalog_dir)
    if problems:
        raise InputError(problems)


def require_folder(folder: Path, what: str) -> None:
    """Refuse a file where a folder belongs: read, it would pass for an empty folder; written to, it breaks the
    write half-way. A folder that does not exist yet is fine: writing makes it."""
    if os.path.lexists(folder) and not folder.is_dir():
        raise InputError([Problem(str(folder), 0, f"a file where {what} belongs: name a folder, or move the file away")])


def make_entry(spec: ImageSpec, repository: str, digest: str, image: dict, download_size: int, checks: dict,
               pinned: PinnedTag, previous: CatalogEntry | None, scan: dict | None, verified_on: dict,
               signed: dict, floating: list[str] | None = None) -> CatalogEntry:
    """The catalog entry for spec published as repository@digest, carrying over the older pinned tags and the keys
    that signed the same digest before (a second key is added beside the first)."""
    same_digest = previous is not None and previous.digest == digest and previous.repository == repository
    older = [p for p in (previous.pinned if previous and previous.repository == repository else []) if p.tag != pinned.tag]
    return CatalogEntry(
        tag=spec.tag, repository=repository, digest=digest, image_id=image["Id"], pinned=[pinned, *older],
        floating=floating or [spec.tag, *spec.aliases], versions=versions(spec), size=image["Size"], download_size=download_size,
        checks=checks, scan=scan if scan is not None else (previous.scan if previous else {"status": "not run"}),
        sbom=pinned.sbom, published_at=previous.published_at if previous and same_digest else utc_timestamp(), updated_at=utc_timestamp(),
        deprecated=spec.deprecated, input_hash=(image.get("Config", {}).get("Labels") or {}).get(INPUT_HASH_LABEL, ""),
        platform=platform_of(image), verified_on=verified_on,
        signing=signing_record(signed, previous.signing if previous and same_digest else {}),
    )


def make_manifest_list(tag: str, repository: str, digest: str, floating: list[str], platforms: dict[str, dict],
                       pinned: PinnedIndex, previous: ManifestList | None, signed: dict) -> ManifestList:
    """The record of a multi-arch tag published as repository@digest, carrying over the older pinned tags and the
    keys that signed the same digest before, as make_entry does for an image."""
    same_repository = previous is not None and previous.repository == repository
    older = [p for p in (previous.pinned if previous and same_repository else []) if p.tag != pinned.tag]
    signed_before = previous.signing if previous and same_repository and previous.digest == digest else {}
    return ManifestList(tag, repository, digest, floating, platforms, utc_timestamp(),
                        signing_record(signed, signed_before), [pinned, *older])


def signing_record(signed: dict, before: dict) -> dict:
    """What the catalog says of a digest's signatures: this run's (publish's PublishResult.signing) merged with what
    an earlier run recorded for the same digest."""
    if not signed:
        return before
    keys = sorted(set(before.get("keys", [])) | {signed["key"]})
    return {"keys": keys, **{name: signed[name] for name in ("signature", "attestation", "referrers", "predicate_types")
                             if name in signed}}


def public_key_path(catalog_dir: Path, fingerprint: str) -> Path:
    return catalog_dir / KEYS_DIR / f"{fingerprint.removeprefix('sha256:')[:16]}.pub"


def save_public_key(catalog_dir: Path, public: PublicKey) -> None:
    """catalog/keys/<fingerprint>.pub: the public key consumers verify with (`cosign verify --key`, Kyverno). A file
    already there must hold this very key: one that holds another is an InputError naming it, never trusted (a
    consumer would verify with whatever it holds) nor silently overwritten (someone changed it)."""
    path = public_key_path(catalog_dir, public.fingerprint)
    if not path.exists():
        atomic_write(path, public.pem, root=catalog_dir)
        return
    found, problem = read_key_file(path)
    if problem is None and found is not None and found.fingerprint != public.fingerprint:
        problem = wrong_key(path, found.fingerprint)
    if problem is not None:
        raise InputError([Problem(str(path), 0, problem)])


def key_file_problems(catalog_dir: Path) -> list[str]:
    """One line for each catalog/keys/*.pub that does not hold the key its name gives (`catalog --check`)."""
    folder = catalog_dir / KEYS_DIR
    if not folder.is_dir():
        return []
    # A file name is anyone's text (a control character, a newline forging a line): made inert before it is shown.
    return [inert(f"{path}: {problem}") for path in sorted(folder.glob("*.pub"))
            if (problem := read_key_file(path)[1]) is not None]


def read_key_file(path: Path) -> tuple[PublicKey | None, str | None]:
    """The key a catalog/keys/ file holds, and why it is not the key its name gives (None when it is): the name is the
    first hex digits of the key's fingerprint, the sha256 of its DER public key, as public_key_path names it."""
    try:
        found = load_public_key(path)
    except InputError as error:
        return None, f"{'; '.join(problem.message for problem in error.problems)} ({restore_key(path)})"
    if public_key_path(path.parent.parent, found.fingerprint).name != path.name:
        return found, wrong_key(path, found.fingerprint)
    return found, None


def wrong_key(path: Path, fingerprint: str) -> str:
    return f"holds the key {fingerprint}, whose file would be {public_key_path(path.parent.parent, fingerprint).name}, " \
           f"not {path.name}: {restore_key(path)}"


def restore_key(path: Path) -> str:
    return (f"restore it with `git checkout -- {path}`, or delete it and publish with the signing key again (it "
            "writes its public key there)")


def platform_of(image: dict) -> str:
    """The engine's image as an OCI platform: linux/amd64, linux/arm64/v8."""
    parts = [image.get("Os", ""), image.get("Architecture", ""), image.get("Variant", "")]
    return "/".join(part for part in parts if part)


def matches_spec(entry: CatalogEntry, spec: ImageSpec, floating: list[str]) -> bool:
    """Whether the entry says what publishing spec now would: the floating tags publish gives it (multiarch.image_tags),
    the same versions and deprecation."""
    return entry.floating == floating and entry.versions == versions(spec) and entry.deprecated == spec.deprecated


def versions(spec: ImageSpec) -> dict[str, str]:
    values = {
        "torch": spec.torch, "torchvision": spec.torchvision, "cuda": spec.cuda_full or spec.cuda or "cpu",
        "cudnn": spec.cudnn_version or (str(spec.cudnn) if spec.cudnn else None), "nccl": spec.nccl_version,
        "python": spec.python, "os": spec.os, "flavor": spec.flavor, "min_driver": spec.min_driver,
    }
    return {key: value for key, value in values.items() if value}


def same_entry(first: CatalogEntry | ManifestList, second: CatalogEntry | ManifestList) -> bool:
    """Equal apart from when they were written (and the SBOM time inside the scan summary)."""
    def comparable(entry: CatalogEntry | ManifestList) -> dict:
        return {**dataclasses.asdict(entry), "updated_at": ""}

    return comparable(first) == comparable(second)


def forget_pinned(catalog: Catalog, removed: set[str], catalog_dir: Path) -> None:
    """Drop pruned pinned tags from their entries, with their SBOM files, and from the manifest lists."""
    for index in catalog.manifest_lists.values():
        if any(pinned.tag in removed for pinned in index.pinned):
            index.pinned = [pinned for pinned in index.pinned if pinned.tag not in removed]
            index.updated_at = utc_timestamp()
    for entry in catalog.images.values():
        gone = [pinned for pinned in entry.pinned if pinned.tag in removed]
        if not gone:
            continue
        entry.pinned = [pinned for pinned in entry.pinned if pinned.tag not in removed]
        entry.updated_at = utc_timestamp()
        for pinned in gone:
            remove_file(inside(catalog_dir, pinned.sbom, str(catalog_file(catalog_dir))), catalog_dir)


def write_catalog(catalog: Catalog, catalog_dir: Path) -> None:
    """catalog.json, atomically (catalog_page.save writes it and the page made from it)."""
    catalog.updated_at = utc_timestamp()
    atomic_write_json(catalog_file(catalog_dir), catalog.to_json())


def registry_mismatches(catalog: Catalog, settings: AccessSettings, log: Callable[[str], None]) -> list[str]:
    """Every catalog tag the registry does not resolve to the catalog's digest."""
    problems: list[str] = []
    # A multi-arch row's tag names its index; each per-arch image is an entry of `images` under its own tags.
    indexes = [(index.repository, index.tag, {name: index.digest for name in index.floating}
                | {pinned.tag: pinned.digest for pinned in index.pinned})
               for index in (catalog.manifest_lists[tag] for tag in sorted(catalog.manifest_lists))]
    images = [(entry.repository, entry.tag, {name: entry.digest for name in entry.floating}
               | {pinned.tag: pinned.digest for pinned in entry.pinned})
              for entry in (catalog.images[tag] for tag in sorted(catalog.images))]
    for repository, tag, expected in images + indexes:
        registry = parse_registry(repository, flag=f"catalog entry {tag}")
        client = RegistryClient(registry, settings.access(registry), RetryPolicy(retries=1), log)
        for name, digest in sorted(expected.items()):
            try:
                found = client.digest_of(name)
            except RegistryError as error:
                return problems + [str(error)]
            if found != digest:
                problems.append(f"{repository}:{name} is {found or 'missing'}, the catalog says {digest}")
    return problems


def current_page(readme_path: Path) -> str | None:
    """images/README.md as it is now (None when there is none): a regular UTF-8 file, or an InputError."""
    if not os.path.lexists(readme_path):
        return None
    return read_text(readme_path, f"delete it; {command('catalog')} writes it again")
