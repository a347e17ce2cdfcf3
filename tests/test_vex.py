"""OpenVEX for published digests (issue 48): the statements each accepted finding and each carried fix gives, the
OpenVEX schema every document must pass, what `verify-image` counts as explained, and the bad input `publish` refuses
before anything is pushed. Pure logic and the CLI's refusals; the signed attestation on a real registry, verified by
the real cosign, is tests/test_vex_signed.py."""
import datetime as dt
import json

import pytest

from torchimages.security import vex
from torchimages.security.freshness import Fixable, RowSecurity
from torchimages.security.sbom import AllowedVulnerability, Allowlist, Inventory, cyclonedx, load_allowlist

from .conftest import copy_fixture_project, run_cli_in_process

TODAY = dt.date(2026, 11, 27)
LATER = dt.date(2027, 1, 31)
REPOSITORY, DIGEST = "registry.example.com/ml/pytorch", "sha256:" + "a" * 64
SBOM = cyclonedx(Inventory({"ID": "debian", "VERSION_ID": "12"}, [("libssl3", "3.0.19-1~deb12u1", "amd64")], []),
                 REPOSITORY, DIGEST, "sha256:" + "b" * 64, "2026-11-27T00:00:00Z")
OPENSSL = Fixable("libssl3", "amd64", "3.0.19-1~deb12u1", "3.0.22-1~deb12u2", ("CVE-2026-28387", "CVE-2026-7383"),
                  "2026-11-20")
ROW = RowSecurity("2.13.0-cpu-runtime", "debian12", "bookworm-security index", "verified", [OPENSSL])


def allowlist(*entries: AllowedVulnerability) -> Allowlist:
    return Allowlist(tuple(entries), path="/project/scanner-allowlist.yaml")


def statements_of(predicate: dict) -> list[dict]:
    return predicate[vex.VEX_PREDICATE]["statements"]


def test_a_justified_cve_entry_is_not_affected_and_a_package_entry_is_affected_until_its_expiry():
    entries = allowlist(AllowedVulnerability("CVE-2026-28387", "no TLS server", LATER, "vulnerable_code_not_in_execute_path"),
                        AllowedVulnerability("libssl3", "the nightly takes it tonight", LATER))
    predicate = vex.image_predicate(entries, ROW, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z", TODAY)
    by_cve = {s["vulnerability"]["name"]: s for s in statements_of(predicate)}
    assert set(by_cve) == {"CVE-2026-28387", "CVE-2026-7383"}  # the CVE entry covers its CVE; the package the other
    assert by_cve["CVE-2026-28387"]["status"] == "not_affected"
    assert by_cve["CVE-2026-28387"]["justification"] == "vulnerable_code_not_in_execute_path"
    assert by_cve["CVE-2026-7383"]["status"] == "affected"
    assert "accepted until 2027-01-31" in by_cve["CVE-2026-7383"]["action_statement"]
    product = by_cve["CVE-2026-7383"]["products"][0]
    assert product["@id"] == f"pkg:oci/pytorch@sha256%3A{'a' * 64}?repository_url={REPOSITORY}"
    assert product["subcomponents"] == [{"@id": SBOM["components"][0]["purl"]}]  # the SBOM's own purl: scanners match it
    assert vex.schema_problems(predicate[vex.VEX_PREDICATE]) == []


def test_an_expired_entry_gives_no_statement_and_nothing_accepted_gives_no_document():
    expired = allowlist(AllowedVulnerability("CVE-2026-28387", "no TLS server", TODAY - dt.timedelta(days=1)))
    assert vex.image_predicate(expired, ROW, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z", TODAY) == {}
    assert vex.image_predicate(allowlist(), None, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z", TODAY) == {}


def test_fixes_the_previous_digest_lacked_become_fixed_statements():
    previous_fixable = [{"package": "libssl3", "fixed": "3.0.19-1~deb12u1", "cves": ["CVE-2026-1111"]},
                        {"package": "libssl3", "fixed": "3.0.30-1", "cves": ["CVE-2026-2222"]},  # still lacked
                        {"package": "zlib1g", "fixed": "1:1.3", "cves": ["CVE-2026-3333"]}]  # not in the image
    fixed = vex.fixes_carried(previous_fixable, {"libssl3": "3.0.19-1~deb12u1"})
    assert fixed == [{"package": "libssl3", "fixed": "3.0.19-1~deb12u1", "cves": ["CVE-2026-1111"]}]
    predicate = vex.image_predicate(allowlist(), None, fixed, REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z", TODAY)
    [statement] = statements_of(predicate)
    assert statement["status"] == "fixed" and statement["vulnerability"]["name"] == "CVE-2026-1111"


def test_an_index_names_itself_beside_each_members_statements():
    entries = allowlist(AllowedVulnerability("CVE-2026-28387", "no TLS server", LATER, "component_not_present"))
    member = vex.image_predicate(entries, None, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z", TODAY)
    index_digest = "sha256:" + "c" * 64
    index = vex.index_predicate(REPOSITORY, index_digest, {"linux/amd64": {"vex": member[vex.VEX_PREDICATE]},
                                                           "linux/arm64": {"vex": None}})
    [statement] = statements_of(index)
    assert [p["@id"] for p in statement["products"]] == [vex.image_purl(REPOSITORY, index_digest),
                                                         vex.image_purl(REPOSITORY, DIGEST)]


@pytest.mark.parametrize(("broken", "named"), [
    (lambda d: d["statements"][0].pop("action_statement"), "action_statement"),
    (lambda d: d["statements"][0].update(status="not_affected"), "justification"),
    (lambda d: d["statements"][0].update(status="unknown"), "unknown"),
    (lambda d: d.update(statements=[]), "statements"),
    (lambda d: d.pop("author"), "author"),
])
def test_a_document_the_openvex_schema_refuses_is_one_line_naming_what(broken, named):
    entries = allowlist(AllowedVulnerability("CVE-2026-28387", "rebuilt tonight", LATER))
    document = vex.image_predicate(entries, None, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z",
                                   TODAY)[vex.VEX_PREDICATE]
    assert vex.schema_problems(document) == []
    broken(document)
    with pytest.raises(vex.VexError) as refused:
        vex.validated(document, "scanner-allowlist.yaml")
    assert "\n" not in str(refused.value) and named in str(refused.value) and "OpenVEX schema" in str(refused.value)


def test_the_vendored_schema_is_openvex_v0_2_0():
    schema = json.loads(vex.SCHEMA.read_text())
    assert schema["$id"] == "https://github.com/openvex/spec/openvex_json_schema_0.2.0.json"
    assert "d29fab0c81cfea04159436d54c3edc32947039ac" in (vex.SCHEMA.parent / "README.md").read_text()


# ------------------------------------------------------------------------------------------------ verify-image

def report_with(*fixable: Fixable) -> dict:
    return {"result": "passed", "security": {"fixable": [item.to_json() for item in fixable]}}


def test_a_finding_is_explained_only_by_an_unexpired_statement_for_every_cve_it_fixes():
    entries = allowlist(AllowedVulnerability("libssl3", "the nightly takes it tonight", LATER))
    document = vex.image_predicate(entries, ROW, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z",
                                   TODAY)[vex.VEX_PREDICATE]
    explained, unexplained = vex.explain([report_with(OPENSSL)], [document], TODAY)
    assert [str(f) for f in explained] == ["libssl3 (CVE-2026-28387, CVE-2026-7383)"] and unexplained == []
    assert vex.explain([report_with(OPENSSL)], [], TODAY)[1]  # no VEX: unexplained
    assert vex.explain([report_with(OPENSSL)], [document], LATER + dt.timedelta(days=1))[1]  # past its date
    one_cve = {**document, "statements": document["statements"][:1]}
    assert vex.explain([report_with(OPENSSL)], [one_cve], TODAY)[1]  # one CVE left unexplained
    fixed = {**document, "statements": [{**s, "status": "fixed"} for s in document["statements"]]}
    assert vex.explain([report_with(OPENSSL)], [fixed], TODAY)[1]  # "fixed" cannot explain a fix it lacks
    no_cve = Fixable("tzdata", "all", "2025a", "2025b")
    assert vex.explain([report_with(no_cve)], [document], TODAY)[1]  # nothing to match a statement with
    index = {"result": "passed", "platforms": {"linux/amd64": {"report": report_with(OPENSSL)}}}
    assert vex.explain([index], [document], TODAY)[0]  # an index's findings are its platforms'


# ------------------------------------------------------------------------------------------------ bad input

def publish_with(tmp_path, allowlist_text: str):
    matrix = copy_fixture_project(tmp_path / "project")
    path = tmp_path / "scanner-allowlist.yaml"
    path.write_text(allowlist_text)
    return path, run_cli_in_process("--matrix", str(matrix), "--images", str(tmp_path / "images"), "--reports",
                                    str(tmp_path / "reports"), "publish", "2.13.0-cpu-runtime", "--registry",
                                    "127.0.0.1:9/ml/pytorch", "--catalog", str(tmp_path / "catalog"),
                                    "--allowlist", str(path))


@pytest.mark.parametrize(("text", "line", "message"), [
    ("allow:\n  - {cve: CVE-2026-1, reason: x, expires: 2099-01-01}\n", 2, "'cve' must look like CVE-2024-12345"),
    ("allow:\n  - {cve: CVE-2026-12345, reason: '', expires: 2099-01-01}\n", 2, "'reason' must say why"),
    ("allow:\n  - {cve: CVE-2026-12345, expires: 2099-01-01}\n", 2, "each allowlist entry needs exactly"),
    ("allow:\n  - {cve: CVE-2026-12345, reason: x, expires: 2020-01-01}\n", 2, "expired 2020-01-01: renew it"),
    ("allow:\n  - {cve: CVE-2026-12345, reason: x, expires: 2099-01-01, justification: trust_me}\n", 2,
     "'justification' must be one of OpenVEX's"),
])
def test_bad_allowlist_entries_exit_2_with_one_line_and_nothing_published(tmp_path, text, line, message):
    path, refused = publish_with(tmp_path, text)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = [row for row in refused.stderr.splitlines() if row.strip()]
    assert len(lines) == 1 and f"{path}:{line}:" in lines[0] and message in lines[0], refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "catalog").exists()


def test_the_allowlist_keeps_a_justification_and_the_entry_line(tmp_path):
    path = tmp_path / "scanner-allowlist.yaml"
    path.write_text("allow:\n  - {cve: CVE-2026-12345, reason: x, expires: 2099-01-01, "
                    "justification: component_not_present}\n")
    [entry] = load_allowlist(path).entries
    assert entry.justification == "component_not_present" and entry.line == 2


def test_verify_image_takes_a_vex_document_failing_the_schema_as_explaining_nothing():
    from torchimages.peers.registry import Manifest
    from torchimages.publish.verify_image import Subject, explain_findings
    from torchimages.trust.admission import ReportVerdict
    from torchimages.trust.signatures import Evidence

    entries = allowlist(AllowedVulnerability("libssl3", "the nightly takes it tonight", LATER))
    document = vex.image_predicate(entries, ROW, [], REPOSITORY, DIGEST, SBOM, "2026-11-27T00:00:00Z",
                                   TODAY)[vex.VEX_PREDICATE]

    def subject(vex_documents: list[dict]) -> Subject:
        found = Subject("image", DIGEST, Manifest(b"{}", "", DIGEST, "", 0),
                        Evidence(DIGEST, ["x"], {vex.VEX_PREDICATE: vex_documents}),
                        [ReportVerdict(report_with(OPENSSL))])
        explain_findings(found, True, TODAY)
        return found

    good = subject([document])
    assert len(good.explained) == 1 and not good.unexplained and not good.evidence.problems
    broken = subject([{**document, "statements": [{k: v for k, v in s.items() if k != "action_statement"}
                                                   for s in document["statements"]]}])
    assert broken.unexplained and "fails the OpenVEX schema" in broken.evidence.warnings[0]
    assert "no signed VEX statement explains (libssl3 (CVE-2026-28387, CVE-2026-7383))" in broken.evidence.problems[0]


def test_a_vex_document_the_schema_refuses_stops_publish_with_exit_2_before_anything(tmp_path, monkeypatch):
    """No allowlist that loads can give one (its entries are checked first): a document made wrong stands in."""
    monkeypatch.setattr(vex, "document", lambda image, statements, timestamp: {"statements": statements})
    path, refused = publish_with(tmp_path, "allow:\n  - {cve: CVE-2026-12345, reason: x, expires: 2099-01-01}\n")
    lines = [row for row in refused.stderr.splitlines() if row.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert str(path) in lines[0] and "fails the OpenVEX schema" in lines[0] and "'@context' is a required" in lines[0]
    assert "Traceback" not in refused.stderr and not (tmp_path / "catalog").exists()


@pytest.mark.parametrize("report", [
    {"security": []}, {"security": {"fixable": "libssl3"}}, {"security": {"fixable": [{"package": "x", "cves": 7}]}},
    {"platforms": []}, {"platforms": {"linux/amd64": "x"}}, {"platforms": {"linux/amd64": {"report": []}}}])
def test_a_report_of_another_shape_holds_no_finding_and_raises_nothing(report):
    explained, unexplained = vex.explain([report], [{"statements": "none"}], TODAY)
    assert explained == [] and all(not finding.cves for finding in unexplained)
