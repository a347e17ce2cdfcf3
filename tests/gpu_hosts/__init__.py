"""Real-hardware GPU hosts, recorded: each <scenario>.yaml says what the host's nvidia-smi answers, what a real
torch.cuda reports on it, and the verdict a real host gives per check and per doctor row, with where each fact
comes from. `stand_in_nvidia_smi` puts the recorded nvidia-smi first on PATH; `simulated_cuda` makes the test
environment's CPU torch answer as that host's torch.cuda does, so that the probe's own functions run unchanged.

`torch_cuda` holds CUDA's answers: `available`, `device_count` (CUDA's count), optionally `nvml_device_count` (what
torch.cuda.device_count() answers before CUDA is initialised; default: the GPUs nvidia-smi lists), `warning`,
`device_error`, `init_error` (what torch.cuda.init() raises where CUDA cannot start) and `devices` (name, uuid,
capability, total_memory in CUDA's order; default: derived from nvidia-smi). These are the answers with
CUDA_VISIBLE_DEVICES unset, or set as `cuda_visible_devices` says; a run that sets another value gets them as CUDA
and torch apply it (`cuda_visible`). `peer_access: false` says no pair of GPUs can reach the other's memory (CUDA's
can_device_access_peer; default: every pair can). `build.py gpu-record` writes a real host's answers in this format, with its
verdicts as the run's expectations."""
from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time
import types
import warnings
from pathlib import Path

import yaml

from torchimages.checks.suite.helpers import PTX_TOO_NEW, cuda_version_number

HERE = Path(__file__).resolve().parent
SCENARIOS = sorted(path.stem for path in HERE.glob("*.yaml"))
NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"
# What torch's first CUDA call warns where CUDA_VISIBLE_DEVICES repeats a device (measured on an H100, gpu-audit-3
# C1: "0,0"), and what torch.cuda.init() raises where CUDA has no device (measured there too; c10/cuda/
# CUDAFunctions.cpp, device_count_ensure_non_zero). A hiding value otherwise warns nothing: CUDA answers
# cudaErrorNoDevice, which c10's device_count_impl takes as zero devices.
INVALID_ORDINAL_WARNING = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
                           "functions before calling NumCudaDevices() that might have already set an error? Error "
                           "101: invalid device ordinal")
NO_CUDA_GPUS = "No CUDA GPUs are available"
# What torch reports as total_memory (CUDA's totalGlobalMem, less than nvidia-smi's memory.total), per model where a
# real host measured it: the H100 in docs/gpu-records/2026-11-27-h100-r580-torch2.11.0-cu130-gpu-only.json (gpu-audit-3
# C7). Other models answer 80 GiB, which no check reads.
TOTAL_MEMORY = {"NVIDIA H100 80GB HBM3": 85017493504}
UNMEASURED_TOTAL_MEMORY = 80 * 2**30
TORCH_WARNING_PREFIX = "CUDA initialization: "


def load(name: str) -> dict:
    scenario = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    scenario["name"] = name
    return scenario


def stand_in_nvidia_smi(scenario: dict, folder: Path) -> dict[str, str]:
    """Environment for a process (or monkeypatch) whose `nvidia-smi` is the scenario host's. The probe runs it twice
    per gathering: it gets the scenario as JSON and runs without site-packages (python -S), which halves what each
    start costs (no .pth files, no YAML parser to import)."""
    folder.mkdir(parents=True, exist_ok=True)
    answers = folder / "host.json"
    answers.write_text(json.dumps(scenario, default=str))  # a record's dates: the stand-in reads no date
    launcher = folder / "nvidia-smi"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{HERE / "nvidia-smi"}" "$@"\n')
    launcher.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "TORCHIMAGES_GPU_HOST": str(answers)}


def cuda_visible_devices(run: dict, monkeypatch) -> None:
    """The run's CUDA_VISIBLE_DEVICES (a record keeps the one its process had), or none: the probe reads it."""
    if run.get("cuda_visible_devices") is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(run["cuda_visible_devices"]))
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def as_run(scenario: dict, run: dict) -> dict:
    """The host as one run's container sees it: the GPUs it was given (`nvidia_smi_gpus`: indices into the host's
    nvidia-smi list) and what torch.cuda reports there (`torch_cuda`), where the run says."""
    seen = copy.deepcopy(scenario)
    if "nvidia_smi_gpus" in run:
        seen["nvidia_smi"]["gpus"] = [scenario["nvidia_smi"]["gpus"][index] for index in run["nvidia_smi_gpus"]]
    if "torch_cuda" in run:
        seen["torch_cuda"] = run["torch_cuda"]
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


def _capability(value) -> tuple[int, int]:
    """"9.0" as a host file or record writes it, or (9, 0) as the lane keeps it."""
    major, minor = value.split(".") if isinstance(value, str) else value
    return int(major), int(minor)


def cuda_devices(scenario: dict, facts: dict) -> list[dict]:
    """The devices CUDA enumerates, in its order, with the name, UUID and capability torch reports: those recorded
    (`torch_cuda.devices`, as gpu-record writes them), else nvidia-smi's GPUs with MIG off first, then the first MIG
    device, named as torch names one ("NVIDIA A100-SXM4-80GB MIG 3g.40gb"): one CUDA process enumerates a single MIG
    device (NVIDIA MIG User Guide, "CUDA Device Enumeration"), listed after the whole GPUs on mixed hosts
    (DataDog/datadog-agent#36377); cut to CUDA's count."""
    if facts.get("devices"):
        return [{**device, "capability": _capability(device["capability"])} for device in facts["devices"]]
    gpus = scenario["nvidia_smi"].get("gpus") or []
    # torch reports a GPU's UUID without nvidia-smi's "GPU-" (measured on an H100, gpu-audit-3 C7)
    whole = [{"name": gpu["name"], "uuid": gpu["uuid"].removeprefix("GPU-"), "capability": _capability(gpu["compute_cap"]),
              "total_memory": TOTAL_MEMORY.get(gpu["name"], UNMEASURED_TOTAL_MEMORY)}
             for gpu in gpus if gpu.get("mig_mode") != "Enabled" and not gpu.get("mig_devices")]
    mig = [{"name": f"{gpu['name']} MIG {device['profile']}", "uuid": device["uuid"],
            "capability": _capability(gpu["compute_cap"])}
           for gpu in gpus for device in gpu.get("mig_devices") or []][:1]
    listed = (whole + mig)[:facts["device_count"]]
    unknown = {"name": "?", "uuid": "?", "capability": (0, 0)}  # a count without nvidia-smi's names
    return listed + [unknown] * (facts["device_count"] - len(listed))


def nvml_device_count(scenario: dict, facts: dict) -> int:
    """What torch.cuda.device_count() answers before CUDA is initialised (torch/cuda/__init__.py, _device_count_nvml):
    NVML's count of the physical GPUs the container was given, the GPUs nvidia-smi lists (MIG devices are not NVML
    devices); -1 where NVML fails (nvidia-smi's NVML errors), and torch then asks CUDA. A recorded count wins."""
    recorded = facts.get("nvml_device_count", scenario.get("nvml_device_count"))
    return int(recorded) if recorded is not None else raw_nvml_count(scenario)


def raw_nvml_count(scenario: dict) -> int:
    """NVML's own count (nvmlDeviceGetCount), whatever CUDA_VISIBLE_DEVICES says: 0 on "No devices were found", -1
    where NVML fails."""
    smi = scenario["nvidia_smi"]
    if smi.get("returncode"):
        return 0 if "No devices were found" in smi.get("output", "") else -1
    return len(smi.get("gpus") or [])


def raw_nvml_uuids(scenario: dict) -> list[str] | None:
    """NVML's UUIDs (nvmlDeviceGetUUID, "GPU-..." as nvidia-smi prints them); None where NVML fails."""
    if raw_nvml_count(scenario) < 0:
        return None
    return [gpu["uuid"] for gpu in scenario["nvidia_smi"].get("gpus") or []]


def _full_uuid(device: dict) -> str:
    """The UUID CUDA_VISIBLE_DEVICES names a device by: torch reports it bare, nvidia-smi with its GPU-/MIG- prefix."""
    uuid = str(device.get("uuid", ""))
    if uuid.startswith(("GPU-", "MIG-")):
        return uuid
    return ("MIG-" if " MIG " in device.get("name", "") else "GPU-") + uuid


def _visible_index(entry: str, devices: list[dict]) -> int | None:
    """The device one CUDA_VISIBLE_DEVICES entry names, or None where it is invalid and ends the list: an index below
    the count, or a unique prefix of a GPU-/MIG- UUID ("GPU-38dc" as measured)."""
    if entry.isdigit():
        return int(entry) if int(entry) < len(devices) else None
    if entry.startswith(("GPU-", "MIG-")):
        matches = [index for index, device in enumerate(devices) if _full_uuid(device).startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def cuda_visible(devices: list[dict], value: str | None) -> tuple[list[dict], str | None]:
    """The devices CUDA enumerates under CUDA_VISIBLE_DEVICES=value, and torch's warning: "If one of the indices is
    invalid, only the devices whose index precedes the invalid index are visible" (CUDA Programming Guide, CUDA
    Environment Variables); a repeated device is error 101 (measured, gpu-audit-3 C1: "0,0")."""
    if value is None:
        return devices, None
    chosen: list[int] = []
    for entry in value.split(","):
        index = _visible_index(entry.strip(), devices)
        if index is None:
            break
        if index in chosen:
            return [], INVALID_ORDINAL_WARNING
        chosen.append(index)
    return [devices[index] for index in chosen], None


def visible_facts(scenario: dict, facts: dict, value: str | None) -> dict:
    """torch.cuda's answers under CUDA_VISIBLE_DEVICES=value: as recorded where it is the value they were recorded
    under, else CUDA's devices cut by it (a host where CUDA cannot start stays so: CUDA fails before it reads the
    variable) and NVML's count left to torch's own _device_count_nvml."""
    recorded_under = facts.get("cuda_visible_devices")
    if value == recorded_under:
        return facts
    if recorded_under is not None:
        raise ValueError(f"{scenario.get('name')}: torch's answers were recorded under CUDA_VISIBLE_DEVICES="
                         f"{recorded_under!r}; the lane cannot derive them for {value!r}")
    if not facts["available"]:
        return facts
    devices, warning = cuda_visible(cuda_devices(scenario, facts), value)
    derived = {key: item for key, item in facts.items() if key != "nvml_device_count"}
    derived.update({"available": bool(devices), "device_count": len(devices), "devices": devices})
    if warning:
        derived["warning"] = warning
    return derived


def device_index(value) -> int:
    """"cuda" (the current device, 0 here), "cuda:1", torch.device("cuda", 1) or 1 -> 1."""
    text = str(value)
    return int(text.rsplit(":", 1)[-1]) if ":" in text else (int(value) if isinstance(value, int) else 0)


@contextlib.contextmanager
def simulated_cuda(torch, scenario: dict, cuda: str, arch_flags: list[str], covers, cudnn_version: int | None = None):
    """The CPU torch answers as the host's torch.cuda does: availability (with torch's first-call warning), the device
    count (NVML's until CUDA is initialised, CUDA's after, as torch.cuda.device_count() does), devices and their
    properties (torch's "Invalid device id" past CUDA's count), and "cuda" tensors computed on the CPU. A device the
    image's arch list does not cover (`covers(flags, capability, cuda)` is None) fails torch's own kernels with the real
    error, as libtorch without a cubin or PTX for it does, the others run; copies and cuBLAS (own SASS) still run. A
    host whose devices refuse every context (`device_error`, e.g. a Prohibited compute mode) fails any tensor made on
    them with that error. `cudnn_version`: what torch.backends.cudnn.version() reports (the row's cuDNN)."""
    from torch.overrides import TorchFunctionMode

    facts = visible_facts(scenario, torch_cuda_facts(scenario, cuda), os.environ.get("CUDA_VISIBLE_DEVICES"))
    count, devices = facts["device_count"], cuda_devices(scenario, facts)
    recorded_nvml_count = facts.get("nvml_device_count", scenario.get("nvml_device_count"))
    real_nvml_count = torch.cuda._device_count_nvml  # torch's own: it reads CUDA_VISIBLE_DEVICES as the real one does
    # PTX newer than the libcuda cannot be JIT-compiled (NVIDIA CUDA Compatibility, minor-version compatibility).
    jit_fails = ((scenario.get("libcuda") or {}).get("driver_version") or 0) < cuda_version_number(cuda)
    coverage = [covers(arch_flags, device["capability"], cuda) for device in devices]
    kernel_errors = [NO_KERNEL_IMAGE if covered is None else PTX_TOO_NEW if covered.startswith("PTX") and jit_fails
                     else None for covered in coverage]
    warned, initialized = [], {"cuda": False}

    def device_error(index: int) -> str | None:
        return facts.get("device_error") or (kernel_errors[index] if index < len(kernel_errors) else None)

    def nvml_count() -> int:
        return int(recorded_nvml_count) if recorded_nvml_count is not None else real_nvml_count()

    def lazy_init():  # torch.cuda._lazy_init: from here on device_count() asks CUDA; it raises where CUDA cannot start
        if not facts["available"] or not count:
            raise RuntimeError(init_error(facts))
        if not initialized["cuda"]:
            initialized["cuda"] = True
            init_checks(torch, scenario, cuda, arch_flags)

    def is_available():
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1" and nvml_count() >= 0:
            return device_count() > 0  # torch/cuda/__init__.py is_available: NVML's count, CUDA not asked
        if facts.get("warning") and not warned:  # c10::cuda::device_count warns once, in a static initialiser
            warned.append(True)
            warnings.warn(facts["warning"], UserWarning, stacklevel=2)
        return bool(facts["available"])

    def device_count():
        before_init = nvml_count()
        return count if initialized["cuda"] or before_init < 0 else before_init

    def properties(index=0):
        lazy_init()
        index = device_index(index)
        if not 0 <= index < count:
            raise AssertionError("Invalid device id")  # torch.cuda.get_device_properties past CUDA's count
        device = devices[index]
        major, minor = device["capability"]
        return types.SimpleNamespace(name=device["name"], major=major, minor=minor, uuid=device["uuid"],
                                     total_memory=device.get("total_memory", UNMEASURED_TOTAL_MEMORY))

    def on_cuda(value) -> bool:
        return isinstance(value, (str, torch.device)) and str(value).startswith("cuda")

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if on_cuda(kwargs.get("device")):
                lazy_init()
                error = device_error(device_index(kwargs["device"]))
                if error:
                    raise RuntimeError(error)
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

    def first_device_capability():
        return properties(0).major, properties(0).minor

    cuda, patches = torch.cuda, []
    stand_ins = [
        (cuda, "is_available", is_available), (cuda, "device_count", device_count),
        (cuda, "_device_count_nvml", nvml_count),
        (cuda, "_raw_device_count_nvml", lambda: raw_nvml_count(scenario)),
        (cuda, "_raw_device_uuid_nvml", lambda: raw_nvml_uuids(scenario)),
        (cuda, "init", lazy_init), (cuda, "_lazy_init", lazy_init),
        (cuda, "get_device_properties", properties),
        (cuda, "get_device_capability", lambda index=0: (properties(index).major, properties(index).minor)),
        (cuda, "get_device_name", lambda index=0: properties(index).name),
        (cuda, "set_device", lambda index: properties(index) and None),
        (cuda, "synchronize", lambda device=None: lazy_init()),
        (cuda, "is_bf16_supported", lambda including_emulation=True: first_device_capability() >= (8, 0)),
        (cuda, "can_device_access_peer", lambda a, b: bool(scenario.get("peer_access", True))),
        (cuda.nccl, "all_reduce", all_reduce),
        (torch, "autocast", autocast), (torch.amp, "GradScaler", scaler),
        (torch.nn.Module, "cuda", lambda module, device=None: module),
        (attention, "sdpa_kernel", sdpa_kernel),
    ]
    if cudnn_version is not None:
        stand_ins += [(torch.backends.cudnn, "version", lambda: cudnn_version),
                      (torch.backends.cudnn, "is_available", lambda: True)]
    for owner, name, value in stand_ins:
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    try:
        with CudaOnCpu(), one_cpu_thread(torch):
            yield
    finally:
        for owner, name, value in reversed(patches):
            setattr(owner, name, value)


NOT_MEASURED = {"ok": True, "not_measured": "the lane host records no speed"}
UNDER_LOAD = "TORCHIMAGES_GPU_UNDER_LOAD"  # the stand-in nvidia-smi answers as the GPUs read under load


@contextlib.contextmanager
def recorded_speed(probe, scenario: dict):
    """The probe's speed measurements answer the host's recorded figures (`speed`: bf16_tflops, h2d_gbps, d2h_gbps,
    busbw_gbps, as the real host measured them), or "not measured": a CPU's timings say nothing about a GPU's."""
    from torchimages.checks import gpu_speed

    speed = scenario.get("speed") or {}

    def bf16(torch, *args, **kwargs):
        return {"ok": True, "tflops": speed["bf16_tflops"]} if "bf16_tflops" in speed else NOT_MEASURED

    def copies(torch):
        return ({"ok": True, "h2d_gbps": speed["h2d_gbps"], "d2h_gbps": speed["d2h_gbps"]} if "h2d_gbps" in speed
                else NOT_MEASURED)

    def all_reduce(torch, count):
        return {"ok": True, "gpus": count, "busbw_gbps": speed["busbw_gbps"]} if "busbw_gbps" in speed else NOT_MEASURED

    def link_under_load(torch, smi):
        """The real read of the link while "copies" run: the stand-in nvidia-smi answers the host's under-load fields
        (a GPU's `health_under_load`, else its `health`: a link that reads the same idle and loaded)."""
        if not smi or "h2d_gbps" not in speed:
            return NOT_MEASURED
        return gpu_speed.read_link_under_load(smi, lambda: time.sleep(0.005), {**os.environ, UNDER_LOAD: "1"})

    def clocks_under_load(torch, smi):
        if not smi or "bf16_tflops" not in speed:
            return NOT_MEASURED
        return gpu_speed.read_clocks_while(smi, lambda: time.sleep(0.005), {**os.environ, UNDER_LOAD: "1"})

    stand_ins = [(probe, "bf16_matmul_throughput", bf16), (gpu_speed, "pinned_copy_bandwidth", copies),
                 (gpu_speed, "clocks_under_load", clocks_under_load),
                 (gpu_speed, "all_reduce_bus_bandwidth", all_reduce), (gpu_speed, "link_under_load", link_under_load)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in stand_ins]
    for owner, name, value in stand_ins:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)


def init_checks(torch, scenario: dict, cuda: str, arch_flags: list[str]) -> None:
    """What torch.cuda's first initialisation runs after CUDA starts: the calls queued at import, _check_capability and
    _check_cubins, which warn for a GPU the wheel's arch list misses (gpu-audit-3 C7: a P100 under a cu130 wheel gets
    both). They run as torch's own, reading the wheel's CUDA, arch list and machine, which the CPU torch lacks."""
    stand_ins = [(torch.version, "cuda", cuda), (torch.cuda, "get_arch_list", lambda: list(arch_flags)),
                 (torch.cuda, "_host_arch_key", lambda: scenario["machine"])]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in stand_ins]
    for owner, name, value in stand_ins:
        setattr(owner, name, value)
    try:
        torch.cuda._check_capability()
        torch.cuda._check_cubins()
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)


def init_error(facts: dict) -> str:
    """What torch.cuda.init() raises where CUDA cannot start: c10's device_count_ensure_non_zero throws the words torch
    warned at the first call ("The NVIDIA driver on your system is too old ...", "... Error 803: ..."), or "No CUDA
    GPUs are available" where CUDA answered no device (measured on an H100, gpu-audit-3 C5)."""
    warning = str(facts.get("warning") or "")
    return facts.get("init_error") or warning.removeprefix(TORCH_WARNING_PREFIX) or NO_CUDA_GPUS


@contextlib.contextmanager
def one_cpu_thread(torch):
    """The probe's GPU work on tensors this small, on one CPU thread: torch's other intra-op threads spin while they
    wait for work, which costs several times the work itself where the test workers already keep every core busy
    (ten times the CPU on two cores). What the probe computes does not depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
