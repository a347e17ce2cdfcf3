"""Signatures and attestations on the registry, in cosign's tag format: `<repo>:sha256-<hex>.sig` holds one layer
per signature, `<repo>:sha256-<hex>.att` one layer per attestation (signing.py makes and checks their contents).

Both tags are written by reading what is there, appending, and writing the whole manifest back (as cosign does), so
a second key (key rotation) adds its signature beside the first and a republish by the same key adds nothing. Two
publishers appending at once can lose one's layer: each write is read back, and a lost layer is appended again.
A tag that holds anything else (another tool's manifest, garbage) is refused, not overwritten. `skopeo copy` of an
image does not carry these tags, so they are written at the registry the image is published to, once its digest
is final there. A new verification report by the same key replaces the key's older one (cosign's `attest --replace`):
a digest verified again, on a GPU host after a CPU host, carries the report the catalog records, never both.

The consumer's side reads what cosign and Kyverno read: an attestation is known by its signed statement's
predicateType (the layer annotation, which `cosign attach attestation` leaves empty, is only a hint), and a layer of
another kind beside cosign's is skipped with a warning, as cosign skips it, rather than failing the image.
"""
from __future__ import annotations

import base64
import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..files import brief
from ..peers.registry import RegistryClient, RegistryError
from ..reporting import human_size
from . import keys, signing

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
ZERO_TIME = "0001-01-01T00:00:00Z"  # what cosign writes into its artifacts' configs: they have no creation time
APPEND_TRIES = 3
# How long a concurrent writer of a .sig/.att tag may take between reading it and writing it back: one skopeo copy of
# a few KB (well under a second on any registry that works).
SETTLE_S = 1.0
MAX_LAYERS = 256  # a signature tag with more is no cosign artifact we write to
# A signature is a few hundred bytes and an attestation at most a few MB (a CUDA image's SBOM, base64 in its envelope):
# an artifact larger than this is refused before it is copied, and one whose blobs arrive larger than its manifest
# declared them (the registry stores what it was sent, whatever the manifest says) before anything of it is read.
MAX_ARTIFACT_BYTES = 64 << 20


def signature_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".sig"


def attestation_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".att"


@dataclass(frozen=True)
class Layer:
    media_type: str
    data: bytes
    annotations: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    @property
    def predicate_type(self) -> str:
        return self.annotations.get(signing.PREDICATE_TYPE_ANNOTATION, "")


def artifact_files(layers: list[Layer]) -> dict[str, bytes]:
    """skopeo's `dir:` layout of an artifact as cosign shapes it: an OCI manifest, a config naming each layer as
    its own diff id (the layers are not compressed), the layers."""
    config = json.dumps({"architecture": "", "created": ZERO_TIME, "history": [{"created": ZERO_TIME}] * len(layers),
                         "os": "", "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
                         "config": {}}, separators=(",", ":")).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "size": len(config), "digest": config_digest},
                "layers": [{"mediaType": layer.media_type, "size": len(layer.data), "digest": layer.digest,
                            "annotations": layer.annotations} for layer in layers]}
    files = {"version": b"Directory Transport Version: 1.1\n",
             "manifest.json": json.dumps(manifest, separators=(",", ":")).encode(),
             config_digest.removeprefix("sha256:"): config}
    files.update({layer.digest.removeprefix("sha256:"): layer.data for layer in layers})
    return files


class UnreadableArtifact(RegistryError):
    """A signature or attestation tag that holds no cosign artifact we can read (another tool's, garbage, too large):
    publish will not rewrite it; for a consumer it vouches for nothing."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where} holds {what}: it is not ours to rewrite; delete that tag (or move what it holds "
                         "elsewhere), then publish again", transient=False)
        self.consumer_message = f"{where} holds {what}: nothing in it was read"


def declared_bytes(body: bytes, budget: int | None = None) -> int:
    """The bytes an artifact's manifest declares for its config and layers, checked before anything is copied; a
    ValueError saying why it is no artifact to copy: more than MAX_LAYERS layers, a size that cannot be true (absent,
    negative, not a whole number), or more than budget (MAX_ARTIFACT_BYTES unless told) in all."""
    budget = MAX_ARTIFACT_BYTES if budget is None else budget
    try:
        manifest = json.loads(body)
        layers = manifest["layers"]
        config = manifest.get("config") or {}
        assert isinstance(layers, list)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError, RecursionError):
        raise ValueError("something that is not an image manifest") from None
    if len(layers) > MAX_LAYERS:
        raise ValueError(f"{len(layers)} layers, more than any signature or attestation ({MAX_LAYERS})")
    sizes = [part.get("size") if isinstance(part, dict) else None for part in [config, *layers]]
    if not all(type(size) is int and size >= 0 for size in sizes):  # type(): a JSON true is no size
        raise ValueError(f"a blob whose size is {brief(next(s for s in sizes if type(s) is not int or s < 0))}, "
                         "not a number of bytes")
    total = sum(size for size in sizes if isinstance(size, int))
    if total > budget:
        raise ValueError(f"{human_size(total)} of layers, more than any signature or attestation "
                         f"({human_size(budget)})")
    return total


@contextmanager
def copied_artifact(registry: RegistryClient, reference: str, budget: int | None = None) -> Iterator[Path | None]:
    """The one way an artifact (a .sig or .att tag, a bundle referrer) is read from the registry: a folder holding
    skopeo's `dir:` copy of it, None when there is no such manifest; a ValueError saying why it cannot be read whole.

    Its manifest is checked first (declared_bytes): the count and sizes come from it, so a tag of thousands of layers
    is refused without a blob fetched. The copy is made by the digest of that manifest (skopeo checks it), so what is
    copied is what was checked. A blob the registry does not have makes the artifact unreadable, never absent: a
    signature beside it would go unseen, and publish would write the tag anew without the others' signatures. skopeo
    copies a blob whole whatever size the manifest declares for it, so the bound is held again on what arrived, before
    a byte of it is read."""
    manifest = registry.manifest_or_none(reference)
    if manifest is None:
        yield None
        return
    declared = declared_bytes(manifest.body, budget)
    with tempfile.TemporaryDirectory(prefix="torchimages-artifact-") as scratch:
        folder = Path(scratch) / "artifact"
        if not registry.read_artifact(manifest.digest, folder):
            if registry.manifest_or_none(manifest.digest) is None:
                yield None  # deleted since it was looked up: there is none now
                return
            raise ValueError("a manifest naming blobs the registry does not have (it cannot be read whole)")
        received = sum(path.lstat().st_size for path in folder.iterdir()
                       if path.name not in ("manifest.json", "version"))
        if received > declared:
            raise ValueError(f"{received} bytes of blobs where its manifest declares {declared}")
        yield folder


def read_artifact_folder(folder: Path, media_type: str, tag: str, strict: bool = True) -> tuple[list[Layer], list[str]]:
    """The layers of an artifact skopeo copied into folder, and why any was left out. Strict (publish, which writes the
    tag back whole): a RegistryError naming the tag when it is not a cosign artifact of media_type (another tool's
    manifest, garbage, a layer whose bytes are not its digest). Not strict (a consumer): such layers are left out,
    each with its reason, as cosign and Kyverno ignore what they cannot use; a tag that is no manifest still fails."""
    def foreign(why: str) -> UnreadableArtifact:
        return UnreadableArtifact(tag, f"{why}, not cosign's {media_type} layers")

    try:
        manifest = json.loads((folder / "manifest.json").read_bytes())
        entries = manifest["layers"]
        assert isinstance(entries, list) and (len(entries) <= MAX_LAYERS or not strict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError):
        raise foreign("something that is not an image manifest") from None
    layers: list[Layer] = []
    skipped = [f"{tag}: {len(entries) - MAX_LAYERS} layers past the first {MAX_LAYERS} not read"
               ] if len(entries) > MAX_LAYERS else []
    for entry in entries[:MAX_LAYERS]:
        try:
            layers.append(_read_layer(folder, entry, media_type))
        except ValueError as why:
            if strict:
                raise foreign(str(why)) from None
            skipped.append(f"{tag}: a layer was skipped: {why}")
    return layers, skipped


def _read_layer(folder: Path, entry: object, media_type: str) -> Layer:
    """One layer of a `dir:` copy; a ValueError saying why it is not a cosign layer of media_type."""
    if not isinstance(entry, dict) or entry.get("mediaType") != media_type:
        raise ValueError(f"a layer of type {brief(entry.get('mediaType') if isinstance(entry, dict) else None)}")
    digest, annotations = str(entry.get("digest", "")), entry.get("annotations") or {}
    path = folder / digest.removeprefix("sha256:")
    try:
        too_large = path.stat().st_size > MAX_ARTIFACT_BYTES
        data = b"" if too_large else path.read_bytes()
    except OSError:
        raise ValueError(f"a layer {brief(digest)} that skopeo did not copy") from None
    if too_large:
        raise ValueError(f"a layer {brief(digest)} larger than {MAX_ARTIFACT_BYTES >> 20} MiB")
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest or not isinstance(annotations, dict):
        raise ValueError(f"a layer whose bytes are not its digest {brief(digest)}")
    return Layer(media_type, data, {str(k): str(v) for k, v in annotations.items()})


# ------------------------------------------------------------------------------------------------- checking layers

def signed_by(key: keys.PublicKey, layer: Layer, digest: str) -> bool:
    try:
        signing.check_signature(key, layer.data, layer.annotations.get(signing.SIGNATURE_ANNOTATION, ""), digest)
    except keys.SignatureError:
        return False
    return True


def attested_by(key: keys.PublicKey, layer: Layer, digest: str) -> dict | None:
    """The statement of an attestation layer that key signed about digest, else None. Its predicate type is the
    signed statement's: the layer's annotation is unsigned, and `cosign attach attestation` leaves it out."""
    try:
        found = signing.open_envelope(key, layer.data, digest)
    except keys.SignatureError:
        return None
    return found if isinstance(found.get("predicateType"), str) else None


def signed_reference(layer: Layer) -> str:
    """The repository a verified simple-signing payload names ("" when it names none)."""
    try:
        reference = json.loads(layer.data)["critical"]["identity"]["docker-reference"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return ""
    return reference if isinstance(reference, str) else ""


def as_json(predicate: dict) -> dict:
    """predicate as it reads back from a statement (tuples as lists, keys as strings): what a stored one is compared
    with."""
    return json.loads(json.dumps(predicate))


def signature_layer(key: keys.SigningKey, repository: str, digest: str) -> Layer:
    payload = signing.simple_signing_payload(repository, digest)
    signature = base64.b64encode(key.sign(payload)).decode()
    return Layer(signing.SIGNATURE_MEDIA_TYPE, payload, {signing.SIGNATURE_ANNOTATION: signature})


def attestation_layer(key: keys.SigningKey, repository: str, digest: str, predicate_type: str,
                      predicate: dict) -> Layer:
    document = signing.envelope(key, signing.statement(repository, digest, predicate_type, predicate))
    return Layer(signing.ATTESTATION_MEDIA_TYPE, document,
                 {signing.SIGNATURE_ANNOTATION: "", signing.PREDICATE_TYPE_ANNOTATION: predicate_type})


# ---------------------------------------------------------------------------------------------------- the registry

class SignatureStore:
    """The `.sig` and `.att` tags of one repository."""

    def __init__(self, registry: RegistryClient):
        self.registry = registry

    def layers(self, tag: str, media_type: str) -> list[Layer]:
        """The artifact's layers, strictly as publish rewrites them ([] when the tag does not exist)."""
        return self.read(tag, media_type, strict=True)[0]

    def read(self, tag: str, media_type: str, strict: bool = False) -> tuple[list[Layer], list[str]]:
        """The artifact's layers and why any was left out (see read_artifact_folder); ([], []) when there is no such
        tag. One that cannot be read whole (copied_artifact) is an UnreadableArtifact, for publish and consumer."""
        where = f"{self.registry.registry.name}:{tag}"
        try:
            with copied_artifact(self.registry, tag) as folder:
                return ([], []) if folder is None else read_artifact_folder(folder, media_type, where, strict)
        except ValueError as why:
            raise UnreadableArtifact(where, f"{why}, not cosign's {media_type} layers") from None

    def sign(self, key: keys.SigningKey, digest: str) -> str:
        """Make sure key's signature of digest is on the registry: 'present' or 'added'."""
        repository, public = self.registry.registry.name, key.public

        def revised(layers: list[Layer]) -> list[Layer] | None:
            if any(signed_by(public, layer, digest) for layer in layers):
                return None
            return [*layers, signature_layer(key, repository, digest)]

        return self._append(signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE, revised)

    def attest(self, key: keys.SigningKey, digest: str, predicates: dict[str, dict],
               replace: frozenset[str] = frozenset()) -> str:
        """Make sure key's attestation of each predicate type is on the registry: 'present', 'added', or 'replaced'
        when key's attestation of a type in replace said something else and gave way to the new one (the verification
        report of an image verified again)."""
        repository, public = self.registry.registry.name, key.public
        wanted = {kind: as_json(predicate) for kind, predicate in predicates.items()}

        def revised(layers: list[Layer]) -> list[Layer] | None:
            kept, found = [], set()
            for layer in layers:
                statement = attested_by(public, layer, digest)
                kind = statement["predicateType"] if statement else None
                if kind in replace and statement and statement.get("predicate") != wanted.get(kind):
                    continue  # superseded: this key's older statement of a kind the new one replaces
                kept.append(layer)
                found.add(kind)
            added = [attestation_layer(key, repository, digest, kind, predicate)
                     for kind, predicate in wanted.items() if kind not in found]
            return None if not added and len(kept) == len(layers) else [*kept, *added]

        return self._append(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE, revised)

    def remove(self, digest: str) -> list[str]:
        """Delete the signature and attestation tags of digest (prune); returns the tags deleted."""
        removed = []
        for tag in (signature_tag(digest), attestation_tag(digest)):
            artifact = self.registry.digest_of(tag)
            if artifact:
                self.registry.delete(artifact)
                removed.append(tag)
        return removed

    def _append(self, tag: str, media_type: str, revised: Callable[[list[Layer]], list[Layer] | None]) -> str:
        """Write the artifact at tag as revised() makes it from what is there, unless it asks for no change:
        'present', 'added', or 'replaced' when the revision left out a layer that was there.

        A registry has no compare-and-swap on tags: a concurrent writer of the same tag, which read it before this
        write, replaces it with a manifest without these layers. So the tag is read back at once and again after
        SETTLE_S (a writer that read it before ours has written by then), and what went missing is written again.
        """
        layers = self.layers(tag, media_type)
        revision = revised(layers)
        if revision is None:
            return "present"
        kept = {layer.digest for layer in revision}
        status = "replaced" if any(layer.digest not in kept for layer in layers) else "added"
        for _ in range(APPEND_TRIES):
            with tempfile.TemporaryDirectory(prefix="torchimages-artifact-") as scratch:
                folder = Path(scratch) / "artifact"
                folder.mkdir()
                for name, content in artifact_files(revision).items():
                    (folder / name).write_bytes(content)
                self.registry.write_artifact(folder, tag)
            revision = revised(self.layers(tag, media_type))
            if revision is None:
                time.sleep(SETTLE_S)
                revision = revised(self.layers(tag, media_type))
            if revision is None:
                return status
        raise RegistryError(f"{self.registry.registry.name}:{tag}: another writer replaced it {APPEND_TRIES} times "
                            "while this one appended to it; publish again", transient=False)


# ------------------------------------------------------------------------------------------------ the consumer side

@dataclass
class Evidence:
    """What a key vouches for about one digest: the repositories its signatures name, and every statement it signed
    about the digest, by predicate type, in the order the registry holds them."""

    digest: str
    signed_as: list[str] = field(default_factory=list)  # repositories verified signatures name; [] when none verifies
    statements: dict[str, list[dict]] = field(default_factory=dict)  # predicate type -> predicates of verified ones
    problems: list[str] = field(default_factory=list)  # what keeps it from being verified
    warnings: list[str] = field(default_factory=list)  # what a reader should know, that does not
    # "signature" and each predicate type -> the formats ("classic", "bundle") it was verified in (referrers.py)
    formats: dict[str, list[str]] = field(default_factory=dict)

    def latest(self, predicate_type: str) -> dict | None:
        """The last verified predicate of a type (the newest a publisher appended), None when there is none."""
        found = self.statements.get(predicate_type)
        return found[-1] if found else None

    def holds(self, predicate_types) -> bool:
        return bool(self.signed_as) and all(kind in self.statements for kind in predicate_types) and not self.problems


def gather_evidence(store: SignatureStore, keys: list[keys.PublicKey], digest: str, predicate_types) -> Evidence:
    """Check digest's signature and attestations on the registry against keys (any of them: a key rotation trusts the
    old and the new key for a while), as cosign does: layers it cannot use are skipped with a warning, a signature
    naming another repository is accepted with one; every failure is a problem named."""
    evidence = Evidence(digest)
    repository = store.registry.registry.name
    signatures, skipped = _read_or_problem(store, signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE, evidence)
    verified = [layer for layer in signatures if any(signed_by(key, layer, digest) for key in keys)]
    evidence.signed_as = sorted({signed_reference(layer) for layer in verified})
    if not verified:
        evidence.problems.append(f"no signature by {'this key' if len(keys) == 1 else 'these keys'} for {digest} "
                                 f"({len(signatures)} signature(s) at {signature_tag(digest)}, none verifies)")
    elif repository not in evidence.signed_as:
        evidence.warnings.append(f"the signature names {', '.join(evidence.signed_as)}, not {repository}: cosign and "
                                 "Kyverno accept it (they compare the digest), podman and CRI-O refuse it")
    layers, skipped_attestations = _read_or_problem(store, attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE,
                                                    evidence)
    evidence.warnings += skipped + skipped_attestations
    for layer in layers:
        found = next((statement for key in keys if (statement := attested_by(key, layer, digest)) is not None), None)
        if found is not None:
            predicate = found.get("predicate")
            evidence.statements.setdefault(found["predicateType"], []).append(predicate if isinstance(predicate, dict)
                                                                              else {})
    for kind in predicate_types:
        if kind not in evidence.statements:
            evidence.problems.append(f"no {kind} attestation by {'this key' if len(keys) == 1 else 'these keys'} "
                                     f"for {digest}")
    return evidence


def _read_or_problem(store: SignatureStore, tag: str, media_type: str, evidence: Evidence) -> tuple[list[Layer], list[str]]:
    """A consumer's read of tag: what cannot be read at all is a problem of the evidence, not an error of the run."""
    try:
        return store.read(tag, media_type)
    except UnreadableArtifact as unreadable:
        evidence.problems.append(unreadable.consumer_message)
        return [], []
