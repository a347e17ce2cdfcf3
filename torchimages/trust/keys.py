"""Signing and public keys as the trust stage passes them around: a `SigningKey` signs (in this process, or on a
PKCS#11 token: keys_pkcs11.py), a `PublicKey` verifies as `cosign verify --key` does. Where keys come from (files,
env://, pkcs11: URIs) is signing.py's `load_signing_key`; this module is what both sides of that name."""
from __future__ import annotations

import abc
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from ..model import TorchImagesError

PKCS11_SCHEME = "pkcs11:"
PIN_VALUE = re.compile(r"(pin-value=)[^&;]*")  # in a pkcs11: URI: shown as pin-value=...

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


def redacted(reference: str) -> str:
    """A key URI as messages show it: without its PIN."""
    return PIN_VALUE.sub(r"\1...", reference)
