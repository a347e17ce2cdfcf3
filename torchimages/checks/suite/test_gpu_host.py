"""gpu and multi-gpu, the host's share: the host GPUs' health as nvidia-smi reports it (a finding is a warning charged
to the host, never an image failure), and the speed floors judged per GPU model (checks/gpu_speed.py): below a floor,
a warning naming the host's cause where its health explains it, a failure where nothing does."""
import warnings

import pytest

from torchimages.checks.gpu_health import host_causes, host_health
from torchimages.checks.gpu_speed import (
    all_reduce_figure,
    all_reduce_shortfall,
    bf16_figure,
    bf16_shortfall,
    copy_figure,
    copy_shortfall,
)
from torchimages.checks.plugin import HostWarning

UNEXPLAINED = ("and the host's health explains none of it (no memory errors, no clock slowdown under load, no degraded "
               "link): the image's CUDA libraries are the suspects; verify on another node of this model to tell")


@pytest.fixture(scope="session")
def health(gpu) -> dict:
    return host_health(gpu)


def _judge(shortfall, not_judged: str) -> None:
    if not_judged:
        pytest.skip(not_judged)
    if shortfall is None:
        return
    if shortfall.host:
        warnings.warn(HostWarning(f"{shortfall.what}: {'; '.join(shortfall.host)}"), stacklevel=2)
        return
    pytest.fail(f"{shortfall.what}, {UNEXPLAINED}")


@pytest.mark.check("gpu")
def test_the_host_gpus_are_healthy(devices, health):
    for cause in host_causes(health, ("memory", "clocks", "link")):
        warnings.warn(HostWarning(cause), stacklevel=2)


@pytest.mark.check("gpu")
def test_bf16_matmul_reaches_its_models_floor(devices, gpu, health):
    figure = bf16_figure(gpu)
    not_judged = ("no bf16 matmul figure (bf16 not native on this GPU, or not measured)" if figure["tflops"] is None
                  else f"no published dense bf16 peak for {figure['device'] or 'this GPU'} (a MIG slice or a vGPU "
                       "profile, or a model the table lacks)" if figure["peak_tflops"] is None else "")
    _judge(bf16_shortfall(gpu, health), not_judged)


@pytest.mark.check("gpu")
def test_pinned_copies_reach_the_links_floor(devices, gpu, health):
    figure = copy_figure(gpu, health)
    not_judged = ("no pinned copy figure (not measured)" if figure["h2d_gbps"] is None and figure["d2h_gbps"] is None
                  else "NVLink-C2C, not PCIe, carries this GPU's host copies (c2c.mode, or a Grace superchip): the "
                       "PCIe fields give no floor for them" if figure["host_link"] == "c2c"
                  else "the PCIe link's generation and width are unknown (nvidia-smi did not say)"
                  if figure["link"] is None else "")
    _judge(copy_shortfall(gpu, health), not_judged)


@pytest.mark.check("multi-gpu")
def test_nccl_all_reduce_reaches_the_topologys_floor(devices, gpu, health):
    if len(devices) < 2:
        pytest.skip(f"{len(devices)} GPU visible: an all-reduce's speed needs 2 or more")
    figure = all_reduce_figure(gpu, health)
    not_judged = ("no all-reduce bandwidth figure (not measured, or the all-reduce failed)" if figure["busbw_gbps"] is None
                  else "no floor for PCIe GPUs whose link is unknown" if figure["floor_gbps"] is None else "")
    _judge(all_reduce_shortfall(gpu, health), not_judged)
