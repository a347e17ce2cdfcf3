"""What the GPU checks and the probe say when torch sees no GPU (issue 44, ../shared/reference/gpu-audit-3.md): the
variable that hides the GPUs, a CUDA that cannot start under PYTORCH_NVML_BASED_CUDA_CHECK=1, a GPU in MIG mode
without a MIG device. The cause is named, with its fix, and the probe always gives its report."""
import json

import pytest

from torchimages.checks import probe, probe_gpu, probe_smoke, rules
from torchimages.checks.rules import arch_flags_for
from torchimages.checks.suite.helpers import hiding_visible_devices
from torchimages.model import PeerError
from torchimages.verify import record

from . import gpu_hosts
from .gpu_fixtures import BY_TAG, gather_gpu_facts, judge

CU130 = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
TWO_GPUS = {"nvidia_smi_gpus": ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa0000-0000-0000-0000-000000000000)",
                                "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb0000-0000-0000-0000-000000000000)"],
            "mig_devices": {}}


@pytest.mark.parametrize(("value", "named"), [
    ("2,3", "names index 2, past the 2 GPU(s)"),  # a derived image's ENV, run with --gpus device=2,3
    ("", "hides every GPU"), ("1,1", "repeats 1"), ("-1", "starts with '-1'"), ("NoDevFiles", "starts with 'NoDevFiles'"),
    ("GPU-cccc", "names GPU-cccc, which is no GPU nvidia-smi -L lists here"),
])
def test_a_cuda_visible_devices_that_hides_the_gpus_is_named_with_the_fix(value, named):
    said = hiding_visible_devices({**TWO_GPUS, "cuda_visible_devices": value})
    assert said and f"CUDA_VISIBLE_DEVICES={value!r} {named}" in said and "set it to 0,1" in said


@pytest.mark.parametrize("value", [None, "0", "1,0", "GPU-bbbb", "0,7"])
def test_a_cuda_visible_devices_that_leaves_a_gpu_is_not_the_cause(value):
    assert hiding_visible_devices({**TWO_GPUS, "cuda_visible_devices": value}) is None


def test_the_images_own_env_is_named_as_where_the_variable_comes_from():
    said = hiding_visible_devices({**TWO_GPUS, "cuda_visible_devices": "2,3"}, ["PATH=/usr/bin", "CUDA_VISIBLE_DEVICES=2,3"])
    assert said and "the image's ENV sets it" in said


@pytest.mark.parametrize("host", ["h100-r535"], indirect=True)
def test_a_cuda_that_cannot_start_under_the_nvml_based_check_leaves_the_report_whole(host, monkeypatch):
    """gpu-audit-3 C5: is_available() answers NVML's count (1) under PYTORCH_NVML_BASED_CUDA_CHECK=1, and
    torch.cuda.init() then raises the driver's words (torch 2.13.0 torch/cuda/__init__.py is_available, _lazy_init)."""
    import torch

    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    flags = arch_flags_for(list(CU130.arch_list))
    with gpu_hosts.simulated_cuda(torch, host, CU130.cuda, flags, rules.arch_covers):
        availability = probe_gpu.cuda_availability(torch)
        smoke = probe_smoke.smoke_eager(torch)
        gpu = probe_gpu.gpu_facts(torch, flags, availability=availability)
    assert list(smoke["devices"]) == ["cpu"] and not gpu["available"]
    checks = judge(CU130, host["runs"][0], gpu, flags)
    assert checks["gpu"]["status"] == "failed" and checks["driver"]["status"] == "failed"
    assert "torch.cuda.init() failed: RuntimeError: The NVIDIA driver on your system is too old" in checks["gpu"]["message"]


def test_a_probe_part_that_crashes_still_prints_its_report_naming_the_cause(monkeypatch, capfd):
    def crashes(budget_s=None):
        raise RuntimeError("No CUDA GPUs are available")

    monkeypatch.setattr(probe_gpu, "gpu_only_facts", crashes)
    assert probe.main(["--gpu-only"]) == 0
    facts = json.loads(capfd.readouterr().out)
    assert facts["part"] == "gpu-only" and "RuntimeError: No CUDA GPUs are available" in facts["probe_error"]


def test_gpu_record_says_in_one_line_that_the_probe_stopped():
    with pytest.raises(PeerError, match="gave no facts: the probe stopped: RuntimeError: No CUDA GPUs"):
        record.vouch_for(CU130, {"part": "gpu-only", "probe_error": "the probe stopped: RuntimeError: No CUDA GPUs"},
                         "python3")


@pytest.mark.parametrize("host", ["h100-mig-no-instances"], indirect=True)
def test_a_gpu_in_mig_mode_without_a_mig_device_skips_naming_the_gpu_and_the_fix(host):
    flags = arch_flags_for(list(CU130.arch_list))
    checks = judge(CU130, host["runs"][0], gather_gpu_facts(host, CU130, flags), flags)
    for name in ("gpu", "amp", "multi-gpu"):
        assert checks[name]["status"] == "skipped"
        assert "GPU 0: NVIDIA H100 80GB HBM3" in checks[name]["message"]
        assert "`nvidia-smi mig -i GPU-7d1e2f30-4a5b-6c7d-8e9f-a0b1c2d3e4f5 -cgi <profile> -C`" in checks[name]["message"]
    assert "Check the host driver" not in checks["gpu"]["message"]
