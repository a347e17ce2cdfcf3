"""Wheel fetching for offline builds: the platform tags follow the row's glibc; rows sharing a folder share a
download (pure logic; the real download runs in the engine tests' fixtures)."""
from pathlib import Path

from torchimages.build.wheels import download_command, plan_downloads, platform_tags, requirements
from torchimages.matrix.load import load_matrix, select

from .conftest import FIXTURE_MATRIX


def test_platform_tags_follow_the_glibc():
    tags = platform_tags("2.36")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_27_x86_64" in tags  # nvidia-cudnn-cu13 is 2_27 only
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_37_x86_64" not in tags
    assert "manylinux_2_39_x86_64" in platform_tags("2.39")


def test_runtime_and_devel_share_one_download_of_the_union():
    specs = select(load_matrix(FIXTURE_MATRIX).specs, ["2.14.1-cuda13.0-*"])
    [download] = plan_downloads(specs, Path("wheelhouse"))
    assert download.dest == Path("wheelhouse/cu130-py3.11") and download.glibc == "2.36"
    runtime, devel = specs
    assert set(download.requirements) == set(requirements(runtime)) | set(requirements(devel))
    assert "numpy==2.3.5" in requirements(runtime) and "nvidia-cuda-nvcc==13.0.88.*" in requirements(devel)
    command = download_command(download, None, None)
    assert command[command.index("--index-url") + 1] == "https://pypi.org/simple"
    assert "manylinux_2_27_x86_64" in command


def test_each_machine_of_a_grace_row_gets_its_own_download_of_its_own_platform_tags():
    """One pip download is for one machine: the aarch64 wheels (PyPI's +cu130 for Grace) go to a folder of their own,
    fetched for every aarch64 manylinux tag the row's glibc runs (pip does not widen --platform itself)."""
    from .conftest import FIXTURE_PROJECT
    specs = select(load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs, ["2.14.1-cuda13.0-*"])
    x86, arm = plan_downloads(specs, Path("wheelhouse"))
    assert (x86.dest, x86.machine) == (Path("wheelhouse/cu130-py3.11"), "x86_64")
    assert (arm.dest, arm.machine) == (Path("wheelhouse/cu130-py3.11-aarch64"), "aarch64")
    assert set(arm.requirements) == set(x86.requirements)
    command = download_command(arm, None, None)
    platforms = [command[i + 1] for i, word in enumerate(command) if word == "--platform"]
    assert platforms[0] == "manylinux_2_36_aarch64" and "manylinux_2_27_aarch64" in platforms
    assert "manylinux2014_aarch64" in platforms and not any("x86_64" in tag for tag in platforms)
