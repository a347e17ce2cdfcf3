"""Trust at the door, both directions, on the real registry of `make engine` with the real cosign 2.5
(signing-interop.md findings 2-6, 9, 16): `verify-image` says verified only where every report by the key passed,
a re-verification replaces the key's report, cosign's own `sign`, `attest` and `attach attestation` verify with
`verify-image`, and layers cosign ignores do not turn `verify-image` red."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from torchimages.publish.catalog import public_key_path
from torchimages.trust import attestations, signing
from torchimages.trust.referrers import ReferrerStore
from torchimages.trust.signatures import (
    MAX_ARTIFACT_BYTES,
    Layer,
    attestation_tag,
    gather_evidence,
    signature_layer,
    signature_tag,
)
from torchimages.verify.reports import CheckVerdict, VerifyReport, judged_host, verify_report_path

from .policy_eval import shipped_policies_admit
from .publish_fixtures import RUNTIME, Workspace, clean_up
from .signing_fixtures import (
    FIRST,
    KEYS,
    SIGNED,
    TEST_PASSWORD,
    accepted_everything,
    cosign_accepts,
    environment,
    key,
    store_of,
    write_layers,
)

pytestmark = pytest.mark.engine
PUBLIC = KEYS / "first.pub"
H100_FACTS = {"main": {"gpu": {"driver_version": "580.159.04", "libcuda_driver_version": 13000,
                               "devices": [{"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}]}}}


@pytest.fixture
def workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    yield space
    clean_up(docker_client, space)


def cosign_writes(cosign: Path, *arguments: str) -> None:
    """cosign signing or attaching as a user would, key-based and without a transparency log."""
    done = subprocess.run([str(cosign), *arguments, "--allow-insecure-registry", "--allow-http-registry"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=environment(COSIGN_PASSWORD=TEST_PASSWORD))
    assert done.returncode == 0, done.stderr


def verdict(space, reference: str, *extra: str) -> tuple[int, dict]:
    found = space.cli("verify-image", reference, "--key", str(PUBLIC), "--format", "json", *extra)
    return found.returncode, json.loads(found.stdout) if found.stdout.strip() else {}


def policies(space, tag: str, digest: str) -> dict[str, bool]:
    """What the shipped Kyverno policies decide on what the key vouches for about digest, published as tag."""
    evidence = gather_evidence(store_of(space), [key().public], digest, attestations.PREDICATE_TYPES)
    return {name: admitted for name, (admitted, _) in shipped_policies_admit(tag, evidence.statements).items()}


def verified_on_gpu(space, tag: str, image_id: str) -> None:
    """What `build.py test` leaves after a verification on an H100 host: every check passed, gpu included."""
    checks = {"identity": CheckVerdict("passed", "torch 2.13.0+cpu"), "gpu": CheckVerdict("passed", "1 GPU")}
    host = judged_host({name: {"status": check.status} for name, check in checks.items()}, H100_FACTS["main"]["gpu"])
    report = VerifyReport(image_id, True, checks, tag=tag, finished_at="2026-01-02T00:00:00Z", host=host)
    verify_report_path(space.reports, tag).write_text(json.dumps(report.to_json()))


def test_a_failed_report_refuses_a_reverification_replaces_it_and_foreign_layers_only_warn(
        workspace, docker_client, cosign, tmp_path):
    space = workspace
    image_id = space.build_verified(docker_client, RUNTIME)
    # A catalog key file that holds another key (catalog/keys/ is what consumers verify with) stops publish before
    # anything is pushed.
    planted = public_key_path(space.catalog, key().public.fingerprint)
    planted.parent.mkdir(parents=True)
    planted.write_text((KEYS / "second.pub").read_text())
    refused = space.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED), check_exit=2)
    assert str(planted) in refused.stderr and space.tags() == []
    planted.unlink()
    space.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    digest = space.catalog_json()["images"][RUNTIME]["digest"]
    reference = f"{space.repository}@{digest}"
    code, first = verdict(space, reference)
    assert code == 0 and first["verified"] and [r["admits"] for r in first["reports"]] == [True]
    assert first["reports"][0]["image_id"] == image_id and first["reports"][0]["tag"] == RUNTIME
    assert all(policies(space, RUNTIME, digest).values()), "the policies admit what verify-image verifies"

    # Finding 2 and 3: a second pipeline with the key attests a failed report. cosign accepts the signature (it does
    # not read the predicate); verify-image, like Kyverno, judges every report and refuses.
    failed = {**first["predicates"][attestations.VERIFICATION_PREDICATE], "result": "failed"}
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    cosign_writes(cosign, "attest", "--key", str(FIRST), "--type", attestations.VERIFICATION_PREDICATE,
                  "--predicate", str(tmp_path / "failed.json"), "--tlog-upload=false", "--yes", reference)
    assert cosign_accepts(cosign, reference, PUBLIC, attestations.VERIFICATION_PREDICATE)
    code, refused = verdict(space, reference)
    assert code == 1 and not refused["verified"]
    assert [r["admits"] for r in refused["reports"]] == [True, False]
    assert any("report 2 of 2" in problem and "'failed'" in problem for problem in refused["problems"])
    text = space.cli("verify-image", reference, "--key", str(PUBLIC), check_exit=1).stdout
    assert "(report 2 of 2)" in text and "REFUSES: the report says 'failed'" in text and "NOT VERIFIED:" in text
    assert not any(policies(space, RUNTIME, digest).values()), "and the policies refuse it too"

    # A requirement of the GPU host: the CPU host's report does not meet it.
    assert verdict(space, reference, "--require", "gpu=passed")[0] == 1

    # Finding 4: verified again on a GPU host, the republish replaces the key's reports with the new one, so the
    # signed report and the catalog agree, and the GPU requirement holds.
    verified_on_gpu(space, RUNTIME, image_id)
    again = space.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    assert "attestations replaced" in again.stdout + again.stderr, again.stdout
    code, renewed = verdict(space, reference, "--require", "gpu=passed", "--require-host", "kind=gpu",
                            "--require-host", "driver_major>=580")
    assert code == 0 and [r["verified_at"] for r in renewed["reports"]] == ["2026-01-02T00:00:00Z"], renewed
    assert space.catalog_json()["images"][RUNTIME]["verified_on"]["host"] == "gpu"
    assert all(policies(space, RUNTIME, digest).values())
    assert accepted_everything(cosign, reference, PUBLIC)
    again = space.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    assert "signature present, attestations present" in again.stdout, again.stdout

    # Finding 6: a layer of another kind in .sig and .att, which cosign skips, is skipped with a warning.
    store = store_of(space)
    for tag, media_type in ((signature_tag(digest), signing.SIGNATURE_MEDIA_TYPE),
                            (attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE)):
        write_layers(store, tag, [*store.layers(tag, media_type),
                                  Layer("application/vnd.oci.image.layer.v1.tar+gzip", b"not cosign's")])
    assert cosign_accepts(cosign, reference, PUBLIC)
    code, warned = verdict(space, reference)
    assert code == 0 and len([w for w in warned["warnings"] if "a layer was skipped" in w]) == 2, warned

    # A report the key signed about this digest but made for another image is refused (finding 10), as is an
    # attestation tag too large to be one, before it is copied.
    copied = {**renewed["predicates"][attestations.VERIFICATION_PREDICATE], "image_id": "sha256:" + "0" * 64}
    (tmp_path / "copied.json").write_text(json.dumps(copied))
    cosign_writes(cosign, "attest", "--key", str(FIRST), "--type", attestations.VERIFICATION_PREDICATE,
                  "--predicate", str(tmp_path / "copied.json"), "--tlog-upload=false", "--yes", reference)
    code, other = verdict(space, reference)
    assert code == 1 and any(f"the report is about image sha256:{'0' * 64}" in p for p in other["problems"]), other
    held = store.read(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE)[0]  # the foreign layer left out
    write_layers(store, attestation_tag(digest), [*held, Layer(signing.ATTESTATION_MEDIA_TYPE,
                                                               os.urandom(MAX_ARTIFACT_BYTES + 1))])
    code, huge = verdict(space, reference)
    assert code == 1 and any("more than any signature or attestation" in p for p in huge["problems"]), huge
    write_layers(store, attestation_tag(digest), held[:-1])  # without the copied report

    # Finding 9: a signature by the key naming another repository verifies, and says so; beside bundles whose
    # signature names this repository, the two formats disagree and the digest is refused.
    write_layers(store, signature_tag(digest), [signature_layer(key(), "evil.example.com/other/pytorch", digest)])
    code, disagreeing = verdict(space, reference)
    assert code == 1 and any("signatures name different repositories" in p for p in disagreeing["problems"])
    ReferrerStore(store.registry).remove(digest)  # the classic set alone
    code, elsewhere = verdict(space, reference)
    assert code == 0 and elsewhere["signed_as"] == ["evil.example.com/other/pytorch"]
    assert any("podman and CRI-O refuse it" in warning for warning in elsewhere["warnings"])


def test_cosigns_own_signature_attestations_and_attached_envelope_verify_with_verify_image(
        workspace, docker_client, cosign, tmp_path):
    """Finding 5 and 16: the other direction. An unsigned publish, then cosign signs and attests it as a user with a
    KMS or CI signing service would; the report's envelope is signed elsewhere and attached with `cosign attach
    attestation`, which writes no predicateType annotation."""
    space = workspace
    image_id = space.build_verified(docker_client, RUNTIME)
    space.publish(RUNTIME)
    digest = space.catalog_json()["images"][RUNTIME]["digest"]
    reference = f"{space.repository}@{digest}"
    assert space.cli("verify-image", reference, "--key", str(PUBLIC)).returncode == 1

    cosign_writes(cosign, "sign", "--key", str(FIRST), "--tlog-upload=false", "--yes", reference)
    sbom, provenance = tmp_path / "sbom.json", tmp_path / "provenance.json"
    sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1, "components": []}))
    provenance.write_text(json.dumps({"buildDefinition": {"buildType": "https://example.com/ci", "externalParameters": {},
                                                          "resolvedDependencies": []},
                                      "runDetails": {"builder": {"id": "https://example.com/ci"}}}))
    for kind, predicate in (("cyclonedx", sbom), ("slsaprovenance1", provenance)):
        cosign_writes(cosign, "attest", "--key", str(FIRST), "--type", kind, "--predicate", str(predicate),
                      "--tlog-upload=false", "--yes", reference)
    report = {"tool": {"name": "torchimages"}, "tag": RUNTIME, "image_id": image_id, "result": "passed",
              "verified_at": "2026-01-01T00:00:00Z", "host": {"kind": "cpu-only"},
              "checks": {"identity": {"status": "passed", "reason": "", "warnings": []}}}
    envelope = tmp_path / "envelope.json"
    envelope.write_bytes(signing.envelope(key(), signing.statement(space.repository, digest,
                                                                   attestations.VERIFICATION_PREDICATE, report)))
    cosign_writes(cosign, "attach", "attestation", "--attestation", str(envelope), reference)
    attached = [layer for layer in store_of(space).layers(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE)
                if not layer.predicate_type]
    assert attached, "cosign attach attestation leaves the predicateType annotation out"

    assert accepted_everything(cosign, reference, PUBLIC)
    code, found = verdict(space, reference)
    assert code == 0 and found["verified"], found
    assert found["predicates"][attestations.VERIFICATION_PREDICATE]["result"] == "passed"
    assert verdict(space, f"{space.repository}:{RUNTIME}")[0] == 0
    # A key rotation: the verifier trusts the old and the new key for a while; either may have signed.
    second = KEYS / "second.pub"
    assert space.cli("verify-image", reference, "--key", str(second)).returncode == 1
    rotated = space.cli("verify-image", reference, "--key", str(second), "--key", str(PUBLIC), "--format", "json")
    assert rotated.returncode == 0 and len(json.loads(rotated.stdout)["keys"]) == 2
