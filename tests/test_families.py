"""OS families are data: a second family (dnf, synthetic here) is a block in compat.yaml, one template and its
OS lines; it renders end to end, passes hadolint, and the SBOM reads its package database with no family table."""
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import yaml

from torchimages.build.render import render_files
from torchimages.checks.suite.helpers import os_is_the_rows
from torchimages.matrix.load import load_matrix
from torchimages.project import DEFAULT_TEMPLATES
from torchimages.security.sbom import cyclonedx, parse_inventory

from .conftest import FIXTURE_COMPAT, ROOT

DNF_TEMPLATE = '''{% macro install(packages, step) -%}
RUN dnf install -y --setopt=install_weak_deps=False {{ packages | join(" ") }} \\
 && dnf clean all \\
 && rm -rf /var/cache/dnf
{%- endmacro %}
{% macro security_upgrade() -%}
ARG OS_SECURITY_REFRESH=none
RUN dnf upgrade -y --security \\
 && dnf clean all \\
 && rm -rf /var/cache/dnf
{%- endmacro %}
'''
DNF_FAMILY = {"certificates": ["ca-certificates"], "download": ["curl"], "compiler": ["gcc-c++"],
              "python": ["python{python}"], "python_venv": [], "python_dev": ["python{python}-devel"],
              "names": {"ninja-build": "ninja-build", "make": "make", "git": "git-core"}, "caches": ["/var/cache/dnf"]}


@pytest.fixture
def dnf_project(tmp_path):
    compat = yaml.safe_load(FIXTURE_COMPAT.read_text())
    compat["families"]["dnf"] = DNF_FAMILY
    compat["os"]["rocky9"] = {"python": "3.11", "image": "rockylinux:9", "glibc": "2.34", "family": "dnf",
                              "os_release": "rocky9.6"}
    (tmp_path / "compat.yaml").write_text(yaml.safe_dump(compat))
    templates = tmp_path / "templates"
    shutil.copytree(DEFAULT_TEMPLATES, templates)
    (templates / "os" / "dnf.j2").write_text(DNF_TEMPLATE)
    (tmp_path / "matrix.yaml").write_text(
        "registry: localhost:5000/ml/pytorch\n"
        "defaults: {python: \"3.11\", os: debian12, user: {name: torch, uid: 1000}}\n"
        "variants:\n  - {torch: 2.13.0, cuda: cpu, os: rocky9, flavors: [runtime, devel]}\n"
        "  - {torch: 2.13.0, cuda: cpu, flavors: [devel]}\n")
    return tmp_path


def test_a_second_family_renders_from_its_table_and_template(dnf_project):
    specs = load_matrix(dnf_project / "matrix.yaml", dnf_project / "compat.yaml").specs
    rocky = {spec.flavor: spec for spec in specs if spec.os == "rocky9"}
    assert rocky["devel"].tag == "2.13.0-cpu-devel-rocky9" and rocky["devel"].os_family == "dnf"
    assert rocky["devel"].flavor_packages == ("make", "ninja-build", "git-core"), "flavor packages by the family"
    assert rocky["devel"].package_caches == ("/var/cache/dnf",) and rocky["devel"].os_release == "rocky9.6"
    debian = next(spec for spec in specs if spec.os == "debian12")
    assert debian.flavor_packages == ("make", "ninja-build", "git") and debian.os_release == "debian12"
    assert debian.package_caches == ("/var/lib/apt/lists", "/var/cache/apt/archives")
    rendered = render_files(specs, dnf_project / "templates", "matrix.yaml", "localhost:5000/ml/pytorch")
    dockerfile = rendered["2.13.0-cpu-devel-rocky9/Dockerfile"].decode()
    assert "ARG BASE_IMAGE=rockylinux:9" in dockerfile and "apt-get" not in dockerfile
    assert "dnf install -y --setopt=install_weak_deps=False ca-certificates python3.11" in dockerfile
    assert "dnf install -y --setopt=install_weak_deps=False gcc-c++ python3.11-devel" in dockerfile
    assert "make ninja-build git-core" in dockerfile
    assert "ARG OS_SECURITY_REFRESH=none\nRUN dnf upgrade -y --security" in dockerfile, "its own security layer"
    assert "apt-get install" in rendered["2.13.0-cpu-devel/Dockerfile"].decode(), "the apt rows are unchanged"
    hadolint = shutil.which("hadolint") or str(ROOT / ".venv" / "bin" / "hadolint")
    (dnf_project / "Dockerfile").write_text(dockerfile)
    lint = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(dnf_project / "Dockerfile")],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_sbom_reads_an_rpm_image_with_no_family_table():
    inventory = parse_inventory("### os-release\nID=\"rocky\"\nVERSION_ID=\"9.6\"\n### rpm\n"
                                "glibc\t2.34-168.el9_6.14\tx86_64\n### pip\n[]\n")
    document = cyclonedx(inventory, "localhost:5000/ml/pytorch", "sha256:" + "a" * 64, "sha256:" + "b" * 64,
                         "2026-11-24T00:00:00Z")
    assert [component["purl"] for component in document["components"]] == [
        "pkg:rpm/rocky/glibc@2.34-168.el9_6.14?arch=x86_64&distro=rocky-9.6"]
    assert document["components"][0]["properties"] == [{"name": "io.torchimages:package-manager", "value": "rpm"}]


@pytest.mark.parametrize("found, os_name, os_release, same", [
    ("rocky9.6", "rocky9", "rocky9.*", True),  # rockylinux/rockylinux:9 floats across point releases
    ("rocky9.4", "rocky9", "rocky9.*", True),
    ("rocky8.10", "rocky9", "rocky9.*", False),
    ("debian12", "debian12", None, True),
    ("debian13", "debian12", None, False),
    ("ubuntu24.04", "ubuntu24.04", None, True),
])
def test_the_identity_check_takes_an_os_release_pattern(found, os_name, os_release, same):
    """compat.yaml's `os_release` may be a shell pattern; without one, /etc/os-release must name the OS exactly."""
    assert os_is_the_rows(found, SimpleNamespace(os=os_name, os_release=os_release)) is same
