"""Issue 59, inventory agreement: our SBOM lists every OS and Python package Trivy finds in the same image, with the
same name, version and PURL, so that a VEX statement naming a package by our PURL matches Trivy's finding.

Pure tests on a recorded Trivy 0.76.0 inventory of the CPU runtime row and our inventory of the same image
(tests/data/trivy/README.md); the PURLs against Trivy's and purl-spec's rules; the comparison's own logic. The engine
tests run the real Trivy on the CPU rows as built (the CUDA 13.0 runtime row: tests/test_cuda_images.py)."""
import datetime as dt
import json
from urllib.parse import quote

import pytest

from torchimages.model import InputError
from torchimages.security import agreement, purls, vex
from torchimages.security.agreement import (
    ONLY_OURS,
    ONLY_THEIRS,
    OTHER_NAME,
    OTHER_PLACE,
    OTHER_PURL,
    OTHER_VERSION,
    Explanation,
    Listed,
)
from torchimages.security.freshness import Fixable, RowSecurity
from torchimages.security.sbom import (
    INVENTORY_SCRIPT,
    AllowedVulnerability,
    Allowlist,
    Inventory,
    cyclonedx,
    parse_inventory,
)

from .conftest import ROOT
from .inventory_fixtures import trivy_image, trivy_rootfs, unexplained_differences

RECORDED = ROOT / "tests" / "data" / "trivy"
TRIVY = json.loads((RECORDED / "2.13.0-cpu-runtime.trivy.cdx.json").read_text())
INVENTORY = parse_inventory((RECORDED / "2.13.0-cpu-runtime.inventory.txt").read_text())
REPOSITORY, DIGEST = "registry.example.com/ml/pytorch", "sha256:" + "a" * 64
OURS = cyclonedx(INVENTORY, REPOSITORY, DIGEST, "sha256:" + "b" * 64, "2026-11-29T00:00:00Z")
VENDORED = {"autocommand", "backports.tarfile", "importlib_metadata", "jaraco.context", "jaraco.functools",
            "jaraco.text", "more-itertools", "packaging", "platformdirs", "tomli", "wheel", "zipp"}


def component(document: dict, name: str) -> dict:
    return next(item for item in document["components"] if item.get("name") == name)


# ------------------------------------------------------------------------------------------ the recorded inventory

def test_our_sbom_of_the_recorded_image_is_trivys_inventory_with_no_difference():
    theirs, ours = agreement.trivy_inventory(TRIVY), agreement.sbom_inventory(OURS)
    assert len(theirs) == 173 and {item.kind for item in theirs} == {"os", "python"}  # 149 Debian, 24 Python
    assert agreement.compare(ours, theirs) == []
    assert ours == theirs  # the same packages, names, versions, PURLs (as written, not only as parsed) and places


def test_the_vendored_packages_are_listed_where_they_lie():
    """setuptools vendors twelve packages, each with its own dist-info: a scanner flags them, so our SBOM lists them."""
    vendored = {item.name: item for item in agreement.sbom_inventory(OURS) if "/_vendor/" in item.location}
    assert set(vendored) == VENDORED
    assert vendored["jaraco.context"].purl == "pkg:pypi/jaraco.context@6.1.0"  # dots kept, as purl-spec and Trivy
    assert vendored["importlib_metadata"].purl == "pkg:pypi/importlib-metadata@8.7.1"
    assert vendored["packaging"].location == \
        "opt/venv/lib/python3.11/site-packages/setuptools/_vendor/packaging-26.3.dist-info/METADATA"
    assert component(OURS, "zipp")["evidence"] == {"occurrences": [
        {"location": "/opt/venv/lib/python3.11/site-packages/setuptools/_vendor/zipp-3.23.0.dist-info/METADATA"}]}


def test_a_debian_epoch_is_trivys_qualifier_and_the_release_its_point_release():
    assert INVENTORY.release_files["debian_version"] == "12.15"
    zlib = component(OURS, "zlib1g")
    assert zlib["version"] == "1:1.2.13.dfsg-1"  # the installed version, as dpkg and Trivy's component give it
    assert zlib["purl"] == component(TRIVY, "zlib1g")["purl"] == \
        "pkg:deb/debian/zlib1g@1.2.13.dfsg-1?arch=amd64&distro=debian-12.15&epoch=1"
    epochs = [item for item in agreement.trivy_inventory(TRIVY) if "epoch=" in item.purl]
    assert len(epochs) == 16


def test_a_vex_statement_made_from_our_sbom_matches_trivys_package():
    """The VEX writer names a package by our SBOM's PURL: Trivy (go-vex PurlMatches) then matches its finding, epoch
    and point release included; the old PURL matched none of the 149 Debian packages."""
    accepted = Allowlist((AllowedVulnerability("zlib1g", "the nightly takes it", dt.date(2027, 1, 31)),),
                         path="scanner-allowlist.yaml")
    row = RowSecurity("2.13.0-cpu-runtime", "debian12", "bookworm-security index", "verified",
                      [Fixable("zlib1g", "amd64", "1:1.2.13.dfsg-1", "1:1.2.13.dfsg-1+deb12u1", ("CVE-2026-0001",))])
    predicate = vex.image_predicate(accepted, row, [], REPOSITORY, DIGEST, OURS, "2026-11-29T00:00:00Z",
                                    dt.date(2026, 11, 29))
    subcomponent = predicate[vex.VEX_PREDICATE]["statements"][0]["products"][0]["subcomponents"][0]["@id"]
    assert purls.matches(subcomponent, component(TRIVY, "zlib1g")["purl"])
    for scanned in (item for item in agreement.trivy_inventory(TRIVY) if item.kind == "os"):
        assert purls.matches(component(OURS, scanned.name)["purl"], scanned.purl), scanned
    old = "pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64&distro=debian-12"
    assert not purls.matches(old, component(TRIVY, "zlib1g")["purl"])
    assert not purls.matches("pkg:deb/debian/bash@5.2.15-2%2Bb13?arch=amd64&distro=debian-12",
                             component(TRIVY, "bash")["purl"]), "distro=debian-12 is not Trivy's debian-12.15"


# ------------------------------------------------------------------------------------------ what a difference is

def old_sbom() -> dict:
    """Our SBOM as it was written before issue 59: the epoch in the version, os-release's VERSION_ID as the
    distro, PEP 503 names, pip's list only (no vendored package, no place)."""
    listed = []
    for item in OURS["components"]:
        if "/_vendor/" in json.dumps(item.get("evidence")):
            continue
        old = {key: value for key, value in item.items() if key != "evidence"}
        if item["purl"].startswith("pkg:deb/"):
            arch = dict(purls.parse(item["purl"]).qualifiers)["arch"]
            old["purl"] = f"pkg:deb/debian/{quote(item['name'])}@{quote(item['version'], safe='')}?arch={arch}" \
                          "&distro=debian-12"
        listed.append(old)
    return {**OURS, "components": listed}


def test_the_sbom_written_before_issue_59_differs_in_every_debian_purl_and_the_vendored_packages():
    differences = agreement.compare(agreement.sbom_inventory(old_sbom()), agreement.trivy_inventory(TRIVY))
    assert len(differences) == len(agreement.unexplained(differences)) == 149 + 12
    assert {d.what for d in differences if d.ours} == {OTHER_PURL}
    assert {d.theirs.name for d in differences if d.what == ONLY_THEIRS} == VENDORED
    lines = {str(d) for d in differences}
    assert ("another PURL: ours: os zlib1g 1:1.2.13.dfsg-1 (pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64&"
            "distro=debian-12); trivy: os zlib1g 1:1.2.13.dfsg-1 (pkg:deb/debian/zlib1g@1.2.13.dfsg-1?arch=amd64&"
            "distro=debian-12.15&epoch=1)") in lines


def listed(name: str, version: str = "1.0", location: str = "", kind: str = "python") -> Listed:
    purl = purls.pypi_purl(name, version) if kind == "python" else f"pkg:deb/debian/{name}@{version}?arch=amd64"
    return Listed(kind, name, version, purl, location)


@pytest.mark.parametrize("ours, theirs, what", [
    ([listed("zipp", location="a/METADATA")], [listed("zipp", location="a/METADATA")], None),
    ([listed("zipp")], [listed("zipp", location="a/METADATA")], None),  # no place given: paired by PURL
    ([listed("zipp", location="a/METADATA")], [listed("zipp", location="b/METADATA")], OTHER_PLACE),
    ([listed("zipp", "1.0")], [listed("zipp", "2.0")], OTHER_VERSION),
    ([listed("libc6", kind="os")], [Listed("os", "libc6", "1.0", "pkg:deb/debian/libc6@1.0?arch=i386")], OTHER_PURL),
    ([Listed("python", "Zipp", "1.0", "pkg:pypi/zipp@1.0")], [listed("zipp")], OTHER_NAME),
    ([listed("zipp")], [], ONLY_OURS),
    ([], [listed("zipp", location="a/METADATA")], ONLY_THEIRS),
    ([], [listed("github.com/x/y", kind="gobinary")], ONLY_THEIRS),  # another ecosystem: a gap in ours, unexplained
])
def test_each_kind_of_difference_is_named(ours, theirs, what):
    differences = agreement.compare(ours, theirs, explained=())
    assert [difference.what for difference in differences] == ([what] if what else [])


def test_a_purl_escaped_another_way_is_the_same_package():
    ours = [Listed("os", "g++", "4:12.2.0-3", "pkg:deb/debian/g++@12.2.0-3?epoch=4&arch=amd64")]
    theirs = [Listed("os", "g++", "4:12.2.0-3", "pkg:deb/debian/g%2B%2B@12.2.0-3?arch=amd64&epoch=4")]
    assert agreement.compare(ours, theirs, explained=()) == []


def test_an_explanation_names_its_reason_and_only_what_it_covers():
    table = (Explanation(ONLY_OURS, "python", r"usr/lib/python3/dist-packages/.*", "the reason"),)
    differences = agreement.compare([listed("a", location="usr/lib/python3/dist-packages/a-1.0.dist-info/METADATA"),
                                     listed("b", location="opt/venv/b-1.0.dist-info/METADATA")], [], explained=table)
    assert [(d.ours.name, d.reason) for d in differences] == [("a", "the reason"), ("b", "")]
    assert [d.ours.name for d in agreement.unexplained(differences)] == ["b"]
    assert str(differences[0]).endswith("[explained: the reason]")


@pytest.mark.parametrize("document", [{}, [], {"bomFormat": "SPDX", "components": []}, {"bomFormat": "CycloneDX"}])
def test_a_document_that_is_not_cyclonedx_is_refused_in_one_line(document):
    with pytest.raises(InputError) as refused:
        agreement.trivy_inventory(document, "scan.json")
    assert str(refused.value).count("\n") == 0 and "scan.json" in str(refused.value)


# ----------------------------------------------------------------------------------------------------- the PURLs

@pytest.mark.parametrize("arguments, expected", [
    (("dpkg", "zlib1g", "1:1.2.13.dfsg-1", "amd64", "debian", "12.15"),
     "pkg:deb/debian/zlib1g@1.2.13.dfsg-1?arch=amd64&distro=debian-12.15&epoch=1"),
    (("dpkg", "g++", "4:12.2.0-3", "amd64", "debian", "12.15"),
     "pkg:deb/debian/g%2B%2B@12.2.0-3?arch=amd64&distro=debian-12.15&epoch=4"),
    (("dpkg", "libc6", "0:2.36-9+deb12u13", "amd64", "debian", "12.15"),  # epoch 0: no qualifier (Trivy)
     "pkg:deb/debian/libc6@2.36-9%2Bdeb12u13?arch=amd64&distro=debian-12.15"),
    (("dpkg", "ca-certificates", "20250419~deb12u2", "all", "debian", "12.15"),
     "pkg:deb/debian/ca-certificates@20250419~deb12u2?arch=all&distro=debian-12.15"),
    (("dpkg", "bash", "5.2.21-2ubuntu4", "amd64", "ubuntu", "24.04"),
     "pkg:deb/ubuntu/bash@5.2.21-2ubuntu4?arch=amd64&distro=ubuntu-24.04"),
    (("dpkg", "bash", "5.2.15-2", "", "debian", ""), "pkg:deb/debian/bash@5.2.15-2"),
    (("rpm", "glibc", "2.34-168.el9_6.14", "x86_64", "rocky", "9.6"),
     "pkg:rpm/rocky/glibc@2.34-168.el9_6.14?arch=x86_64&distro=rocky-9.6"),
    (("rpm", "dbus", "1:1.12.20-8.el9", "x86_64", "rocky", "9.6"),  # purl-spec's rpm: the epoch qualifier too
     "pkg:rpm/rocky/dbus@1.12.20-8.el9?arch=x86_64&distro=rocky-9.6&epoch=1"),
    (("apk", "Musl", "1.2.5-r0", "", "alpine", "3.20.3"), "pkg:apk/alpine/musl@1.2.5-r0?distro=3.20.3"),
])
def test_os_purls_are_written_as_trivy_writes_them(arguments, expected):
    assert purls.os_purl(*arguments) == expected


@pytest.mark.parametrize("name, version, expected", [
    ("Django_package", "1.11.1.dev1", "pkg:pypi/django-package@1.11.1.dev1"),  # purl-spec tests/types/pypi-test.json
    ("jaraco.context", "6.1.0", "pkg:pypi/jaraco.context@6.1.0"),
    ("typing_extensions", "4.16.0", "pkg:pypi/typing-extensions@4.16.0"),
    ("torch", "2.13.0+cpu", "pkg:pypi/torch@2.13.0%2Bcpu"),
])
def test_pypi_purls_lower_case_the_name_and_keep_its_dots(name, version, expected):
    assert purls.pypi_purl(name, version) == expected


@pytest.mark.parametrize("os_release, files, expected", [
    ({"ID": "debian", "VERSION_ID": "12"}, {"debian_version": "12.15\n"}, "12.15"),
    ({"ID": "debian", "VERSION_ID": "12"}, {}, "12"),  # an inventory read before the release files were
    ({"ID": "ubuntu", "VERSION_ID": "24.04"}, {"lsb-release": "DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE=24.04\n",
                                              "debian_version": "trixie/sid"}, "24.04"),
    ({"ID": "alpine", "VERSION_ID": "3.20.3"}, {"alpine-release": "3.20.3"}, "3.20.3"),
    ({"ID": "rocky", "VERSION_ID": "9.6"}, {}, "9.6"),
])
def test_the_release_is_read_where_trivy_reads_it(os_release, files, expected):
    assert purls.release(os_release, files) == expected


def test_an_inventory_without_release_files_or_metadata_keeps_its_old_sbom_shape():
    inventory = Inventory({"ID": "debian", "VERSION_ID": "12"}, [("libssl3", "3.0.19-1~deb12u1", "amd64")],
                          [("typing_extensions", "4.16.0")])
    document = cyclonedx(inventory, REPOSITORY, DIGEST, "sha256:" + "b" * 64, "2026-11-29T00:00:00Z")
    assert [item["purl"] for item in document["components"]] == [
        "pkg:deb/debian/libssl3@3.0.19-1~deb12u1?arch=amd64&distro=debian-12", "pkg:pypi/typing-extensions@4.16.0"]
    assert "evidence" not in document["components"][1]


# ---------------------------------------------------------------------------------------------- the real Trivy

def test_trivys_own_inventory_of_each_cpu_row_is_ours(cpu_images, docker_client):
    """Trivy 0.76 on the rows as built: `trivy image` (from the engine) on the runtime row, `trivy rootfs` in a
    container of each; the two modes list the same packages at the same places, and ours differs in nothing
    unexplained (inventory_fixtures.py: why both modes, and what each costs)."""
    runtime = cpu_images["2.13.0-cpu-runtime"]
    image_mode = agreement.trivy_inventory(trivy_image(runtime))
    for tag, image in sorted(cpu_images.items()):
        scanned = trivy_rootfs(docker_client, image)
        if image == runtime:
            assert agreement.trivy_inventory(scanned) == image_mode
        assert unexplained_differences(docker_client, image, scanned) == [], tag


def test_the_metadata_walk_reads_the_header_only_and_a_path_cannot_forge_a_section(cpu_images, docker_client):
    """A metadata file with CRLF lines and a Name repeated in its body gives its header's name and version; one whose
    path holds a newline (an image names its folders as it likes) is skipped, so it cannot start a section of the
    inventory (a forged `### dpkg`)."""
    forged = "/opt/x\n### dpkg\nforged\t6.6.6\tall\n/evil.dist-info"
    prepare = (f"mkdir -p '{forged}' /opt/ok.dist-info && printf 'Name: evil\\nVersion: 1.0\\n' > '{forged}/METADATA' && "
               "printf 'Metadata-Version: 2.1\\r\\nName: good_pkg \\r\\nVersion: 2.0\\r\\n\\r\\nName: body\\n' "
               "> /opt/ok.dist-info/METADATA\n")
    output = docker_client.containers.run(cpu_images["2.13.0-cpu-runtime"], ["-c", prepare + INVENTORY_SCRIPT],
                                          entrypoint=["/bin/sh"], user="0", network_disabled=True, remove=True)
    inventory = parse_inventory(output.decode())
    assert ("/opt/ok.dist-info/METADATA", "good_pkg", "2.0") in inventory.python_files
    assert not [item for item in inventory.python_files if "evil" in item[0] or item[1] == "evil"]
    assert "forged" not in {name for name, _, _ in inventory.debs} and len(inventory.debs) > 100  # the real list
