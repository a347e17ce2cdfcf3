"""Every kind of malformed matrix gives exit 2 and one message per problem naming its line."""
import json
import textwrap
from pathlib import Path

import pytest
import yaml

from torchimages.matrix.load import load_matrix

from .conftest import FIXTURE_PROJECT, run_cli_in_process

# Matrices written into tmp_path are checked against the compatibility data beside them.
pytestmark = pytest.mark.usefixtures("compat_beside_tmp_matrix")


@pytest.fixture
def cli():
    """The matrix commands here read files and print: in this process (an interpreter start costs more than the command)."""
    return run_cli_in_process


GOOD_VARIANT = """
  - torch: 2.14.0
    cuda: "13.0"
    cudnn: 9
    flavors: [runtime]
"""


def write_matrix(tmp_path: Path, variants: str, header: str = "registry: example.com/ml/pytorch\ndefaults:\n  python: \"3.12\"\n  os: ubuntu24.04\n") -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(header + "variants:\n" + textwrap.dedent(variants).strip("\n").replace("\n", "\n") + "\n")
    return path


def indent(text: str) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), "  ")


def errors_for(cli, path: Path) -> list[str]:
    result = cli("--matrix", str(path), "list", check_exit=2)
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("variant, line, expected", [
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavours: [runtime]", 9, "did you mean 'flavors'", id="unknown-key"),
    pytest.param("- torch: 2.14\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]", 6, "'torch' must be X.Y.Z", id="wrong-type-version"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: nine\n  flavors: [runtime]", 8, "cuDNN major version as a number", id="wrong-type-cudnn"),
    pytest.param("- torch: 2.99.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]", 6, "unknown torch 2.99.0", id="unknown-torch"),
    pytest.param("- torch: 2.14.0\n  cuda: \"11.8\"\n  cudnn: 9\n  flavors: [runtime]", 7, "unknown CUDA 11.8", id="unknown-cuda"),
    pytest.param("- torch: 2.12.0\n  cuda: \"13.2\"\n  cudnn: 9\n  flavors: [runtime]", 7, "has no CUDA 13.2 build of torch 2.12.0", id="unsupported-combination"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 8\n  flavors: [runtime]", 8, "cudnn must be 9", id="wrong-cudnn-major"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  python: \"3.9\"\n  flavors: [runtime]", 9, "Python 3.10 to 3.14, not 3.9", id="python-out-of-range"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtim]", 9, "did you mean 'runtime'", id="unknown-flavor"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  os: ubuntu18.04\n  flavors: [runtime]", 9, "unknown os 'ubuntu18.04'", id="unknown-os"),
    pytest.param("- torch: 2.14.0\n  torchvision: 0.28.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]", 7, "not the release paired", id="unpaired-torchvision"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]\n  user: root", 10, "'user' must be a mapping", id="bad-user"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]\n  shm_size: lots", 10, "must be a size", id="bad-size"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  flavors: [runtime]", 6, "cuDNN major version", id="missing-cudnn"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  base: conda\n  flavors: [runtime]", 9, "'base' must be one of os, nvidia", id="unknown-base"),
    pytest.param("- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  os: debian12\n  base: nvidia\n  flavors: [runtime]", 10, "nvidia/cuda has no 13.0 images for debian12", id="nvidia-base-for-another-os"),
    pytest.param("- torch: 2.14.0\n  cuda: \"12.6\"\n  cudnn: 9\n  flavors: [devel]", 9, "cuda-toolkit wheels torch 2.14.0 pins for CUDA 12.6", id="devel-without-toolkit-facts"),
    pytest.param("- torch: 2.14.0\n  cudnn: 9\n  flavors: [runtime]", 6, "missing required key 'cuda'", id="missing-key"),
    pytest.param("- torch: 2.13.0\n  cuda: cpu\n  cudnn: 9\n  flavors: [runtime]", 8, "CPU variants have no cuDNN", id="cpu-with-cudnn"),
])
def test_each_error_kind_names_its_line(cli, tmp_path, variant, line, expected):
    path = write_matrix(tmp_path, indent(variant))
    messages = errors_for(cli, path)
    assert len(messages) == 1, messages
    assert f"{path}:{line}:" in messages[0]
    assert expected in messages[0]


def test_invalid_yaml_names_its_line(cli, tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("registry: x/y\nvariants:\n  - torch: [2.14.0\n    cuda: cpu\n")
    [message] = errors_for(cli, path)
    assert "invalid YAML" in message and f"{path}:" in message


def test_duplicate_yaml_key_is_an_error(cli, tmp_path):
    path = write_matrix(tmp_path, indent("- torch: 2.14.0\n  torch: 2.13.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]"))
    [message] = errors_for(cli, path)
    assert f"{path}:7:" in message and "duplicate key 'torch'" in message


def test_two_variants_giving_one_tag(cli, tmp_path):
    path = write_matrix(tmp_path, indent(GOOD_VARIANT) + "\n" + indent(GOOD_VARIANT.replace("torch: 2.14.0", "torch: 2.14.0\n    python: \"3.11\"")))
    [message] = errors_for(cli, path)
    assert "two variants give the tag '2.14.0-cuda13.0-cudnn9-runtime'" in message
    assert "other is at line 6" in message


def test_all_problems_reported_at_once(cli, tmp_path):
    path = write_matrix(tmp_path, indent("- torch: 2.99.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]\n- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [nightly]\n  colour: red"))
    messages = errors_for(cli, path)
    assert len(messages) == 3
    assert any(":6:" in m for m in messages) and any(":13:" in m for m in messages) and any(":14:" in m for m in messages)


def test_unknown_top_level_key_and_missing_registry(cli, tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("defualts: {}\nvariants:\n" + indent(GOOD_VARIANT.replace("flavors", "python: \"3.12\"\n    os: ubuntu24.04\n    flavors")) + "\n")
    messages = errors_for(cli, path)
    assert any("did you mean 'defaults'" in m and ":1:" in m for m in messages)
    assert any("'registry' must be" in m for m in messages)


def test_allow_unlisted_admits_an_unpublished_pairing(tmp_path):
    path = write_matrix(tmp_path, indent("- torch: 2.12.0\n  cuda: \"13.2\"\n  cudnn: 9\n  flavors: [runtime]\n  allow_unlisted: true\n  arch_list: [\"9.0\"]"))
    [spec] = load_matrix(path).specs
    assert spec.tag == "2.12.0-cuda13.2-cudnn9-runtime"
    assert spec.wheel_index == "cu132" and spec.arch_list == ("9.0",)


def test_unquoted_python_version_keeps_its_digits(tmp_path):
    path = write_matrix(tmp_path, indent("- torch: 2.14.0\n  cuda: 13.0\n  cudnn: 9\n  python: 3.10\n  flavors: [runtime]"))
    [spec] = load_matrix(path).specs
    assert spec.python == "3.10" and spec.cuda == "13.0"


def test_rows_on_another_os_than_the_default_get_a_suffix(tmp_path):
    """The names users know (2.14.1-cuda13.0-cudnn9-runtime) stay on the default OS; the others stay unique."""
    path = write_matrix(tmp_path, indent("- torch: 2.14.1\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime, devel]\n"
                                         "- torch: 2.14.1\n  cuda: \"13.0\"\n  cudnn: 9\n  os: debian12\n  python: \"3.11\"\n"
                                         "  flavors: [runtime]"))
    specs = load_matrix(path).specs
    assert [spec.tag for spec in specs] == ["2.14.1-cuda13.0-cudnn9-runtime", "2.14.1-cuda13.0-cudnn9-devel",
                                            "2.14.1-cuda13.0-cudnn9-runtime-debian12"]
    runtime, devel, debian = specs
    assert runtime.base_image == "ubuntu:24.04" and debian.base_image == "debian:bookworm", "GPU rows start from the OS"
    assert runtime.cuda_toolkit is None and devel.cuda_toolkit == "13.0.3" and devel.cuda_home == "nvidia/cu13"
    assert "nvidia-cuda-nvcc==13.0.88.*" in devel.cuda_toolkit_packages
    assert runtime.system_packages == devel.system_packages == ("g++", "python3.12-dev")
    assert "ninja-build" in devel.flavor_packages and not runtime.flavor_packages
    assert runtime.index_url == "https://pypi.org/simple", "PyPI's torch 2.14.1 is the cu130 build"


def test_nvidia_base_keeps_its_own_requirement_and_drops_its_libcudart(tmp_path):
    path = write_matrix(tmp_path, indent("- torch: 2.14.1\n  cuda: \"13.0\"\n  cudnn: 9\n  base: nvidia\n  flavors: [runtime]"))
    [spec] = load_matrix(path).specs
    assert spec.base_image == "nvidia/cuda:13.0.3-base-ubuntu24.04"
    assert spec.remove_from_base == ("/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so*",)


def test_bad_selector_is_exit_2(cli):
    result = cli("--project", str(FIXTURE_PROJECT), "list", "9.9.9-*", check_exit=2)
    assert "selector '9.9.9-*' matches no tag" in result.stderr


def test_list_json_shows_every_field(cli):
    rows = json.loads(cli("--project", str(FIXTURE_PROJECT), "list", "--format", "json", check_exit=0).stdout)
    assert len(rows) == 9  # the fixture project's rows (tests/project/matrix.yaml)
    assert set(rows[0]) == {"tag", "torch", "cuda", "cudnn", "python", "os", "flavor", "base_image", "min_driver", "arch_list"}


def test_the_compatibility_data_is_the_projects_own_beside_its_matrix_or_named(cli, tmp_path):
    """A project keeps its facts as it keeps its matrix: compat.yaml beside --matrix, or --compat PATH; the package
    holds none, so a project without them is told where they were looked for."""
    matrix = write_matrix(tmp_path, GOOD_VARIANT)
    assert "2.14.0-cuda13.0-cudnn9-runtime" in cli("--matrix", str(matrix), "list", check_exit=0).stdout
    elsewhere = tmp_path / "facts" / "compat.yaml"
    elsewhere.parent.mkdir()
    (tmp_path / "compat.yaml").rename(elsewhere)
    missing = cli("--matrix", str(matrix), "list", check_exit=2)
    assert f"{tmp_path / 'compat.yaml'}: cannot read it" in missing.stderr and "Traceback" not in missing.stderr
    named = cli("--matrix", str(matrix), "--compat", str(elsewhere), "list", check_exit=0)
    assert "2.14.0-cuda13.0-cudnn9-runtime" in named.stdout


def test_a_release_without_a_numpy_pin_is_refused_naming_the_fix(cli, tmp_path):
    """Every image installs NumPy beside torch: a release compat.yaml pins none would install whatever is newest on
    the day of the build."""
    matrix = write_matrix(tmp_path, GOOD_VARIANT)
    compat = tmp_path / "compat.yaml"
    facts = yaml.safe_load(compat.read_text())
    del facts["torch"]["2.14.0"]["numpy"]
    compat.write_text(yaml.safe_dump(facts))
    errors = errors_for(cli, matrix)
    assert any("pins no NumPy for torch" in line and "compat refresh" in line for line in errors), errors


@pytest.mark.parametrize("arch, expected", [
    ("sparc", "'arch' must be one of x86_64, aarch64"),
    ("[x86_64, x86_64]", "each once"),
    ("aarch64", ("no facts read from torch 2.14.0's aarch64 wheels for CUDA 13.0 (`by_arch:` under the build): run "
                 "`python build.py compat refresh 2.14.0`")),
])
def test_a_machine_the_data_cannot_describe_is_exit_2_naming_arch(cli, tmp_path, arch, expected):
    path = write_matrix(tmp_path, indent(f"- torch: 2.14.0\n  cuda: \"13.0\"\n  cudnn: 9\n  arch: {arch}\n"
                                         "  flavors: [runtime]"))
    [error] = errors_for(cli, path)
    assert ":9:" in error and expected in error, error


def test_grace_rows_are_one_tag_per_arch_with_the_aarch64_wheels_own_arch_list():
    specs = {spec.tag: spec for spec in load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs}
    x86, arm = specs["2.14.1-cuda13.0-cudnn9-runtime"], specs["2.14.1-cuda13.0-cudnn9-runtime-arm64"]
    assert (x86.arch, x86.platform, x86.index_tag) == ("x86_64", "linux/amd64", x86.tag)
    assert (arm.arch, arm.platform, arm.index_tag) == ("aarch64", "linux/arm64", x86.tag)
    assert x86.arch_list == ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")
    assert arm.arch_list == ("8.0", "9.0", "10.0", "11.0", "12.0"), "no sm_75, sm_110 added (PyPI's aarch64 wheel)"
    assert arm.cudnn_version == x86.cudnn_version and arm.cuda_toolkit is None
    assert specs["2.15.0-cuda13.2-cudnn9-runtime"].aliases == ("latest",)
    assert specs["2.15.0-cuda13.2-cudnn9-runtime-arm64"].aliases == ("latest-arm64",)
    fixture = {spec.tag: spec for spec in load_matrix(FIXTURE_PROJECT / "matrix.yaml").specs}
    assert x86.spec_hash() == fixture[x86.tag].spec_hash(), "an x86_64 row's inputs did not change with the arm64 one"
