"""compat refresh against a PEP 691 index on 127.0.0.1 serving small real wheels made here (range requests, no
separate metadata files, as PyPI), and one read of the real 2.14.1 from PyPI in the slow lane."""
import shutil

import pytest
import yaml

from torchimages.compat_refresh import arch_list, metadata_facts, python_max
from torchimages.matrix import COMPAT_FILE, load_matrix

from .conftest import run_cli_in_process
from .index_fixtures import PINS, LocalIndex, make_release


@pytest.fixture
def index(tmp_path):
    with LocalIndex(make_release(tmp_path / "index")) as served:
        yield served


@pytest.fixture
def compat(tmp_path):
    path = tmp_path / "compat.yaml"
    shutil.copy(COMPAT_FILE, path)
    return path


def refresh(index, compat, *args, check_exit: int):
    result = run_cli_in_process("compat", "refresh", *args, "--index-url", index.url, "--compat", str(compat))
    assert result.returncode == check_exit, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def test_a_new_release_is_read_from_its_wheels_with_sources(index, compat, tmp_path):
    before = compat.read_text()
    refresh(index, compat, "2.16.0", check_exit=0)
    facts = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]
    assert facts["python"] == {"min": "3.11", "max": "3.14"}, "cp315t is free-threaded: not a Python the rows use"
    assert facts["torchvision"] == "0.31" and facts["cpu"] is True
    build = facts["cuda"]["13.2"]
    assert build["wheel_index"] == "cu132" and build["pypi"] is True
    assert (build["cudnn"], build["nccl"], build["cusparselt"], build["nvshmem"], build["toolkit"]) == (
        "9.30.0.1", "2.31.0", "0.9.0", "3.8.0", "13.2.2")
    assert build["triton"] == "~=3.10.0"
    assert build["arch_list"] == ["7.5", "9.0", "12.0+PTX"]
    wheel = "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert build["source"]["file"] == wheel and build["source"]["index"] == index.url
    assert len(build["source"]["sha256"]) == 64 and build["source"]["uploaded"] == "2026-11-20"
    assert index.sent[wheel] < (index.folder / wheel).stat().st_size / 2, "read by range requests, not downloaded"
    # Only the torch: section changed; every other section is byte for byte what people wrote.
    assert compat.read_text().split("\n\ncuda:\n", 1)[1] == before.split("\n\ncuda:\n", 1)[1]
    assert "# PyPI torch-2.15.0-cp311" in compat.read_text(), "comments stay"
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("registry: localhost:5000/ml/pytorch\ndefaults: {python: \"3.11\", os: debian12}\nvariants:\n"
                      "  - {torch: 2.16.0, torchvision: 0.31.0, cuda: \"13.2\", cudnn: 9, flavors: [runtime, devel]}\n"
                      "  - {torch: 2.16.0, cuda: cpu, flavors: [runtime]}\n")
    specs = load_matrix(matrix, compat).specs
    assert [spec.tag for spec in specs] == ["2.16.0-cuda13.2-cudnn9-runtime", "2.16.0-cuda13.2-cudnn9-devel",
                                            "2.16.0-cpu-runtime"]
    assert specs[0].arch_list == ("7.5", "9.0", "12.0+PTX") and specs[0].cudnn_version == "9.30.0.1"
    refresh(index, compat, "2.16.0", "--check", check_exit=0)
    every_release = refresh(index, compat, "--check", check_exit=0)
    assert f"torch 2.15.0: not on {index.url}; its facts are kept as compat.yaml has them" in every_release.stdout


def test_a_disagreement_is_reported_with_both_values_and_never_changed_silently(index, compat):
    refresh(index, compat, "2.16.0", check_exit=0)
    compat.write_text(compat.read_text().replace('cudnn: "9.30.0.1"', 'cudnn: "9.29.0.7"'))
    typed = compat.read_text()
    result = refresh(index, compat, "2.16.0", "--check", check_exit=1)
    assert "cuda 13.2 cudnn: compat.yaml says 9.29.0.7, the index says 9.30.0.1" in result.stderr
    assert "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl" in result.stderr
    result = refresh(index, compat, "2.16.0", check_exit=1)
    assert "disagrees" in result.stderr and compat.read_text() == typed, "kept until someone says --correct"
    result = refresh(index, compat, "2.16.0", "--correct", check_exit=0)
    assert "corrected: torch 2.16.0 cuda 13.2 cudnn" in result.stderr
    assert yaml.safe_load(compat.read_text())["torch"]["2.16.0"]["cuda"]["13.2"]["cudnn"] == "9.30.0.1"
    refresh(index, compat, "2.16.0", "--check", check_exit=0)


def test_a_missing_fact_fails_the_check(index, compat):
    refresh(index, compat, "2.16.0", check_exit=0)
    compat.write_text(compat.read_text().replace('        triton: "~=3.10.0"\n', ""))
    result = refresh(index, compat, "2.16.0", "--check", check_exit=1)
    assert "missing: torch 2.16.0 cuda 13.2 triton = ~=3.10.0" in result.stdout


def test_bad_input_names_the_release_or_the_index(index, compat):
    before = compat.read_text()
    result = refresh(index, compat, "2.99.0", check_exit=2)
    assert "no torch '2.99.0' wheels" in result.stderr
    result = run_cli_in_process("compat", "refresh", "2.16.0", "--index-url", "http://127.0.0.1:9/simple",
                                "--compat", str(compat))
    assert result.returncode == 2 and "http://127.0.0.1:9/simple" in result.stderr and "Traceback" not in result.stderr
    assert compat.read_text() == before


def test_facts_from_wheel_contents():
    assert arch_list(b"..\x00sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90\x00..") == (
        "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0")
    assert arch_list(b"\x00sm_100 compute_120 sm_120\x00") == ("10.0", "12.0+PTX")
    assert arch_list(b"no arch list here") == () and arch_list(b"\x00sm_80\x00 \x00sm_90\x00") == ()
    python_min, pins, triton = metadata_facts("Requires-Python: >=3.10\n" + "".join(
        f"Requires-Dist: {p}\n" for p in PINS))
    assert python_min == "3.10" and triton == "~=3.10.0"
    assert pins == {"toolkit": "13.2.2", "cudnn": "9.30.0.1", "nccl": "2.31.0", "cusparselt": "0.9.0",
                    "nvshmem": "3.8.0"}
    assert python_max(["torch-2.16.0-cp314-cp314-manylinux_2_28_x86_64.whl",
                       "torch-2.16.0-cp314-cp314t-manylinux_2_28_x86_64.whl", "bad name.whl"]) == "3.14"


@pytest.mark.engine
def test_the_real_index_agrees_with_compat_yaml_for_2_14_1_and_2_15_0():
    """PyPI itself (network; the slow lane): compat.yaml's facts for the releases the matrix builds are the wheels'."""
    result = run_cli_in_process("compat", "refresh", "2.14.1", "2.15.0", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sm_" not in result.stdout and "7.5 8.0 8.6 9.0 10.0 12.0" in result.stdout


def test_a_member_larger_than_a_torch_wheels_is_refused(index, compat, monkeypatch):
    """What is read of a wheel is held in memory: a hostile index's giant member is refused, not read."""
    import torchimages.compat_refresh as compat_refresh

    monkeypatch.setattr(compat_refresh, "MAX_MEMBER_BYTES", 1 << 16)
    before = compat.read_text()
    result = refresh(index, compat, "2.16.0", check_exit=2)
    assert "torch/lib/libtorch_python.so is larger than a torch wheel's" in result.stderr
    assert compat.read_text() == before
