"""verify-image's decision (torchimages/trust/admission.py) and the index attestations it reads, as pure logic: the report
rule (every report by the key passes and meets every requirement, Kyverno's semantics: signing-interop.md findings
2, 3, 10), the requirements a cluster admits on, and an index report built from its members' reports."""
from pathlib import Path

import pytest

from torchimages.build.bases_lock import LockedBase
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError
from torchimages.publish import multiarch
from torchimages.trust import attestations, signing
from torchimages.trust.admission import DOCKER_MANIFEST, judge_reports, parse_requirement
from torchimages.trust.signatures import (
    MAX_LAYERS,
    Layer,
    UnreadableArtifact,
    artifact_files,
    attestation_layer,
    attested_by,
    read_artifact_folder,
    signature_layer,
)

from .signing_fixtures import DIGEST, MATRIX, key, verification_report

IMAGE_ID = "sha256:" + "1" * 64
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SPEC = load_matrix(MATRIX).specs[0]


def report(gpu: bool = False, result: str = "passed", image_id: str = IMAGE_ID) -> dict:
    predicate = attestations.verification_predicate(SPEC, image_id, verification_report(gpu))
    return {**predicate, "result": result}


def problems(reports: list[dict], *requirements: str, media_type: str = DOCKER_MANIFEST) -> list[str]:
    parsed = [parse_requirement(text, "host" if "kind" in text or "driver" in text or "model" in text else "check")
              for text in requirements]
    return judge_reports(reports, parsed, media_type, IMAGE_ID)[1]


def test_a_passed_report_about_this_image_admits_and_a_failed_one_refuses():
    assert problems([report()]) == []
    [refusal] = problems([report(result="failed")])
    assert "the report says 'failed', not 'passed'" in refusal


def test_every_report_by_the_key_must_pass_as_kyverno_judges_every_statement():
    """Finding 3: with a passed report and then a failed one, the first no longer decides."""
    assert problems([report(), report(result="failed")]) == [
        f"verification report 2 of 2 ({report()['verified_at']}): the report says 'failed', not 'passed'"]
    assert len(problems([report(result="failed"), report()])) == 1


def test_requirements_hold_for_every_report_so_a_cpu_hosts_report_refuses_a_gpu_requirement():
    gpu, cpu = report(gpu=True), report(gpu=False)
    assert problems([gpu], "gpu=passed", "kind=gpu", "driver_major>=580", "gpu_model=NVIDIA H100 80GB HBM3") == []
    [refusal] = problems([cpu, gpu], "gpu=passed")
    assert refusal.startswith("verification report 1 of 2") and "checks.gpu.status = passed (it has 'skipped')" in refusal
    assert "host.driver_major >= 600" in problems([gpu], "driver_major>=600")[0]
    assert "host.gpu_model = NVIDIA A100" in problems([gpu], "gpu_model=NVIDIA A100")[0]


def test_a_report_about_another_image_refuses_where_the_manifest_shows_the_image_id():
    """Finding 10: a gzip push keeps Docker's v2 manifest, whose config digest is the engine's image id."""
    other = report(image_id="sha256:" + "2" * 64)
    [refusal] = problems([other])
    assert f"the report is about image sha256:{'2' * 64}, not this image ({IMAGE_ID})" in refusal
    verdicts, found = judge_reports([other], [], OCI_MANIFEST, IMAGE_ID)
    assert found == [] and "compare by tag" in verdicts[0].notes[0], "a zstd push's OCI config is not the image id"


@pytest.mark.parametrize(("text", "subject", "message"), [
    ("gpu", "check", "is not CHECK=STATUS"),
    ("gpu=ok", "check", "a check's status is passed, failed or skipped"),
    ("gpu>=1", "check", "a check's status is passed, failed or skipped"),
    ("colour=blue", "host", "'colour' is no host field"),
    ("driver_major>=new", "host", ">= compares numbers"),
])
def test_a_requirement_that_cannot_be_judged_is_bad_input_naming_the_flag(text, subject, message):
    with pytest.raises(InputError) as raised:
        parse_requirement(text, subject)
    [problem] = raised.value.problems
    assert problem.file == ("--require" if subject == "check" else "--require-host") and message in problem.message


def member(platform: str, gpu: bool = False, result: str = "passed") -> dict:
    return {"digest": "sha256:" + ("a" if platform.endswith("amd64") else "b") * 64, "tag": f"row-{platform[6:]}",
            "report": {**report(gpu), "result": result}, "sbom": {"components": [{"name": platform}]}}


def test_an_index_report_passes_only_when_every_platform_passed_and_keeps_the_weakest_host():
    both = {"linux/amd64": member("linux/amd64", gpu=True), "linux/arm64": member("linux/arm64")}
    index = attestations.index_verification_predicate("row", both)
    assert index["result"] == "passed" and index["image_id"] == ""
    assert index["checks"]["gpu"]["status"] == "skipped", "the arm64 image's gpu check was skipped"
    assert index["host"]["kind"] == "cpu-only", "the least-verified member's host"
    assert index["platforms"]["linux/amd64"]["report"] == both["linux/amd64"]["report"]
    assert judge_reports([index], [], multiarch.INDEX_MEDIA_TYPE, "")[1] == []
    assert problems([index], "gpu=passed", media_type=multiarch.INDEX_MEDIA_TYPE)

    failed = {**both, "linux/arm64": member("linux/arm64", result="failed")}
    assert attestations.index_verification_predicate("row", failed)["result"] == "failed"


def test_an_index_provenance_and_sbom_name_each_member_by_digest_and_platform():
    both = {"linux/amd64": member("linux/amd64"), "linux/arm64": member("linux/arm64")}
    provenance = attestations.index_provenance_predicate("row", both)
    assert provenance["runDetails"]["metadata"] == {"invocationID": "row"}
    assert [(d["annotations"]["platform"], d["digest"]["sha256"]) for d in
            provenance["buildDefinition"]["resolvedDependencies"]] == [("linux/amd64", "a" * 64), ("linux/arm64", "b" * 64)]
    sbom = attestations.index_sbom("row", "r/p", "sha256:" + "c" * 64, both)
    assert [component["components"] for component in sbom["components"]] == [[{"name": "linux/amd64"}],
                                                                           [{"name": "linux/arm64"}]]


def test_the_provenance_names_the_base_by_the_locks_registry_digest_and_slsa_v1s_invocation_id():
    """Finding 13: SLSA v1's field is invocationID; a consumer matches a base by its registry manifest digest."""
    image = {"Id": IMAGE_ID, "Config": {"Labels": {"org.opencontainers.image.base.digest": "sha256:" + "e" * 64}}}
    pinned = LockedBase(SPEC.base_image, "sha256:" + "d" * 64, "sha256:" + "e" * 64, "registry", "", "2026-01-01")
    predicate = attestations.provenance_predicate(SPEC, image, [], pinned)
    assert predicate["runDetails"]["metadata"]["invocationID"] == IMAGE_ID
    [base] = predicate["buildDefinition"]["resolvedDependencies"]
    assert base["digest"] == {"sha256": "d" * 64}
    assert base["annotations"] == {"pin": "registry-manifest", "imageId": "sha256:" + "e" * 64, "lockSource": "registry"}
    [unlocked] = attestations.provenance_predicate(SPEC, image, [])["buildDefinition"]["resolvedDependencies"]
    assert unlocked["digest"] == {"sha256": "e" * 64} and unlocked["annotations"]["pin"] == "engine-image-id"



def artifact_folder(folder: Path, layers: list[Layer]) -> Path:
    folder.mkdir()
    for name, content in artifact_files(layers).items():
        (folder / name).write_bytes(content)
    return folder


def test_a_consumer_skips_layers_cosign_would_skip_and_publish_refuses_to_rewrite_them(tmp_path):
    """Finding 6: a foreign layer beside cosign's makes publish refuse the tag (it is not ours to rewrite), while a
    consumer reads the valid layer and says what it skipped."""
    valid = signature_layer(key(), "r/p", DIGEST)
    folder = artifact_folder(tmp_path / "mixed", [Layer("application/vnd.oci.image.layer.v1.tar+gzip", b"x"), valid])
    with pytest.raises(UnreadableArtifact, match="not ours to rewrite"):
        read_artifact_folder(folder, signing.SIGNATURE_MEDIA_TYPE, "r/p:sig")
    layers, skipped = read_artifact_folder(folder, signing.SIGNATURE_MEDIA_TYPE, "r/p:sig", strict=False)
    assert [layer.digest for layer in layers] == [valid.digest]
    assert skipped == ["r/p:sig: a layer was skipped: a layer of type 'application/vnd.oci.image.layer.v1.tar+gzip'"]


def test_a_consumer_reads_the_first_layers_of_an_oversized_artifact_and_says_so(tmp_path):
    many = [signature_layer(key(), "r/p", DIGEST)] * (MAX_LAYERS + 2)
    folder = artifact_folder(tmp_path / "many", many)
    with pytest.raises(UnreadableArtifact):
        read_artifact_folder(folder, signing.SIGNATURE_MEDIA_TYPE, "r/p:sig")
    layers, skipped = read_artifact_folder(folder, signing.SIGNATURE_MEDIA_TYPE, "r/p:sig", strict=False)
    assert len(layers) == MAX_LAYERS and skipped == [f"r/p:sig: 2 layers past the first {MAX_LAYERS} not read"]


def test_an_attestation_is_known_by_its_signed_predicate_type_not_its_annotation():
    """Finding 5: `cosign attach attestation` writes no predicateType annotation; a lying one changes nothing."""
    layer = attestation_layer(key(), "r/p", DIGEST, attestations.VERIFICATION_PREDICATE, report())
    for annotations in ({signing.SIGNATURE_ANNOTATION: ""}, {"predicateType": attestations.SBOM_PREDICATE}):
        found = attested_by(key().public, Layer(layer.media_type, layer.data, annotations), DIGEST)
        assert found is not None and found["predicateType"] == attestations.VERIFICATION_PREDICATE
