"""Signing keys held on a PKCS#11 token (an HSM, a smart card, a YubiKey, SoftHSM2), named as cosign names them: an
RFC 7512 URI such as `pkcs11:token=NAME;object=LABEL?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=1234`.

The private key never leaves the token: the host hashes the message (SHA-256), the token signs the digest (CKM_ECDSA)
and its raw r||s signature is written as the DER cosign writes. As in cosign, the module comes from module-path or
COSIGN_PKCS11_MODULE_PATH and the user PIN from pin-value or COSIGN_PKCS11_PIN; pin-source (RFC 7512: a file holding
it) is read too. Messages show the URI with `pin-value=...`, never the PIN.
"""
from __future__ import annotations

import hashlib
import re
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pkcs11
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from pkcs11 import KeyType, Mechanism, ObjectClass, SignMixin, TokenFlag
from pkcs11.util.ec import encode_ec_public_key

from ..files import brief, read_bytes
from ..model import InputError, PeerError, Problem
from .keys import PIN_ATTRIBUTE, PublicKey, SigningKey, pkcs11_attributes, redacted

if TYPE_CHECKING:
    from pkcs11._pkcs11 import lib as Module  # what pkcs11.lib() returns

PIN_VARIABLE = "COSIGN_PKCS11_PIN"
MODULE_VARIABLE = "COSIGN_PKCS11_MODULE_PATH"
EXAMPLE_MODULE = "/usr/lib/softhsm/libsofthsm2.so"
LIST_OBJECTS = "`pkcs11-tool --module MODULE --login --list-objects` lists them"
# A session runs one operation at a time and a token has one login for the whole process: signatures (publish signs
# from threads) take turns, each in a session of its own that logs in and out.
TOKEN_TURN = threading.Lock()
PROBE = b"torchimages: is the public key object the private key's half?"
SLOT_NUMBER = re.compile(r"[0-9]{1,20}", re.ASCII)
MAX_SLOT_ID = 2**64 - 1  # a CK_ULONG


class KeyReference:
    """What a pkcs11: URI names: the module, the token (label or slot), the key (label or id) and the PIN."""

    def __init__(self, uri: str, environment: Mapping[str, str]):
        self.shown = redacted(uri)
        where, how = (_attributes(part) for part in pkcs11_attributes(uri))
        self.token_label = _text(where.get("token"))
        self.slot_id = self._slot_id(where.get("slot-id"))
        self.key_label = _text(where.get("object"))
        self.key_id = urllib.parse.unquote_to_bytes(where["id"]) if where.get("id") else None
        self.module = _text(how.get("module-path")) or environment.get(MODULE_VARIABLE, "")
        self.pin = (_text(how.get(PIN_ATTRIBUTE)) or self._pin_from(how.get("pin-source"))
                    or environment.get(PIN_VARIABLE) or None)
        self._check()

    def wrong(self, message: str) -> InputError:
        return InputError([Problem(self.shown, 0, message)])

    @property
    def key_name(self) -> str:
        return f"labelled {self.key_label!r}" if self.key_label is not None else f"with id {self.key_id!r}"

    @property
    def token_name(self) -> str:
        return f"token {self.token_label!r}" if self.token_label is not None else f"the token in slot {self.slot_id}"

    @property
    def search(self) -> dict:
        """get_key's keywords for the key's objects (private and public): its label and id."""
        found: dict = {}
        if self.key_label is not None:
            found["label"] = self.key_label
        if self.key_id is not None:
            found["id"] = self.key_id
        return found

    def _slot_id(self, text: str | None) -> int | None:
        """A slot number as PKCS#11 holds one (a CK_ULONG): ASCII digits only (str.isdigit takes '²' and '٣', which
        int() refuses or reads), and few enough of them (int() refuses thousands)."""
        if text is None:
            return None
        if not SLOT_NUMBER.fullmatch(text) or int(text) > MAX_SLOT_ID:
            raise self.wrong(f"slot-id={brief(text)} is not a slot number: `softhsm2-util --show-slots` (or "
                             "`pkcs11-tool --list-slots`) lists them")
        return int(text)

    def _pin_from(self, source: str | None) -> str | None:
        """The PIN in the file pin-source names (`file:/path` or a path), its line end dropped."""
        if source is None:
            return None
        path = Path(urllib.parse.unquote(source).removeprefix("file://").removeprefix("file:"))
        data = read_bytes(path, f"pin-source names the file holding the token's PIN (or set {PIN_VARIABLE})")
        return data.decode("utf-8", errors="replace").rstrip("\r\n")

    def _check(self) -> None:
        if self.token_label is None and self.slot_id is None:
            raise self.wrong("names no token: add token=LABEL (or slot-id=N), e.g. "
                             f"pkcs11:token=NAME;object=LABEL?module-path={EXAMPLE_MODULE}")
        if self.key_label is None and self.key_id is None:
            raise self.wrong("names no key: add object=LABEL (or id=%XX...) to the path, before any '?'")
        if not self.module:
            raise self.wrong(f"names no PKCS#11 module: add ?module-path={EXAMPLE_MODULE} (the token vendor's module) "
                             f"or set {MODULE_VARIABLE}")
        if not Path(self.module).is_absolute() or not Path(self.module).is_file():
            raise self.wrong(f"module-path {self.module} is not a file: give the absolute path of the token "
                             f"vendor's PKCS#11 module (SoftHSM2: {EXAMPLE_MODULE})")


class TokenSigningKey(SigningKey):
    """A key that signs on its token: this process holds its public half and the way to reach it, never the key."""

    def __init__(self, reference: KeyReference, token: pkcs11.Token, public: PublicKey):
        self.source = reference.shown
        self._reference, self._token, self._public = reference, token, public

    @property
    def public(self) -> PublicKey:
        return self._public

    def sign(self, message: bytes) -> bytes:
        try:
            raw = self._sign_digest(hashlib.sha256(message).digest())
        except pkcs11.PKCS11Error as error:  # a token pulled out or locked since it was opened
            raise PeerError(f"{self.source}: the token did not sign ({type(error).__name__}): is it still "
                            "there, and its PIN unchanged?") from None
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big"))

    def _sign_digest(self, digest: bytes) -> bytes:
        with TOKEN_TURN, self._token.open(user_pin=self._reference.pin) as session:
            return _private_key(session, self._reference).sign(digest, mechanism=Mechanism.ECDSA)


def load_token_key(uri: str, environment: Mapping[str, str]) -> TokenSigningKey:
    """The key a pkcs11: URI names, checked on its token (found, PIN right, ECDSA P-256, its public key object its
    own); an InputError naming the URI (PIN redacted) and what to do otherwise."""
    reference = KeyReference(uri, environment)
    module = _module(reference)
    try:
        token = _token(module, reference)
        if reference.pin is None and token.flags & TokenFlag.LOGIN_REQUIRED:
            raise reference.wrong(f"{reference.token_name} needs its user PIN: set {PIN_VARIABLE} (or pin-source=FILE "
                                  "in the URI's query)")
        with TOKEN_TURN, token.open(user_pin=reference.pin) as session:
            public = _public_key(session, reference)
    except pkcs11.PKCS11Error as error:
        raise reference.wrong(_refusal(error, reference)) from None
    key = TokenSigningKey(reference, token, public)
    # A public key object of the same name that is another key's would sign images nobody can verify: caught now.
    if not public.verifies(key.sign(PROBE), PROBE):
        raise reference.wrong(f"the public key object {reference.key_name} is not the private key's half: the token "
                              f"holds two keys of that name ({LIST_OBJECTS}); name the key by id=")
    return key


def _module(reference: KeyReference) -> Module:
    try:
        return pkcs11.lib(reference.module)
    except pkcs11.PKCS11Error as error:
        why = str(error).rpartition(f"{reference.module}: ")[2]  # the loader's reason, after the paths it repeats
        raise reference.wrong(f"module-path {reference.module} is not a PKCS#11 module ({why}): give the token "
                              f"vendor's module (SoftHSM2: {EXAMPLE_MODULE})") from None


def _token(module: Module, reference: KeyReference) -> pkcs11.Token:
    tokens = [slot.get_token() for slot in module.get_slots(token_present=True)
              if reference.slot_id is None or slot.slot_id == reference.slot_id]
    matching = [token for token in tokens if reference.token_label in (None, token.label)]
    if len(matching) == 1:
        return matching[0]
    wanted = f"labelled {reference.token_label!r}" if reference.token_label is not None else ""
    wanted += f" in slot {reference.slot_id}" if reference.slot_id is not None else ""
    if matching:
        raise reference.wrong(f"{len(matching)} tokens are {wanted.strip()}: name one by slot-id=N "
                              "(`softhsm2-util --show-slots` or `pkcs11-tool --list-slots` lists them)")
    present = ", ".join(repr(token.label) for token in tokens if token.flags & TokenFlag.TOKEN_INITIALIZED) or "none"
    raise reference.wrong(f"no token {wanted.strip()} in {reference.module} (tokens there: {present}): plug it in, "
                          "or fix token= (SoftHSM2: its SOFTHSM2_CONF's tokendir)")


def _public_key(session: pkcs11.Session, reference: KeyReference) -> PublicKey:
    """The key's public half, read from the public key object beside it; checks the private key is there too and is
    ECDSA P-256, the kind cosign and cluster verifiers check."""
    private = _private_key(session, reference)
    if private.key_type != KeyType.EC:
        raise reference.wrong(f"the key {reference.key_name} is an {private.key_type.name} key: signing here takes "
                              "ECDSA P-256 keys, what every cluster verifier checks")
    try:
        public_object = session.get_key(ObjectClass.PUBLIC_KEY, **reference.search)
    except pkcs11.NoSuchKey:
        raise reference.wrong(f"the token holds the private key {reference.key_name} but no public key object of that "
                              "name, which signing here (and cosign) reads the public key from: import it with "
                              "`pkcs11-tool --write-object key.pub --type pubkey` and the same label and id") from None
    public = serialization.load_der_public_key(encode_ec_public_key(cast(pkcs11.PublicKey, public_object)))
    if not isinstance(public, ec.EllipticCurvePublicKey) or not isinstance(public.curve, ec.SECP256R1):
        curve = public.curve.name if isinstance(public, ec.EllipticCurvePublicKey) else type(public).__name__
        raise reference.wrong(f"the key {reference.key_name} is on {curve}: signing here takes ECDSA P-256 keys, what "
                              "every cluster verifier checks")
    return PublicKey(public)


def _private_key(session: pkcs11.Session, reference: KeyReference) -> SignMixin:
    found = session.get_key(ObjectClass.PRIVATE_KEY, **reference.search)
    if not isinstance(found, SignMixin):  # python-pkcs11 gives a key sign() only where the token lets it sign
        raise reference.wrong(f"the key {reference.key_name} may not sign (its CKA_SIGN is false): make a signing key")
    return found


def _refusal(error: pkcs11.PKCS11Error, reference: KeyReference) -> str:
    """What a token's refusal means, and the fix."""
    token = reference.token_name
    if isinstance(error, pkcs11.PinIncorrect | pkcs11.PinInvalid | pkcs11.PinLenRange):
        return f"{token} refused the PIN: give its user PIN in pin-value, pin-source or {PIN_VARIABLE}"
    if isinstance(error, pkcs11.PinLocked | pkcs11.PinExpired):
        return f"{token}'s user PIN is locked or expired: its security officer resets it"
    if isinstance(error, pkcs11.NoSuchKey):
        return (f"{token} holds no private key {reference.key_name} ({LIST_OBJECTS}): fix object= or id= in "
                "the URI")
    if isinstance(error, pkcs11.MultipleObjectsReturned):
        return f"{token} holds several private keys {reference.key_name}: name one by id= as well"
    return f"{token} refused ({type(error).__name__}): check the token and its module"


def _attributes(items: list[str]) -> dict[str, str]:
    """RFC 7512's name=value pairs, values still percent-encoded (an id is bytes, the rest UTF-8 text)."""
    pairs = (item.partition("=") for item in items if item)
    return {name: value for name, _, value in pairs}


def _text(value: str | None) -> str | None:
    return urllib.parse.unquote(value) if value else None
