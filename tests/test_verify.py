"""Verification (`build.py test`): the pure rules, then on a real engine every check proven to fail on a
deliberately broken image, the real CPU images passing with GPU checks skipped, GPU requests failing fast,
and no container or derived image left behind."""
import base64
import dataclasses
import hashlib
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchimages.checks import downstream
from torchimages.checks.plugin import Outcome, aggregate
from torchimages.checks.probe import find_nvcc, wheel_module
from torchimages.checks.probe_base import quiet_import
from torchimages.checks.rules import (
    arch_covers,
    arch_flags_for,
    decode_cudnn_version,
    group_library_copies,
    last_error_line,
    redacted_env,
    secret_env_names,
)
from torchimages.checks.suite.helpers import (
    compile_fix,
    distinct_errors,
    duplicated_libraries,
    expected_device_count,
    gpu_skip_reason,
    minimum_driver,
    pip_error,
)
from torchimages.model import ImageSpec, InputError
from torchimages.peers import engine
from torchimages.verify import (
    CHECKS,
    GPU_CHECKS,
    CheckSelection,
    VerifyOptions,
    VerifyResult,
    complete_checks,
    parse_gpus,
    parse_selection,
    summary_markdown,
    verify_images,
)
from torchimages.verify.suite import selected_verdicts

from .conftest import FIXTURE_MATRIX, ROOT, interruptible, run_cli, run_cli_side_by_side, wait_until
from .verify_fixtures import (
    assert_only_check_failed,
    containers_left,
    image_report_of,
    report_of,
    selection_for,
)

BROKEN = ROOT / "tests" / "data" / "broken"
RUNTIME, DEVEL = "2.13.0-cpu-runtime", "2.13.0-cpu-devel"


# ---------------------------------------------------------------- pure rules

def test_arch_coverage_follows_cubin_and_ptx_rules():
    cu130 = arch_flags_for(["7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX"])
    assert cu130 == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
    assert arch_covers(cu130, (8, 9)) == "cubin sm_86"  # Ada runs Ampere cubins: same major, lower minor
    assert arch_covers(cu130, (12, 1)) == "cubin sm_120"
    assert arch_covers(cu130, (13, 0)).startswith("PTX compute_120")
    assert arch_covers(cu130, (7, 0)) is None  # Volta: no sm_7x cubin at or below 7.0, PTX only from 12.0
    cu126 = arch_flags_for(["5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"])
    assert arch_covers(cu126, (10, 0)) is None  # a cubin never runs on a newer major
    assert arch_covers(cu126, (6, 1)) == "cubin sm_60"


def test_cudnn_version_ints_decode_for_8_and_9():
    assert decode_cudnn_version(92400) == (9, 24, 0)
    assert decode_cudnn_version(91002) == (9, 10, 2)
    assert decode_cudnn_version(8907) == (8, 9, 7)
    assert decode_cudnn_version(None) is None


def test_library_copies_count_files_not_symlinks(tmp_path):
    toolkit = tmp_path / "usr/local/cuda-13.0/lib64"
    wheel = tmp_path / "site-packages/nvidia/cublas/lib"
    for folder in (toolkit, wheel):
        folder.mkdir(parents=True)
    (toolkit / "libcublas.so.13.0.1").write_text("x")
    (toolkit / "libcublas.so.13").symlink_to("libcublas.so.13.0.1")
    (toolkit / "libcublasLt.so.13").write_text("x")
    (wheel / "libcublas.so.13").write_text("x")
    (toolkit / "libcuda.so.1").write_text("driver, not ours to count")
    copies = group_library_copies([str(p) for p in (toolkit.iterdir())] + [str(wheel / "libcublas.so.13")])
    assert set(copies) == {"libcublas", "libcublasLt"}
    assert len(copies["libcublas"]) == 2 and len(copies["libcublasLt"]) == 1


CU130_SITE = "/opt/venv/lib/python3.11/site-packages"
# The libcupti files of the real torch 2.14.1+cu130 wheel set (with cuda-toolkit 13.0.3 and triton 3.8.0 installed):
# the nvidia-cuda-cupti wheel's copy, and the copies Triton ships for its profiler (files, not links, in a wheel).
CU130_CUPTI = [f"{CU130_SITE}/nvidia/cu13/lib/libcupti.so.13"] + [
    f"{CU130_SITE}/triton/backends/nvidia/lib/{folder}/{name}"
    for folder, names in (("cupti", ("libcupti.so", "libcupti.so.12", "libcupti.so.2025.1.1")),
                          ("cupti-blackwell", ("libcupti.so", "libcupti.so.13", "libcupti.so.2026.2.0")))
    for name in names]


def test_tritons_profiler_cupti_is_not_a_second_copy_but_a_second_cudnn_is():
    cudnn = f"{CU130_SITE}/nvidia/cudnn/lib/libcudnn.so.9"
    wheel_set = group_library_copies([*CU130_CUPTI, cudnn], resolve=lambda path: path)
    assert len(wheel_set["libcupti"]) == 7 and duplicated_libraries(wheel_set) == {}
    copied = group_library_copies([*CU130_CUPTI, cudnn, "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"], resolve=lambda p: p)
    assert duplicated_libraries(copied) == {"libcudnn": [cudnn, "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"]}
    elsewhere = group_library_copies([*CU130_CUPTI, "/usr/local/cuda-13.0/lib64/libcupti.so.13"], resolve=lambda p: p)
    assert list(duplicated_libraries(elsewhere)) == ["libcupti"]  # only Triton's own folders are exempt


def test_nvcc_is_found_where_torch_looks_for_it():
    wheel_toolkit = f"{CU130_SITE}/nvidia/cu13"
    exists = {f"{wheel_toolkit}/bin/nvcc", "/usr/local/cuda/bin/nvcc"}.__contains__
    on_path = lambda name, path: "/opt/tools/nvcc" if path and "/opt/tools" in path else None  # noqa: E731
    assert find_nvcc({"CUDA_HOME": wheel_toolkit, "PATH": "/opt/tools"}, exists, on_path) == f"{wheel_toolkit}/bin/nvcc"
    assert find_nvcc({"CUDA_HOME": "/nowhere", "PATH": "/opt/tools"}, exists, on_path) is None  # torch would fail too
    assert find_nvcc({"PATH": "/opt/tools"}, exists, on_path) == "/opt/tools/nvcc"
    assert find_nvcc({"PATH": "/bin"}, exists, on_path) == "/usr/local/cuda/bin/nvcc"


def test_the_driver_floor_comes_from_the_images_label():
    spec = _spec(min_driver="580.65.06")
    assert minimum_driver({"labels": {"io.torchimages.min-driver": "580.95.05"}}, spec)[0] == "580.95.05"
    floor, source = minimum_driver({"labels": {}}, spec)
    assert floor == "580.65.06" and "no io.torchimages.min-driver label" in source


def test_failures_are_said_once_with_their_fix():
    missing = "InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: (None, 'g++')"
    said = distinct_errors({"float16": missing, "float32": missing, "float64": "ok"})
    assert said == f"float16, float32: {missing}"
    assert "gcc, g++" in compile_fix(said) and "pythonX.Y-dev" in compile_fix("fatal error: Python.h: No such file")
    pip_log = ("Processing /tmp/x.whl\n\x1b[91mERROR: Could not install packages due to an OSError: [Errno 13] "
               "Permission denied: '/opt/venv/lib'\nCheck the permissions.\n\x1b[0m")
    assert pip_error(pip_log).startswith("ERROR: Could not install packages") and pip_error(pip_log).endswith("lib'")
    build_log = (" ---> Running in 1a2b3c4d5e6f\nDefaulting to user installation because normal site-packages is not "
                 "writeable\nAssertionError: pip installed /home/torch/.local/m.py, outside the image environment\n"
                 "Removing intermediate container 1a2b3c4d5e6f\n")
    assert pip_error(build_log).startswith("AssertionError: pip installed /home/torch/.local")


def test_the_downstream_wheel_is_a_valid_wheel():
    with zipfile.ZipFile(io.BytesIO(downstream.wheel_bytes())) as wheel:
        names = wheel.namelist()
        record = wheel.read(f"{downstream.MODULE}-{downstream.VERSION}.dist-info/RECORD").decode().splitlines()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            if digest:
                data = wheel.read(path)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert (digest, int(size)) == (f"sha256={expected}", len(data))
    assert f"{downstream.MODULE}/__init__.py" in names and downstream.wheel_bytes() == downstream.wheel_bytes()
    assert wheel_module(f"{downstream.CONTAINER_DIR}/{downstream.WHEEL}") == downstream.MODULE


def test_the_downstream_wheel_installs_with_pip(tmp_path):
    wheel = tmp_path / downstream.WHEEL
    wheel.write_bytes(downstream.wheel_bytes())
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
                    "--target", str(tmp_path / "site"), str(wheel)], check=True, capture_output=True)
    assert (tmp_path / "site" / downstream.MODULE / "__init__.py").is_file()


def test_imports_are_recorded_with_what_they_warn_and_print(tmp_path, monkeypatch):
    (tmp_path / "noisy_module.py").write_text("import os, warnings\nwarnings.warn('old NumPy')\n"
                                               "os.write(2, b'printed by C++\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module, facts = quiet_import("noisy_module")
    assert module is not None and facts["import_warnings"] == ["UserWarning: old NumPy"]
    assert facts["import_output"] == "printed by C++\n"
    missing, facts = quiet_import("no_such_module_here")
    assert missing is None and facts["missing"] is True and "No module named" in facts["error"]


def test_the_checks_ship_in_the_package(tmp_path):
    """`build.py test` from an installed package: the probe and the suite are package data, found from the package."""
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ and egg-info there
    shutil.copytree(ROOT / "torchimages", source / "torchimages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("torchimages-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    suite = {f"torchimages/checks/suite/{name}" for name in ("pytest.ini", "conftest.py", "helpers.py", "test_smoke.py")}
    assert {"torchimages/checks/probe.py", "torchimages/checks/downstream.py"} | suite <= names
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
                    str(tmp_path / "site"), str(wheel)], check=True, capture_output=True)
    locate = "from torchimages import verify; print(verify.SUITE, verify.PROBE_SOURCE)"
    where = subprocess.run([sys.executable, "-c", locate], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site")},
                           capture_output=True, text=True, check=True).stdout.split()
    assert [Path(path) for path in where] == [tmp_path / "site/torchimages/checks/suite",
                                             tmp_path / "site/torchimages/checks/probe.py"]
    assert all(Path(path).exists() for path in where)


def test_secrets_are_found_by_name_or_url_and_hidden():
    env = {"HF_TOKEN": "hf_x", "PIP_INDEX_URL": "https://ci:pw@mirror/simple", "GPG_KEY": "A035C8C1",
           "PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    assert secret_env_names(env) == ["HF_TOKEN", "PIP_INDEX_URL"]
    hidden = redacted_env(env)
    assert "hf_x" not in json.dumps(hidden) and hidden["PATH"] == "/bin"


def test_dataloader_errors_are_reduced_to_their_cause():
    error = RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nTraceback:\n  File x\n"
                         "RuntimeError: unable to allocate shared memory(shm): No space left on device (28)\n")
    assert last_error_line(error) == "RuntimeError: unable to allocate shared memory(shm): No space left on device (28)"


def test_facts_of_another_probe_version_are_a_probe_error():
    """The checks read the fields of the probe this package ships: older facts are refused, not misread."""
    from torchimages.checks.probe import PROBE_VERSION
    from torchimages.verify import run_probe

    class Container:
        def __init__(self, version):
            self.version = version

        def exec_run(self, command, user, demux):
            return 0, (json.dumps({"probe_version": self.version, "python": {}}).encode() + b"\n", b"")

    assert run_probe(Container(PROBE_VERSION), [], "", 10)["probe_version"] == PROBE_VERSION
    stale = run_probe(Container(PROBE_VERSION - 1), [], "", 10)
    assert "version" in stale["probe_error"] and "reinstall" in stale["probe_error"]


def test_gpus_option_follows_dockers_syntax():
    assert parse_gpus("all").count == -1 and parse_gpus("all").expected_count is None
    assert not parse_gpus("none").wanted and parse_gpus("none").device_requests() == []
    assert parse_gpus("2").expected_count == 2
    devices = parse_gpus("device=0,2")
    assert devices.device_ids == ("0", "2") and devices.expected_count == 2
    assert devices.device_requests()[0]["DeviceIDs"] == ["0", "2"]
    with pytest.raises(InputError, match="not all, none"):
        parse_gpus("two")


def test_expected_device_count_honours_cuda_visible_devices():
    expect = {"gpus": {"text": "all", "expected_count": None}}
    assert expected_device_count(expect, {"nvidia_smi_gpus": ["GPU 0", "GPU 1"], "cuda_visible_devices": None})[0] == 2
    assert expected_device_count(expect, {"nvidia_smi_gpus": ["GPU 0", "GPU 1"], "cuda_visible_devices": "1"})[0] == 1
    assert expected_device_count({"gpus": {"text": "device=3", "expected_count": 1}}, {})[0] == 1


def _spec(**changes) -> ImageSpec:
    values = dict(tag="t", torch="2.14.0", cuda="13.0", cudnn=9, python="3.12", os="ubuntu24.04", flavor="runtime",
                  base_image="b", wheel_index="cu130", python_from_os=True)
    return ImageSpec(**{**values, **changes})


def test_gpu_checks_are_skipped_with_a_reason_never_passed():
    no_gpus = {"gpus": {"wanted": False}, "host_gpu_runtime": False}
    assert "no NVIDIA runtime" in gpu_skip_reason(_spec(), no_gpus)
    assert gpu_skip_reason(_spec(cuda=None, cudnn=None), no_gpus).startswith("CPU image")
    assert gpu_skip_reason(_spec(), {"gpus": {"wanted": True}, "host_gpu_runtime": True}) is None


def test_a_check_fails_if_any_test_fails_and_is_skipped_only_if_all_are():
    outcomes = [Outcome("a", "identity", "passed"), Outcome("b", "identity", "skipped", "n/a"),
                Outcome("c", "shm", "failed", "/dev/shm is 64 MiB"), Outcome("d", "shm", "passed"),
                Outcome("e", "gpu", "skipped", "no GPU"), Outcome("f", "gpu", "skipped", "no GPU")]
    verdicts = aggregate(outcomes)
    assert verdicts["identity"]["status"] == "passed" and "n/a" in verdicts["identity"]["message"]
    assert (verdicts["shm"]["status"], verdicts["shm"]["message"]) == ("failed", "/dev/shm is 64 MiB")
    assert verdicts["gpu"]["status"] == "skipped" and verdicts["gpu"]["message"] == "no GPU"
    assert "amp" not in verdicts  # no test reported: verify.complete_checks turns that into a failure


def test_summary_is_a_checks_by_images_table():
    checks = {name: {"status": "skipped" if name in GPU_CHECKS else "passed", "message": "no GPU | here"} for name in CHECKS}
    checks["shm"] = {"status": "failed", "message": "/dev/shm is 64 MiB"}
    text = summary_markdown([VerifyResult("2.13.0-cpu-runtime", "ref", "sha256:1", False, checks, Path("r"))])
    assert "| shm | ❌ failed |" in text and "| gpu | ⏭️ skipped |" in text and "| identity | ✅ passed |" in text
    assert "no GPU \\| here" in text  # a pipe in a message cannot break the table


# ---------------------------------------------------------------- check selection (--only/--skip)

def test_a_selection_takes_repeated_and_comma_separated_names():
    selection = parse_selection(None, ["smoke,devel", " hygiene", "smoke"])
    assert selection.skip == ("smoke", "devel", "hygiene") and not selection.full
    assert selection.selected() == tuple(name for name in CHECKS if name not in ("smoke", "devel", "hygiene"))
    assert selection.reason == "not selected: --skip smoke,devel,hygiene"
    only = parse_selection(["hygiene"], None)
    assert only.selected() == ("hygiene",) and only.to_json() == {"only": ["hygiene"]}
    assert CheckSelection.from_json(only.to_json()) == only
    every = parse_selection(None, None)
    assert every.full and every.selected() == CHECKS and every.to_json() == {}


@pytest.mark.parametrize("only, skip, says", [
    (None, ["smok"], "--skip 'smok' is not a check: name one or more of identity, gpu,"),
    (["hygiene,Smoke"], None, "--only 'Smoke' is not a check"),
    (["hygiene"], ["smoke"], "--only and --skip cannot be combined"),
    ([","], None, "--only names no check"),
    (None, [",".join(CHECKS)], "--skip names every check, so nothing would be verified"),
], ids=["unknown", "wrong case", "both", "empty", "everything skipped"])
def test_a_selection_that_cannot_run_is_bad_input(only, skip, says):
    with pytest.raises(InputError) as raised:
        parse_selection(only, skip)
    [problem] = raised.value.problems
    assert says in problem.message and "\n" not in str(problem)


def test_unselected_checks_are_skipped_naming_the_option_however_the_run_ended(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text("INTERNALERROR> the suite broke\n")
    broken_suite = complete_checks({}, 3, log)  # every check failed: nothing the suite said can be trusted
    checks = selected_verdicts(broken_suite, parse_selection(["hygiene", "shm"], None))
    assert {name for name, check in checks.items() if check["status"] == "failed"} == {"shm", "hygiene"}
    assert checks["smoke"] == {"status": "skipped", "message": "not selected: --only hygiene,shm", "tests": []}


def test_the_probe_is_told_the_selection_and_the_side_work_follows_it():
    from torchimages.checks import probe
    from torchimages.verify.container import probe_arguments, side_work_wanted

    devel = _spec(cuda=None, cudnn=None, flavor="devel", arch_list=(), builds_extensions=True)
    assert probe_arguments(devel, 600, 1, CheckSelection()) == ["--budget-s", "600", "--slowdown", "1", "--devel"]
    skip_smoke = parse_selection(None, ["smoke"])
    arguments = probe_arguments(devel, 600, 1, skip_smoke)
    assert arguments[-1] == f"--checks={','.join(skip_smoke.selected())}"
    checks = probe.parse_arguments(arguments).checks
    assert not probe.runs_work_of(checks, "smoke") and probe.runs_work_of(checks, "devel")
    assert probe.runs_work_of(probe.parse_arguments([]).checks, "smoke")  # no --checks: every check's work
    assert side_work_wanted(CheckSelection()) == {"files", "import", "downstream", "layers"}
    assert side_work_wanted(parse_selection(["hygiene"], None)) == {"files", "import"}
    assert side_work_wanted(parse_selection(["downstream"], None)) == {"import", "downstream"}
    assert side_work_wanted(parse_selection(["smoke"], None)) == set()
    assert side_work_wanted(parse_selection(["layout"], None)) == {"layers"}


def test_a_selective_verification_is_never_one_to_publish_or_reuse(tmp_path, monkeypatch):
    """publish refuses it, saying to verify in full; the nightly, asking publish's question, verifies the row again."""
    from types import SimpleNamespace

    from torchimages.matrix.load import load_matrix, select
    from torchimages.nightly import run as nightly
    from torchimages.publish.publisher import SPEC_HASH_LABEL, verification_refusal
    from torchimages.verify.reports import CheckVerdict, VerifyReport, verify_report_path

    [spec] = select(load_matrix(FIXTURE_MATRIX).specs, [RUNTIME])
    image = {"Id": "sha256:" + "a" * 64, "Config": {"Labels": {SPEC_HASH_LABEL: spec.spec_hash()}}}
    full = VerifyReport(image["Id"], True, {"smoke": CheckVerdict("passed")}, tag=RUNTIME)
    selective = dataclasses.replace(full, checks={"smoke": CheckVerdict("skipped", "not selected: --skip smoke")},
                                    selection={"skip": ["smoke"]})
    path = verify_report_path(tmp_path, RUNTIME)
    assert verification_refusal(spec, image, full, path) is None
    refusal = verification_refusal(spec, image, selective, path)
    assert "only some checks (--skip smoke)" in refusal and f"run the full `torchimages test {RUNTIME}`" in refusal

    monkeypatch.setattr(nightly.engine, "inspect_image", lambda client, name: image)
    run = SimpleNamespace(project=SimpleNamespace(reports=tmp_path))  # all passed_already reads of the nightly
    for report, reused in ((full, True), (selective, False)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_json()))
        assert nightly.Nightly.passed_already(run, None, spec) is reused


def test_the_summary_says_a_selective_verification_is_not_one_to_publish():
    selection = parse_selection(["hygiene"], None)
    checks = {name: {"status": "passed" if name == "hygiene" else "skipped", "message": selection.reason}
              for name in CHECKS}
    text = summary_markdown([VerifyResult(RUNTIME, "ref", "sha256:1", True, checks, Path("r"), selection=selection)])
    assert "- **smoke** skipped: not selected: --only hygiene" in text
    assert f"only some checks ran (--only hygiene): publishing needs every check, `torchimages test {RUNTIME}`" in text


# ---------------------------------------------------------------- on a real engine

@dataclass(frozen=True)
class Broken:
    """A good image with one defect (tests/data/broken/<name>), and the one check that must catch it."""

    name: str
    row: str  # the image it is built FROM, and the row it is checked against
    check: str
    says: tuple[str, ...]  # what the failure message must mention to be helpful

    @property
    def image(self) -> str:
        return f"torchimages-test/broken:{self.name}"


BROKEN_IMAGES = (
    Broken("wrong-torch-version", RUNTIME, "identity", ("torch is 2.12.0+cpu", "expects 2.13.0+cpu", "rebuild")),
    Broken("missing-torch", RUNTIME, "identity", ("torch does not import", "rebuild")),
    Broken("wrong-labels", RUNTIME, "identity", ("io.torchimages.torch is missing", "io.torchimages.cuda=13.0")),
    Broken("duplicated-cuda-library", RUNTIME, "hygiene", ("libcublas: 2 copies", "/usr/local/cuda-12.6/lib64")),
    Broken("leftover-netrc", RUNTIME, "hygiene", ("/home/torch/.netrc", "remove")),
    Broken("token-in-env", RUNTIME, "hygiene", ("HF_TOKEN", "run time")),
    Broken("runs-as-root", RUNTIME, "hygiene", ("uid 0", "USER 1000")),
    Broken("leftover-package-lists", RUNTIME, "hygiene", ("OS package cache /var/lib/apt/lists", "apt-get clean")),
    Broken("autocast-does-nothing", RUNTIME, "amp", ("bf16 autocast on the CPU did not train", "torch.float32")),
    Broken("devel-without-ninja", DEVEL, "devel", ("Ninja is required", "ninja")),
    Broken("without-numpy", RUNTIME, "smoke", ("No module named 'numpy'", "Install numpy")),
    Broken("runtime-without-compiler", RUNTIME, "smoke", ("torch.compile", "InvalidCxxCompiler", "gcc, g++")),
    Broken("read-only-venv", RUNTIME, "downstream", ("could not pip-install a package as its user 1000", "/opt/venv",
                                                      "COPY --chown")),
    Broken("broken-torchrun", RUNTIME, "distributed", ("torchrun", "exit code 1", "broken on purpose")),
    Broken("duplicate-layer", RUNTIME, "layout", ("layer 13 of 13 (COPY file:", "in /torchimages-marker)",
                                                   "has the same content as layer 12", "drop the step")),
)


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def images(request):
    """The real CPU images (built by the session fixture when missing); skipped only when no engine can run."""
    from devtools.localengine import EngineError

    try:
        request.getfixturevalue("engine_env")
    except EngineError as error:
        pytest.skip(f"no Docker engine to verify on: {error}")
    return request.getfixturevalue("cpu_images")


@dataclass(frozen=True)
class Verified:
    """One `build.py test` run: the finished process, its reports folder, and each tag's verify.json."""

    process: subprocess.CompletedProcess
    reports: Path
    by_tag: dict[str, dict]


@pytest.fixture(scope="module")
def baseline(images, tmp_path_factory) -> Verified:
    """The real CPU images verified once, as CI does: what each broken image is compared with."""
    reports = tmp_path_factory.mktemp("baseline")
    process = run_cli("--reports", str(reports), "test", "2.13.0-cpu-*", "--gpus", "none")
    return Verified(process, reports, {tag: report_of(reports, tag) for tag in images})


@pytest.fixture(scope="module")
def broken_images(images, docker_client):
    built = {}
    for case in BROKEN_IMAGES:
        docker_client.images.build(path=str(BROKEN / case.name), buildargs={"BASE": images[case.row]}, tag=case.image,
                                   rm=True, forcerm=True)
        built[case.name] = docker_client.api.inspect_image(case.image)["Id"]
    yield built
    for case in BROKEN_IMAGES:
        docker_client.images.remove(case.image, force=True)


@pytest.mark.engine
def test_real_cpu_images_pass_with_gpu_checks_skipped(baseline, images, docker_client):
    reports = baseline.reports
    for tag, report in baseline.by_tag.items():
        assert report["image_id"] == docker_client.api.inspect_image(images[tag])["Id"]
        failed = {name: check["message"] for name, check in report["checks"].items() if check["status"] == "failed"}
        assert not failed, f"{tag}: {failed}"
        for name in GPU_CHECKS:
            assert report["checks"][name]["status"] == "skipped" and report["checks"][name]["message"]
        assert report["passed"] is True and report["finished_at"].endswith("Z")
        junit = (reports / tag / "junit.xml").read_text()
        assert f'testsuite name="{tag}"' in junit and "docker://" not in junit
        names = re.findall(r'<testcase [^>]*name="([^"]+)"', junit)
        assert names and all(name.endswith(f"[{tag}]") for name in names)
    assert baseline.process.returncode == 0, baseline.process.stdout + baseline.process.stderr
    summary = (reports / "verify-summary.md").read_text()
    assert f"`{RUNTIME}`" in summary and f"`{DEVEL}`" in summary and "| gpu | ⏭️ skipped | ⏭️ skipped |" in summary
    assert not containers_left(docker_client, reports)


@pytest.fixture(scope="module")
def broken_verdicts(broken_images, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Each broken image verified once by `build.py test --image`, as a user would, two runs at a time (without the
    smoke check where it is not the one under test: selection_for)."""
    reports = {case.name: tmp_path_factory.mktemp(case.name) for case in BROKEN_IMAGES}
    processes = run_cli_side_by_side({case.name: ("--reports", str(reports[case.name]), "test", case.row, "--image",
                                                  case.image, "--gpus", "none", *selection_for(case.check))
                                      for case in BROKEN_IMAGES})
    return {name: (process, reports[name]) for name, process in processes.items()}


@pytest.mark.engine
@pytest.mark.parametrize("case", BROKEN_IMAGES, ids=lambda case: case.name)
def test_a_broken_image_fails_exactly_its_check(case, broken_images, broken_verdicts, baseline, docker_client):
    result, reports = broken_verdicts[case.name]
    report = image_report_of(reports, case.row, case.image)
    assert result.returncode == 1, result.stdout + result.stderr
    assert report["image_id"] == broken_images[case.name] and report["passed"] is False
    assert report["selection"] == ({"skip": ["smoke"]} if selection_for(case.check) else {})
    assert_only_check_failed(report, baseline.by_tag[case.row], case.check, case.says)
    assert not containers_left(docker_client, reports)


@pytest.mark.engine
def test_a_row_expecting_another_python_fails_identity(baseline, tmp_path, docker_client):
    result = run_cli("--matrix", str(BROKEN / "python-3.12-matrix.yaml"), "--compat", str(ROOT / "compat.yaml"),
                     "--reports", str(tmp_path), "test", RUNTIME, *selection_for("identity"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert_only_check_failed(report_of(tmp_path, RUNTIME), baseline.by_tag[RUNTIME], "identity",
                             ("runs Python 3.11", "expects Python 3.12"))
    assert not containers_left(docker_client, tmp_path)


@pytest.mark.engine
def test_only_runs_just_that_check_and_skips_the_rest_naming_the_option(images, tmp_path, docker_client):
    """A developer re-running one check: the other checks' work is not done, they are skipped naming --only (report,
    JUnit, summary), and the exit code is the selected check's."""
    result = run_cli("--reports", str(tmp_path), "test", RUNTIME, "--only", "hygiene", "--gpus", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    report = report_of(tmp_path, RUNTIME)
    assert report["passed"] is True and report["selection"] == {"only": ["hygiene"]}
    assert report["checks"].pop("hygiene")["status"] == "passed"
    assert {(check["status"], check["message"]) for check in report["checks"].values()} == {
        ("skipped", "not selected: --only hygiene")}
    facts = json.loads((tmp_path / RUNTIME / "facts.json").read_text())
    assert "downstream" not in facts and not {"smoke", "extension", "distributed"} & set(facts["main"])
    assert "dataloader" not in facts["main"]["shm"] and "user_install" not in facts["import"]
    assert 'message="not selected: --only hygiene"' in (tmp_path / RUNTIME / "junit.xml").read_text()
    assert "only some checks ran (--only hygiene)" in (tmp_path / "verify-summary.md").read_text()
    assert not containers_left(docker_client, tmp_path)


@pytest.mark.engine
def test_too_little_shm_fails_shm_through_the_api(baseline, images, tmp_path, docker_client):
    """The nightly job's way in: verify_images with options, here with Docker's default-sized /dev/shm (and without
    the smoke check's compiles, as the broken images: selection_for)."""
    from torchimages.matrix.load import load_matrix, select

    specs = select(load_matrix(ROOT / "matrix.yaml").specs, [RUNTIME])
    [result] = verify_images(docker_client, specs, VerifyOptions(reports_dir=tmp_path, shm_size="64m",
                                                                 selection=parse_selection(None, ["smoke"])))
    assert result.report_dir == tmp_path / RUNTIME and result.passed is False
    assert result.image_id == docker_client.api.inspect_image(images[RUNTIME])["Id"]
    assert_only_check_failed(report_of(tmp_path, RUNTIME), baseline.by_tag[RUNTIME], "shm",
                             ("/dev/shm is 64.0 MiB", "--shm-size=8g", "--ipc=host", "No space left on device"))
    assert not containers_left(docker_client, tmp_path)


@pytest.mark.engine
def test_gpus_all_without_nvidia_runtime_fails_at_once(images, tmp_path, engine_without_gpus):
    docker_client = engine_without_gpus
    result = run_cli("--reports", str(tmp_path), "test", RUNTIME, "--gpus", "all")
    assert result.returncode == 2
    assert engine.GPU_RUNTIME_HINT in one_line(result.stderr)
    assert "could not select device driver" not in result.stderr
    assert not containers_left(docker_client, tmp_path) and not (tmp_path / RUNTIME / "verify.json").exists()


@pytest.mark.engine
@pytest.mark.parametrize("selector, running", [(DEVEL, 1), ("2.13.0-cpu-*", 2)], ids=["one image", "two at once"])
def test_ctrl_c_removes_the_container(selector, running, images, tmp_path, docker_client):
    # The devel image: its probe compiles a torch extension, so the run is surely still going at Ctrl-C. Two images
    # (no GPUs: verified side by side) stop together, their two containers removed.
    process = interruptible([sys.executable, str(ROOT / "build.py"), "--reports", str(tmp_path), "test", selector],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def verifying() -> list[str]:  # the images' own containers (not those of a derived image's build)
        return [name for name in containers_left(docker_client, tmp_path) if name.startswith("torchimages-verify-")]

    wait_until(lambda: process.poll() is not None or len(verifying()) == running,
               "the verification starting its containers")
    assert process.poll() is None, "the verification ended before its containers ran"
    for name in verifying():
        wait_until(lambda name=name: "torchimages-probe" in str(docker_client.api.top(name)), "the probe running in the container")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    # A derived image's build container is removed by the engine itself, just after the client goes.
    wait_until(lambda: not containers_left(docker_client, tmp_path), "the run's containers being removed", timeout_s=60)
    assert not (tmp_path / DEVEL / "verify.json").exists() and not (tmp_path / RUNTIME / "verify.json").exists()


def test_images_are_verified_side_by_side_only_where_no_gpu_is_given():
    """Two images on the same GPUs would halve each other's throughput figures: with GPUs, one at a time."""
    from types import SimpleNamespace

    from torchimages.verify.run import verification_jobs

    without, with_gpus = (SimpleNamespace(gpus=SimpleNamespace(wanted=wanted)) for wanted in (False, True))
    assert verification_jobs([without, without, without], 2) == 2
    assert verification_jobs([without], 2) == 1 and verification_jobs([without, without], 1) == 1
    assert verification_jobs([without, with_gpus], 2) == 1


def test_main_job_takes_the_cpu_rows_without_gpus_and_verifies_them(cpu_images, wheelhouse, tmp_path,
                                                                   engine_without_gpus):
    """`make images` runs `build.py images`: on an engine without the NVIDIA runtime it says it takes the CPU
    rows, builds them (skipping what is unchanged) and verifies them."""
    result = run_cli("--reports", str(tmp_path), "images", "--wheelhouse", str(wheelhouse))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no NVIDIA runtime on this Docker engine: taking the CPU rows" in result.stderr
    for tag in cpu_images:
        report = json.loads((tmp_path / tag / "verify.json").read_text())
        assert report["passed"] is True and report["checks"]["gpu"]["status"] == "skipped"
    assert not any("cuda" in path.name for path in tmp_path.iterdir()), "GPU rows were not selected"
