"""The real GPU hosts' facts (docs/gpu-records/) and the simulation lane: the lane host made from a real record answers
field for field as the record says, and the lane's torch.cuda applies CUDA_VISIBLE_DEVICES as the real H100's did
(../shared/reference/gpu-audit-3.md, C1's table, measured on an H100 80GB HBM3 with torch 2.11.0+cu130)."""
import json
import warnings
from pathlib import Path

import pytest

from torchimages.checks import probe
from torchimages.verify import record

from . import gpu_hosts
from .test_gpu_simulation import host as host  # noqa: F401 - the fixture, by name

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
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], probe.arch_covers):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            answers = (torch.cuda.is_available(), torch.cuda._device_count_nvml(),
                       probe.cuda_availability(torch)["device_count"])
    assert answers == (available, nvml, cuda)
    assert [str(w.message) for w in caught if "Error 101" in str(w.message)] == ([gpu_hosts.INVALID_ORDINAL_WARNING]
                                                                                  if error_101 else [])


@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_torch_reports_the_gpus_uuid_without_nvidia_smis_prefix_and_its_real_memory(host, monkeypatch):
    import torch

    gpu_hosts.cuda_visible_devices({}, monkeypatch)
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], probe.arch_covers):
        torch.cuda.init()
        properties = torch.cuda.get_device_properties(0)
    assert (properties.uuid, properties.total_memory) == ("91126b07-7f28-e641-d524-14d28acfa28f", 85017493504)


@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_torch_cuda_init_raises_where_cuda_visible_devices_hides_every_gpu(host, monkeypatch):
    """Measured on the H100 (gpu-audit-3 C5): torch.cuda.init() raises "No CUDA GPUs are available"."""
    import torch

    gpu_hosts.cuda_visible_devices({"cuda_visible_devices": "1"}, monkeypatch)
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], probe.arch_covers):
        with pytest.raises(RuntimeError, match=gpu_hosts.NO_CUDA_GPUS):
            torch.cuda.init()
