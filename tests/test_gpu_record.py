"""`build.py gpu-record`: the record line of docs/gpu-validation.md from a GPU host's facts, judged by the real GPU
checks, and every raw fact kept as a simulation-lane host that replays the run. Its facts here come from the recorded
hosts of the simulation lane (tests/gpu_hosts/), gathered by the probe's own functions."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from torchimages.checks import probe_gpu
from torchimages.checks.rules import arch_flags_for
from torchimages.verify import record
from torchimages.verify.record import peak_tflops

from . import gpu_hosts
from .gpu_fixtures import BY_TAG, CU130, gather_gpu_facts, gpu_record, judge, saved_facts


@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_a_good_host_prints_a_passed_line_with_the_bf16_ratio_to_the_datasheet_peak(host, tmp_path):
    result = gpu_record(tmp_path, CU130, "--facts", saved_facts(tmp_path, host, 712.3))
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("| 20") and "| NVIDIA H100 80GB HBM3 x8 | 580.95.05 |" in line
    assert "torch 2.14.1+cu130 (2.14.1-cuda13.0-cudnn9-runtime) | passed |" in line
    assert "712.3 TFLOPS (72% of 989.4 dense peak) |" in line


@pytest.mark.parametrize("host", ["h100-r535"], indirect=True)
def test_a_host_whose_driver_cannot_run_the_row_prints_a_failed_line_and_exits_1(host, tmp_path):
    result = gpu_record(tmp_path, CU130, "--facts", saved_facts(tmp_path, host))
    assert result.returncode == 1
    assert "| failed: gpu, driver |" in result.stdout and "| not measured |" in result.stdout


@pytest.mark.parametrize("host", ["prohibited"], indirect=True)
def test_a_host_whose_gpus_cannot_be_used_prints_a_not_run_line_and_exits_1(host, tmp_path):
    """The GPU checks skip there: a record must not say passed where no kernel ran."""
    result = gpu_record(tmp_path, CU130, "--facts", saved_facts(tmp_path, host))
    assert result.returncode == 1 and "| passed |" not in result.stdout
    assert "| not run: gpu, cudnn, amp (not run: GPU 1: NVIDIA H100 PCIe" in result.stdout


def test_peaks_are_found_by_device_name():
    assert peak_tflops("NVIDIA GH200 480GB") == 989.4 and peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peak_tflops("NVIDIA L40S") == 362.05 and peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA L40") == 181.05 and peak_tflops("NVIDIA GB200") == 2500.0  # not the L4's, the B200's
    assert peak_tflops("Tesla T4") is None


def test_a_tag_that_is_not_one_row_is_exit_2(tmp_path):
    result = gpu_record(tmp_path, "2.14.1-*", "--facts", "/nonexistent")
    assert result.returncode == 2 and "name one tag" in result.stderr


@pytest.mark.parametrize(("changes", "named"), [
    ({"version": "2.13.0+cu130"}, "torch 2.13.0+cu130 where the row has 2.14.1"),
    ({"cuda": "12.6"}, "CUDA 12.6 where the row has 13.0"),
    ({"arch_flags": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]}, "arch list sm_50 sm_60"),
])
@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_facts_from_another_torch_build_are_refused_with_one_line(host, tmp_path, changes, named):
    """Judging another build against the row would record a verdict for a build that never ran on the host."""
    result = gpu_record(tmp_path, CU130, "--facts", saved_facts(tmp_path, host, **changes))
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert f"not row {CU130}'s build: {named}" in line and "--image REF" in line


@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_a_python_without_torch_is_refused_saying_so(host, tmp_path):
    no_torch = {"importable": False, "error": "ModuleNotFoundError: No module named 'torch'"}
    path = tmp_path / "gpu-only.json"
    path.write_text(json.dumps({"part": "gpu-only", "torch": no_torch, "host": {}, "gpu": {}}))
    result = gpu_record(tmp_path, CU130, "--facts", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert "no torch to record with: ModuleNotFoundError: No module named 'torch'" in line


def test_the_host_probe_without_torch_or_past_its_timeout_says_why(monkeypatch, tmp_path):
    """Host mode runs the probe with this Python: no torch is exit 2, a hang past the timeout exit 1, each one line."""
    no_torch = {"part": "gpu-only", "torch": {"importable": False, "error": "ModuleNotFoundError: No module named "
                                                                            "'torch'"}, "host": {}}
    monkeypatch.setattr(record.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], 0, json.dumps(no_torch) + "\n", ""))
    result = gpu_record(tmp_path, CU130)
    assert result.returncode == 2 and "no torch to record with" in result.stderr and "Traceback" not in result.stderr

    def hangs(command, **options):
        raise subprocess.TimeoutExpired(command, options["timeout"])

    monkeypatch.setattr(record.subprocess, "run", hangs)
    result = gpu_record(tmp_path, CU130)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert f"did not finish in {record.GPU_ONLY_TIMEOUT_S}s" in line


@pytest.mark.parametrize(("host", "row"), [
    ("h100x8-nvlink", CU130), ("h100-r535", CU130), ("h100-r535", "2.14.1-cuda12.6-cudnn9-runtime"),
    ("prohibited", CU130), ("a100-mig-mixed", CU130), ("h100x4-mig-all", CU130), ("v100-p100-old-arch", CU130),
    ("driver-library-mismatch", CU130),
], indirect=["host"])
def test_a_record_replays_as_a_lane_host_with_the_verdicts_the_host_gave(host, row, tmp_path, monkeypatch):
    """The record's one file, copied into tests/gpu_hosts, is a lane host; the lane's replay of it gives the record's
    verdicts, which are the ones the original host states."""
    result = gpu_record(tmp_path, row, "--facts", saved_facts(tmp_path, host, row=row))
    assert result.returncode in (0, 1), result.stderr
    [written] = (tmp_path / "reports" / "gpu-record").glob("*.yaml")
    replayed = yaml.safe_load(written.read_text())
    [run] = replayed["runs"]
    recorded_verdicts = {line.split(": ")[0]: line.split(": ")[1] for line in result.stderr.splitlines()
                         if line.split(": ")[0] in run["expect"]}
    assert {name: v.replace("passed-with-warning", "passed") for name, v in run["expect"].items()} == recorded_verdicts

    replayed["name"] = "replayed"
    for name, value in gpu_hosts.stand_in_nvidia_smi(replayed, tmp_path / "bin").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(probe_gpu, "NVIDIA_DRIVER_PROC", gpu_hosts.proc_driver_version(replayed, tmp_path / "proc"))
    monkeypatch.setattr(probe_gpu, "libcuda_driver_version", lambda: replayed["libcuda"]["driver_version"])
    gpu_hosts.cuda_visible_devices(run, monkeypatch)
    spec, flags = BY_TAG[row], arch_flags_for(list(BY_TAG[row].arch_list))
    checks = judge(spec, run, gather_gpu_facts(replayed, spec, flags), flags)
    assert {name: record.verdict(checks[name]) for name in run["expect"]} == run["expect"]
    original = next((r["expect"] for r in host["runs"] if r["row"] == row and r["gpus"] == "all"), {})
    assert {name: run["expect"][name] for name in original} == original


@pytest.mark.parametrize("host", ["l4-r570"], indirect=True)
def test_the_records_cuda_visible_devices_is_replayed(host, tmp_path, monkeypatch):
    """torch sees what CUDA_VISIBLE_DEVICES leaves: a record made with it set replays with it set."""
    row = "2.14.1-cuda12.6-cudnn9-runtime"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    result = gpu_record(tmp_path, row, "--facts", saved_facts(tmp_path, host, row=row))
    [written] = (tmp_path / "reports" / "gpu-record").glob("*.yaml")
    [run] = yaml.safe_load(written.read_text())["runs"]
    assert result.returncode == 0 and run["cuda_visible_devices"] == "1,0"
    gpu_hosts.cuda_visible_devices({}, monkeypatch)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    gpu_hosts.cuda_visible_devices(run, monkeypatch)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"


def test_a_mig_slice_has_no_datasheet_peak():
    assert peak_tflops("NVIDIA A100-SXM4-80GB MIG 1g.10gb") is None and peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0


def test_the_lane_host_keeps_torchs_cuda_warning_where_nvml_warned_first():
    """gpu-audit-3 C8: on a driver upgraded without a reboot torch warns "Can't initialize NVML" (_raw_device_count_nvml)
    before its CUDA warning, which names the cause."""
    error_803 = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
                 "before calling NumCudaDevices() that might have already set an error? Error 803: system has "
                 "unsupported display driver / cuda driver combination")
    facts = record.torch_cuda_as_lane_host({"available": False, "warnings": ["Can't initialize NVML", error_803]})
    assert facts["warning"] == error_803
    assert record.torch_cuda_as_lane_host({"warnings": ["Can't initialize NVML"]})["warning"] == "Can't initialize NVML"


@pytest.mark.parametrize("host", ["v100-p100-old-arch"], indirect=True)
def test_a_record_replays_torchs_arch_warnings_as_the_host_gave_them(host, tmp_path):
    """torch.cuda.init() warns for a GPU the cu130 arch list misses (torch/cuda/__init__.py _check_capability and
    _check_cubins; gpu-audit-3 C7): those are no first-call warning, so the lane host does not quote one as its
    `warning`, and its replay gives the host's warnings once each, not the first one twice."""
    path = saved_facts(tmp_path, host)
    warned = json.loads(Path(path).read_text())["gpu"]["warnings"]
    gpu_record(tmp_path, CU130, "--facts", path)
    [written] = (tmp_path / "reports" / "gpu-record").glob("*.yaml")
    replayed = {**yaml.safe_load(written.read_text()), "name": "replayed"}
    spec = BY_TAG[CU130]
    assert len(warned) == 3 and "warning" not in replayed["torch_cuda"]
    assert gather_gpu_facts(replayed, spec, arch_flags_for(list(spec.arch_list)))["warnings"] == warned


def test_an_h200_nvl_is_measured_against_its_own_peak():
    # gpu-audit-3 C9: NVIDIA's H200 table, H200 NVL BF16 1,671 TFLOPS with sparsity, 835.5 dense; the SXM H200 989.4.
    assert peak_tflops("NVIDIA H200 NVL") == 835.5 and peak_tflops("NVIDIA H200") == 989.4
