"""Keys beyond a file: a key in hardware (a PKCS#11 token: SoftHSM2's, made here in a temporary folder, `make
softhsm`) signs without leaving it; cloud KMS keys are refused with the way to sign with them; verify-image takes every
public key kind cosign verifies. The token's signature and attestation are checked by the real cosign on the real
registry of `make engine`.
"""
import _hashlib
import hashlib
import io
import json
import os
import subprocess
import tarfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pkcs11
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from pkcs11 import Attribute, KeyType, ObjectClass
from pkcs11.util.ec import encode_ec_public_key, encode_named_curve_parameters

from devtools.softhsm import UTILITY, softhsm_module
from torchimages.peers.registry import RegistryClient, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import Registry
from torchimages.trust import attestations, signing
from torchimages.trust.keys_pkcs11 import TokenSigningKey
from torchimages.trust.signatures import SignatureStore, signature_layer

from .conftest import FIXTURE_PROJECT, run_cli, run_cli_in_process
from .signing_fixtures import (
    CPU_ROW,
    DIGEST,
    KEYS,
    MATRIX,
    cosign_accepts,
    pem_key,
    publish_refusing_the_key,
    scratch_folders,
)

TOKEN_LABEL = "torchimages-test"
# Test PINs, distinctive so that a leak into any output is found by a plain search.
PIN, WRONG_PIN, SO_PIN = "735914", "208461", "5551212"
KEY_LABEL = "signer"
MESSAGE = b"a payload to sign"


@dataclass(frozen=True)
class Token:
    """A SoftHSM2 token of the tests' own, its keys made on it."""

    module: Path
    public_pem: Path  # the signing key's public half, exported

    def uri(self, key: str = KEY_LABEL, pin: str | None = PIN, module: str | None = None,
            token: str = TOKEN_LABEL) -> str:
        query = [f"module-path={module or self.module}"] + ([f"pin-value={pin}"] if pin is not None else [])
        return f"pkcs11:token={token};object={key}?{'&'.join(query)}"


@pytest.fixture(scope="session")
def token(tmp_path_factory) -> Token:
    """One token per test process: SoftHSM2 reads SOFTHSM2_CONF once, when a process first loads its module."""
    module = softhsm_module()
    assert module, "the hardware-key tests need SoftHSM2: run `make softhsm` (python -m devtools.softhsm)"
    folder = tmp_path_factory.mktemp("softhsm")
    (folder / "tokens").mkdir()
    config = folder / "softhsm2.conf"
    config.write_text(f"directories.tokendir = {folder / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    os.environ["SOFTHSM2_CONF"] = str(config)
    subprocess.run([UTILITY, "--init-token", "--free", "--label", TOKEN_LABEL, "--pin", PIN, "--so-pin", SO_PIN],
                   check=True, capture_output=True, timeout=60)
    public_pem = folder / "signer.pub"
    with pkcs11.lib(str(module)).get_token(token_label=TOKEN_LABEL).open(rw=True, user_pin=PIN) as session:
        public = make_ec_key(session, KEY_LABEL, "secp256r1")
        public_pem.write_bytes(serialization.load_der_public_key(encode_ec_public_key(public)).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        make_ec_key(session, "p384", "secp384r1")
        make_ec_key(session, "lonely", "secp256r1").destroy()  # a private key without its public key object
        session.generate_keypair(KeyType.RSA, 2048, label="rsa", store=True)
    return Token(module, public_pem)


def make_ec_key(session, label: str, curve: str):
    """An EC key pair made on the token, its private half never extractable; returns the public half."""
    parameters = session.create_domain_parameters(
        KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters(curve)}, local=True)
    public, _ = parameters.generate_keypair(store=True, label=label, private_template={
        Attribute.EXTRACTABLE: False, Attribute.SENSITIVE: True})
    return public


# ------------------------------------------------------------------------------------------------ the token's key

def test_a_token_key_signs_what_its_exported_public_key_verifies(token):
    key = signing.load_signing_key(token.uri(), {})
    exported = signing.load_public_key(token.public_pem)
    assert isinstance(key, TokenSigningKey) and key.public.fingerprint == exported.fingerprint
    signature = key.sign(MESSAGE)
    decode_dss_signature(signature)  # DER, as cosign writes it
    assert exported.verifies(signature, MESSAGE) and not exported.verifies(signature, MESSAGE + b"!")
    layer = signature_layer(key, "registry.example.com/ml/pytorch", DIGEST)
    signing.check_signature(exported, layer.data, layer.annotations[signing.SIGNATURE_ANNOTATION], DIGEST)
    document = signing.envelope(key, signing.statement("r/x", DIGEST, attestations.VERIFICATION_PREDICATE, {"a": 1}))
    assert signing.open_envelope(exported, document, DIGEST)["predicate"] == {"a": 1}
    assert PIN not in repr(key) and "pin-value=..." in repr(key) and key.public.pem == token.public_pem.read_text()


def test_the_token_key_cannot_be_read_out(token):
    with pkcs11.lib(str(token.module)).get_token(token_label=TOKEN_LABEL).open(user_pin=PIN) as session:
        private = session.get_key(ObjectClass.PRIVATE_KEY, label=KEY_LABEL)
        assert private[Attribute.EXTRACTABLE] is False and private[Attribute.SENSITIVE] is True
        with pytest.raises(pkcs11.AttributeSensitive):
            private[Attribute.VALUE]


def test_the_pin_and_module_come_from_cosign_s_variables_or_a_pin_file(token, tmp_path):
    fingerprint = signing.load_public_key(token.public_pem).fingerprint
    from_variables = f"pkcs11:token={TOKEN_LABEL};object={KEY_LABEL}"
    environment = {"COSIGN_PKCS11_PIN": PIN, "COSIGN_PKCS11_MODULE_PATH": str(token.module)}
    assert signing.load_signing_key(from_variables, environment).public.fingerprint == fingerprint
    (tmp_path / "pin").write_text(PIN + "\n")
    from_file = f"{token.uri(pin=None)}&pin-source=file:{tmp_path / 'pin'}"
    assert signing.load_signing_key(from_file, {"COSIGN_PKCS11_PIN": WRONG_PIN}).public.fingerprint == fingerprint


def test_signers_on_threads_take_turns_on_the_token(token):
    key = signing.load_signing_key(token.uri(), {})
    signed: dict[bytes, bytes] = {}
    signers = [threading.Thread(target=lambda message=message: signed.update({message: key.sign(message)}))
               for message in (b"one", b"two", b"three", b"four")]
    for signer in signers:
        signer.start()
    for signer in signers:
        signer.join()
    assert len(signed) == 4 and all(key.public.verifies(signature, message) for message, signature in signed.items())


# ------------------------------------------------------------------------------------------------------ bad input

def bad_token_keys(token: Token, folder: Path) -> dict[str, tuple[str, dict, str]]:
    """name -> (--signing-key value, environment, what the one line must say)."""
    (folder / "not-a-module.so").write_text("hello\n")
    unset = {"COSIGN_PKCS11_PIN": "", "COSIGN_PKCS11_MODULE_PATH": ""}
    return {
        "no such token": (token.uri(token="no-such-token"), unset, "no token labelled 'no-such-token'"),
        "no such key": (token.uri(key="no-such-key"), unset, "holds no private key labelled 'no-such-key'"),
        "wrong pin": (token.uri(pin=WRONG_PIN), unset, "refused the PIN"),
        "wrong pin in the variable": (token.uri(pin=None), {**unset, "COSIGN_PKCS11_PIN": WRONG_PIN},
                                      "refused the PIN"),
        "no pin": (token.uri(pin=None), unset, "needs its user PIN: set COSIGN_PKCS11_PIN"),
        "no module": (f"pkcs11:token={TOKEN_LABEL};object={KEY_LABEL}?pin-value={PIN}", unset,
                      "names no PKCS#11 module"),
        "missing module": (token.uri(module=str(folder / "nope.so")), unset, "is not a file"),
        "not a library": (token.uri(module=str(folder / "not-a-module.so")), unset, "is not a PKCS#11 module"),
        # a shared library already loaded here, with no PKCS#11 entry point
        "a library, not PKCS#11": (token.uri(module=_hashlib.__file__), unset,
                                   "is not a PKCS#11 module (undefined symbol: C_GetFunctionList)"),
        "no key named": (f"pkcs11:token={TOKEN_LABEL}?module-path={token.module}&pin-value={PIN}", unset,
                         "names no key"),
        "missing pin file": (f"{token.uri(pin=None)}&pin-source=file:{folder / 'nope'}", unset,
                             "cannot read it (No such file or directory): pin-source names the file holding"),
        "p384 key": (token.uri(key="p384"), unset, "is on secp384r1: signing here takes ECDSA P-256"),
        "rsa key": (token.uri(key="rsa"), unset, "is an RSA key"),
        "no public key object": (token.uri(key="lonely"), unset, "no public key object"),
        "aws kms": ("awskms:///alias/release", unset, "`cosign sign --key awskms:///alias/release"),
        "gcp kms": ("gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k", unset, "and `cosign attest --key gcpkms"),
        "azure kms": ("azurekms://vault.vault.azure.net/key", unset, "keys sign inside their KMS"),
        "vault": ("hashivault://release", unset, "keys sign inside their KMS"),
        "kubernetes": ("k8s://ci/signing-key", unset, "keys sign inside their KMS"),
    }


@pytest.mark.parametrize("case", ["no such token", "no such key", "wrong pin", "wrong pin in the variable", "no pin",
                                  "no module", "missing module", "not a library", "a library, not PKCS#11",
                                  "no key named", "missing pin file", "p384 key", "rsa key", "no public key object",
                                  "aws kms", "gcp kms", "azure kms", "vault", "kubernetes"])
def test_a_bad_key_uri_exits_2_with_one_line_and_leaks_no_pin(token, tmp_path, case):
    source, environment, expected = bad_token_keys(token, tmp_path)[case]
    result, line = publish_refusing_the_key(tmp_path, source, environment, expected)
    assert PIN not in result.stdout + result.stderr and WRONG_PIN not in result.stdout + result.stderr
    named = str(tmp_path / "nope") if case == "missing pin file" else source.partition(":")[0] + ":"
    assert line.startswith(f"error: {named}")  # the key or the PIN's file named (the CLI hides a URI's token=)


def test_a_wrong_pin_from_a_fresh_process_is_one_line_too(token, tmp_path):
    result = run_cli("--matrix", str(MATRIX), *scratch_folders(tmp_path), "publish", CPU_ROW, "--registry",
                     "127.0.0.1:1/x/pytorch", "--catalog", str(tmp_path / "catalog"), "--signing-key",
                     token.uri(pin=WRONG_PIN), env={**os.environ, "COSIGN_PKCS11_PIN": ""}, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "pin-value=...: token 'torchimages-test' refused the PIN" in result.stderr
    assert WRONG_PIN not in result.stdout + result.stderr and PIN not in result.stdout + result.stderr


# --------------------------------------------------------------------------------------------- public key kinds

def public_pem(private) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize("kind", ["p256", "p384", "p521", "rsa", "ed25519"])
def test_every_public_key_kind_cosign_verifies_loads_and_verifies(tmp_path, kind):
    """With cosign's hash for each (SHA-256 for all; on P-384 and P-521 also the curve's own, as a KMS signs)."""
    def ecdsa(curve, *algorithms):
        private = ec.generate_private_key(curve)
        return private, [private.sign(MESSAGE, ec.ECDSA(algorithm)) for algorithm in algorithms]

    if kind == "rsa":
        private = rsa.generate_private_key(65537, 2048)
        signatures = [private.sign(MESSAGE, padding.PKCS1v15(), hashes.SHA256())]
    elif kind == "ed25519":
        private = ed25519.Ed25519PrivateKey.generate()
        signatures = [private.sign(MESSAGE)]
    else:
        curve, own = {"p256": (ec.SECP256R1(), hashes.SHA256()), "p384": (ec.SECP384R1(), hashes.SHA384()),
                      "p521": (ec.SECP521R1(), hashes.SHA512())}[kind]
        private, signatures = ecdsa(curve, hashes.SHA256(), own)
    (tmp_path / "key.pub").write_bytes(public_pem(private))
    loaded = signing.load_public_key(tmp_path / "key.pub")
    der = private.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert loaded.fingerprint == "sha256:" + hashlib.sha256(der).hexdigest()
    assert loaded.pem.encode() == public_pem(private)
    for signature in signatures:
        assert loaded.verifies(signature, MESSAGE) and not loaded.verifies(signature, MESSAGE + b"!")
    if kind == "rsa":  # PSS is not cosign's default for RSA keys
        pss = private.sign(MESSAGE, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
        assert not loaded.verifies(pss, MESSAGE)


def bad_public_keys(folder: Path) -> dict[str, tuple[str, str]]:
    """name -> (--key value, what the one line must say)."""
    (folder / "dsa.pub").write_bytes(public_pem(dsa.generate_private_key(2048)))
    (folder / "k1.pub").write_bytes(public_pem(ec.generate_private_key(ec.SECP256K1())))
    (folder / "garbage.pub").write_text("hello\n")
    (folder / "private.pem").write_bytes(pem_key(ec.generate_private_key(ec.SECP256R1())))
    (folder / "cert.pem").write_bytes(self_signed_certificate())
    return {
        "dsa": (str(folder / "dsa.pub"), "is a DSA public key: cosign verifies ECDSA P-256, P-384 or P-521, RSA"),
        "secp256k1": (str(folder / "k1.pub"), "is a secp256k1 public key"),
        "garbage": (str(folder / "garbage.pub"), "is not a PEM public key"),
        "private key": (str(folder / "private.pem"), "it is a private key"),
        "certificate": (str(folder / "cert.pem"), "it is a certificate: `openssl x509 -pubkey"),
        "kms reference": ("awskms:///alias/release", "`cosign public-key --key 'awskms://...' > key.pub`"),
        "token reference": (f"pkcs11:token=t;object=k?pin-value={PIN}", "is a key reference"),
    }


def self_signed_certificate() -> bytes:
    import datetime

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                   .sign(private, hashes.SHA256()))
    return certificate.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize("case", ["dsa", "secp256k1", "garbage", "private key", "certificate", "kms reference",
                                  "token reference"])
def test_a_public_key_cosign_does_not_verify_exits_2_with_one_line(tmp_path, case):
    key, expected = bad_public_keys(tmp_path)[case]
    result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image", "127.0.0.1:1/x/pytorch:tag", "--key", key)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert PIN not in result.stderr


# ----------------------------------------------------------------------------------------- the real registry

def tiny_image(folder: Path) -> Path:
    """An OCI layout of one small image of its own (a new digest each run): no build, no engine."""
    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media_type: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    content, archive = uuid.uuid4().hex.encode(), io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        entry = tarfile.TarInfo("hello.txt")
        entry.size = len(content)
        tar.addfile(entry, io.BytesIO(content))
    layer = blob(archive.getvalue(), "application/vnd.oci.image.layer.v1.tar")
    config = blob(json.dumps({"architecture": "amd64", "os": "linux",
                              "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode(),
                  "application/vnd.oci.image.config.v1+json")
    manifest = blob(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                "config": config, "layers": [layer]}).encode(),
                    "application/vnd.oci.image.manifest.v1+json")
    (folder / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (folder / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {**manifest, "annotations": {"org.opencontainers.image.ref.name": "tiny"}}]}))
    return folder


def test_the_real_cosign_accepts_what_the_token_key_signed_and_attested(token, engine_env, cosign, tmp_path):
    registry = Registry(engine_env.registry, f"t{uuid.uuid4().hex[:10]}/tiny")
    layout, digest_file = tiny_image(tmp_path / "layout"), tmp_path / "digest"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--digestfile", str(digest_file),
                    f"oci:{layout}:tiny", f"docker://{registry.name}:tiny"], check=True, timeout=120)
    digest = digest_file.read_text().strip()
    store = SignatureStore(RegistryClient(registry, registry_access(registry), RetryPolicy(retries=1), lambda _: None))
    key = signing.load_signing_key(token.uri(), {})
    try:
        assert store.sign(key, digest) == "added"
        assert store.attest(key, digest, {attestations.VERIFICATION_PREDICATE: {"result": "passed"}}) == "added"
        reference = f"{registry.name}@{digest}"
        assert cosign_accepts(cosign, reference, token.public_pem)
        assert cosign_accepts(cosign, reference, token.public_pem, attestations.VERIFICATION_PREDICATE)
        assert not cosign_accepts(cosign, reference, KEYS / "first.pub")
    finally:
        store.remove(digest)
        store.registry.delete(digest)
