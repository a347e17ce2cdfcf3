"""Real-hardware GPU hosts, recorded: each <scenario>.yaml says what the host's nvidia-smi answers, what a real
torch.cuda reports on it, and the verdict a real host gives per check and per doctor row, with where each fact
comes from. `stand_in_nvidia_smi` puts the recorded nvidia-smi first on PATH; `simulated_cuda` makes the test
environment's CPU torch answer as that host's torch.cuda does, so that the probe's own functions run unchanged."""
from __future__ import annotations

import contextlib
import copy
import os
import sys
import types
import warnings
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SCENARIOS = sorted(path.stem for path in HERE.glob("*.yaml"))
NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"


def load(name: str) -> dict:
    scenario = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    scenario["name"], scenario["path"] = name, str(HERE / f"{name}.yaml")
    return scenario


def stand_in_nvidia_smi(scenario: dict, folder: Path) -> dict[str, str]:
    """Environment for a process (or monkeypatch) whose `nvidia-smi` is the scenario host's."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / "nvidia-smi"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "nvidia-smi"}" "$@"\n')
    launcher.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "TORCHIMAGES_GPU_HOST": scenario["path"]}


def as_run(scenario: dict, run: dict, folder: Path) -> dict:
    """The host as one run's container sees it: the GPUs it was given (`nvidia_smi_gpus`: indices into the host's
    nvidia-smi list) and what torch.cuda reports there (`torch_cuda`), where the run says; written for the stand-in."""
    seen = copy.deepcopy(scenario)
    if "nvidia_smi_gpus" in run:
        seen["nvidia_smi"]["gpus"] = [scenario["nvidia_smi"]["gpus"][index] for index in run["nvidia_smi_gpus"]]
    if "torch_cuda" in run:
        seen["torch_cuda"] = run["torch_cuda"]
    folder.mkdir(parents=True, exist_ok=True)
    seen["path"] = str(folder / f"{scenario['name']}.yaml")
    Path(seen["path"]).write_text(yaml.safe_dump({key: value for key, value in seen.items() if key != "path"}))
    return seen


def proc_driver_version(scenario: dict, folder: Path) -> str:
    """A path that reads as the host's /proc/driver/nvidia/version (the loaded kernel module: present wherever the
    module is loaded, whatever NVML says), or one that does not exist on a host without it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "version"
    if scenario.get("proc_driver_version"):
        path.write_text(scenario["proc_driver_version"] + "\n")
    return str(path)


def torch_cuda_facts(scenario: dict, cuda: str) -> dict:
    """What torch.cuda reports on the host for a wheel of this CUDA version."""
    facts = scenario["torch_cuda"]
    return facts.get("by_cuda_major", {}).get(cuda.split(".")[0], facts)


def _capabilities(scenario: dict) -> list[tuple[int, int]]:
    return [tuple(int(part) for part in gpu["compute_cap"].split(".")) for gpu in scenario["nvidia_smi"]["gpus"]]


@contextlib.contextmanager
def simulated_cuda(torch, scenario: dict, cuda: str, arch_flags: list[str], covers):
    """The CPU torch answers as the host's torch.cuda does: availability (with torch's first-call warning), devices
    and their properties, and "cuda" tensors computed on the CPU. A device the image's arch list does not cover
    (`covers(flags, capability)` is None) fails torch's own kernels with the real error, as libtorch without a
    cubin or PTX for it does; copies and cuBLAS (own SASS) still run. A host whose devices refuse every context
    (`device_error`, e.g. a Prohibited compute mode) fails any tensor made on them with that error."""
    from torch.overrides import TorchFunctionMode

    facts = torch_cuda_facts(scenario, cuda)
    gpus = scenario["nvidia_smi"]["gpus"]
    count = facts["device_count"]
    capabilities = _capabilities(scenario)[:max(count, 1)] or [(0, 0)]
    uncovered = any(covers(arch_flags, capability) is None for capability in capabilities)
    device_error = facts.get("device_error") or (NO_KERNEL_IMAGE if uncovered else None)
    warned = []

    def is_available():
        if facts.get("warning") and not warned:  # c10::cuda::device_count warns once, in a static initialiser
            warned.append(True)
            warnings.warn(facts["warning"], UserWarning, stacklevel=2)
        return bool(facts["available"])

    def properties(index=0):
        index = int(str(index).rsplit(":", 1)[-1]) if not isinstance(index, int) else index
        gpu = gpus[index] if gpus else {"name": "?", "uuid": "?"}
        major, minor = capabilities[index]
        return types.SimpleNamespace(name=gpu["name"], major=major, minor=minor, uuid=gpu["uuid"],
                                     total_memory=80 * 2**30)

    def on_cuda(value) -> bool:
        return isinstance(value, (str, torch.device)) and str(value).startswith("cuda")

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if on_cuda(kwargs.get("device")):
                if device_error:
                    raise RuntimeError(device_error)
                kwargs["device"] = "cpu"
            args = tuple("cpu" if on_cuda(arg) else arg for arg in args)
            return func(*args, **kwargs)

    real_autocast, real_scaler = torch.autocast, torch.amp.GradScaler

    class autocast(real_autocast):  # noqa: N801 - stands in for torch.autocast
        def __init__(self, device_type="cuda", dtype=None, *args, **options):
            super().__init__("cpu" if on_cuda(device_type) else device_type, dtype or torch.float16, *args, **options)

    class scaler(real_scaler):  # noqa: N801 - stands in for torch.amp.GradScaler
        def __init__(self, device="cuda", *args, **options):
            super().__init__("cpu" if on_cuda(device) else device, *args, **options)

    def all_reduce(inputs, outputs=None, **_):
        total = sum(tensor.clone() for tensor in inputs)
        for tensor in inputs:
            tensor.copy_(total)

    from torch.nn import attention

    real_sdpa_kernel = attention.sdpa_kernel

    def sdpa_kernel(backends, *args, **kwargs):  # cuDNN attention's CPU stand-in is the math kernel
        return real_sdpa_kernel(attention.SDPBackend.MATH, *args, **kwargs)

    sdpa_kernel.__wrapped__ = real_sdpa_kernel.__wrapped__  # torch._dynamo reads it when torch.optim first imports it

    cuda, patches = torch.cuda, []
    for owner, name, value in (
        (cuda, "is_available", is_available), (cuda, "device_count", lambda: count),
        (cuda, "get_device_properties", properties),
        (cuda, "get_device_capability", lambda index=0: (properties(index).major, properties(index).minor)),
        (cuda, "get_device_name", lambda index=0: properties(index).name),
        (cuda, "synchronize", lambda device=None: None),
        (cuda, "is_bf16_supported", lambda including_emulation=True: capabilities[0] >= (8, 0)),
        (cuda, "can_device_access_peer", lambda a, b: True),
        (cuda.nccl, "all_reduce", all_reduce),
        (torch, "autocast", autocast), (torch.amp, "GradScaler", scaler),
        (torch.nn.Module, "cuda", lambda module, device=None: module),
        (attention, "sdpa_kernel", sdpa_kernel),
    ):
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    try:
        with CudaOnCpu():
            yield
    finally:
        for owner, name, value in reversed(patches):
            setattr(owner, name, value)
