"""Signing and public keys as the trust stage passes them around: a `SigningKey` signs (in this process, or on a
PKCS#11 token: keys_pkcs11.py), a `PublicKey` verifies as `cosign verify --key` does. Where keys come from (files,
env://, pkcs11: URIs) is signing.py's `load_signing_key`; this module is what both sides of that name."""
from __future__ import annotations

import abc
import hashlib
import urllib.parse
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from ..model import TorchImagesError
from ..redaction import inert

PKCS11_SCHEME = "pkcs11:"
PIN_ATTRIBUTE = "pin-value"  # in a pkcs11: URI's query: shown as pin-value=...
SHOWN_URI_CHARACTERS = 300  # of a key URI in a message: a hostile one is megabytes long

ECDSA_HASHES: dict[str, hashes.HashAlgorithm] = {
    "secp256r1": hashes.SHA256(), "secp384r1": hashes.SHA384(), "secp521r1": hashes.SHA512()}
KEY_KINDS = "ECDSA P-256, P-384 or P-521, RSA and Ed25519 keys, as PEM"
VerifyingKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey


class SignatureError(TorchImagesError):
    """A signature or attestation that does not hold: what it is and why."""


@dataclass(frozen=True)
class PublicKey:
    key: VerifyingKey

    @property
    def pem(self) -> str:
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    @property
    def fingerprint(self) -> str:
        """sha256 of the DER public key, as `sha256:<hex>`: what the catalog lists and a consumer compares."""
        der = self.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return "sha256:" + hashlib.sha256(der).hexdigest()

    def verifies(self, signature: bytes, message: bytes) -> bool:
        """Whether signature is this key's over message, as `cosign verify --key` checks it."""
        key = self.key
        if isinstance(key, ec.EllipticCurvePublicKey):
            return any(_holds(key.verify, signature, message, ec.ECDSA(algorithm)) for algorithm in _ecdsa_hashes(key))
        if isinstance(key, rsa.RSAPublicKey):  # cosign's default for RSA keys: PKCS#1 v1.5, SHA-256
            return _holds(key.verify, signature, message, padding.PKCS1v15(), hashes.SHA256())
        return _holds(key.verify, signature, message)


def _ecdsa_hashes(key: ec.EllipticCurvePublicKey) -> list[hashes.HashAlgorithm]:
    """SHA-256 (cosign's, whatever the curve) and the curve's own hash (a KMS's): a signature over one digest cannot
    pass for one over another's without a collision between the two."""
    own = ECDSA_HASHES.get(key.curve.name, hashes.SHA256())
    return list({algorithm.name: algorithm for algorithm in (hashes.SHA256(), own)}.values())


def _holds(verify, *arguments) -> bool:
    try:
        verify(*arguments)
    except InvalidSignature:
        return False
    return True


class SigningKey(abc.ABC):
    """A private key that signs in cosign's way: ECDSA P-256 over SHA-256, the signature DER-encoded."""

    source: str  # the file, env:// name or key URI (its PIN redacted) it came from, for messages

    @property
    @abc.abstractmethod
    def public(self) -> PublicKey: ...

    @abc.abstractmethod
    def sign(self, message: bytes) -> bytes: ...

    def __repr__(self) -> str:  # never the key, its password or a PIN
        return f"{type(self).__name__}({self.source!r}, {self.public.fingerprint})"


@dataclass(frozen=True, repr=False)
class FileSigningKey(SigningKey):
    """A key read from a file or an environment variable, held in this process."""

    private: ec.EllipticCurvePrivateKey
    source: str

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.private.public_key())

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message, ec.ECDSA(hashes.SHA256()))


def pkcs11_attributes(uri: str) -> tuple[list[str], list[str]]:
    """A pkcs11: URI's path and query attributes (`name=value`, the value still percent-encoded), split as RFC 7512
    splits them: the path ends at the first '?', its attributes at ';', the query's at '&'. The one reading of a key
    URI: its parser (keys_pkcs11.KeyReference) and its redaction both take it, so that a PIN ends where both say."""
    path, _, query = uri.removeprefix(PKCS11_SCHEME).partition("?")
    return path.split(";"), query.split("&")


def redacted(reference: str) -> str:
    """A key URI as messages show it: without its PIN, wherever in the URI a pin-value is (the parser reads the
    query's; one in the path is hidden too), its control characters escaped and cut short."""
    if reference.startswith(PKCS11_SCHEME):
        path, query = ([f"{item.partition('=')[0]}=..." if _names_pin(item) else item for item in part]
                       for part in pkcs11_attributes(reference))
        reference = PKCS11_SCHEME + ";".join(path) + ("?" + "&".join(query) if "?" in reference else "")
    shown = inert(reference)
    if len(shown) <= SHOWN_URI_CHARACTERS:
        return shown
    return f"{shown[:SHOWN_URI_CHARACTERS]}... ({len(shown)} characters)"


def _names_pin(attribute: str) -> bool:
    """Whether an attribute is a PIN, however its name is spelled (encoded or capitalised: hiding more is safe)."""
    return urllib.parse.unquote(attribute.partition("=")[0]).strip().lower() == PIN_ATTRIBUTE
