"""Signatures and attestations in cosign's formats, made and checked with `cryptography` alone (no cosign binary).

What cosign writes and checks, key-based, without a transparency log (`cosign verify --key KEY.pub
--insecure-ignore-tlog=true`, Kyverno's `rekor: {ignoreTlog: true}`):
- a signature is an ECDSA P-256 signature (DER, base64) over the SHA-256 of a "simple signing" payload naming the
  repository and the manifest digest; it travels as a layer of the `sha256-<hex>.sig` tag, its payload the layer,
  the signature in the layer's annotation;
- an attestation is an in-toto Statement v1 (subject: the manifest digest) in a DSSE envelope whose signature is
  over the envelope's PAE encoding; it travels as a layer of the `sha256-<hex>.att` tag, its predicate type in the
  layer's annotation.

Signing keys (`SigningKey`: sign(message) -> DER, public, source): a key made by `cosign generate-key-pair` (an
"ENCRYPTED SIGSTORE PRIVATE KEY": scrypt + NaCl secretbox around PKCS#8, password in COSIGN_PASSWORD, cosign's own
convention), a PKCS#8 PEM key (encrypted or not), from a file or env://VAR; or a key in hardware, named by a PKCS#11
URI as cosign names it (`pkcs11:token=NAME;object=LABEL?module-path=...`, keys_pkcs11.py), which signs on the token.
ECDSA P-256 only: it is what cosign makes, and what every verifier in front of a cluster (cosign, Kyverno,
policy-controller, Ratify, CRI-O) checks with SHA-256. Cloud KMS URIs (awskms://, gcpkms://, azurekms://,
hashivault://, k8s://) are refused with how to sign with cosign and the same key instead: its formats are these.
Neither a key, its password nor a PIN ever reaches a message.

Public keys (`verify-image --key`): any PEM key cosign 2.5 verifies with `--key`: ECDSA P-256, P-384 and P-521, RSA
(PKCS#1 v1.5, SHA-256) and Ed25519. cosign 2.5 hashes with SHA-256 whatever the key unless told otherwise
(`--signature-digest-algorithm`; sigstore's LoadVerifier), while a KMS signs with its curve's own hash (SHA-384 on
P-384, SHA-512 on P-521): both are accepted on those curves.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import nacl.exceptions
import nacl.secret
from asn1crypto import keys as asn1_keys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ..files import read_bytes
from ..model import InputError, Problem
from .keys import (
    ECDSA_HASHES,
    KEY_KINDS,
    PKCS11_SCHEME,
    FileSigningKey,
    PublicKey,
    SignatureError,
    SigningKey,
    redacted,
)

SIGNATURE_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
ATTESTATION_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_TYPE_ANNOTATION = "predicateType"
SIMPLE_SIGNING_TYPE = "cosign container image signature"
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

PASSWORD_VARIABLE = "COSIGN_PASSWORD"
KEY_VARIABLE = "TORCHIMAGES_SIGNING_KEY"
ENV_PREFIX = "env://"  # cosign's way to name a key held in an environment variable (a CI secret)
COSIGN_PEM_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")
# scrypt's cost parameters are read from the key file: bounded, so a hostile file cannot ask for gigabytes.
MAX_SCRYPT_N = 1 << 20
# scrypt works in 128 * r * N bytes of memory: cosign's keys ask 32 MiB (N 32768, r 8). More is refused before any
# derivation, as is a PBKDF2 count past what any tool writes (OpenSSL 2048, cryptography far fewer than this): one
# derivation is one C call that no signal interrupts.
MAX_SCRYPT_MEMORY = 256 << 20
MAX_PBKDF2_ITERATIONS = 10_000_000
MAKE_A_KEY = ("make one with `cosign generate-key-pair` (password in COSIGN_PASSWORD) or "
              "`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out key.pem`")
KMS_SCHEMES = ("awskms://", "gcpkms://", "azurekms://", "hashivault://", "k8s://")
# A key reference given where a path belongs (verify-image's --key) arrives with its `://` made `:/`.
KEY_REFERENCES_AS_PATHS = (*(scheme.replace("://", ":/") for scheme in KMS_SCHEMES), PKCS11_SCHEME)
# The curves cosign verifies, each with the hash a KMS signs with on it (besides cosign's own default, SHA-256).
# ------------------------------------------------------------------------------------------------------------ keys

def load_signing_key(source: str, environment: Mapping[str, str] | None = None) -> SigningKey:
    """The private key named by source (a file, env://VAR, or a pkcs11: URI), decrypted with COSIGN_PASSWORD where
    it is encrypted; an InputError naming the source and what to do, never quoting the key, its password or a PIN."""
    variables: Mapping[str, str] = os.environ if environment is None else environment
    if source.startswith(PKCS11_SCHEME):
        from .keys_pkcs11 import load_token_key  # python-pkcs11 loads only for keys in hardware

        return load_token_key(source, variables)
    if source.startswith(KMS_SCHEMES):
        raise InputError([Problem(source, 0, _sign_with_cosign(source))])
    text = _key_text(source, variables)
    password = variables.get(PASSWORD_VARIABLE, "").encode()

    def wrong(message: str) -> InputError:
        return InputError([Problem(source, 0, message)])

    if "PUBLIC KEY-----" in text and "PRIVATE KEY-----" not in text:
        raise wrong("is a public key: signing needs the private key (cosign.key), the public one is for verifying")
    pem_type = _pem_type(text)
    if pem_type in COSIGN_PEM_TYPES:
        der = _cosign_decrypt(text, password, wrong)
        key = _load_der(der, wrong)
    elif pem_type and pem_type.endswith("PRIVATE KEY"):
        key = _load_pem(text.encode(), password, wrong)
    else:
        raise wrong(f"is not a PEM private key: {MAKE_A_KEY}")
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        kind = key.curve.name if isinstance(key, ec.EllipticCurvePrivateKey) else type(key).__name__.removeprefix("_")
        raise wrong(f"is a {_key_kind(kind)} key: cosign-compatible signing here takes ECDSA P-256 keys, "
                    f"what every cluster verifier checks; {MAKE_A_KEY}")
    return FileSigningKey(key, source)


def load_public_key(path: Path) -> PublicKey:
    """A PEM public key (cosign.pub) of a kind cosign verifies, for verifying; an InputError naming the file
    otherwise."""
    reference = str(path)
    if reference.startswith(KEY_REFERENCES_AS_PATHS):
        scheme = reference.partition(":")[0]
        example = "pkcs11:..." if reference.startswith(PKCS11_SCHEME) else f"{scheme}://..."
        raise InputError([Problem(redacted(reference), 0, f"is a key reference, and --key reads a PEM public key: "
                                                           f"`cosign public-key --key '{example}' > key.pub` writes "
                                                           "it; pass key.pub")])
    data = read_bytes(path, "--key names the PEM public key the images were signed with (cosign.pub)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise InputError([Problem(reference, 0, f"is not a PEM public key{_what_it_is(data)}: "
                                                "`cosign public-key --key cosign.key` prints it")]) from None
    except Exception:  # noqa: BLE001 - cryptography's UnsupportedAlgorithm: a key of a kind it cannot read
        raise InputError([Problem(reference, 0, f"holds a public key of a kind cosign does not verify: {KEY_KINDS}")]) \
            from None
    if isinstance(key, rsa.RSAPublicKey | ed25519.Ed25519PublicKey) or (
            isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in ECDSA_HASHES):
        return PublicKey(key)
    kind = key.curve.name if isinstance(key, ec.EllipticCurvePublicKey) else type(key).__name__
    raise InputError([Problem(reference, 0, f"is a {_key_kind(kind)} public key: cosign verifies {KEY_KINDS}")])


def _what_it_is(data: bytes) -> str:
    if b"PRIVATE KEY" in data:
        return " (it is a private key: give the public one)"
    if b"CERTIFICATE" in data:
        return " (it is a certificate: `openssl x509 -pubkey -noout -in CERT` prints its public key)"
    return ""


def _sign_with_cosign(uri: str) -> str:
    """How to sign with a cloud KMS key, which this tool cannot reach: cosign with the same key writes the same
    formats, and verify-image checks them with the key's public half."""
    return (f"{uri.partition('://')[0]} keys sign inside their KMS, which this tool does not reach: publish without "
            f"--signing-key, then sign and attest each digest with cosign and the same key (the formats are the "
            f"same): `cosign sign --key {uri} --tlog-upload=false REPO@DIGEST` and `cosign attest --key {uri} "
            f"--tlog-upload=false --type TYPE --predicate FILE REPO@DIGEST`")


def _key_text(source: str, environment) -> str:
    if source.startswith(ENV_PREFIX):
        name = source.removeprefix(ENV_PREFIX)
        value = environment.get(name)
        if not value:
            raise InputError([Problem(source, 0, f"the environment variable {name} is not set or empty: set it to "
                                                 "the PEM text of the signing key (a CI secret)")])
        return value
    data = read_bytes(Path(source), f"--signing-key (or {KEY_VARIABLE}) names the private key file; {MAKE_A_KEY}")
    return data.decode("ascii", errors="replace")


def _pem_type(text: str) -> str | None:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("-----BEGIN ") and line.endswith("-----"):
            return line.removeprefix("-----BEGIN ").removesuffix("-----")
    return None


def _key_kind(name: str) -> str:
    """A key's kind as people name it, from its class or curve name."""
    kinds = {"RSA": "RSA", "Ed25519": "Ed25519", "Ed448": "Ed448", "X25519": "X25519", "X448": "X448", "DSA": "DSA",
             "secp384r1": "ECDSA P-384", "secp521r1": "ECDSA P-521"}
    base = name.removeprefix("_").removesuffix("PrivateKey").removesuffix("PublicKey")
    return kinds.get(base, name)


def _pbkdf2_iterations(data: bytes) -> int:
    """The key-derivation iteration count an encrypted PKCS#8 PEM asks for (0 when it cannot be read here: the key
    loader then says what is wrong with it)."""
    body = b"".join(line.strip() for line in data.splitlines() if line.strip() and not line.startswith(b"-----"))
    try:
        algorithm = asn1_keys.EncryptedPrivateKeyInfo.load(base64.b64decode(body))["encryption_algorithm"]
        return int(algorithm.kdf_iterations)  # PBES2's PBKDF2, or PBES1's and PKCS#12's own counts
    except (ValueError, TypeError, KeyError, binascii.Error):
        return 0


def _load_pem(data: bytes, password: bytes, wrong):
    if _pem_type(data.decode("ascii", errors="replace")) == "ENCRYPTED PRIVATE KEY":
        iterations = _pbkdf2_iterations(data)
        if iterations > MAX_PBKDF2_ITERATIONS:
            raise wrong(f"asks for {iterations} PBKDF2 iterations, more than any key tool writes "
                        f"({MAX_PBKDF2_ITERATIONS} at most): the file is damaged")
    try:
        return serialization.load_pem_private_key(data, password or None)
    except TypeError:  # encrypted and no password, or a password for a key that has none
        if password:
            return _load_pem(data, b"", wrong)
        raise wrong(f"is encrypted: put its password in {PASSWORD_VARIABLE}") from None
    except ValueError:
        raise wrong(f"cannot be read as a private key (a wrong {PASSWORD_VARIABLE}, or a damaged file)") from None
    except Exception:  # noqa: BLE001 - cryptography's UnsupportedAlgorithm and its Rust errors
        raise wrong(f"holds a key of a kind that cannot be used: {MAKE_A_KEY}") from None


def _load_der(der: bytes, wrong):
    try:
        return serialization.load_der_private_key(der, None)
    except Exception:  # noqa: BLE001 - any failure means the same: not a key
        raise wrong("decrypts to something that is not a private key: the file is damaged") from None


def _cosign_decrypt(text: str, password: bytes, wrong) -> bytes:
    """cosign's encrypted key: a JSON document (scrypt parameters and salt, a secretbox nonce, the ciphertext) in PEM."""
    body = "".join(line.strip() for line in text.strip().splitlines() if not line.startswith("-----"))
    try:
        document = json.loads(base64.b64decode(body, validate=True))
        params, salt = document["kdf"]["params"], base64.b64decode(document["kdf"]["salt"], validate=True)
        nonce = base64.b64decode(document["cipher"]["nonce"], validate=True)
        ciphertext = base64.b64decode(document["ciphertext"], validate=True)
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError):
        raise wrong("is not a cosign key file of the shape `cosign generate-key-pair` writes: the file is damaged") \
            from None
    if document["kdf"].get("name") != "scrypt" or document["cipher"].get("name") != "nacl/secretbox":
        raise wrong("is encrypted with something other than scrypt and nacl/secretbox, which cosign writes")
    if not (2 <= n <= MAX_SCRYPT_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise wrong("asks for scrypt parameters outside what cosign writes: the file is damaged")
    if 128 * r * n > MAX_SCRYPT_MEMORY:
        raise wrong(f"asks for {128 * r * n >> 20} MiB of scrypt memory, more than any cosign key "
                    f"({MAX_SCRYPT_MEMORY >> 20} MiB at most): the file is damaged")
    if not password:
        raise wrong(f"is encrypted: put its password in {PASSWORD_VARIABLE}")
    try:
        secret = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=32, maxmem=128 * r * (n + p + 2) + (1 << 20))
    except (ValueError, MemoryError):
        raise wrong("cannot derive its key with the scrypt parameters it names: the file is damaged") from None
    try:
        return nacl.secret.SecretBox(secret).decrypt(ciphertext, nonce)
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise wrong(f"cannot be decrypted: {PASSWORD_VARIABLE} is not its password") from None


# -------------------------------------------------------------------------------------------------------- payloads

def simple_signing_payload(repository: str, digest: str) -> bytes:
    """What a cosign signature signs: the repository and the manifest digest."""
    return json.dumps({"critical": {"identity": {"docker-reference": repository},
                                    "image": {"docker-manifest-digest": digest},
                                    "type": SIMPLE_SIGNING_TYPE},
                       "optional": None}, separators=(",", ":")).encode()


def statement(repository: str, digest: str, predicate_type: str, predicate: dict) -> bytes:
    """An in-toto Statement v1 about repository@digest."""
    algorithm, _, value = digest.partition(":")
    return json.dumps({"_type": STATEMENT_TYPE, "subject": [{"name": repository, "digest": {algorithm: value}}],
                       "predicateType": predicate_type, "predicate": predicate}, sort_keys=True,
                      separators=(",", ":")).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signature is over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def envelope(key: SigningKey, payload: bytes) -> bytes:
    """A DSSE envelope of an in-toto payload, signed with key."""
    signature = key.sign(pae(IN_TOTO_PAYLOAD_TYPE, payload))
    return json.dumps({"payloadType": IN_TOTO_PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                       "signatures": [{"keyid": "", "sig": base64.b64encode(signature).decode()}]},
                      separators=(",", ":")).encode()


# ------------------------------------------------------------------------------------------------------- checking

def check_signature(key: PublicKey, payload: bytes, signature_b64: str, digest: str) -> None:
    """That a signature layer is key's signature naming digest; a SignatureError saying why not."""
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("its signature annotation is not base64") from None
    if not key.verifies(signature, payload):
        raise SignatureError("the signature does not match this key and payload")
    try:
        signed = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise SignatureError("the signed payload is not a simple-signing document") from None
    if signed != digest:
        raise SignatureError(f"it signs {signed}, not {digest}")


def open_envelope(key: PublicKey, document: bytes, digest: str) -> dict:
    """The statement inside a DSSE envelope that key signed about digest; a SignatureError saying why not."""
    try:
        sealed = json.loads(document)
        payload = base64.b64decode(sealed["payload"], validate=True)
        signatures = [base64.b64decode(entry["sig"], validate=True) for entry in sealed["signatures"]]
        payload_type = sealed["payloadType"]
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError):
        raise SignatureError("not a DSSE envelope") from None
    if payload_type != IN_TOTO_PAYLOAD_TYPE:
        raise SignatureError(f"its payload type is {payload_type!r}, not in-toto")
    if not any(key.verifies(signature, pae(payload_type, payload)) for signature in signatures):
        raise SignatureError("no signature in the envelope matches this key")
    try:
        found = json.loads(payload)
        subjects = [subject["digest"] for subject in found["subject"]]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise SignatureError("its payload is not an in-toto statement") from None
    algorithm, _, value = digest.partition(":")
    if not any(isinstance(subject, dict) and subject.get(algorithm) == value for subject in subjects):
        raise SignatureError(f"its subject is not {digest}")
    return found
