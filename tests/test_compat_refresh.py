"""compat refresh against a PEP 691 index on 127.0.0.1 serving small real wheels made here (range requests, no
separate metadata files, as PyPI), refreshing a copy of the tests' frozen compatibility data (tests/project/)."""
import hashlib
import shutil

import pytest
import yaml

from torchimages.matrix.compat_refresh import arch_list, metadata_facts, python_max
from torchimages.matrix.load import load_matrix
from torchimages.peers import index_http

from .conftest import FIXTURE_COMPAT, run_cli_in_process
from .index_fixtures import PINS, LocalIndex, SilentServer, make_release, version_py
from .wheels_fixtures import make_wheel


@pytest.fixture
def index(tmp_path):
    with LocalIndex(make_release(tmp_path / "index")) as served:
        yield served


@pytest.fixture
def compat(tmp_path):
    path = tmp_path / "compat.yaml"
    shutil.copy(FIXTURE_COMPAT, path)
    return path


def refresh_cli(compat, *args):
    """`compat refresh` writing into the test's copy of the compatibility data."""
    return run_cli_in_process("--compat", str(compat), "compat", "refresh", *args)


def refresh(index, compat, *args, check_exit: int):
    result = refresh_cli(compat, *args, "--index-url", index.url)
    assert result.returncode == check_exit, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def test_a_new_release_is_read_from_its_wheels_with_sources(index, compat, tmp_path):
    before = compat.read_text()
    refresh(index, compat, "2.16.0", check_exit=0)
    facts = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]
    assert facts["python"] == {"min": "3.11", "max": "3.14"}, "cp315t is free-threaded: not a Python the rows use"
    assert facts["torchvision"] == "0.31" and facts["cpu"] is True
    assert facts["numpy"] == "2.4.1" and facts["numpy_source"]["file"].startswith("numpy-2.4.1-"), "newest final"
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
    result = refresh_cli(compat, "2.16.0", "--index-url", "http://127.0.0.1:9/simple")
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


def test_a_member_larger_than_a_torch_wheels_is_refused(index, compat, monkeypatch):
    """What is read of a wheel is held in memory: a hostile index's giant member is refused, not read."""
    from torchimages.peers import package_index

    monkeypatch.setattr(package_index, "MAX_MEMBER_BYTES", 1 << 16)
    before = compat.read_text()
    result = refresh(index, compat, "2.16.0", check_exit=2)
    assert "torch/lib/libtorch_python.so is larger than a torch wheel's" in result.stderr
    assert compat.read_text() == before


def test_facts_the_index_cannot_confirm_are_named_not_passed_as_read(index, compat, tmp_path):
    """A build compat.yaml lists that the index does not have (typed from release pages, or read from another index)
    is kept but named as not read from a wheel, with the index to read it from; a CPU build read is sourced too."""
    refresh(index, compat, "2.16.0", check_exit=0)
    facts = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]
    assert facts["cpu_source"]["file"] == "torch-2.16.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert facts["cpu_source"]["index"] == index.url and len(facts["cpu_source"]["sha256"]) == 64
    hand_typed = '      "12.6":\n        wheel_index: cu126\n        cudnn: "9.10.2.21"\n'
    before_13_2 = '    cuda:\n      "13.2":\n'
    compat.write_text(compat.read_text().replace(before_13_2, '    cuda:\n' + hand_typed + '      "13.2":\n', 1))
    result = refresh(index, compat, "2.16.0", "--check", check_exit=0)
    assert ("unread: torch 2.16.0 cuda 12.6: the index has no cu126 build; compat.yaml's facts for it are not read "
            "from a wheel (read them with --index-url https://download.pytorch.org/whl/cu126)") in result.stdout
    assert "cuda 13.2" not in result.stdout.split("unread:", 1)[1], "the builds read are not named"
    without_cpu = tmp_path / "without-cpu"
    shutil.copytree(index.folder, without_cpu)  # the same wheels (a new make_release would be other bytes)
    for wheel in without_cpu.glob("*+cpu*"):
        wheel.unlink()
    with LocalIndex(without_cpu) as other:
        result = refresh(other, compat, "2.16.0", "--check", check_exit=0)
    assert "unread: torch 2.16.0 cpu: the index has no +cpu build" in result.stdout
    assert "https://download.pytorch.org/whl/cpu" in result.stdout


def test_a_wheel_that_is_not_a_zip_is_exit_2_naming_it(tmp_path, compat):
    folder = make_release(tmp_path / "index")
    (folder / "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"<html>not found</html>" * 100)
    before = compat.read_text()
    with LocalIndex(folder) as served:
        result = refresh(served, compat, "2.16.0", check_exit=2)
    assert "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl" in result.stderr and "zip" in result.stderr
    assert compat.read_text() == before


def test_a_file_host_without_range_requests_is_refused_not_downloaded(tmp_path, compat):
    """A host that ignores Range would send each 550 MB wheel whole: refused, naming the need."""
    with LocalIndex(make_release(tmp_path / "index"), ranges=False) as served:
        result = refresh(served, compat, "2.16.0", check_exit=2)
    assert "range requests" in result.stderr and "files/torch-2.16.0" in result.stderr


@pytest.mark.parametrize("stalls", ["index", "file host"])
def test_a_stalled_index_or_file_host_ends_the_refresh_naming_it(tmp_path, compat, monkeypatch, stalls):
    """Every request is bounded: an index (or the host its files are on) that accepts and never answers is exit 2
    naming its URL once the timeout passes, instead of a nightly job hanging until it is killed."""
    monkeypatch.setattr(index_http, "TIMEOUT_S", 0.5)
    with SilentServer() as silent:
        if stalls == "index":
            result = refresh_cli(compat, "2.16.0", "--index-url", silent.url + "/simple")
        else:
            with LocalIndex(make_release(tmp_path / "index"), files_url=silent.url + "/files") as served:
                result = refresh_cli(compat, "2.16.0", "--index-url", served.url)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert silent.url in result.stderr and "timed out" in result.stderr


def test_a_mirror_login_is_used_but_never_written_or_printed(tmp_path, compat):
    """--index-url https://USER:PASSWORD@mirror/simple: the login reaches the mirror (its pages and its files), and
    appears nowhere else: not in compat.yaml's sources, its comment, the output, or an error."""
    secret = "s3cret-mirror-pass"
    with LocalIndex(make_release(tmp_path / "index"), login=("ci", secret)) as served:
        with_login = served.url.replace("http://", f"http://ci:{secret}@")
        result = refresh_cli(compat, "2.16.0", "--index-url", with_login)
        assert result.returncode == 0, result.stdout + result.stderr
        assert served.authorizations and all(served.authorizations), "every request carried the login"
        missing = refresh_cli(compat, "2.99.0", "--index-url", with_login)
    assert missing.returncode == 2 and served.url in missing.stderr
    facts = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]
    assert facts["cuda"]["13.2"]["source"]["index"] == served.url
    for text in (compat.read_text(), result.stdout, result.stderr, missing.stdout, missing.stderr):
        assert secret not in text


def test_a_wheel_whose_sha256_changed_is_a_disagreement_not_a_new_source(index, compat):
    """The same file name with other bytes (a mirror serving something else, a wheel replaced) is reported with
    both digests and the recorded source is kept until --correct, like any fact."""
    refresh(index, compat, "2.16.0", check_exit=0)
    facts = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]
    real = facts["cuda"]["13.2"]["source"]["sha256"]
    compat.write_text(compat.read_text().replace(real, "0" * 64))
    recorded = compat.read_text()
    result = refresh(index, compat, "2.16.0", "--check", check_exit=1)
    assert f"cuda 13.2 sha256: compat.yaml says {'0' * 64}, the index says {real}" in result.stderr
    refresh(index, compat, "2.16.0", check_exit=1)
    assert compat.read_text() == recorded, "the recorded source is kept"
    refresh(index, compat, "2.16.0", "--correct", check_exit=0)
    assert yaml.safe_load(compat.read_text())["torch"]["2.16.0"]["cuda"]["13.2"]["source"]["sha256"] == real


def test_a_release_the_wheels_cannot_describe_is_not_written(tmp_path, compat):
    """A torch wheel without Requires-Python leaves the release with no Python range: compat.yaml would stop being
    readable by every command, so nothing is written and the problem is named."""
    from .index_fixtures import ARCH_FLAGS, version_py

    folder = tmp_path / "index"
    make_wheel(folder, "torch", "2.16.0", PINS, "", files={"torch/version.py": version_py("2.16.0+cu132", "13.2"),
                                                            "torch/lib/libtorch_python.so": ARCH_FLAGS})
    before = compat.read_text()
    with LocalIndex(folder) as served:
        result = refresh(served, compat, "2.16.0", check_exit=2)
    assert "not written" in result.stderr and "torch '2.16.0' needs python" in result.stderr
    assert compat.read_text() == before


def test_a_wheelhouse_folder_is_read_offline(tmp_path, compat):
    """--index-url FOLDER (what `build.py wheels --dest` makes, one folder per row or flat): the same facts, read
    from the files, each with its file's sha256; a path that is neither an index nor a folder is exit 2."""
    folder = make_release(tmp_path / "wheelhouse" / "cu132-py3.11")
    result = refresh_cli(compat, "2.16.0", "--index-url", str(tmp_path / "wheelhouse"))
    assert result.returncode == 0, result.stdout + result.stderr
    facts = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]
    build = facts["cuda"]["13.2"]
    assert build["cudnn"] == "9.30.0.1" and build["arch_list"] == ["7.5", "9.0", "12.0+PTX"] and build["pypi"]
    assert build["source"]["index"] == str(tmp_path / "wheelhouse")
    wheel = folder / "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert build["source"]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert facts["cpu_source"]["file"].startswith("torch-2.16.0+cpu-") and facts["torchvision"] == "0.31"
    missing = refresh_cli(compat, "2.16.0", "--index-url", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "neither an http(s) package index nor a wheelhouse folder" in missing.stderr


def test_a_partial_wheelhouse_does_not_contradict_the_python_range(tmp_path, index, compat):
    """A wheelhouse holds the wheels a row needed (one Python), not the release: its newest Python is no fact."""
    refresh(index, compat, "2.16.0", check_exit=0)
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    shutil.copy(index.folder / "torch-2.16.0-cp311-cp311-manylinux_2_28_x86_64.whl", folder)
    result = refresh_cli(compat, "2.16.0", "--check", "--index-url", str(folder))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "python.max" not in result.stderr


def test_an_index_page_larger_than_any_index_sends_is_refused(index, compat, monkeypatch):
    """An index page is held in memory: one larger than the bound is exit 2 naming the index, not read on."""
    monkeypatch.setattr(index_http, "MAX_PAGE_BYTES", 256)
    result = refresh(index, compat, "2.16.0", check_exit=2)
    assert "larger than an index page" in result.stderr and index.url in result.stderr


def test_numpy_is_pinned_once_from_the_index_or_carried_then_the_projects_choice(tmp_path, compat):
    """Torch pins no NumPy, so a new release takes the index's newest; later refreshes keep that pin whatever the
    index has since. An index without NumPy (a torch-only mirror, a wheelhouse) carries the newest release's pin."""
    folder = make_release(tmp_path / "index")
    with LocalIndex(folder) as served:
        refresh(served, compat, "2.16.0", check_exit=0)
    make_wheel(folder, "numpy", "2.9.0", (), ">=3.11")
    with LocalIndex(folder) as served:
        again = refresh(served, compat, "2.16.0", "--check", check_exit=0)
    assert yaml.safe_load(compat.read_text())["torch"]["2.16.0"]["numpy"] == "2.4.1" and "numpy" not in again.stderr
    for wheel in folder.glob("numpy-*"):
        wheel.unlink()
    other = tmp_path / "compat-without-2.16.0.yaml"
    shutil.copy(FIXTURE_COMPAT, other)
    with LocalIndex(folder) as served:
        carried = refresh(served, other, "2.16.0", check_exit=0)
    newest_pin = yaml.safe_load(FIXTURE_COMPAT.read_text())["torch"]["2.15.0"]["numpy"]
    assert yaml.safe_load(other.read_text())["torch"]["2.16.0"]["numpy"] == newest_pin
    assert f"added: torch 2.16.0 numpy = {newest_pin} (from torch 2.15.0's pin (the index has no NumPy))" in carried.stdout


def test_the_aarch64_wheels_own_arch_list_is_read_beside_the_x86_64_one(tmp_path, compat):
    """PyPI's aarch64 torch is the same CUDA build with its own arch list (2.14.1/2.15.0: no sm_75, sm_110 added):
    a refresh reads it from that wheel into the build's `by_arch:`, and an aarch64 row takes it."""
    wheels = make_release(tmp_path / "index")
    make_wheel(wheels, "torch", "2.16.0", PINS, ">=3.11", tag="cp311-cp311-manylinux_2_28_aarch64", files={
        "torch/version.py": version_py("2.16.0+cu132", "13.2"),
        "torch/lib/libtorch_python.so": b"\x7fELF" + b"\x00sm_80 sm_90 sm_100 sm_110 sm_120\x00" + b"\x01" * 64})
    with LocalIndex(wheels) as index:
        refresh(index, compat, "2.16.0", check_exit=0)
        build = yaml.safe_load(compat.read_text())["torch"]["2.16.0"]["cuda"]["13.2"]
        assert build["arch_list"] == ["7.5", "9.0", "12.0+PTX"], "the x86_64 wheel's, as before"
        aarch64 = build["by_arch"]["aarch64"]
        assert aarch64["arch_list"] == ["8.0", "9.0", "10.0", "11.0", "12.0"]
        assert aarch64["source"]["file"] == "torch-2.16.0-cp311-cp311-manylinux_2_28_aarch64.whl"
        assert set(aarch64) == {"arch_list", "source"}, "pins equal to the x86_64 wheel's are not repeated"
        matrix = tmp_path / "matrix.yaml"
        matrix.write_text("registry: localhost:5000/ml/pytorch\ndefaults: {python: \"3.11\", os: debian12}\n"
                          "variants:\n  - {torch: 2.16.0, cuda: \"13.2\", cudnn: 9, arch: [x86_64, aarch64], "
                          "flavors: [runtime]}\n")
        x86, arm = load_matrix(matrix, compat).specs
        assert (x86.tag, x86.arch_list) == ("2.16.0-cuda13.2-cudnn9-runtime", ("7.5", "9.0", "12.0+PTX"))
        assert (arm.tag, arm.index_tag, arm.platform) == ("2.16.0-cuda13.2-cudnn9-runtime-arm64",
                                                          x86.tag, "linux/arm64")
        assert arm.arch_list == ("8.0", "9.0", "10.0", "11.0", "12.0") and arm.cudnn_version == x86.cudnn_version
        compat.write_text(compat.read_text().replace('["8.0", "9.0", "10.0", "11.0", "12.0"]', '["7.5", "9.0"]'))
        result = refresh(index, compat, "2.16.0", "--check", check_exit=1)
        assert "cuda 13.2 aarch64 arch_list: compat.yaml says" in result.stderr
        refresh(index, compat, "2.16.0", "--correct", check_exit=0)
        assert yaml.safe_load(compat.read_text())["torch"]["2.16.0"]["cuda"]["13.2"]["by_arch"]["aarch64"][
            "arch_list"] == ["8.0", "9.0", "10.0", "11.0", "12.0"]
        refresh(index, compat, "2.16.0", "--check", check_exit=0)
