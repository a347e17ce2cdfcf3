"""Digests are checked, everywhere (issue 43): skopeo 1.9.3's `inspect --raw` of REPO@sha256:X prints whatever the
registry answers, so a registry (or a proxy in front of one) could answer an unsigned digest with a signed image's
manifest, or a member of an index with another image. The registry here is tests.registry_fixtures.ServingRegistry
on 127.0.0.1, which answers each reference with the bytes a test gives it; the catalog's key files are checked
against the fingerprints their names give."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from torchimages.model import InputError
from torchimages.peers.registry import RegistryClient, RegistryError, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import image_registry
from torchimages.publish import catalog, multiarch
from torchimages.publish.catalog import Catalog, public_key_path, save_public_key
from torchimages.publish.catalog_page import save
from torchimages.trust import attestations
from torchimages.trust.admission import DOCKER_MANIFEST
from torchimages.trust.signatures import (
    artifact_files,
    attestation_layer,
    attestation_tag,
    signature_layer,
    signature_tag,
)
from torchimages.trust.signing import PublicKey

from .conftest import FIXTURE_PROJECT, run_cli_in_process
from .registry_fixtures import ServingRegistry
from .signing_fixtures import FIRST, SECOND, key

CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"


@pytest.fixture
def served():
    registry = ServingRegistry()
    yield registry
    registry.close()


def client_of(served: ServingRegistry, tmp_path) -> RegistryClient:
    address, _ = image_registry(f"{served.host}/{served.repository}:any")
    return RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)


def image(name: str) -> tuple[bytes, dict[str, bytes]]:
    """A layerless image's manifest and its config blob (digest -> bytes), told apart by name."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"name": name}},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                           "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": config_digest},
                           "layers": []}).encode()
    return manifest, {config_digest: config}


def serve_artifact(served: ServingRegistry, tag: str, layers) -> None:
    """A cosign artifact (skopeo's `dir:` files of signatures.artifact_files) served under tag."""
    files = artifact_files(layers)
    manifest = files.pop("manifest.json")
    files.pop("version")
    served.serve(tag, manifest, {f"sha256:{name}": data for name, data in files.items()})
    served.serve("sha256:" + hashlib.sha256(manifest).hexdigest(), manifest)  # by its digest too, as a registry does


def serve_signed_image(served: ServingRegistry, name: str) -> tuple[str, bytes]:
    """An image served by its digest, signed and attested with the first test key as publish does; (digest, body)."""
    body, blobs = image(name)
    digest = served.serve("sha256:" + hashlib.sha256(body).hexdigest(), body, blobs)
    repository, signer = f"{served.host}/{served.repository}", key(FIRST)
    config_digest = json.loads(body)["config"]["digest"]
    predicates: dict[str, dict] = {attestations.SBOM_PREDICATE: {"components": []},
                  attestations.PROVENANCE_PREDICATE: {"buildDefinition": {}, "runDetails": {}},
                  attestations.VERIFICATION_PREDICATE: {"result": "passed", "image_id": config_digest, "tag": name,
                                                        "host": {"kind": "cpu-only"}, "checks": {}}}
    serve_artifact(served, signature_tag(digest), [signature_layer(signer, repository, digest)])
    serve_artifact(served, attestation_tag(digest), [attestation_layer(signer, repository, digest, kind, predicate)
                                                     for kind, predicate in predicates.items()])
    return digest, body


def assert_one_line_naming(text: str, *words: str) -> None:
    line = text.strip()
    assert "\n" not in line, text
    for word in words:
        assert word in line, line


# -------------------------------------------------------------------------------------- manifests fetched by digest

def test_a_manifest_asked_for_by_digest_must_be_that_digest(served, tmp_path):
    signed, _ = image("signed")
    unsigned, _ = image("unsigned")
    asked = "sha256:" + hashlib.sha256(unsigned).hexdigest()
    answered = served.serve(asked, signed)
    client = client_of(served, tmp_path)
    for fetch in (client.manifest, client.manifest_or_none, client.digest_of):
        with pytest.raises(RegistryError) as raised:
            fetch(asked)
        assert not raised.value.transient
        assert_one_line_naming(str(raised.value), f"registry {served.host} answered {served.repository}@{asked} "
                                                  f"with a manifest whose digest is {answered}",
                               "it is not the image asked for")


def test_a_manifest_of_the_digest_asked_for_and_a_tags_manifest_are_read(served, tmp_path):
    """A tag cannot be checked this way: its digest is the sha256 of the very bytes the registry answered."""
    body, _ = image("runtime")
    digest = served.serve("sha256:" + hashlib.sha256(body).hexdigest(), body)
    served.serve("runtime", body)
    client = client_of(served, tmp_path)
    assert client.manifest(digest).body == body
    assert client.tag_manifests(["runtime", "absent"])["runtime"].digest == digest
    assert client.digest_of("sha256:" + "0" * 64) is None  # a digest the registry does not have is still "none"


def test_an_index_member_substituted_by_the_registry_is_refused(served, tmp_path):
    """What publish does before it builds and signs a manifest list: read each member by the digest its push
    returned (`self.registry.manifest(result.digest)` in publish's index building); a member the registry answers
    with another image's manifest stops it, naming the member."""
    amd64, _ = image("amd64")
    arm64, _ = image("arm64")
    impostor, _ = image("impostor")
    amd64_digest = served.serve("sha256:" + hashlib.sha256(amd64).hexdigest(), amd64)
    arm64_digest = "sha256:" + hashlib.sha256(arm64).hexdigest()
    served.serve(arm64_digest, impostor)
    client = client_of(served, tmp_path)
    assert client.manifest(amd64_digest).body == amd64
    with pytest.raises(RegistryError) as raised:
        client.manifest(arm64_digest)
    assert_one_line_naming(str(raised.value), arm64_digest, "sha256:" + hashlib.sha256(impostor).hexdigest())


def test_skopeo_itself_checks_configs_and_copies_by_digest(served, tmp_path):
    """containers/image checks what `inspect --config` and `copy` read by digest (the manifest against the digest
    asked for, each blob against its own): the claims of registry.py's docstring, seen on skopeo 1.9.3."""
    signed, blobs = image("signed")
    unsigned, _ = image("unsigned")
    asked = "sha256:" + hashlib.sha256(unsigned).hexdigest()
    served.serve(asked, signed, blobs)
    client = client_of(served, tmp_path)
    with pytest.raises(RegistryError, match="does not match"):
        client.image_config(asked)
    with pytest.raises(RegistryError, match="does not match"):
        client.copy_tag(asked, "never-written")
    honest = served.serve("sha256:" + hashlib.sha256(signed).hexdigest(), signed,
                          {digest: b"not the config" for digest in blobs})
    with pytest.raises(RegistryError, match="does not match"):
        client.image_config(honest)


# --------------------------------------------------------------------------------------------------- verify-image

def verify_image(reference: str, tmp_path):
    return run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image", reference, "--key", str(FIRST.with_suffix(".pub")), "--retries", "0",
                              env={"DOCKER_CONFIG": str(tmp_path)})


def test_verify_image_of_an_unsigned_digest_answered_with_a_signed_manifest_exits_1(served, tmp_path):
    signed_digest, signed_body = serve_signed_image(served, "signed")
    repository = f"{served.host}/{served.repository}"
    assert verify_image(f"{repository}@{signed_digest}", tmp_path).returncode == 0, "the signed image itself verifies"
    unsigned, _ = image("unsigned")
    asked = "sha256:" + hashlib.sha256(unsigned).hexdigest()
    served.serve(asked, signed_body)
    result = verify_image(f"{repository}@{asked}", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "verified:" not in result.stdout
    assert_one_line_naming(result.stderr, f"answered {served.repository}@{asked}", signed_digest)


def test_verify_image_of_an_index_whose_member_is_answered_with_a_signed_manifest_exits_1(served, tmp_path):
    """A multi-arch tag names its index (a tag: unchecked), the index names each member by digest: the member is."""
    signed_digest, signed_body = serve_signed_image(served, "signed")
    unsigned, _ = image("unsigned")
    member = "sha256:" + hashlib.sha256(unsigned).hexdigest()
    served.serve(member, signed_body)
    served.serve("multi", multiarch.index_body([multiarch.Member("linux/amd64", "multi-amd64", member,
                                                                  DOCKER_MANIFEST, len(unsigned))]))
    result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image",
                                f"{served.host}/{served.repository}:multi", "--platform", "linux/amd64", "--key", str(FIRST.with_suffix(".pub")), "--retries", "0",
                                env={"DOCKER_CONFIG": str(tmp_path)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert_one_line_naming(result.stderr, f"answered {served.repository}@{member}", signed_digest)


# --------------------------------------------------------------------------------------------------- catalog keys

def tampered_key_file(folder: Path) -> tuple[Path, PublicKey]:
    """catalog/keys/<first key's fingerprint>.pub holding the second key: (the file, the first key)."""
    first = key(FIRST).public
    path = public_key_path(folder, first.fingerprint)
    path.parent.mkdir(parents=True)
    path.write_text(key(SECOND).public.pem)
    return path, first


def test_saving_a_key_compares_the_file_already_there(tmp_path):
    path, first = tampered_key_file(tmp_path / "catalog")
    with pytest.raises(InputError) as raised:
        save_public_key(tmp_path / "catalog", first)
    assert_one_line_naming(str(raised.value), str(path), key(SECOND).public.fingerprint, "git checkout")
    assert path.read_text() == key(SECOND).public.pem, "the file was rewritten instead of refused"
    path.write_text(first.pem)
    save_public_key(tmp_path / "catalog", first)  # the same key already there: nothing to do
    assert path.read_text() == first.pem


def test_catalog_check_names_a_key_file_whose_content_is_not_its_name(tmp_path):
    save(Catalog({}), tmp_path / "catalog", tmp_path / "images")
    path, first = tampered_key_file(tmp_path / "catalog")
    (path.parent / "deadbeefdeadbeef.pub").write_text("not a PEM key")
    result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "--images", str(tmp_path / "images"), "catalog",
                                "--check")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    tampered, garbage = (next(line for line in result.stderr.splitlines() if name in line)
                         for name in (path.name, "deadbeefdeadbeef.pub"))
    assert str(path) in tampered and key(SECOND).public.fingerprint in tampered and "git checkout" in tampered
    assert "not a PEM public key" in garbage
    path.write_text(first.pem)
    (path.parent / "deadbeefdeadbeef.pub").unlink()
    assert run_cli_in_process("--project", str(FIXTURE_PROJECT), "--images", str(tmp_path / "images"), "catalog",
                              "--check").returncode == 0
    assert catalog.key_file_problems(tmp_path / "catalog") == []
