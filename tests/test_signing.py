"""Signed, attested publishing: keys, signatures and DSSE attestations in cosign's formats, checked by the real
cosign CLI (Debian 13's package, `make cosign`) and by `build.py verify-image`, on the real registry of `make engine`.
The CPU rows themselves are published signed and checked by cosign in test_publish's nightly end-to-end test.
"""
import base64
import contextlib
import json
import re
import shutil
import threading
import urllib.request
from pathlib import Path

import docker.errors
import pytest
from asn1crypto import keys as asn1_keys
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from torchimages.matrix.load import load_matrix
from torchimages.trust import attestations, bundles, signing
from torchimages.trust.signatures import (
    Layer,
    attestation_tag,
    signature_layer,
    signature_tag,
    signed_by,
)

from .conftest import FIXTURE_COMPAT, run_cli_in_process
from .publish_fixtures import DEVEL, RUNTIME, Workspace, clean_up
from .registry_fixtures import start_refusing_proxy
from .signing_fixtures import (
    CPU_ROW,
    DIGEST,
    FIRST,
    KEYS,
    MATRIX,
    SECOND,
    SIGNED,
    TEST_PASSWORD,
    accepted_everything,
    cosign_accepts,
    environment,
    key,
    pem_key,
    publish_refusing_the_key,
    scratch_folders,
    store_of,
    verification_report,
    write_layers,
)

# ------------------------------------------------------------------------------------------------------- keys

def test_a_cosign_key_opens_with_its_password_and_matches_its_public_key():
    loaded = key()
    assert loaded.public.pem.strip() == (KEYS / "first.pub").read_text().strip()
    assert signing.load_public_key(KEYS / "first.pub").fingerprint == loaded.public.fingerprint
    assert "torchimages-test" not in repr(loaded) and "PRIVATE" not in repr(loaded)


def test_a_pkcs8_key_plain_or_encrypted_and_an_env_key_load(tmp_path):
    private = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "plain.pem").write_bytes(pem_key(private))
    (tmp_path / "locked.pem").write_bytes(pem_key(private, b"secret"))
    fingerprint = signing.PublicKey(private.public_key()).fingerprint
    assert signing.load_signing_key(str(tmp_path / "plain.pem"), {}).public.fingerprint == fingerprint
    assert signing.load_signing_key(str(tmp_path / "locked.pem"), {"COSIGN_PASSWORD": "secret"}).public.fingerprint \
        == fingerprint
    environment = {"CI_KEY": pem_key(private).decode()}
    assert signing.load_signing_key("env://CI_KEY", environment).public.fingerprint == fingerprint


def with_pbkdf2_iterations(pem: bytes, iterations: int) -> bytes:
    """An encrypted PKCS#8 key whose PBKDF2 asks for this many iterations (it no longer opens: only read up front)."""
    info = asn1_keys.EncryptedPrivateKeyInfo.load(pem_to_der(pem))
    info["encryption_algorithm"]["parameters"]["key_derivation_func"]["parameters"]["iteration_count"] = iterations
    body = base64.encodebytes(info.dump(force=True)).decode()
    return f"-----BEGIN ENCRYPTED PRIVATE KEY-----\n{body}-----END ENCRYPTED PRIVATE KEY-----\n".encode()


def pem_to_der(pem: bytes) -> bytes:
    return base64.b64decode(b"".join(line for line in pem.splitlines() if not line.startswith(b"-----")))


def bad_keys(folder: Path) -> dict[str, tuple[str, dict, str]]:
    """name -> (--signing-key value, environment, what the one line must say)."""
    (folder / "rsa.pem").write_bytes(pem_key(rsa.generate_private_key(65537, 2048)))
    (folder / "ed25519.pem").write_bytes(pem_key(ed25519.Ed25519PrivateKey.generate()))
    (folder / "p384.pem").write_bytes(pem_key(ec.generate_private_key(ec.SECP384R1())))
    (folder / "garbage.key").write_text("hello\n")
    cosign = (FIRST).read_text().splitlines()
    (folder / "damaged.key").write_text("\n".join([cosign[0], cosign[1][:-4] + "AAAA", *cosign[2:]]))
    document = {"kdf": {"name": "scrypt", "params": {"N": 1 << 30, "r": 8, "p": 1}, "salt": "AAAA"},
                "cipher": {"name": "nacl/secretbox", "nonce": "AAAA"}, "ciphertext": "AAAA"}
    body = base64.b64encode(json.dumps(document).encode()).decode()
    (folder / "greedy.key").write_text(f"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n{body}\n"
                                       "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    # Within each parameter's old bound, yet together 16 GiB of scrypt memory (past hashlib's maxmem: a traceback).
    document["kdf"]["params"] = {"N": 1 << 20, "r": 32, "p": 16}
    body = base64.b64encode(json.dumps(document).encode()).decode()
    (folder / "greedy-together.key").write_text(f"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n{body}\n"
                                                "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    (folder / "slow-pbkdf2.pem").write_bytes(with_pbkdf2_iterations(
        pem_key(ec.generate_private_key(ec.SECP256R1()), TEST_PASSWORD.encode()), 2_000_000_000))
    password = {"COSIGN_PASSWORD": TEST_PASSWORD}
    return {
        "missing": (str(folder / "nope.key"), password, "cannot read it"),
        "folder": (str(folder), password, "a folder where a file belongs"),
        "no password": (str(FIRST), {"COSIGN_PASSWORD": ""}, "is encrypted: put its password in COSIGN_PASSWORD"),
        "wrong password": (str(FIRST), {"COSIGN_PASSWORD": "not-the-password"}, "COSIGN_PASSWORD is not its password"),
        "public key": (str(KEYS / "first.pub"), password, "is a public key"),
        "rsa": (str(folder / "rsa.pem"), password, "is a RSA key"),
        "ed25519": (str(folder / "ed25519.pem"), password, "is a Ed25519 key"),
        "p384": (str(folder / "p384.pem"), password, "is a ECDSA P-384 key"),
        "garbage": (str(folder / "garbage.key"), password, "is not a PEM private key"),
        "damaged": (str(folder / "damaged.key"), password, "the file is damaged"),
        "greedy scrypt": (str(folder / "greedy.key"), password, "scrypt parameters"),
        "greedy scrypt together": (str(folder / "greedy-together.key"), password, "MiB of scrypt memory"),
        "slow pbkdf2": (str(folder / "slow-pbkdf2.pem"), password, "2000000000 PBKDF2 iterations"),
        "empty env": ("env://NO_SUCH_VARIABLE_SET", password, "NO_SUCH_VARIABLE_SET is not set"),
    }


@pytest.mark.parametrize("case", ["missing", "folder", "no password", "wrong password", "public key", "rsa", "ed25519",
                                  "p384", "garbage", "damaged", "greedy scrypt", "greedy scrypt together",
                                  "slow pbkdf2", "empty env"])
def test_a_bad_key_exits_2_with_one_line_and_leaks_nothing(tmp_path, case):
    source, environment, expected = bad_keys(tmp_path)[case]
    result, _ = publish_refusing_the_key(tmp_path, source, environment, expected)
    secret = environment.get("COSIGN_PASSWORD") or TEST_PASSWORD
    assert secret not in result.stdout + result.stderr
    assert "PRIVATE KEY-----\n" not in result.stderr and FIRST.read_text().splitlines()[1] not in result.stderr


def test_required_signing_without_a_key_exits_2_before_anything(tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("signing: required\n" + MATRIX.read_text())
    shutil.copy(FIXTURE_COMPAT, tmp_path / "compat.yaml")
    assert load_matrix(matrix).signing == "required"
    result = run_cli_in_process("--matrix", str(matrix), *scratch_folders(tmp_path), "publish", CPU_ROW,
                                "--registry", "127.0.0.1:1/x/pytorch", "--catalog", str(tmp_path / "catalog"), env={})
    assert result.returncode == 2 and "says `signing: required`, and no key was given" in result.stderr, result.stderr
    flagged = run_cli_in_process("--matrix", str(MATRIX), *scratch_folders(tmp_path), "publish", CPU_ROW, "--registry",
                                 "127.0.0.1:1/x/pytorch", "--catalog", str(tmp_path / "catalog"), "--require-signing",
                                 env={"TORCHIMAGES_SIGNING_KEY": ""})
    assert flagged.returncode == 2 and "--require-signing, and no key was given" in flagged.stderr
    matrix.write_text("signing: always\n" + MATRIX.read_text())
    wrong = run_cli_in_process("--matrix", str(matrix), "list")
    assert wrong.returncode == 2 and f"{matrix}:1: 'signing' must be one of optional, required" in wrong.stderr


# ---------------------------------------------------------------------------------------------- formats, offline

def test_signatures_and_envelopes_hold_for_their_key_and_digest_only():
    first, second = key(FIRST), key(SECOND)
    layer = signature_layer(first, "registry.example.com/ml/pytorch", DIGEST)
    signature = layer.annotations[signing.SIGNATURE_ANNOTATION]
    signing.check_signature(first.public, layer.data, signature, DIGEST)
    for public, payload, digest, why in [
            (second.public, layer.data, DIGEST, "does not match this key"),
            (first.public, layer.data.replace(b"ml/pytorch", b"ml/pytorcH"), DIGEST, "does not match"),
            (first.public, layer.data, "sha256:" + "cd" * 32, "not sha256:cdcd")]:
        with pytest.raises(signing.SignatureError, match=why):
            signing.check_signature(public, payload, signature, digest)

    document = signing.envelope(first, signing.statement("r/x", DIGEST, attestations.VERIFICATION_PREDICATE, {"a": 1}))
    assert signing.open_envelope(first.public, document, DIGEST)["predicate"] == {"a": 1}
    with pytest.raises(signing.SignatureError, match="no signature in the envelope matches"):
        signing.open_envelope(second.public, document, DIGEST)
    with pytest.raises(signing.SignatureError, match="its subject is not"):
        signing.open_envelope(first.public, document, "sha256:" + "cd" * 32)
    sealed = json.loads(document)
    sealed["payload"] = base64.b64encode(base64.b64decode(sealed["payload"]).replace(b'"a":1', b'"a":2')).decode()
    with pytest.raises(signing.SignatureError, match="no signature in the envelope matches"):
        signing.open_envelope(first.public, json.dumps(sealed).encode(), DIGEST)


def test_the_verification_report_names_the_gpu_host_a_policy_can_require():
    spec = load_matrix(MATRIX).specs[0]
    on_gpu = attestations.verification_predicate(spec, "sha256:" + "12" * 32, verification_report(gpu=True))
    kept = {key: value for key, value in on_gpu["host"].items() if key not in ("health", "performance")}  # issue 44
    assert on_gpu["host"]["health"]["healthy"] is None  # these facts carry no nvidia-smi health fields
    assert kept == {"kind": "gpu", "gpu_models": ["NVIDIA H100 80GB HBM3"],
                              "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}], "driver": "580.95.05",
                              "driver_major": 580, "cuda_driver": "13000", "note": ""}
    assert on_gpu["checks"]["gpu"]["status"] == "passed" and on_gpu["result"] == "passed"
    on_cpu = attestations.verification_predicate(spec, "sha256:" + "12" * 32, verification_report(gpu=False))
    assert on_cpu["host"]["note"] == "no GPU: GPU checks skipped" and on_cpu["checks"]["gpu"]["status"] == "skipped"


# ----------------------------------------------------------------------------------------- the real registry


@pytest.fixture
def workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    yield space
    clean_up(docker_client, space)


def verify_image(space: Workspace, reference: str, public: Path):
    return space.cli("verify-image", reference, "--key", str(public))


def test_a_signed_publish_is_accepted_by_cosign_and_verify_image_and_each_tampering_is_rejected(
        workspace, docker_client, cosign):
    workspace.build_verified(docker_client, RUNTIME)
    published = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    assert "signed with key sha256:" in published.stdout and "unsigned" not in published.stdout
    entry = workspace.catalog_json()["images"][RUNTIME]
    digest, first_pub, second_pub = entry["digest"], KEYS / "first.pub", KEYS / "second.pub"
    reference = f"{workspace.repository}@{digest}"
    assert entry["signing"]["keys"] == [key().public.fingerprint]
    assert (workspace.catalog / "keys" / f"{key().public.fingerprint[7:23]}.pub").read_text() == first_pub.read_text()
    readme = (workspace.images / "README.md").read_text()
    assert f"cosign verify --key catalog/keys/{key().public.fingerprint[7:23]}.pub" in readme  # from the project root

    assert accepted_everything(cosign, reference, first_pub)
    assert accepted_everything(cosign, f"{workspace.repository}:{RUNTIME}", first_pub)
    checked = verify_image(workspace, f"{workspace.repository}:{RUNTIME}", first_pub)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "signature: verified" in checked.stdout and "passed on cpu-only (no GPU: GPU checks skipped)" in checked.stdout
    assert "https://cyclonedx.org/bom: verified: CycloneDX SBOM" in checked.stdout

    # Another key.
    assert not cosign_accepts(cosign, reference, second_pub)
    assert verify_image(workspace, reference, second_pub).returncode == 1

    # A tampered payload: the signature kept, the payload changed (another repository named).
    store = store_of(workspace)
    original = store.layers(signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE)
    tampered = Layer(signing.SIGNATURE_MEDIA_TYPE, original[0].data.replace(b"/pytorch", b"/pytorcH"),
                     original[0].annotations)
    write_layers(store, signature_tag(digest), [tampered])
    assert not cosign_accepts(cosign, reference, first_pub)
    assert "NOT VERIFIED" in verify_image(workspace, reference, first_pub).stdout
    write_layers(store, signature_tag(digest), original)
    assert cosign_accepts(cosign, reference, first_pub)

    # The floating tag moved to another digest: nothing vouches for what it names now.
    other = workspace.build_verified(docker_client, DEVEL)
    workspace.publish(DEVEL)
    other_digest = workspace.catalog_json()["images"][DEVEL]["digest"]
    store.registry.copy_tag(other_digest, RUNTIME)
    assert other and not cosign_accepts(cosign, f"{workspace.repository}:{RUNTIME}", first_pub)
    assert verify_image(workspace, f"{workspace.repository}:{RUNTIME}", first_pub).returncode == 1

    # A deleted signature; the attestations alone do not pass verify-image either.
    store.registry.delete(store.registry.digest_of(signature_tag(digest)))
    assert not cosign_accepts(cosign, reference, first_pub)
    assert cosign_accepts(cosign, reference, first_pub, attestations.VERIFICATION_PREDICATE)
    deleted = verify_image(workspace, reference, first_pub)
    assert deleted.returncode == 1 and "no signature by this key" in deleted.stdout


def test_a_republish_adds_nothing_a_second_key_appends_and_prune_takes_only_pruned_digests_signatures(
        workspace, docker_client, cosign):
    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME, date="20260101", extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    old = workspace.catalog_json()["images"][RUNTIME]["digest"]
    store = store_of(workspace)
    again = workspace.publish(RUNTIME, date="20260101", extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    assert "unchanged" in again.stdout and "signature present, attestations present, bundles present" in again.stdout
    assert len(store.layers(signature_tag(old), signing.SIGNATURE_MEDIA_TYPE)) == 1
    assert len(store.layers(attestation_tag(old), signing.ATTESTATION_MEDIA_TYPE)) == 3

    rotated = workspace.publish(RUNTIME, date="20260101", extra=["--signing-key", str(SECOND)],
                                env=environment(**SIGNED))
    assert "signature added, attestations added" in rotated.stdout
    assert len(store.layers(signature_tag(old), signing.SIGNATURE_MEDIA_TYPE)) == 2
    assert len(store.layers(attestation_tag(old), signing.ATTESTATION_MEDIA_TYPE)) == 6
    reference = f"{workspace.repository}@{old}"
    assert accepted_everything(cosign, reference, KEYS / "first.pub")
    assert accepted_everything(cosign, reference, KEYS / "second.pub")
    assert workspace.catalog_json()["images"][RUNTIME]["signing"]["keys"] == sorted(
        [key(FIRST).public.fingerprint, key(SECOND).public.fingerprint])

    workspace.build_verified(docker_client, RUNTIME)  # a new image: a new digest, signed on 20260102
    workspace.publish(RUNTIME, date="20260102", extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    new = workspace.catalog_json()["images"][RUNTIME]["digest"]
    assert new != old
    pruned = workspace.cli("prune", RUNTIME, "--registry", workspace.repository, "--retention", "1",
                           "--catalog", str(workspace.catalog), check_exit=0)
    assert f"deleted {signature_tag(old)}" in pruned.stderr + pruned.stdout
    tags = set(workspace.tags())
    assert {signature_tag(new), attestation_tag(new), bundles.referrers_tag(new)} <= tags
    assert not {signature_tag(old), attestation_tag(old), bundles.referrers_tag(old)} & tags
    assert accepted_everything(cosign, f"{workspace.repository}@{new}", KEYS / "first.pub")


def test_a_foreign_signature_tag_is_refused_and_concurrent_signers_both_land(workspace, docker_client):
    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME)  # unsigned
    digest = workspace.catalog_json()["images"][RUNTIME]["digest"]
    store = store_of(workspace)
    store.registry.copy_tag(digest, signature_tag(digest))  # an image, not a signature, at the .sig tag
    refused = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED), check_exit=1)
    assert f"{signature_tag(digest)} holds a layer of type" in refused.stdout
    assert "it is not ours to rewrite" in refused.stdout and TEST_PASSWORD not in refused.stdout + refused.stderr
    assert workspace.digest_of(RUNTIME) == digest
    store.registry.delete(digest)  # the image and the tag that named it

    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME)
    digest = workspace.catalog_json()["images"][RUNTIME]["digest"]
    signers = [threading.Thread(target=store_of(workspace).sign, args=(key(path), digest)) for path in (FIRST, SECOND)]
    for signer in signers:
        signer.start()
    for signer in signers:
        signer.join()
    layers = store.layers(signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE)
    assert {signed.public.fingerprint for signed in (key(FIRST), key(SECOND))
            if any(signed_by(signed.public, layer, digest) for layer in layers)} == {key(FIRST).public.fingerprint,
                                                                                 key(SECOND).public.fingerprint}


def test_a_registry_that_refuses_the_signature_leaves_no_tag_on_the_unsigned_digest(tmp_path, docker_client,
                                                                                     own_registry):
    _, upstream = own_registry
    signature_push = re.compile(r"/v2/.+/manifests/sha256-[0-9a-f]{64}\.(?:sig|att)", re.ASCII)
    proxy = start_refusing_proxy(upstream, lambda method, path: method == "PUT" and bool(signature_push.fullmatch(path)))
    space = Workspace(tmp_path, f"127.0.0.1:{proxy.server_address[1]}")
    try:
        space.build_verified(docker_client, RUNTIME)
        refused = space.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED), check_exit=1)
        failed = [line for line in refused.stdout.splitlines() if line.startswith("failed")]
        assert len(failed) == 1 and "tag is protected" in failed[0] and "not signed, so no tag names it" in failed[0]
        assert space.tags() == [] and not (space.catalog / "catalog.json").exists()
        assert TEST_PASSWORD not in refused.stdout + refused.stderr
    finally:
        clean_up(docker_client, space)
        proxy.shutdown()


def test_a_damaged_wheel_record_stops_the_publish_before_anything_is_pushed(workspace, docker_client):
    workspace.build_verified(docker_client, RUNTIME)
    record = workspace.reports / RUNTIME / "wheels.json"
    record.write_text(json.dumps({"schema": 1, "input_hash": 3, "wheels": []}))
    refused = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED), check_exit=2)
    assert f"{record}:1: not a wheel record" in refused.stderr and "Traceback" not in refused.stderr
    assert workspace.tags() == []


def test_a_lazy_variant_prefetches_the_start_up_set_is_signed_and_a_plain_engine_runs_it(workspace, docker_client,
                                                                                          cosign, tmp_path):
    """Issue 58: `publish --lazy estargz` pushes the image's eStargz variant under its pinned tag + -esgz: the measured
    start-up set (REPORTS/<tag>/startup-set.json, here written as `startup-set` writes it) is each layer's prefetch
    area, the real cosign and verify-image accept it with the image's key, and Docker 20.10, which knows nothing of
    eStargz, pulls it as plain gzip and runs it."""
    from torchimages.publish import estargz, estargz_reader

    image_id = workspace.build_verified(docker_client, RUNTIME)
    diff_ids = docker_client.api.inspect_image(image_id)["RootFS"]["Layers"]
    record = workspace.reports / RUNTIME / "startup-set.json"
    # libc read in two runs of its first 1 MiB: not prefetched, cut where the runs begin and end (lazy.read_cuts).
    libc, size = docker_client.containers.run(image_id, ["sh", "-c", "stat -c '%n %s' /usr/lib/*-linux-gnu/libc.so.6"],
                                              remove=True).decode().split()
    libc_size = int(size)
    libc_reads = [[0, 4096], [600_000, 604_096]]
    record.write_text(json.dumps({"image_id": image_id, "layers": [{"diff_id": d} for d in diff_ids],
                                  "files": {"/nonce": {"layer": 1, "ranges": [[0, 33]]},
                                            "/usr/lib/os-release": {"layer": 0, "ranges": [[0, 267]]},
                                            libc: {"layer": 0, "size": libc_size, "ranges": libc_reads}}}))
    published = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST), "--lazy", "estargz"],
                                  env=environment(**SIGNED))
    pinned = workspace.catalog_json()["images"][RUNTIME]["pinned"][0]["tag"]
    lazy_tag = f"{pinned}-esgz"
    variant = workspace.digest_of(lazy_tag)
    assert variant and f"; eStargz variant {workspace.repository}:{lazy_tag} = {variant}" in published.stdout
    reference, public = f"{workspace.repository}@{variant}", KEYS / "first.pub"
    assert cosign_accepts(cosign, reference, public)
    for kind in (attestations.SBOM_PREDICATE, attestations.PROVENANCE_PREDICATE, attestations.VERIFICATION_PREDICATE):
        assert cosign_accepts(cosign, reference, public, kind), kind
    checked = verify_image(workspace, reference, public)
    assert checked.returncode == 0 and "signature: verified" in checked.stdout, checked.stdout + checked.stderr

    store = store_of(workspace)
    manifest = json.loads(store.registry.manifest(variant).body)
    for layer, wanted in zip(manifest["layers"], (["usr/lib/os-release"], ["nonce"]), strict=True):
        assert layer["annotations"][estargz.TOC_DIGEST_ANNOTATION].startswith("sha256:")
        blob = tmp_path / "blob"
        url = f"http://{workspace.registry_host}/v2/{workspace.namespace}/pytorch/blobs/{layer['digest']}"
        with urllib.request.urlopen(url, timeout=30) as answer:
            blob.write_bytes(answer.read())
        toc = estargz_reader.read_toc_file(blob)
        before = [entry.name for entry in toc.entries
                  if entry.type == "reg" and entry.size and entry.offset < toc.prefetch_end()]
        assert before == wanted, "the layer's prefetch area is its part of the start-up set"
        if wanted == ["usr/lib/os-release"]:
            starts = {chunk.chunk_offset for chunk in toc.data(libc)}
            assert {4096, 600_000, 604_096} <= starts and len(starts) > 3, "libc is cut where its runs begin and end"

    try:
        docker_client.images.pull(f"{workspace.repository}@{variant}")
        nonce = docker_client.containers.run(f"{workspace.repository}@{variant}", ["cat", "/nonce"], remove=True)
        original = docker_client.containers.run(image_id, ["cat", "/nonce"], remove=True)
        assert nonce == original
        assert docker_client.containers.run(f"{workspace.repository}@{variant}", ["sha256sum", libc], remove=True) == \
            docker_client.containers.run(image_id, ["sha256sum", libc], remove=True)
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            docker_client.images.remove(f"{workspace.repository}@{variant}", force=True)
