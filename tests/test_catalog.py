"""The catalog and its developer page, SBOM documents and the vulnerability-scan hook (pure logic and files),
plus the catalog's registry check on the real registry."""
import dataclasses
import datetime as dt
import json

import pytest

from torchimages.model import InputError
from torchimages.publish import catalog as catalog_stage
from torchimages.publish.catalog import Catalog, load_catalog
from torchimages.publish.catalog_page import readme, save
from torchimages.security import trivy
from torchimages.security.gate import scan_image
from torchimages.security.sbom import (
    AllowedVulnerability,
    Allowlist,
    Finding,
    cyclonedx,
    judge,
    load_allowlist,
    parse_grype,
    parse_inventory,
    parse_trivy,
)

from .catalog_fixtures import DIGEST_NEW, DIGEST_OLD, REPOSITORY, entry
from .conftest import FIXTURE_MATRIX, FIXTURE_PROJECT, ROOT, run_cli_in_process

# ------------------------------------------------------------------------------------------------------- catalog

@pytest.mark.parametrize(("scan", "shown"), [
    ({"status": "passed", "fixable_count": 0, "oldest_missing_fix": "", "fix_age_days": 0}, "none"),
    ({"status": "passed", "fixable_count": 2, "oldest_missing_fix": "2026-01-01", "fix_age_days": 3},
     "2, oldest 3 days (2026-01-01)"),
    ({"status": "passed", "fixable_count": 1, "oldest_missing_fix": "", "fix_age_days": 0}, "1 (undated)"),
])
def test_the_page_shows_each_digest_s_fix_age(scan, shown):
    """Issue 48: the fixable OS packages a digest carries and the age of the oldest fix it lacks, as publish recorded."""
    tag = "2.13.0-cpu-runtime"
    page = readme(Catalog({tag: dataclasses.replace(entry(tag), scan=scan)}), "../catalog")
    assert f"| {shown} |" in page


def test_readme_tells_what_to_pull_and_where_floating_tags_point():
    tag = "2.14.0-cuda13.0-cudnn9-runtime"
    page = readme(Catalog({tag: entry(tag), "2.13.0-cpu-runtime": entry("2.13.0-cpu-runtime", (), "use 2.14")}), "../catalog")
    assert f"`docker pull {REPOSITORY}:{tag}-20260102`" in page
    assert f"`docker pull {REPOSITORY}@{DIGEST_NEW}`" in page
    assert "| OS fixes it lacks |" in page and "| - |" in page  # published without a security lookup
    assert f"| `{REPOSITORY}:latest` | `{DIGEST_NEW}` | `{tag}-20260102` |" in page
    assert f"| `{REPOSITORY}:{tag}-20260101` | `{DIGEST_OLD}` | 2026-01-01 |" in page
    assert "6.9 GiB (2.9 GiB)" in page and "6 passed, 3 skipped" in page
    assert f"[CycloneDX](../catalog/sbom/{tag}-20260102.cdx.json)" in page
    assert "2.13.0-cpu-runtime (deprecated: use 2.14)" in page
    assert page.index("| 2.13.0-cpu-runtime ") < page.index(f"| {tag} ")  # sorted by tag
    assert "Nothing is published yet" in readme(Catalog(), "../catalog")


def test_catalog_round_trips_and_is_written_with_its_page(tmp_path):
    catalog = Catalog({"2.13.0-cpu-runtime": entry("2.13.0-cpu-runtime")})
    save(catalog, tmp_path / "catalog", tmp_path / "images")
    loaded = load_catalog(tmp_path / "catalog" / "catalog.json")
    assert loaded.images == catalog.images and loaded.updated_at
    assert json.loads((tmp_path / "catalog" / "catalog.json").read_text())["images"]["2.13.0-cpu-runtime"]["digest"] == DIGEST_NEW
    assert (tmp_path / "images" / "README.md").read_text() == readme(catalog, "../catalog")
    assert not [p for p in (tmp_path / "catalog").iterdir() if p.name.startswith(".")]  # no temporary files left


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    ('{"schema": 99}', "not a torchimages catalog of schema 1"),
    ('{"schema": 1, "images": {"x": {"tag": "x"}}}', "does not have the catalog's fields"),
])
def test_a_damaged_catalog_is_an_input_error_saying_how_to_recover(tmp_path, content, message):
    path = tmp_path / "catalog.json"
    path.write_text(content)
    with pytest.raises(InputError) as error:
        load_catalog(path)
    assert message in str(error.value) and str(path) in str(error.value) and "git checkout" in str(error.value)


def test_catalog_command_prints_the_page_writes_it_and_checks_it(tmp_path):
    save(Catalog({"2.13.0-cpu-runtime": entry("2.13.0-cpu-runtime")}), tmp_path / "catalog", tmp_path / "images")
    (tmp_path / "images" / "README.md").write_text("edited by hand\n")
    args = ("--project", str(FIXTURE_PROJECT), "--images", str(tmp_path / "images"), "catalog")
    assert run_cli_in_process(*args, "--check", check_exit=1).stderr.count("is stale") == 1
    shown = run_cli_in_process(*args, check_exit=0)
    assert f"docker pull {REPOSITORY}:2.13.0-cpu-runtime-20260102" in shown.stdout
    assert (tmp_path / "images" / "README.md").read_text() == shown.stdout
    run_cli_in_process(*args, "--check", check_exit=0)
    as_json = json.loads(run_cli_in_process(*args, "--format", "json", check_exit=0).stdout)
    assert as_json["images"]["2.13.0-cpu-runtime"]["digest"] == DIGEST_NEW
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "catalog.json").write_text("[")
    assert "not valid JSON" in run_cli_in_process(*args, "--catalog", str(broken), check_exit=2).stderr


@pytest.mark.engine
def test_check_registry_reports_tags_the_registry_does_not_have(tmp_path, engine_env):
    stale = entry("2.13.0-cpu-runtime")
    stale.repository = f"{engine_env.registry}/never-published/pytorch"
    save(Catalog({stale.tag: stale}), tmp_path / "catalog", tmp_path / "images")
    result = run_cli_in_process("--images", str(tmp_path / "images"), "catalog", "--check-registry", check_exit=1)
    assert f"{stale.repository}:latest is missing, the catalog says {DIGEST_NEW}" in result.stderr


# ---------------------------------------------------------------------------------------------------------- SBOM

INVENTORY = """\
### os-release
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
ID=debian
VERSION_ID="12"
### dpkg
libc6\t2.36-9+deb12u9\tamd64
adduser\t3.134\tall
### pip
[{"name": "torch", "version": "2.13.0+cpu"}, {"name": "typing_extensions", "version": "4.16.0"}]
"""


def test_sbom_lists_os_and_python_packages_with_package_urls():
    inventory = parse_inventory(INVENTORY)
    document = cyclonedx(inventory, REPOSITORY, DIGEST_NEW, "sha256:" + "c" * 64, "2026-01-02T02:00:00Z")
    purls = [component["purl"] for component in document["components"]]
    assert purls == sorted([
        "pkg:deb/debian/adduser@3.134?arch=all&distro=debian-12",
        "pkg:deb/debian/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=debian-12",
        "pkg:pypi/torch@2.13.0%2Bcpu",
        "pkg:pypi/typing-extensions@4.16.0",
    ])
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.5"
    assert document["metadata"]["component"] == {**document["metadata"]["component"], "type": "container",
                                                 "name": REPOSITORY, "version": DIGEST_NEW}
    again = cyclonedx(inventory, REPOSITORY, DIGEST_NEW, "sha256:" + "c" * 64, "2026-01-02T02:00:00Z")
    assert again == document  # same image, same document (the serial number follows the digest)


def test_an_image_without_python_has_only_os_packages():
    inventory = parse_inventory(INVENTORY.split("### pip")[0] + "### pip\n")
    assert inventory.python == [] and len(inventory.debs) == 2


# ---------------------------------------------------------------------------------------------------------- scan

TRIVY = {"Results": [{"Vulnerabilities": [
    {"VulnerabilityID": "CVE-2026-0001", "PkgName": "openssl", "InstalledVersion": "3.0.1", "Severity": "CRITICAL"},
    {"VulnerabilityID": "CVE-2026-0002", "PkgName": "zlib1g", "InstalledVersion": "1.2", "Severity": "HIGH"},
    {"VulnerabilityID": "CVE-2026-0003", "PkgName": "bash", "InstalledVersion": "5.2", "Severity": "LOW"},
]}]}
GRYPE = {"matches": [{"vulnerability": {"id": "CVE-2026-0002", "severity": "High"},
                      "artifact": {"name": "zlib1g", "version": "1.2"}}]}


def test_scanner_reports_parse_into_findings():
    assert parse_trivy(TRIVY)[0] == Finding("CVE-2026-0001", "openssl", "3.0.1", "CRITICAL")
    assert parse_grype(GRYPE) == [Finding("CVE-2026-0002", "zlib1g", "1.2", "HIGH")]
    assert parse_trivy({"Results": [{"Target": "x"}]}) == []


def test_serious_findings_block_unless_allowlisted_and_not_expired():
    today = dt.date(2026, 6, 1)
    allowlist = Allowlist((AllowedVulnerability("CVE-2026-0001", "not reachable", dt.date(2026, 12, 31)),
                           AllowedVulnerability("CVE-2026-0002", "no fix yet", dt.date(2026, 5, 31))),
                          path="scanner-allowlist.yaml")
    verdict = judge(parse_trivy(TRIVY), allowlist, today, "trivy")
    assert verdict.status == "failed"
    assert [finding.id for finding in verdict.blocking] == ["CVE-2026-0002"]
    assert "allowlist entry expired 2026-05-31" in verdict.message and "scanner-allowlist.yaml" in verdict.message
    assert verdict.allowed == ["CVE-2026-0001: not reachable (until 2026-12-31)"]
    lenient = Allowlist(allowlist.entries, fail_on=("CRITICAL",))
    assert judge(parse_trivy(TRIVY), lenient, today, "trivy").status == "passed"


def test_no_scanner_installed_means_skipped_with_a_message(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(trivy, "find_trivy", lambda: None)  # the test extra's trivy, beside this Python
    result = scan_image("anything:latest", Allowlist())
    assert result.status == "skipped" and "neither trivy nor grype is installed" in result.message


def test_an_installed_scanner_without_a_database_is_not_run(monkeypatch):
    """No download, no hang: without a database given the scanner does not run, and the verdict says why."""
    monkeypatch.setattr(trivy, "find_trivy", lambda: "/nowhere/trivy")
    monkeypatch.setattr(trivy, "run_trivy", lambda *args, **kwargs: pytest.fail("trivy ran without a database"))
    result = scan_image("anything:latest", Allowlist())
    assert result.status == "skipped" and result.message == (
        "vulnerability scan skipped: trivy is installed but was given no database to read offline (--scanner-db DIR "
        "or $TORCHIMAGES_SCANNER_DB; docs/security.md, \"Scanning offline\")")


def test_the_committed_allowlist_loads_and_bad_entries_name_their_line(tmp_path):
    committed = load_allowlist(ROOT / "scanner-allowlist.yaml")
    assert committed.fail_on == ("CRITICAL", "HIGH")
    assert load_allowlist(tmp_path / "missing.yaml") == Allowlist(path=str(tmp_path / "missing.yaml"))
    bad = tmp_path / "allow.yaml"
    bad.write_text("fail_on: [SEVERE]\nallow:\n  - {cve: CVE-2026-0001, reason: ok, expires: soon}\n")
    with pytest.raises(InputError) as error:
        load_allowlist(bad)
    problems = [str(problem) for problem in error.value.problems]
    assert problems == [f"{bad}:1: 'fail_on' must be a list drawn from CRITICAL, HIGH, MEDIUM, LOW, UNKNOWN",
                        f"{bad}:3: CVE-2026-0001: 'expires' must be a date, YYYY-MM-DD, got 'soon'"]


def test_entries_record_versions_from_the_matrix_row():
    from torchimages.matrix.load import load_matrix

    spec = next(s for s in load_matrix(FIXTURE_MATRIX).specs if s.tag == "2.14.1-cuda13.0-cudnn9-runtime")
    versions = catalog_stage.versions(spec)
    assert versions["cuda"] == spec.cuda_full and versions["cudnn"] == spec.cudnn_version
    assert versions["torchvision"] == "0.29.1" and versions["min_driver"] == spec.min_driver
