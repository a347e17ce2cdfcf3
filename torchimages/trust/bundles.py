"""Signatures and attestations as Sigstore bundles in OCI referrers: the format cosign v3 writes by default
(`--new-bundle-format`), Kyverno's ImageValidatingPolicy and Trivy read first, and cosign 2.x reads with
`verify-attestation --new-bundle-format`. Pure: making and opening them; referrers.py puts them on a registry.

What cosign writes (sigstore/cosign pkg/oci/remote/write.go `WriteReferrer`, `WriteAttestationNewBundleFormat`, at
d6d86c2; the same bytes from Debian 13's cosign 2.5 `attest --new-bundle-format` against docker-registry 2.8):
- a bundle v0.3: `verificationMaterial.publicKey.hint` (base64 of the SHA-256 of the key's DER, cosign's
  internal/key/svkeypair.go) and a DSSE envelope of an in-toto statement; no transparency-log entry and no timestamp,
  as a key-signed bundle with `--tlog-upload=false` has;
- the signature is such a statement of predicate type `https://sigstore.dev/cosign/sign/v1` with an empty predicate
  (cmd/cosign/cli/sign/sign.go `signDigestBundle`), each attestation one of its own predicate type;
- each bundle travels as the one layer of an OCI image manifest whose `subject` is the signed digest: artifactType
  the bundle's media type, config the empty descriptor, annotations naming the content and the predicate type.
Where a registry has no referrers API the referrers are listed in an OCI index tagged `sha256-<hex>` (the OCI
distribution spec's referrers tag schema).
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json

from cryptography.hazmat.primitives import serialization

from .keys import PublicKey, SignatureError, SigningKey
from .signing import IN_TOTO_PAYLOAD_TYPE, open_envelope, pae, statement

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
# The spellings of a bundle's mediaType that sigstore's clients accept for v0.3 (sigstore-go pkg/bundle).
BUNDLE_MEDIA_TYPES = (BUNDLE_MEDIA_TYPE, "application/vnd.dev.sigstore.bundle+json;version=0.3")
SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"  # a cosign v3 signature is a statement of this type
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(EMPTY_CONFIG).hexdigest()
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
CREATED_ANNOTATION = "org.opencontainers.image.created"


def key_hint(key: PublicKey) -> str:
    """How a bundle names the key that signed it: base64 of the SHA-256 of its DER (cosign's and sigstore-go's)."""
    der = key.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def make_bundle(key: SigningKey, repository: str, digest: str, predicate_type: str, predicate: dict) -> bytes:
    """A bundle v0.3 holding key's DSSE envelope of the in-toto statement about repository@digest."""
    payload = statement(repository, digest, predicate_type, predicate)
    signature = key.sign(pae(IN_TOTO_PAYLOAD_TYPE, payload))
    return json.dumps({
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key_hint(key.public)}},
        "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": IN_TOTO_PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(signature).decode()}]},
    }, separators=(",", ":")).encode()


def open_bundle(key: PublicKey, data: bytes, digest: str) -> dict:
    """The in-toto statement of a bundle that key signed about digest; a SignatureError saying why not. A bundle
    holding a message signature (not a DSSE envelope) says nothing about an image: cosign v3 writes none for one."""
    try:
        bundle = json.loads(data)
        media_type, envelope = bundle["mediaType"], bundle.get("dsseEnvelope")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise SignatureError("not a Sigstore bundle") from None
    if media_type not in BUNDLE_MEDIA_TYPES:
        raise SignatureError(f"a bundle of media type {str(media_type)[:80]!r}, not {BUNDLE_MEDIA_TYPE}")
    if not isinstance(envelope, dict):
        raise SignatureError("a bundle without a DSSE envelope")
    found = open_envelope(key, json.dumps(envelope).encode(), digest)
    if not isinstance(found.get("predicateType"), str):
        raise SignatureError("its statement names no predicate type")
    return found


def bundle_hint(data: bytes) -> str:
    """The key hint a bundle carries ("" when none): which of several keys to try first, never trusted."""
    try:
        hint = json.loads(data)["verificationMaterial"]["publicKey"]["hint"]
        base64.b64decode(hint, validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError):
        return ""
    return hint


# ------------------------------------------------------------------------------------------------ referrer manifests

def referrer_manifest(subject: dict, predicate_type: str, bundle: bytes, created: dt.datetime) -> bytes:
    """The OCI manifest that carries one bundle as a referrer of subject (the signed manifest's descriptor: its
    mediaType, digest and size), shaped as cosign's WriteReferrer shapes it."""
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "size": len(EMPTY_CONFIG), "digest": EMPTY_DIGEST},
        "layers": [{"mediaType": BUNDLE_MEDIA_TYPE, "size": len(bundle),
                    "digest": "sha256:" + hashlib.sha256(bundle).hexdigest()}],
        "subject": subject,
        "annotations": {CONTENT_ANNOTATION: "dsse-envelope", PREDICATE_ANNOTATION: predicate_type,
                        CREATED_ANNOTATION: created.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
    }, separators=(",", ":")).encode()


def referrer_descriptor(manifest: bytes) -> dict:
    """A referrer's entry in the referrers list: its digest, size, artifactType and annotations (the OCI
    distribution spec asks the list to repeat them, so a reader can pick by predicate type without fetching)."""
    document = json.loads(manifest)
    entry = {"mediaType": OCI_MANIFEST, "size": len(manifest), "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
             "artifactType": document.get("artifactType") or document["config"]["mediaType"]}
    if document.get("annotations"):
        entry["annotations"] = document["annotations"]
    return entry


def referrers_index(entries: list[dict]) -> bytes:
    """The referrers tag schema's index over entries (in the order given)."""
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries},
                      separators=(",", ":")).encode()


def index_entries(body: bytes) -> list[dict]:
    """The manifests a referrers index lists; a ValueError when it is not an OCI index (another tool's tag)."""
    try:
        document = json.loads(body)
        entries = document["manifests"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ValueError("something that is not an OCI image index") from None
    if document.get("mediaType", OCI_INDEX) != OCI_INDEX or not isinstance(entries, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("digest"), str) for entry in entries):
        raise ValueError("an index whose entries are not descriptors")
    return entries


def referrers_tag(digest: str) -> str:
    """The referrers tag schema's tag for digest: `sha256-<hex>`, no suffix (the classic tags add .sig and .att)."""
    return digest.replace(":", "-", 1)
