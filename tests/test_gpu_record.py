"""`build.py gpu-record`: the record line of docs/gpu-validation.md from a GPU host's facts, judged by the real GPU
checks. Its facts here come from the recorded hosts of the simulation lane (tests/gpu_hosts/)."""
import json

import pytest

from torchimages.verify.record import peak_tflops

from . import gpu_hosts
from .conftest import run_cli_in_process
from .test_gpu_simulation import BY_TAG, gather_gpu_facts, torch_facts
from .test_gpu_simulation import host as host  # noqa: F401 - the fixture, by name

CU130 = "2.14.1-cuda13.0-cudnn9-runtime"


def saved_facts(tmp_path, scenario: dict, tflops: float | None = None) -> str:
    """What `probe.py --gpu-only` prints on that host, saved to a file."""
    spec = BY_TAG[CU130]
    flags = torch_facts(spec, [])["arch_flags"] or [f"sm_{a.replace('.', '')}" for a in spec.arch_list]
    gpu = gather_gpu_facts(scenario, spec, flags)
    if tflops is not None:
        gpu["bf16_matmul"] = {"ok": True, "tflops": tflops}
    path = tmp_path / "gpu-only.json"
    path.write_text(json.dumps({"torch": {**torch_facts(spec, flags), "version": "2.14.1+cu130"}, "gpu": gpu},
                               default=str))
    return str(path)


@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_a_good_host_prints_a_passed_line_with_the_bf16_ratio_to_the_datasheet_peak(host, tmp_path):
    result = run_cli_in_process("gpu-record", CU130, "--facts", saved_facts(tmp_path, host, 712.3))
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("| 20") and "| NVIDIA H100 80GB HBM3 x8 | 580.95.05 |" in line
    assert "torch 2.14.1+cu130 (2.14.1-cuda13.0-cudnn9-runtime) | passed |" in line
    assert "712.3 TFLOPS (72% of 989.4 dense peak) |" in line


@pytest.mark.parametrize("host", ["h100-r535"], indirect=True)
def test_a_host_whose_driver_cannot_run_the_row_prints_a_failed_line_and_exits_1(host, tmp_path):
    result = run_cli_in_process("gpu-record", CU130, "--facts", saved_facts(tmp_path, host))
    assert result.returncode == 1
    assert "| failed: gpu, driver |" in result.stdout and "| not measured |" in result.stdout


@pytest.mark.parametrize("host", ["prohibited"], indirect=True)
def test_a_host_whose_gpus_cannot_be_used_prints_a_not_run_line_and_exits_1(host, tmp_path):
    """The GPU checks skip there: a record must not say passed where no kernel ran."""
    result = run_cli_in_process("gpu-record", CU130, "--facts", saved_facts(tmp_path, host))
    assert result.returncode == 1 and "| passed |" not in result.stdout
    assert "| not run: gpu, cudnn, amp (not run: GPU 1: NVIDIA H100 PCIe" in result.stdout


def test_peaks_are_found_by_device_name():
    assert peak_tflops("NVIDIA GH200 480GB") == 989.4 and peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peak_tflops("NVIDIA L40S") == 362.05 and peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA L40") == 181.05 and peak_tflops("NVIDIA GB200") == 2500.0  # not the L4's, the B200's
    assert peak_tflops("Tesla T4") is None


def test_a_tag_that_is_not_one_row_is_exit_2():
    result = run_cli_in_process("gpu-record", "2.14.1-*", "--facts", "/nonexistent")
    assert result.returncode == 2 and "name one tag" in result.stderr
