"""The independent bundle verifiers of tests/bundle_verifiers.py work, and can fail: each accepts a good bundle and
refuses one checked with another key, one with a payload byte changed, and one about another image (a wrong subject
digest); the schema accepts what cosign writes and refuses a bundle without verificationMaterial.

Three sources of bundles: made here with `cryptography` for a made-up digest (engine-free); the one the real cosign 2.5
wrote, kept in tests/data/sigstore/ (engine-free); and fresh ones from the real cosign against a registry process of
the test's own (the engine lane: `cosign` marks it so)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .bundle_verifiers import (
    BUNDLE_MEDIA_TYPE,
    SCHEMA,
    bundle_schema_errors,
    cosign_trusted_root,
    cosign_verify_bundle_attestation,
    dsse_bundle,
    in_toto_statement,
    sigstore_js_verify,
    statement_of,
    with_payload_byte_changed,
)

DATA = Path(__file__).parent / "data" / "sigstore"
PREDICATE_TYPE = "https://torchimages.io/verification-report/v1"
PREDICATE = {"status": "passed"}
MADE_UP_DIGEST = "sha256:" + "5e" * 32
ANOTHER_DIGEST = "sha256:" + "0f" * 32
# What the real cosign 2.5 wrote (tests/data/sigstore/README.md): its bundle, its key, the image it is about.
COSIGN_BUNDLE = (DATA / "cosign-2.5-attestation.bundle.json").read_bytes()
COSIGN_PUBLIC = (DATA / "cosign-2.5-attestation.pub").read_text()
COSIGN_SUBJECT = "sha256:cac1423a814e80c160a6046d3af54653324f7778d8bc51b895d25e71373a274a"
# protobuf-specs v0.5.0's gen/jsonschema/schemas/Bundle.schema.json (tests/data/sigstore/README.md).
SCHEMA_SHA256 = "6f94437aaf57685129ce60d26ea27beb3d2540764637958374d205563f14d46d"


@dataclass(frozen=True)
class Signer:
    private: ec.EllipticCurvePrivateKey

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message, ec.ECDSA(hashes.SHA256()))

    @property
    def public_pem(self) -> str:
        return self.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer(ec.generate_private_key(ec.SECP256R1()))


@pytest.fixture(scope="module")
def another_signer() -> Signer:
    return Signer(ec.generate_private_key(ec.SECP256R1()))


@pytest.fixture(scope="module")
def python_bundle(signer) -> bytes:
    """A bundle made here, in cosign's shape, about MADE_UP_DIGEST."""
    return dsse_bundle(in_toto_statement(MADE_UP_DIGEST, PREDICATE_TYPE, PREDICATE), signer.sign, signer.public_pem)


# ------------------------------------------------------------------------------------------------------ sigstore-js
def test_sigstore_js_accepts_a_bundle_made_in_python(python_bundle, signer):
    assert sigstore_js_verify(python_bundle, signer.public_pem, MADE_UP_DIGEST) == (True, PREDICATE_TYPE)


def test_sigstore_js_refuses_another_key(python_bundle, another_signer):
    accepted, why = sigstore_js_verify(python_bundle, another_signer.public_pem, MADE_UP_DIGEST)
    # The bundle's hint names the signer's key, which is not in the trust material: not found, so not used.
    assert not accepted and "PUBLIC_KEY_ERROR" in why, why


def test_sigstore_js_refuses_another_key_even_under_its_hint(signer, another_signer):
    """A hint is unauthenticated: a bundle signed by one key but naming another's hint fails on the signature."""
    statement = in_toto_statement(MADE_UP_DIGEST, PREDICATE_TYPE, PREDICATE)
    misnamed = dsse_bundle(statement, another_signer.sign, signer.public_pem)
    accepted, why = sigstore_js_verify(misnamed, signer.public_pem, MADE_UP_DIGEST)
    assert not accepted and "SIGNATURE_ERROR" in why, why


def test_sigstore_js_refuses_a_changed_payload_byte(python_bundle, signer):
    changed = with_payload_byte_changed(python_bundle, at=b"passed")
    assert statement_of(changed)["predicate"] == {"status": "Passed"}  # still a well-formed statement
    accepted, why = sigstore_js_verify(changed, signer.public_pem, MADE_UP_DIGEST)
    assert not accepted and "SIGNATURE_ERROR" in why, why


def test_sigstore_js_refuses_a_wrong_subject_digest(python_bundle, signer):
    accepted, why = sigstore_js_verify(python_bundle, signer.public_pem, ANOTHER_DIGEST)
    assert not accepted and f"no subject has the digest {ANOTHER_DIGEST}" in why, why


def test_sigstore_js_refuses_a_payload_that_is_not_in_toto(signer):
    not_in_toto = dsse_bundle(b'{"critical":{}}', signer.sign, signer.public_pem,
                              payload_type="application/vnd.dev.cosign.simplesigning.v1+json")
    accepted, why = sigstore_js_verify(not_in_toto, signer.public_pem, MADE_UP_DIGEST)
    assert not accepted and "payloadType" in why, why


def test_sigstore_js_accepts_the_bundle_cosign_wrote_and_refuses_it_tampered(another_signer):
    assert sigstore_js_verify(COSIGN_BUNDLE, COSIGN_PUBLIC, COSIGN_SUBJECT) == (True, PREDICATE_TYPE)
    refusals = {"another key": sigstore_js_verify(COSIGN_BUNDLE, another_signer.public_pem, COSIGN_SUBJECT),
                "a changed byte": sigstore_js_verify(with_payload_byte_changed(COSIGN_BUNDLE, at=b"passed"),
                                                     COSIGN_PUBLIC, COSIGN_SUBJECT),
                "another subject": sigstore_js_verify(COSIGN_BUNDLE, COSIGN_PUBLIC, ANOTHER_DIGEST)}
    assert not any(accepted for accepted, _ in refusals.values()), refusals


# ----------------------------------------------------------------------------------------------------------- schema
def test_the_vendored_schema_is_protobuf_specs_unchanged():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_the_schema_as_generated_refuses_every_bundle_hence_the_correction():
    """Why bundle_schema corrects the file: its oneOf names proto fields (dsse_envelope) no JSON bundle has."""
    raw = json.loads(SCHEMA.read_text())
    assert not jsonschema.Draft4Validator(raw).is_valid(json.loads(COSIGN_BUNDLE))


def test_the_schema_accepts_the_bundle_cosign_wrote_and_one_made_in_python(python_bundle):
    assert bundle_schema_errors(COSIGN_BUNDLE) == []
    assert bundle_schema_errors(python_bundle) == []


def test_the_schema_refuses_a_bundle_without_verification_material():
    bundle = json.loads(COSIGN_BUNDLE)
    del bundle["verificationMaterial"]
    errors = bundle_schema_errors(json.dumps(bundle).encode())
    assert errors == ["(bundle): 'verificationMaterial' is a required property"], errors


@pytest.mark.parametrize(("change", "where"), [
    (lambda bundle: bundle.pop("dsseEnvelope"), "(bundle)"),  # no content at all
    (lambda bundle: bundle.update(messageSignature={"signature": "AA=="}), "(bundle)"),  # two contents
    (lambda bundle: bundle["verificationMaterial"].pop("publicKey"), "verificationMaterial"),
    (lambda bundle: bundle["dsseEnvelope"].update(signature=[]), "dsseEnvelope"),  # a misspelt field
    (lambda bundle: bundle["dsseEnvelope"].update(payload=7), "dsseEnvelope/payload"),
], ids=["no-content", "two-contents", "no-key", "unknown-field", "payload-not-a-string"])
def test_the_schema_refuses_malformed_bundles(change, where):
    bundle = json.loads(COSIGN_BUNDLE)
    change(bundle)
    errors = bundle_schema_errors(json.dumps(bundle).encode())
    assert errors and all(error.startswith(f"{where}:") for error in errors), errors


def test_the_schema_refuses_what_is_not_json():
    assert bundle_schema_errors(b"\x89PNG")[0].startswith("(bundle): not JSON")


# ------------------------------------------------------------------------- the real cosign, on a registry of its own
@dataclass
class Image:
    """An image in a test's own registry, with what cosign attached to it."""
    registry: str
    repository: str
    digest: str
    manifest_size: int

    @property
    def reference(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"

    @property
    def fallback_tag(self) -> str:
        """The OCI referrers tag schema's tag: the index of its referrers on a registry without the referrers API
        (docker-registry 2.8), where cosign 2.5 puts and looks for bundles."""
        return self.digest.replace(":", "-")


def registry_call(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[dict, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the test's own plain-HTTP registry
        return dict(response.headers), response.read()


def push_blob(registry: str, repository: str, content: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    headers, _ = registry_call("POST", f"http://{registry}/v2/{repository}/blobs/uploads/", b"")
    location = headers["Location"]
    location = location if location.startswith("http") else f"http://{registry}{location}"
    separator = "&" if "?" in location else "?"
    registry_call("PUT", f"{location}{separator}digest={digest}", content,
                  {"Content-Type": "application/octet-stream"})
    return digest


def push_manifest(registry: str, repository: str, manifest: dict, tag: str | None = None) -> tuple[str, int]:
    """Put manifest under tag, or by its digest alone; its digest and size."""
    body = json.dumps(manifest, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    registry_call("PUT", f"http://{registry}/v2/{repository}/manifests/{tag or digest}", body,
                  {"Content-Type": manifest["mediaType"]})
    return digest, len(body)


def get_manifest(registry: str, repository: str, reference: str) -> dict:
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    return json.loads(registry_call("GET", f"http://{registry}/v2/{repository}/manifests/{reference}",
                                    headers={"Accept": accept})[1])


def get_blob(registry: str, repository: str, digest: str) -> bytes:
    return registry_call("GET", f"http://{registry}/v2/{repository}/blobs/{digest}")[1]


def push_image(registry: str) -> Image:
    """A tiny image of its own (its layer unique), under a repository of its own."""
    repository = f"bundle-verifiers/{uuid.uuid4().hex[:12]}"
    config = b"{}"
    layer = f"layer {uuid.uuid4()}".encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                           "digest": push_blob(registry, repository, config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": len(layer),
                            "digest": push_blob(registry, repository, layer)}]}
    digest, size = push_manifest(registry, repository, manifest, tag="latest")
    return Image(registry, repository, digest, size)


def cosign_attest(cosign: Path, image: Image, folder: Path) -> bytes:
    """`cosign attest --new-bundle-format` with the first test key and no tlog: the bundle it attached."""
    from .signing_fixtures import FIRST, TEST_PASSWORD

    predicate = folder / "predicate.json"
    predicate.write_text(json.dumps(PREDICATE))
    attested = subprocess.run([str(cosign), "attest", "--yes", "--new-bundle-format", "--key", str(FIRST),
                               "--tlog-upload=false", "--allow-insecure-registry", "--allow-http-registry",
                               "--type", PREDICATE_TYPE, "--predicate", str(predicate), image.reference],
                              env={**os.environ, "COSIGN_PASSWORD": TEST_PASSWORD}, capture_output=True, text=True,
                              timeout=120, check=False)
    assert attested.returncode == 0, attested.stderr
    return referrer_bundle(image)


def referrer_manifest(image: Image) -> tuple[dict, dict]:
    """The one referrer cosign's fallback index lists: the index's entry and the referrer's manifest."""
    index = get_manifest(image.registry, image.repository, image.fallback_tag)
    [entry] = index["manifests"]
    return entry, get_manifest(image.registry, image.repository, entry["digest"])


def referrer_bundle(image: Image) -> bytes:
    _, manifest = referrer_manifest(image)
    [layer] = manifest["layers"]
    assert manifest["artifactType"] == layer["mediaType"] == BUNDLE_MEDIA_TYPE, manifest
    return get_blob(image.registry, image.repository, layer["digest"])


def replace_bundle(image: Image, bundle: bytes) -> None:
    """cosign's referrer swapped for one in its very layout holding bundle instead: the layer replaced, then the
    fallback index made to list the new referrer alone."""
    entry, manifest = referrer_manifest(image)
    manifest["layers"][0].update(digest=push_blob(image.registry, image.repository, bundle), size=len(bundle))
    digest, size = push_manifest(image.registry, image.repository, manifest)
    index = get_manifest(image.registry, image.repository, image.fallback_tag)
    index["manifests"] = [{**entry, "digest": digest, "size": size}]
    push_manifest(image.registry, image.repository, index, tag=image.fallback_tag)


@pytest.fixture
def attested(cosign, own_registry, tmp_path) -> tuple[Image, bytes]:
    """A fresh image in a registry of this test's own, attested by the real cosign: the image and cosign's bundle."""
    _, registry = own_registry
    image = push_image(registry)
    return image, cosign_attest(cosign, image, tmp_path)


# cosign 2.5's words for a signature that does not verify, and for a statement about another image.
BAD_SIGNATURE = "accepted signatures do not match threshold, Found: 0, Expected 1"
ANOTHER_SUBJECT = "provided artifact digest does not match any digest in statement"


def cosign_refusal(cosign: Path, image: Image, public_key: Path, folder: Path) -> str:
    """Why cosign refuses image's attestation (the test fails if it accepts it)."""
    verified = cosign_verify_bundle_attestation(cosign, image.reference, public_key, PREDICATE_TYPE,
                                                cosign_trusted_root(folder))
    assert verified.returncode != 0, f"cosign accepted it:\n{verified.stdout}"
    return verified.stderr


@pytest.mark.engine
def test_every_verifier_accepts_cosigns_bundle_and_refuses_another_key(cosign, attested, tmp_path):
    from .signing_fixtures import FIRST, SECOND

    image, bundle = attested
    first_public, second_public = FIRST.with_suffix(".pub"), SECOND.with_suffix(".pub")
    assert statement_of(bundle)["subject"][0]["digest"] == {"sha256": image.digest.removeprefix("sha256:")}
    assert bundle_schema_errors(bundle) == []

    verified = cosign_verify_bundle_attestation(cosign, image.reference, first_public, PREDICATE_TYPE,
                                                cosign_trusted_root(tmp_path))
    assert verified.returncode == 0, verified.stderr
    assert BAD_SIGNATURE in cosign_refusal(cosign, image, second_public, tmp_path)

    assert sigstore_js_verify(bundle, first_public.read_text(), image.digest) == (True, PREDICATE_TYPE)
    accepted, why = sigstore_js_verify(bundle, second_public.read_text(), image.digest)
    assert not accepted and "PUBLIC_KEY_ERROR" in why, why
    accepted, why = sigstore_js_verify(bundle, first_public.read_text(), ANOTHER_DIGEST)
    assert not accepted and "no subject has the digest" in why, why


@pytest.mark.engine
def test_cosign_refuses_a_changed_payload_byte(cosign, attested, tmp_path):
    from .signing_fixtures import FIRST

    image, bundle = attested
    changed = with_payload_byte_changed(bundle, at=b"passed")
    replace_bundle(image, changed)
    assert referrer_bundle(image) == changed  # cosign will read the changed one
    assert BAD_SIGNATURE in cosign_refusal(cosign, image, FIRST.with_suffix(".pub"), tmp_path)
    accepted, why = sigstore_js_verify(changed, FIRST.with_suffix(".pub").read_text(), image.digest)
    assert not accepted and "SIGNATURE_ERROR" in why, why


@pytest.mark.engine
def test_cosign_accepts_a_bundle_made_in_python_and_refuses_one_about_another_image(cosign, attested, tmp_path):
    """A bundle made here with the same key, in cosign's shape: accepted when its statement is about the image (what
    the project's own bundles must be), refused when it is about another digest though its signature is good."""
    from .signing_fixtures import FIRST, key

    image, _ = attested
    first, first_public = key(FIRST), FIRST.with_suffix(".pub")
    about_the_image = dsse_bundle(in_toto_statement(image.digest, PREDICATE_TYPE, PREDICATE, name=image.repository),
                                  first.sign, first_public.read_text())
    replace_bundle(image, about_the_image)
    verified = cosign_verify_bundle_attestation(cosign, image.reference, first_public, PREDICATE_TYPE,
                                                cosign_trusted_root(tmp_path))
    assert verified.returncode == 0, verified.stderr

    about_another = dsse_bundle(in_toto_statement(ANOTHER_DIGEST, PREDICATE_TYPE, PREDICATE, name=image.repository),
                                first.sign, first_public.read_text())
    replace_bundle(image, about_another)
    assert ANOTHER_SUBJECT in cosign_refusal(cosign, image, first_public, tmp_path)
    assert sigstore_js_verify(about_another, first_public.read_text(), ANOTHER_DIGEST) == (True, PREDICATE_TYPE)
    assert not sigstore_js_verify(about_another, first_public.read_text(), image.digest)[0]
