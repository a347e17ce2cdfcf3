"""Issue 48 on the real registry of `make engine` with the real cosign 2.5: a CPU row whose allowlist accepts one
finding (a fix the security index lists and the image lacks) is published with a signed OpenVEX attestation that
`cosign verify-attestation --type openvex` verifies; `verify-image` reports the finding explained, and without the
VEX attestation unexplained (exit 1 under `--require no-fixable`); the catalog and the signed verification report
record the digest's fixable package and the age of the oldest fix it lacks."""
import base64
import datetime as dt
import json
import shutil
import subprocess

import pytest

from torchimages.matrix.load import load_matrix
from torchimages.security.sbom import collect_inventory, sbom_path
from torchimages.security.vex import VEX_PREDICATE, image_purl
from torchimages.trust import signing
from torchimages.trust.referrers import ReferrerStore
from torchimages.trust.signatures import attestation_tag

from .multiarch_fixtures import MATRIX as MULTI_ARCH_MATRIX
from .multiarch_fixtures import RUNTIME_ARM, build_stand_in
from .publish_fixtures import RUNTIME, Workspace, clean_up
from .security_fixtures import Package, make_key, write_archive
from .signing_fixtures import FIRST, KEYS, SIGNED, environment, run_cosign, store_of, write_layers

pytestmark = pytest.mark.engine
PUBLIC = KEYS / "first.pub"
FIX_DATE = dt.date(2026, 11, 24)


@pytest.fixture
def workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    yield space
    clean_up(docker_client, space)


def a_fix_the_image_lacks(workspace: Workspace, docker_client, image_id: str, tmp_path) -> str:
    """A signed security index listing a newer base-files than the image's, closing CVE-2026-90001."""
    installed = {name: (version, arch) for name, version, arch in collect_inventory(docker_client, image_id).debs}
    version, arch = installed["base-files"]
    key = make_key(tmp_path, "archive")
    shutil.copy(key.keyring, workspace.security_keyring)
    changelog = (f"base-files ({version}+sec1) bookworm-security; urgency=high\n\n  * Fix CVE-2026-90001.\n\n"
                 f" -- Security Team <team@security.debian.org>  Tue, 24 Nov 2026 10:00:00 +0000\n")
    write_archive(workspace.security_archive, key, [Package("base-files", f"{version}+sec1", arch, changelog)])
    return version


def openvex_verified(cosign, reference: str) -> dict | None:
    """The statement `cosign verify-attestation --type openvex` verified, or None when it refuses."""
    done = run_cosign(cosign, "verify-attestation", "--key", str(PUBLIC), "--type", "openvex", reference)
    if done.returncode != 0:
        return None
    envelope = json.loads(done.stdout.splitlines()[0])
    return json.loads(base64.b64decode(envelope["payload"]))


def test_a_row_whose_allowlist_accepts_a_finding_carries_signed_vex_cosign_verifies_and_verify_image_explains(
        workspace, docker_client, cosign, tmp_path):
    image_id = workspace.build_verified(docker_client, RUNTIME)
    installed = a_fix_the_image_lacks(workspace, docker_client, image_id, tmp_path)
    allowlist = workspace.root / "allowlist.yaml"
    allowlist.write_text("allow:\n  - {cve: CVE-2026-90001, reason: nothing in the image reads base-files, "
                         "expires: 2099-01-01, justification: vulnerable_code_not_in_execute_path}\n")
    workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST), "--allowlist", str(allowlist)],
                      env=environment(**SIGNED))
    entry = workspace.catalog_json()["images"][RUNTIME]
    reference = f"{workspace.repository}@{entry['digest']}"

    # The catalog: the fixable package the digest carries, and the age of the oldest fix it lacks.
    scan = entry["scan"]
    assert scan["fixable_count"] == 1 and scan["fixable"][0]["installed"] == installed
    assert scan["oldest_missing_fix"] == FIX_DATE.isoformat()
    assert scan["fix_age_days"] == (dt.date.today() - FIX_DATE).days

    # The real cosign verifies the VEX attestation, under OpenVEX's predicate type.
    statement = openvex_verified(cosign, reference)
    assert statement is not None and statement["predicateType"] == VEX_PREDICATE
    [vex] = statement["predicate"]["statements"]
    assert vex["vulnerability"]["name"] == "CVE-2026-90001" and vex["status"] == "not_affected"
    assert vex["justification"] == "vulnerable_code_not_in_execute_path"
    assert vex["products"][0]["subcomponents"][0]["@id"].startswith("pkg:deb/debian/base-files@")

    checked = workspace.cli("verify-image", reference, "--key", str(PUBLIC), "--require", "no-fixable")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 findings explained, 0 unexplained" in checked.stdout
    shown = json.loads(workspace.cli("verify-image", reference, "--key", str(PUBLIC), "--format", "json").stdout)
    assert shown["findings"] == {"explained": ["base-files (CVE-2026-90001)"], "unexplained": []}
    assert shown["predicates"]["https://torchimages.io/verification-report/v1"]["security"]["fix_age_days"] == \
        scan["fix_age_days"]

    # Without the VEX attestation the finding is unexplained: cosign finds no openvex attestation, and verify-image
    # refuses the digest where every fixable finding must be explained.
    store = store_of(workspace)
    layers = store.layers(attestation_tag(entry["digest"]), signing.ATTESTATION_MEDIA_TYPE)
    write_layers(store, attestation_tag(entry["digest"]),
                 [layer for layer in layers if layer.predicate_type != VEX_PREDICATE])
    ReferrerStore(store.registry).remove(entry["digest"])  # the bundles too: the classic set alone, without VEX
    assert openvex_verified(cosign, reference) is None
    plain = workspace.cli("verify-image", reference, "--key", str(PUBLIC))
    assert plain.returncode == 0 and "0 findings explained, 1 unexplained" in plain.stdout
    refused = workspace.cli("verify-image", reference, "--key", str(PUBLIC), "--require", "no-fixable", check_exit=1)
    assert "1 fixable finding(s) no signed VEX statement explains (base-files (CVE-2026-90001))" in refused.stdout


def test_a_new_digest_states_fixed_what_the_rows_previous_digest_lacked(workspace, docker_client, cosign, tmp_path):
    """The previous digest's catalog record lists a fix it lacked (a version the image's base-files has reached);
    the row's next digest, publishing no accepted finding at all, carries a `fixed` statement for its CVE."""
    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    first = workspace.catalog_json()["images"][RUNTIME]["digest"]
    assert openvex_verified(cosign, f"{workspace.repository}@{first}") is None  # nothing to say: no VEX
    catalog = workspace.catalog_json()
    catalog["images"][RUNTIME]["scan"]["fixable"] = [
        {"package": "base-files", "arch": "amd64", "installed": "12.0", "fixed": "12.1", "cves": ["CVE-2026-90009"],
         "since": "2026-11-20"}]
    (workspace.catalog / "catalog.json").write_text(json.dumps(catalog))

    workspace.build_verified(docker_client, RUNTIME)  # another image of the row: a new digest
    workspace.publish(RUNTIME, date="20260102", extra=["--signing-key", str(FIRST)], env=environment(**SIGNED))
    entry = workspace.catalog_json()["images"][RUNTIME]
    assert entry["digest"] != first
    assert entry["scan"]["fixed"] == [{"package": "base-files", "fixed": "12.1", "cves": ["CVE-2026-90009"]}]
    statement = openvex_verified(cosign, f"{workspace.repository}@{entry['digest']}")
    assert statement is not None
    [fixed] = statement["predicate"]["statements"]
    assert fixed["status"] == "fixed" and fixed["vulnerability"]["name"] == "CVE-2026-90009"


@pytest.fixture
def multi_arch(tmp_path, engine_env, docker_client):
    """A workspace whose CPU row is built for x86_64 and aarch64: its tag is an index over both."""
    space = Workspace(tmp_path, engine_env.registry)
    space.matrix.write_text(MULTI_ARCH_MATRIX.format(namespace=space.namespace))
    space.specs = {spec.tag: spec for spec in load_matrix(space.matrix).specs}
    yield space
    clean_up(docker_client, space)


def test_a_multi_arch_tag_resolves_to_an_index_whose_vex_cosign_verifies(multi_arch, docker_client, cosign):
    """cosign, Kyverno and scanners resolve REPO:TAG to the index digest: its VEX names the index beside each
    member image, for each statement of theirs."""
    space = multi_arch
    for tag in (RUNTIME, RUNTIME_ARM):
        build_stand_in(space, docker_client, tag)
    allowlist = space.root / "allowlist.yaml"
    allowlist.write_text("allow:\n  - {cve: CVE-2026-90001, reason: no TLS server in the image, expires: 2099-01-01, "
                         "justification: vulnerable_code_not_present}\n")
    space.publish(extra=["--signing-key", str(FIRST), "--allowlist", str(allowlist)], env=environment(**SIGNED))
    index = space.catalog_json()["manifest_lists"][RUNTIME]
    assert VEX_PREDICATE in index["signing"]["predicate_types"]
    statement = openvex_verified(cosign, f"{space.repository}:{RUNTIME}")
    assert statement is not None and statement["subject"][0]["digest"]["sha256"] == index["digest"][7:]
    products = [[product["@id"] for product in s["products"]] for s in statement["predicate"]["statements"]]
    assert len(products) == 2 and all(ids[0] == image_purl(space.repository, index["digest"]) for ids in products)
    assert sorted(ids[1] for ids in products) == sorted(image_purl(space.repository, member["digest"])
                                                        for member in index["platforms"].values())


def test_the_real_trivy_obeys_the_vex_publish_signs_and_scan_ignores_a_forged_one(workspace, docker_client, cosign,
                                                                                   tmp_path):
    """Issue 59 end to end, with the real Trivy (offline, on a database this test writes) and the real cosign: the
    row has two advisories, one accepted in the allowlist. Publish's gate runs Trivy, so the signed VEX names the
    package Trivy found the accepted CVE in; `scan` then suppresses exactly that one. An attacker who can push
    replaces the VEX with one signed by another key that accepts both: `trivy --vex oci`, which verifies nothing,
    suppresses both; `scan` suppresses none and names the forged one."""
    from .signing_fixtures import SECOND
    from .trivy_db import Advisory, trivy_vex_oci, write_trivy_db

    image_id = workspace.build_verified(docker_client, RUNTIME)
    installed = {name: version for name, version, _ in collect_inventory(docker_client, image_id).debs}
    database = tmp_path / "trivy"
    write_trivy_db(database, [Advisory("CVE-2026-91001", "base-files", installed["base-files"] + "+sec1", "HIGH"),
                              Advisory("CVE-2026-91002", "bash", installed["bash"] + "+sec1", "LOW")])
    allowlist = workspace.root / "allowlist.yaml"
    allowlist.write_text("allow:\n  - {cve: CVE-2026-91001, reason: nothing in the image reads base-files, "
                         "expires: 2099-01-01, justification: vulnerable_code_not_in_execute_path}\n")
    published = workspace.publish(RUNTIME, extra=["--signing-key", str(FIRST), "--allowlist", str(allowlist),
                                                  "--scanner-db", str(database)], env=environment(**SIGNED))
    assert "trivy" in published.stdout + published.stderr, published.stdout  # the gate ran it
    digest = workspace.catalog_json()["images"][RUNTIME]["digest"]
    reference = f"{workspace.repository}@{digest}"

    def scanned() -> tuple[int, dict]:
        done = workspace.cli("scan", reference, "--key", str(PUBLIC), "--scanner-db", str(database), "--allowlist",
                             str(allowlist), "--format", "json")
        return done.returncode, json.loads(done.stdout)

    code, facts = scanned()
    assert code == 0 and facts["vex_statements"] == 1, facts  # the LOW finding left blocks nothing
    assert sorted((item["id"], item["suppressed"]) for item in facts["findings"]) == [
        ("CVE-2026-91001", True), ("CVE-2026-91002", False)]

    # The VEX replaced, in both formats, by one signed with another key, accepting both.
    store = store_of(workspace)
    layers = store.layers(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE)
    write_layers(store, attestation_tag(digest), [layer for layer in layers if layer.predicate_type != VEX_PREDICATE])
    ReferrerStore(store.registry).remove(digest)
    pinned = workspace.catalog_json()["images"][RUNTIME]["pinned"][0]["tag"]
    sbom = json.loads(sbom_path(workspace.catalog, pinned).read_text())
    purls = {component["name"]: component["purl"] for component in sbom["components"]
             if str(component.get("purl", "")).startswith("pkg:deb/")}
    image = image_purl(workspace.repository, digest)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({
        "@context": "https://openvex.dev/ns/v0.2.0", "@id": "https://example.invalid/vex/forged", "author": "someone",
        "timestamp": "2026-11-29T00:00:00Z", "version": 1,
        "statements": [{"vulnerability": {"name": cve}, "status": "not_affected",
                        "justification": "vulnerable_code_not_in_execute_path",
                        "products": [{"@id": image, "subcomponents": [{"@id": purls[package]}]}]}
                       for cve, package in (("CVE-2026-91001", "base-files"), ("CVE-2026-91002", "bash"))]}))
    attached = subprocess.run([str(cosign), "attest", "--yes", "--key", str(SECOND), "--tlog-upload=false",
                               "--allow-insecure-registry", "--allow-http-registry", "--type", "openvex",
                               "--predicate", str(forged), reference],
                              capture_output=True, text=True, timeout=120, env=environment(**SIGNED), check=False)
    assert attached.returncode == 0, attached.stderr

    with_oci = trivy_vex_oci(reference, database, tmp_path)
    assert with_oci.returncode == 0, with_oci.stderr[-2000:]
    report = json.loads(with_oci.stdout)
    assert not [item for result in report.get("Results") or [] for item in result.get("Vulnerabilities") or []]

    code, facts = scanned()
    assert facts["vex_statements"] == 0 and len(facts["ignored_vex"]) == 1, facts
    assert not any(item["suppressed"] for item in facts["findings"])
    assert code == 1 and facts["blocking"] == [f"CVE-2026-91001 (HIGH) in base-files {installed['base-files']}"]
