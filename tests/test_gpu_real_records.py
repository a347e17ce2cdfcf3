"""The real GPU hosts' facts (docs/gpu-records/) and the simulation lane: the lane host made from a real record answers
field for field as the record says, and the lane's torch.cuda applies CUDA_VISIBLE_DEVICES as the real H100's did
(../shared/reference/gpu-audit-3.md, C1's table, measured on an H100 80GB HBM3 with torch 2.11.0+cu130)."""
import json
import warnings
from pathlib import Path

import pytest

from torchimages.checks import probe_gpu, rules
from torchimages.verify import record

from . import gpu_hosts

RECORDS = Path(__file__).resolve().parent.parent / "docs" / "gpu-records"
H100_RECORD = RECORDS / "2026-11-27-h100-r580-torch2.11.0-cu130-gpu-only.json"
FOREIGN_GPU, FOREIGN_MIG = "GPU-deadbeef-0000-0000-0000-000000000000", "MIG-deadbeef-0000-0000-0000-000000000000"


@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_the_real_h100_lane_host_is_its_committed_record(host):
    facts = json.loads(H100_RECORD.read_text())
    assert host["nvidia_smi"] == record.nvidia_smi_as_lane_host(facts["host"])
    assert host["proc_driver_version"] == facts["host"]["proc_driver_version"]
    assert host["libcuda"]["driver_version"] == facts["gpu"]["libcuda_driver_version"]
    assert host["torch_cuda"] == record.torch_cuda_as_lane_host(facts["gpu"])
    assert host["speed"] == record.recorded_speed(facts["gpu"])


# (CUDA_VISIBLE_DEVICES, is_available(), torch.cuda._device_count_nvml(), CUDA's count, torch warns Error 101):
# gpu-audit-3 C1's table, measured on a one-GPU H100; "GPU-9112" stands for the abbreviated UUID measured there.
MEASURED = [
    ("", False, 0, 0, False), ("1", False, 0, 0, False), ("1,0", False, 0, 0, False), ("-1", False, 0, 0, False),
    ("NoDevFiles", False, 0, 0, False), (FOREIGN_GPU, False, 0, 0, False), (FOREIGN_MIG, False, -1, 0, False),
    ("0,0", False, 0, 0, True), ("0,1", True, 1, 1, False), ("GPU-9112", True, 1, 1, False),
    ("GPU-91126b07-7f28-e641-d524-14d28acfa28f", True, 1, 1, False), (None, True, 1, 1, False),
]


@pytest.mark.parametrize(("value", "available", "nvml", "cuda", "error_101"), MEASURED)
@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_the_lanes_torch_applies_cuda_visible_devices_as_the_real_h100_did(host, monkeypatch, value, available, nvml,
                                                                          cuda, error_101):
    import torch

    gpu_hosts.cuda_visible_devices({"cuda_visible_devices": value}, monkeypatch)
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], rules.arch_covers):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            answers = (torch.cuda.is_available(), torch.cuda._device_count_nvml(),
                       probe_gpu.cuda_availability(torch)["device_count"])
    assert answers == (available, nvml, cuda)
    assert [str(w.message) for w in caught if "Error 101" in str(w.message)] == ([gpu_hosts.INVALID_ORDINAL_WARNING]
                                                                                  if error_101 else [])


@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_torch_reports_the_gpus_uuid_without_nvidia_smis_prefix_and_its_real_memory(host, monkeypatch):
    import torch

    gpu_hosts.cuda_visible_devices({}, monkeypatch)
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], rules.arch_covers):
        torch.cuda.init()
        properties = torch.cuda.get_device_properties(0)
    assert (properties.uuid, properties.total_memory) == ("91126b07-7f28-e641-d524-14d28acfa28f", 85017493504)


@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_torch_cuda_init_raises_where_cuda_visible_devices_hides_every_gpu(host, monkeypatch):
    """Measured on the H100 (gpu-audit-3 C5): torch.cuda.init() raises "No CUDA GPUs are available"."""
    import torch

    gpu_hosts.cuda_visible_devices({"cuda_visible_devices": "1"}, monkeypatch)
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], rules.arch_covers):
        with pytest.raises(RuntimeError, match=gpu_hosts.NO_CUDA_GPUS):
            torch.cuda.init()


def _lists_an_h100(name: str) -> bool:
    return any("H100" in gpu["name"] for gpu in gpu_hosts.load(name)["nvidia_smi"].get("gpus") or [])


H100_HOSTS = [name for name in gpu_hosts.SCENARIOS if _lists_an_h100(name)]


@pytest.mark.parametrize("name", H100_HOSTS)
def test_every_lane_h100_hosts_driver_file_has_the_real_h100s_two_lines(name, tmp_path):
    """The real H100's /proc/driver/nvidia/version (the committed record; gpu-audit-3 C7) is two lines, the kernel
    module's NVRM line and the GCC line: a loaded module always gives both, so no H100 lane host lacks the file."""
    real = json.loads(H100_RECORD.read_text())["host"]["proc_driver_version"].splitlines()
    scenario = gpu_hosts.load(name)
    lines = Path(gpu_hosts.proc_driver_version(scenario, tmp_path)).read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == [line.split(":")[0] for line in real] == ["NVRM version",
                                                                                               "GCC version"]
    assert f"  {scenario['nvidia_smi']['gpus'][0]['driver_version']}  " in lines[0]


def _torch_warnings(scenario: dict) -> list[str]:
    """Every torch.cuda warning a lane host quotes: its own, per CUDA major, and per run."""
    answers = [scenario["torch_cuda"], *scenario["torch_cuda"].get("by_cuda_major", {}).values(),
               *(run["torch_cuda"] for run in scenario["runs"] if "torch_cuda" in run)]
    return [answers["warning"] for answers in answers if answers.get("warning")]


@pytest.mark.parametrize("name", gpu_hosts.SCENARIOS)
def test_no_lane_host_quotes_a_warning_torch_never_gives_where_cuda_has_no_device(name):
    """c10's device_count_impl takes cudaErrorNoDevice (100) as zero devices without a warning, and the real H100
    warned nothing where CUDA had no device (gpu-audit-3 C7; C1's table, evidence B and C)."""
    assert not [warning for warning in _torch_warnings(gpu_hosts.load(name))
                if "Error 100" in warning or "no CUDA-capable device" in warning]


def _derives_a_whole_h100(name: str) -> bool:
    """Where torch's first device is a whole GPU derived from nvidia-smi (not recorded, not a MIG device)."""
    scenario = gpu_hosts.load(name)
    first = scenario["nvidia_smi"]["gpus"][0]
    return (scenario["torch_cuda"].get("available") and not scenario["torch_cuda"].get("devices")
            and first.get("mig_mode") != "Enabled" and not first.get("mig_devices"))


@pytest.mark.parametrize("host", [name for name in H100_HOSTS if _derives_a_whole_h100(name)], indirect=True)
def test_a_derived_h100_hosts_torch_reports_the_uuid_and_memory_as_the_real_h100s_did(host, monkeypatch):
    """torch's answers on a lane host that derives its devices from nvidia-smi have the real H100's form: the UUID
    without nvidia-smi's "GPU-" and, for the same model, the same total_memory (the committed record; gpu-audit-3
    C7)."""
    import torch

    real = json.loads(H100_RECORD.read_text())["gpu"]["devices"][0]
    gpu = host["nvidia_smi"]["gpus"][0]
    gpu_hosts.cuda_visible_devices({}, monkeypatch)
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], rules.arch_covers):
        torch.cuda.init()
        properties = torch.cuda.get_device_properties(0)
    assert properties.uuid == gpu["uuid"].removeprefix("GPU-")
    if gpu["name"] == real["name"]:
        assert properties.total_memory == real["total_memory"]


def _first_call_warnings(scenario: dict, flags: list[str]) -> list[str]:
    import torch

    with gpu_hosts.simulated_cuda(torch, scenario, "13.0", flags, rules.arch_covers):
        return probe_gpu.cuda_availability(torch)["warnings"]


def test_torch_cuda_init_warns_for_a_gpu_the_wheels_arch_list_misses_as_torch_does(monkeypatch):
    """torch.cuda's first initialisation runs its own _check_capability and _check_cubins (torch/cuda/__init__.py),
    recorded by the probe's first call (gpu-audit-3 C7). Under the cu130 wheel's arch list (the real record's,
    sm_75 and up) a P100 (6.0) gets both warnings; a V100 (7.0) only _check_capability's, as _check_cubins passes
    any GPU whose major has a cubin (sm_75); the real H100 got none (the committed record's `warnings`)."""
    facts = json.loads(H100_RECORD.read_text())
    cu130 = facts["torch"]["arch_flags"]
    gpu_hosts.cuda_visible_devices({}, monkeypatch)
    legacy = gpu_hosts.load("v100-p100-old-arch")
    alone = {"torch_cuda": {"available": True, "device_count": 1}}
    v100 = _first_call_warnings(gpu_hosts.as_run(legacy, {**alone, "nvidia_smi_gpus": [0]}), cu130)
    p100 = _first_call_warnings(gpu_hosts.as_run(legacy, {**alone, "nvidia_smi_gpus": [1]}), cu130)
    assert [warning.splitlines()[0] for warning in v100] == [
        "Found GPU0 Tesla V100-SXM2-32GB which is of compute capability (CC) 7.0."]
    assert [warning.strip().splitlines()[0] for warning in p100] == [
        "Found GPU0 Tesla P100-PCIE-16GB which is of compute capability (CC) 6.0.",
        "Tesla P100-PCIE-16GB with CUDA capability sm_60 is not compatible with the current PyTorch installation."]
    assert _first_call_warnings(legacy, rules.arch_flags_for(["6.0", "7.0"])) == []
    assert _first_call_warnings(gpu_hosts.load("h100-r580-real"), cu130) == facts["gpu"]["warnings"] == []
