"""Independent verifiers of Sigstore bundles (v0.3, a DSSE envelope signed with a key, as `cosign attest
--new-bundle-format` writes them), for the tests of the project's own bundles: none of them uses torchimages' code.

- sigstore-js (@sigstore/verify, pinned in devtools/sigstore-js/): `sigstore_js_verify`; the tests that call it skip,
  saying why, where the machine has no node;
- the real cosign 2.5, offline (an empty trusted root, no transparency log): `cosign_trusted_root`,
  `cosign_verify_bundle_attestation`;
- the bundle's JSON schema from sigstore/protobuf-specs (tests/data/sigstore/): `bundle_schema_errors`.

And what a test needs to make a bundle of its own: `in_toto_statement`, `dsse_bundle`, `public_key_hint`.
"""
from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives import serialization
from filelock import FileLock

SCHEMA = Path(__file__).parent / "data" / "sigstore" / "Bundle.schema.json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
# What cosign 2.5's `attest` writes (its in-toto library's default), though v1 is the current one.
STATEMENT_V01 = "https://in-toto.io/Statement/v0.1"
# cosign's `--trusted-root` with nothing in it: with `--key` and `--insecure-ignore-tlog` the key is all it trusts.
EMPTY_TRUSTED_ROOT = {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}
NODE_TIMEOUT_S = 60
COSIGN_TIMEOUT_S = 120


# ------------------------------------------------------------------------------------------------------ sigstore-js
def sigstore_js_command() -> list[str]:
    """node and devtools/verify_bundle.mjs, its packages installed first (`npm ci`, by whichever test process comes
    first: the others wait for it); the calling test is skipped where there is no node."""
    from devtools import sigstore_js

    node = sigstore_js.node_path()
    if node is None:
        pytest.skip("no node (Node.js 20.17 or newer) on PATH: sigstore-js cannot verify here "
                    "(Debian: apt-get install nodejs npm; then `make cosign`)")
    # Outside the packages' folder: `npm ci` empties node_modules, and the folder is the repository's.
    lock = Path(tempfile.gettempdir()) / f"torchimages-sigstore-js-{_short_hash(str(sigstore_js.PACKAGES))}.lock"
    with FileLock(lock):
        return [str(node), str(sigstore_js.ensure_sigstore_js())]


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def sigstore_js_verify(bundle: bytes, public_pem: str, subject_digest: str) -> tuple[bool, str]:
    """Whether @sigstore/verify accepts bundle with public_pem as its only trust material and finds subject_digest
    among the statement's subjects; with the predicateType it read, or its one line saying why not."""
    command = sigstore_js_command()
    with tempfile.TemporaryDirectory(prefix="sigstore-js-") as scratch:
        bundle_file, key_file = Path(scratch) / "bundle.json", Path(scratch) / "key.pub"
        bundle_file.write_bytes(bundle)
        key_file.write_text(public_pem)
        result = subprocess.run([*command, str(bundle_file), str(key_file), subject_digest],
                                capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False)
    if result.returncode == 0:
        return True, result.stdout.strip()
    return False, (result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}, no message")


# ----------------------------------------------------------------------------------------------------------- cosign
def cosign_trusted_root(folder: Path) -> Path:
    """An empty trusted root (no CAs, logs or timestamp authorities) in folder, for `--trusted-root`: cosign 2.5 wants
    one with --new-bundle-format, and would otherwise fetch the public-good instance's over the network."""
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / "trusted_root.json"
    root.write_text(json.dumps(EMPTY_TRUSTED_ROOT))
    return root


def cosign_verify_bundle_attestation(cosign: Path, reference: str, public_key: Path, predicate_type: str,
                                     trusted_root: Path) -> subprocess.CompletedProcess:
    """`cosign verify-attestation` of reference's bundle referrers, offline: the key, the empty trusted root and no
    transparency log; a plain-HTTP registry allowed (the tests' local one). The finished process, output as text."""
    command = [str(cosign), "verify-attestation", "--new-bundle-format", "--trusted-root", str(trusted_root),
               "--key", str(public_key), "--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry",
               "--type", predicate_type, reference]
    return subprocess.run(command, capture_output=True, text=True, timeout=COSIGN_TIMEOUT_S, check=False)


# ----------------------------------------------------------------------------------------------------------- schema
def bundle_schema_errors(bundle: bytes) -> list[str]:
    """What the protobuf-specs JSON schema finds wrong in bundle, one line each as `where: what`; [] when valid."""
    try:
        document = json.loads(bundle)
    except ValueError as error:
        return [f"(bundle): not JSON: {error}"]
    validator = jsonschema.Draft4Validator(bundle_schema())
    errors = sorted(validator.iter_errors(document), key=lambda error: list(map(str, error.absolute_path)))
    return [f"{'/'.join(map(str, error.absolute_path)) or '(bundle)'}: {_short(error.message)}" for error in errors]


@functools.cache
def bundle_schema() -> dict[str, Any]:
    """The vendored schema with the generator's two faults corrected (tests/data/sigstore/README.md)."""
    schema = json.loads(SCHEMA.read_text())
    corrected = copy.deepcopy(schema)
    for definition in corrected["definitions"].values():
        # The oneOf alternatives name proto fields (dsse_envelope); the properties, and bundles, the JSON names
        # (dsseEnvelope).
        for alternative in definition.get("oneOf", []):
            alternative["required"] = [_json_name(field) for field in alternative.get("required", [])]
    # protos/sigstore_bundle.proto: `VerificationMaterial verification_material = 2 [(google.api.field_behavior) =
    # REQUIRED]`, a mark the generator dropped. (The protos' other REQUIRED marks are on the tlog entries', inclusion
    # proofs' and certificates' fields, which a key-signed bundle without a tlog does not hold.)
    corrected["definitions"]["Bundle"]["required"] = ["verificationMaterial"]
    return corrected


def _json_name(proto_field: str) -> str:
    """The proto3 JSON mapping's name of a field: lowerCamelCase."""
    return re.sub(r"_([a-z0-9])", lambda match: match.group(1).upper(), proto_field)


def _short(message: str, limit: int = 300) -> str:
    """jsonschema's messages quote the whole offending value (a bundle's payload among it): enough to recognise it."""
    return message if len(message) <= limit else message[:limit] + "..."


# ------------------------------------------------------------------------------------------------- making a bundle
def public_key_hint(public_pem: str) -> str:
    """The verification material's key hint as cosign writes it: base64 of the SHA-256 of the key's DER (SPKI)."""
    key = serialization.load_pem_public_key(public_pem.encode())
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def in_toto_statement(subject_digest: str, predicate_type: str, predicate: dict[str, Any],
                      name: str = "registry.example/ml/pytorch", statement_type: str = STATEMENT_V01) -> bytes:
    """An in-toto statement about one subject, subject_digest as `sha256:<hex>`, compact JSON as cosign writes it."""
    algorithm, hex_digest = subject_digest.split(":", 1)
    statement = {"_type": statement_type, "predicateType": predicate_type,
                 "subject": [{"name": name, "digest": {algorithm: hex_digest}}], "predicate": predicate}
    return json.dumps(statement, separators=(",", ":")).encode()


def dsse_pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, what the envelope's signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def dsse_bundle(payload: bytes, sign: Callable[[bytes], bytes], public_pem: str,
                payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> bytes:
    """A v0.3 bundle in the shape cosign 2.5 writes: the key's hint, one DSSE signature (sign: message -> DER ECDSA
    over its SHA-256), no tlog entries or timestamps."""
    signature = base64.b64encode(sign(dsse_pae(payload_type, payload))).decode()
    bundle = {"mediaType": BUNDLE_MEDIA_TYPE,
              "verificationMaterial": {"publicKey": {"hint": public_key_hint(public_pem)}},
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
                               "signatures": [{"sig": signature}]}}
    return json.dumps(bundle).encode()


def with_payload_byte_changed(bundle: bytes, at: bytes) -> bytes:
    """bundle with one byte of its DSSE payload changed, the signature kept: the first byte of the first occurrence of
    at, a letter, swapped to the other case (the statement stays valid JSON, so only the signature can refuse it)."""
    document = json.loads(bundle)
    payload = bytearray(base64.b64decode(document["dsseEnvelope"]["payload"]))
    index = payload.index(at)
    assert chr(payload[index]).isalpha(), f"{at!r} must start with a letter"
    payload[index] ^= 0x20
    document["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()
    return json.dumps(document).encode()


def statement_of(bundle: bytes) -> dict[str, Any]:
    """The in-toto statement a bundle's envelope carries (unverified: for a test's own inspection)."""
    return json.loads(base64.b64decode(json.loads(bundle)["dsseEnvelope"]["payload"]))
