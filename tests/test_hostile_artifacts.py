"""Signature, attestation and bundle artifacts, indexes, VEX and provenances as a hostile registry or signer shapes
them (issue 56; docs/hostile-input.md): each test attacks the code it is named after, and none needs a Docker engine.
The registries are real docker-registry processes of the test's own (own_registry), written with skopeo as publish
writes them, so a manifest can declare what its blobs are not.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
import urllib.request
from pathlib import Path
from unittest import mock

import pytest

from torchimages.cli import verifying
from torchimages.model import InputError
from torchimages.peers.registry import Manifest, RegistryClient, RegistryError, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import Registry
from torchimages.publish import verify_image
from torchimages.security import vex
from torchimages.trust import admission, attestations, bundles, signing
from torchimages.trust.rebuild import claim_of
from torchimages.trust.referrers import ReferrerStore
from torchimages.trust.signatures import (
    Layer,
    SignatureStore,
    UnreadableArtifact,
    artifact_files,
    gather_evidence,
    signature_layer,
    signature_tag,
)

from .conftest import FIXTURE_PROJECT, run_cli_in_process
from .registry_fixtures import tiny_image
from .signing_fixtures import KEYS, SECOND, key

PUBLIC = KEYS / "first.pub"
SIGNATURE = signing.SIGNATURE_MEDIA_TYPE
OTHER_DIGEST = "sha256:" + "cd" * 32


@pytest.fixture
def own_client(own_registry) -> RegistryClient:
    registry = Registry(own_registry[1], "hostile/pytorch")
    return RegistryClient(registry, registry_access(registry), RetryPolicy(retries=0), lambda _: None)


def write_manifest(client: RegistryClient, tag: str, layers: list[Layer], change=lambda descriptor: None) -> dict:
    """Push layers as an artifact at tag, each layer's descriptor changed by change() first (a lying size, none);
    the manifest as written."""
    files = artifact_files(layers)
    manifest = json.loads(files["manifest.json"])
    for descriptor in manifest["layers"]:
        change(descriptor)
    files["manifest.json"] = json.dumps(manifest).encode()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "artifact"
        folder.mkdir()
        for name, content in files.items():
            (folder / name).write_bytes(content)
        client.write_artifact(folder, tag)
    return manifest


def never_copied(*_):
    raise AssertionError("an artifact was copied before its manifest was checked")


# ------------------------------------------------------------------------ 3: the bound holds on what is received

def test_signature_store_read_holds_the_bound_on_blobs_larger_than_their_manifest_declares(own_client, monkeypatch):
    """Each layer under the bound, all of them over it, each declared 1 byte: the bound is on what arrived."""
    monkeypatch.setattr("torchimages.trust.signatures.MAX_ARTIFACT_BYTES", 1 << 20)
    digest, _ = tiny_image(own_client)
    layers = [Layer(SIGNATURE, os.urandom(512 << 10)) for _ in range(3)]
    write_manifest(own_client, signature_tag(digest), layers, lambda descriptor: descriptor.update(size=1))
    store = SignatureStore(own_client)
    with pytest.raises(UnreadableArtifact, match="bytes of blobs where its manifest declares"):
        store.read(signature_tag(digest), SIGNATURE)
    evidence = gather_evidence(store, [key().public], digest, [])
    assert any("where its manifest declares" in problem for problem in evidence.problems), evidence.problems


@pytest.mark.parametrize("size", [None, -(1 << 40)], ids=["absent", "negative"])
def test_signature_store_read_refuses_sizes_that_cannot_be_true_before_copying(own_client, size):
    digest, _ = tiny_image(own_client)

    def declared(descriptor: dict) -> None:
        descriptor.pop("size")
        if size is not None:
            descriptor["size"] = size

    write_manifest(own_client, signature_tag(digest), [signature_layer(key(), "r/p", digest)], declared)
    with mock.patch.object(RegistryClient, "read_artifact", never_copied), \
            pytest.raises(UnreadableArtifact, match="not a number of bytes"):
        SignatureStore(own_client).read(signature_tag(digest), SIGNATURE)


def test_referrer_store_read_holds_all_bundles_together_to_the_bound(own_client, monkeypatch):
    """256 referrers of 64 MiB each were 16 GiB held at once: the bundles of a digest share one bound, as a .att
    tag's attestations do, and a referrer past it is skipped before it is copied."""
    digest, subject = tiny_image(own_client)
    store = ReferrerStore(own_client)
    store.attest(key(), digest, subject, {bundles.SIGN_PREDICATE: {}, attestations.SBOM_PREDICATE: {"n": 1}})
    entries, _ = store.entries(digest)
    sizes = [json.loads(own_client.manifest(entry["digest"]).body)["layers"][0]["size"] for entry in entries]
    # Room for both bundles but for the second's config blob (2 bytes): the first is read, the second is not.
    monkeypatch.setattr("torchimages.trust.referrers.MAX_ARTIFACT_BYTES", sum(sizes) + 1)
    found, skipped = store.read(digest)
    assert len(found) == 1 and len(skipped) == 1 and "more than any signature or attestation" in skipped[0], skipped


# ------------------------------------------------------------- 9: counted before copying; a tag read whole or not

def test_signature_store_read_counts_layers_from_the_manifest_before_copying(own_client):
    digest, _ = tiny_image(own_client)
    write_manifest(own_client, signature_tag(digest), [signature_layer(key(), "r/p", digest)] * 257)
    with mock.patch.object(RegistryClient, "read_artifact", never_copied), \
            pytest.raises(UnreadableArtifact, match="257 layers, more than"):
        SignatureStore(own_client).read(signature_tag(digest), SIGNATURE)


def test_signature_store_reads_a_tag_missing_a_blob_as_unreadable_never_as_absent(own_client, own_registry):
    """A blob gone from the registry hid the good signature beside it (the tag read as absent), and publish then
    wrote the tag anew, without the other keys' signatures."""
    digest, _ = tiny_image(own_client)
    other = Layer(SIGNATURE, b"another signature")
    write_manifest(own_client, signature_tag(digest), [signature_layer(key(), own_client.registry.name, digest), other])
    before = own_client.digest_of(signature_tag(digest))
    request = urllib.request.Request(f"http://{own_registry[1]}/v2/hostile/pytorch/blobs/{other.digest}",
                                     method="DELETE")
    urllib.request.urlopen(request, timeout=10).close()
    store = SignatureStore(own_client)
    evidence = gather_evidence(store, [key().public], digest, [])
    assert any("blobs the registry does not have" in problem for problem in evidence.problems), evidence.problems
    with pytest.raises(UnreadableArtifact, match="not ours to rewrite"):
        store.sign(key(SECOND), digest)
    assert own_client.digest_of(signature_tag(digest)) == before


# ---------------------------------------------------------------- 7, 14, 15: indexes of any size, names, digests

def index_of(digest: str, platforms: list[tuple[object, object]], member_digest: object = None) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": bundles.OCI_MANIFEST, "digest": digest if member_digest is None else member_digest,
         "size": 400, "platform": {"os": os_name, "architecture": architecture}}
        for os_name, architecture in platforms]}).encode()


def one_error_line(result) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_subjects_of_refuses_an_index_naming_more_than_any_multi_arch_tag(own_client):
    digest, _ = tiny_image(own_client)
    own_client.write_index(index_of(digest, [("linux", f"arch{n}") for n in range(1000)]), "many")
    with mock.patch("torchimages.publish.verify_image.check_subject") as checked:
        result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image", f"{own_client.registry.name}:many",
                                    "--key", str(PUBLIC),
                                    "--platform", "all")
    assert "an index naming 1000 manifests, more than any multi-arch tag (64)" in one_error_line(result)
    assert not checked.called


def test_subjects_of_shows_platform_names_of_an_unsigned_index_inert(own_client):
    digest, _ = tiny_image(own_client)
    own_client.write_index(index_of(digest, [("linux\x1b]0;pwned\x07\x1b[2J", "amd64"), ("linux", "arm64")]), "odd")
    result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image", f"{own_client.registry.name}:odd",
                                "--key", str(PUBLIC),
                                "--platform", "all")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stdout
    assert "linux\\x1b]0;pwned\\x07\\x1b[2J/amd64" in result.stdout, result.stdout


@pytest.mark.parametrize("member_digest", [5, ["sha256:" + "a" * 64], "latest"])
def test_subjects_of_refuses_an_index_whose_member_digest_is_no_digest(member_digest):
    manifest = Manifest.from_body(index_of("", [("linux", "amd64")], member_digest))
    client = mock.Mock(registry=Registry("127.0.0.1:1", "ml/pytorch"))
    with pytest.raises(RegistryError, match="an index member whose digest is"):
        verify_image.subjects_of(client, manifest, "all")
    assert not client.manifest.called


# ---------------------------------------------------------------------- 10: VEX about this image, not another

def vex_about(digest: str, cve: str) -> dict:
    image = vex.image_purl("registry.example.com/ml/pytorch", digest)
    statement = {"vulnerability": {"name": cve}, "products": [{"@id": image}], "status": "not_affected",
                 "justification": "vulnerable_code_not_in_execute_path", "status_notes": "accepted until 2099-01-01"}
    document = vex.document(image, [statement], "2026-11-27T00:00:00Z")
    assert vex.schema_problems(document) == []
    return document


@pytest.mark.parametrize("about", [OTHER_DIGEST, "sha256:" + "ab" * 32], ids=["another image", "this image"])
def test_explain_findings_takes_only_statements_naming_this_image(about):
    this = "sha256:" + "ab" * 32
    report = {"result": "passed", "security": {"fixable": [{"package": "libssl3", "cves": ["CVE-2026-1"]}]}}
    subject = verify_image.Subject("image", this, mock.Mock(spec=Manifest))
    subject.reports = [admission.ReportVerdict(report)]
    subject.evidence.statements[vex.VEX_PREDICATE] = [vex_about(about, "CVE-2026-1")]
    verify_image.explain_findings(subject, no_fixable=True, today=dt.date(2026, 11, 28))
    assert bool(subject.explained) == (about == this) and bool(subject.unexplained) == (about != this)
    assert any("no signed VEX statement explains" in p for p in subject.evidence.problems) == (about != this)


# -------------------------------------------------------------------- 11, 15: what a signed provenance names

def provenance(*dependencies: dict) -> dict:
    return {"buildDefinition": {"externalParameters": {"tag": "2.13.0-cpu-devel"}, "resolvedDependencies": [
        {"uri": "git+torchimages", "digest": {"gitCommit": "0" * 40}}, *dependencies]}}


@pytest.mark.parametrize("name", ["../x.whl", "/etc/x", "a/b.whl", "..", "", "x\n.whl", ["x.whl"]])
def test_claim_of_refuses_wheel_names_that_are_not_plain_file_names(name):
    wheel = {"uri": "pkg:pypi/x", "name": name, "digest": {"sha256": "1" * 64}}
    with pytest.raises(InputError, match="not a file name and a hash as `torchimages publish` writes them"):
        claim_of(provenance(wheel), "ref")
    assert claim_of(provenance({**wheel, "name": "torch-2.13.0-cp312-none-linux_x86_64.whl"}), "ref").wheels


@pytest.mark.parametrize("document", [
    [1], "provenance", {"buildDefinition": [1]}, {"buildDefinition": {"resolvedDependencies": 5}},
    provenance({"uri": "pkg:pypi/x", "name": "x.whl", "digest": ["1" * 64]}),
    provenance({"uri": "pkg:deb/debian/x", "name": "x.deb", "digest": {"sha256": "1" * 64}, "annotations": [1]}),
    {**provenance(), "runDetails": {"builder": {"version": [1]}}}, {**provenance(), "runDetails": 5},
], ids=["list", "text", "definition list", "dependencies number", "digest list", "annotations list",
        "version list", "run number"])
def test_claim_of_reads_a_provenance_of_another_shape_as_input_error(document):
    try:
        claim_of(document, "ref")
    except InputError:
        pass  # refused in one line (exit 2); a claim read from what is there is as good


# ------------------------------------------------------- 15: signed statements of other shapes, enormous numbers

def test_check_subject_reads_signed_statements_of_other_shapes_as_problems_in_one_run(own_client):
    digest, _ = tiny_image(own_client)
    store = SignatureStore(own_client)
    store.sign(key(), digest)
    store.attest(key(), digest, {
        attestations.SBOM_PREDICATE: {"components": 5},
        attestations.PROVENANCE_PREDICATE: {"buildDefinition": [1], "runDetails": "x"},
        attestations.VERIFICATION_PREDICATE: {"result": "passed", "host": {"driver_major": 10 ** 400}},
        vex.VEX_PREDICATE: {"statements": 5}})
    reference = f"{own_client.registry.name}@{digest}"
    for output in ("text", "json"):
        result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "verify-image", reference, "--key", str(PUBLIC),
                                    "--require-host",
                                    "driver_major>=580", "--format", output)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
        # The SBOM and the provenance; the report is read, and its number past any float meets no requirement.
        assert result.stdout.count("of another shape than publish writes") == 2, result.stdout
        assert "fails the OpenVEX schema" in result.stdout


def test_print_subject_shows_a_subject_whose_statements_were_of_other_shapes(capsys):
    subject = verify_image.Subject("image", OTHER_DIGEST, mock.Mock(spec=Manifest, media_type="", config_digest=""))
    subject.evidence.signed_as = ["r/p"]
    subject.evidence.statements = {attestations.VERIFICATION_PREDICATE: [{"result": "passed", "host": [1]}],
                                   attestations.SBOM_PREDICATE: [{"components": {"a": 1}}]}
    verify_image.keep_readable_statements(subject.evidence, [], subject.manifest)
    verifying.print_subject("r/p", "key", subject)
    assert not subject.verified and "of another shape" in capsys.readouterr().out


def test_copied_artifact_copies_the_manifest_it_checked_by_its_digest(own_client):
    """copied_artifact copies by the digest of the manifest it checked: what it reads is what it counted."""
    digest, _ = tiny_image(own_client)
    manifest = write_manifest(own_client, signature_tag(digest), [signature_layer(key(), "r/p", digest)])
    copied = []
    real = RegistryClient.read_artifact

    def recording(client, reference, folder):
        copied.append(reference)
        return real(client, reference, folder)

    with mock.patch.object(RegistryClient, "read_artifact", recording):
        layers, _ = SignatureStore(own_client).read(signature_tag(digest), SIGNATURE)
    body = json.dumps(manifest).encode()
    assert copied == ["sha256:" + hashlib.sha256(body).hexdigest()] and len(layers) == 1
