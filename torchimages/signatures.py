"""Signatures and attestations on the registry, in cosign's tag format: `<repo>:sha256-<hex>.sig` holds one layer
per signature, `<repo>:sha256-<hex>.att` one layer per attestation (signing.py makes and checks their contents).

Both tags are written by reading what is there, appending, and writing the whole manifest back (as cosign does), so
a second key (key rotation) adds its signature beside the first and a republish by the same key adds nothing. Two
publishers appending at once can lose one's layer: each write is read back, and a lost layer is appended again.
A tag that holds anything else (another tool's manifest, garbage) is refused, not overwritten. `skopeo copy` of an
image does not carry these tags, so they are written at the registry the image is published to, once its digest
is final there.
"""
from __future__ import annotations

import base64
import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import signing
from .files import brief
from .registry import RegistryClient, RegistryError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
ZERO_TIME = "0001-01-01T00:00:00Z"  # what cosign writes into its artifacts' configs: they have no creation time
APPEND_TRIES = 3
# How long a concurrent writer of a .sig/.att tag may take between reading it and writing it back: one skopeo copy of
# a few KB (well under a second on any registry that works).
SETTLE_S = 1.0
MAX_LAYERS = 256  # a signature tag with more is no cosign artifact we write to


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


def read_artifact_folder(folder: Path, media_type: str, tag: str) -> list[Layer]:
    """The layers of an artifact skopeo copied into folder; a RegistryError naming the tag when it is not a cosign
    artifact of media_type (another tool's manifest, garbage, a layer whose bytes are not its digest)."""
    def foreign(why: str) -> RegistryError:
        return RegistryError(f"{tag} holds {why}, not cosign's {media_type} layers: it is not ours to rewrite; "
                             f"delete that tag (or move what it holds elsewhere), then publish again", transient=False)

    try:
        manifest = json.loads((folder / "manifest.json").read_bytes())
        entries = manifest["layers"]
        assert isinstance(entries, list) and len(entries) <= MAX_LAYERS
    except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError):
        raise foreign("something that is not an image manifest") from None
    layers = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("mediaType") != media_type:
            kind = entry.get("mediaType") if isinstance(entry, dict) else None
            raise foreign(f"a layer of type {brief(kind)}")
        digest, annotations = str(entry.get("digest", "")), entry.get("annotations") or {}
        try:
            data = (folder / digest.removeprefix("sha256:")).read_bytes()
        except OSError:
            raise foreign(f"a layer {brief(digest)} that skopeo did not copy") from None
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest or not isinstance(annotations, dict):
            raise foreign(f"a layer whose bytes are not its digest {brief(digest)}")
        layers.append(Layer(media_type, data, {str(k): str(v) for k, v in annotations.items()}))
    return layers


# ------------------------------------------------------------------------------------------------- checking layers

def signed_by(key: signing.PublicKey, layer: Layer, digest: str) -> bool:
    try:
        signing.check_signature(key, layer.data, layer.annotations.get(signing.SIGNATURE_ANNOTATION, ""), digest)
    except signing.SignatureError:
        return False
    return True


def attested_by(key: signing.PublicKey, layer: Layer, digest: str) -> dict | None:
    """The statement of an attestation layer that key signed about digest, else None."""
    try:
        found = signing.open_envelope(key, layer.data, digest)
    except signing.SignatureError:
        return None
    return found if found.get("predicateType") == layer.predicate_type else None


def signature_layer(key: signing.SigningKey, repository: str, digest: str) -> Layer:
    payload = signing.simple_signing_payload(repository, digest)
    signature = base64.b64encode(key.sign(payload)).decode()
    return Layer(signing.SIGNATURE_MEDIA_TYPE, payload, {signing.SIGNATURE_ANNOTATION: signature})


def attestation_layer(key: signing.SigningKey, repository: str, digest: str, predicate_type: str,
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
        """The artifact's layers ([] when the tag does not exist)."""
        with tempfile.TemporaryDirectory(prefix="torchimages-artifact-") as scratch:
            folder = Path(scratch) / "artifact"
            if not self.registry.read_artifact(tag, folder):
                return []
            return read_artifact_folder(folder, media_type, f"{self.registry.registry.name}:{tag}")

    def sign(self, key: signing.SigningKey, digest: str) -> str:
        """Make sure key's signature of digest is on the registry: 'present' or 'added'."""
        repository, public = self.registry.registry.name, key.public

        def missing(layers: list[Layer]) -> list[Layer]:
            signed = any(signed_by(public, layer, digest) for layer in layers)
            return [] if signed else [signature_layer(key, repository, digest)]

        return self._append(signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE, missing)

    def attest(self, key: signing.SigningKey, digest: str, predicates: dict[str, dict]) -> str:
        """Make sure key's attestation of each predicate type is on the registry: 'present' or 'added'."""
        repository, public = self.registry.registry.name, key.public

        def missing(layers: list[Layer]) -> list[Layer]:
            found = {layer.predicate_type for layer in layers if attested_by(public, layer, digest)}
            return [attestation_layer(key, repository, digest, kind, predicate)
                    for kind, predicate in predicates.items() if kind not in found]

        return self._append(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE, missing)

    def remove(self, digest: str) -> list[str]:
        """Delete the signature and attestation tags of digest (prune); returns the tags deleted."""
        removed = []
        for tag in (signature_tag(digest), attestation_tag(digest)):
            artifact = self.registry.digest_of(tag)
            if artifact:
                self.registry.delete(artifact)
                removed.append(tag)
        return removed

    def _append(self, tag: str, media_type: str, missing) -> str:
        """Append the layers missing() asks for to the artifact at tag, unless it asks for none.

        A registry has no compare-and-swap on tags: a concurrent writer of the same tag, which read it before this
        write, replaces it with a manifest without these layers. So the tag is read back at once and again after
        SETTLE_S (a writer that read it before ours has written by then), and what went missing is appended again.
        """
        layers = self.layers(tag, media_type)
        wanted = missing(layers)
        if not wanted:
            return "present"
        for _ in range(APPEND_TRIES):
            with tempfile.TemporaryDirectory(prefix="torchimages-artifact-") as scratch:
                folder = Path(scratch) / "artifact"
                folder.mkdir()
                for name, content in artifact_files([*layers, *wanted]).items():
                    (folder / name).write_bytes(content)
                self.registry.write_artifact(folder, tag)
            layers = self.layers(tag, media_type)
            wanted = missing(layers)
            if not wanted:
                time.sleep(SETTLE_S)
                layers = self.layers(tag, media_type)
                wanted = missing(layers)
            if not wanted:
                return "added"
        raise RegistryError(f"{self.registry.registry.name}:{tag}: another writer replaced it {APPEND_TRIES} times "
                            "while this one appended to it; publish again", transient=False)


# ------------------------------------------------------------------------------------------------ the consumer side

@dataclass
class Evidence:
    """What a key vouches for about one digest: its signature and its attestations by predicate type."""

    digest: str
    signed_as: str = ""  # the repository the verified signature names; "" when none verifies
    predicates: dict[str, dict] = field(default_factory=dict)  # predicate type -> predicate, of verified ones
    problems: list[str] = field(default_factory=list)

    def holds(self, predicate_types) -> bool:
        return bool(self.signed_as) and all(kind in self.predicates for kind in predicate_types) and not self.problems


def gather_evidence(store: SignatureStore, key: signing.PublicKey, digest: str, predicate_types) -> Evidence:
    """Check digest's signature and attestations on the registry against key; every failure is a problem named."""
    evidence = Evidence(digest)
    signatures = store.layers(signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE)
    verified = [layer for layer in signatures if signed_by(key, layer, digest)]
    if verified:
        evidence.signed_as = json.loads(verified[0].data)["critical"]["identity"]["docker-reference"]
    else:
        evidence.problems.append(f"no signature by this key for {digest} ({len(signatures)} signature(s) at "
                                 f"{signature_tag(digest)}, none verifies)")
    for layer in store.layers(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE):
        found = attested_by(key, layer, digest)
        if found is not None:
            evidence.predicates.setdefault(layer.predicate_type, found.get("predicate") or {})
    for kind in predicate_types:
        if kind not in evidence.predicates:
            evidence.problems.append(f"no {kind} attestation by this key for {digest}")
    return evidence
