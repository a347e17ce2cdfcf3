"""The pure rules the probe, the check suite and the host share: which cubins and PTX cover a GPU, what cuDNN's
version number means, what the GPUs' compute and MIG modes allow, which CUDA library copies are one, which environment
variables are secrets.

Standard library only: it is copied into the container beside probe.py (verify.container.PROBE_MODULES) and imported
there as a plain module, and on the host as torchimages.checks.rules.
"""
from __future__ import annotations

import os
import re
import typing

# nvidia-smi's compute_mode per GPU (nvidia-smi documentation, "compute_mode"; CUDA C++ Programming Guide, "Compute
# Modes"): Exclusive_Process takes one CUDA context per GPU at a time, Prohibited none at all (CUDA still lists the GPU,
# and a context on it fails with "CUDA-capable device(s) is/are busy or unavailable"). Default, and "[N/A]" or
# "[Not Supported]" where the GPU or driver does not report a mode, limit nothing.
EXCLUSIVE_COMPUTE_MODES = ("Exclusive_Process", "Exclusive_Thread")
PROHIBITED_COMPUTE_MODE = "Prohibited"
EXCLUSIVE_REASON = ("not run: a GPU is in {mode} compute mode (one CUDA context per GPU at a time), and the probe's "
                    "own process holds it; run on GPUs in Default compute mode (nvidia-smi -c DEFAULT) to test this")
PROHIBITED_REASON = ("not run: {gpus} in Prohibited compute mode: no process may use it, so the host, not the image, "
                     "stops the GPU checks; give the container only usable GPUs (--gpus device=...), or set the mode "
                     "back on the host with {fix}")
# The container's nvidia-smi numbers its GPUs from 0 whichever host GPUs it was given (--gpus device=1,3 shows 0 and
# 1), so a fix for the host names the GPU by its UUID, which `nvidia-smi -i` accepts as well as an index.
NVIDIA_SMI_UUID = re.compile(r"\(UUID: ([^)\s]+)\)")
# A GPU in MIG mode runs CUDA work only in the MIG devices made on it, and MIG mode survives a reboot where the
# instances do not (NVIDIA MIG User Guide, "Getting Started with MIG"): where every GPU is so, CUDA has no device.
MIG_WITHOUT_DEVICES_REASON = ("not run: {gpus} in MIG mode with no MIG device made on it, and CUDA runs only in MIG "
                              "devices (NVIDIA MIG User Guide, \"Getting Started with MIG\"; an instance does not "
                              "survive a reboot), so the host, not the image, keeps the GPU checks from running: "
                              "create a MIG device ({fix}, or let nvidia-mig-manager make the configured ones) and give "
                              "the container its MIG-<uuid> from `nvidia-smi -L` (--gpus device=MIG-...), or take the "
                              "GPU out of MIG mode")
# MIG devices have no CUDA peer access (RAPIDS' MIG guide; NVIDIA's statement in NVIDIA/nccl#1716), and NCCL runs on
# MIG instances only experimentally and only recently (NVIDIA/nccl#1716; older NCCL refuses them, NVIDIA/nccl#431):
# where CUDA lists a MIG device beside a whole GPU, peer copies and NCCL across them are not what a good image does.
MIG_MULTI_GPU_REASON = ("not run: {count} CUDA devices, one of them a MIG device ({mig}): MIG devices have no CUDA "
                        "peer access and NCCL supports them only experimentally (NVIDIA/nccl#1716), so peer copies "
                        "and NCCL across a MIG device and a whole GPU test the host's layout, not the image")

CUDA_LIBRARY = re.compile(
    r"^(libcudart|libcublas|libcublasLt|libcudnn(?:_[a-z_]+)?|libnccl|libcufft|libcufftw|libcurand|libcusolver|"
    r"libcusolverMg|libcusparse|libcusparseLt|libnvrtc|libnvrtc-builtins|libnvJitLink|libcupti|libnvToolsExt|"
    r"libcufile)\.so(\.\d+)*$"
)
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|(^|_)AUTH($|_))", re.I)
URL_CREDENTIALS = re.compile(r"://[^/@\s:]+:[^/@\s]+@")


def decode_cudnn_version(value: int | None) -> tuple[int, int, int] | None:
    """cuDNN's version int: 9.x is MAJOR*10000 + MINOR*100 + PATCH (92400), 8.x is MAJOR*1000 + MINOR*100 + PATCH."""
    if not value:
        return None
    if value >= 10000:
        return value // 10000, value // 100 % 100, value % 100
    return value // 1000, value // 100 % 10, value % 100


def arch_flags_for(arch_list: typing.Sequence[str]) -> list[str]:
    """A TORCH_CUDA_ARCH_LIST (["7.5", "12.0+PTX"]) -> what torch.cuda.get_arch_list() reports for it."""
    flags = []
    for entry in arch_list:
        number = entry.removesuffix("+PTX").replace(".", "")
        flags.append(f"sm_{number}")
        if entry.endswith("+PTX"):
            flags.append(f"compute_{number}")
    return flags


def _flag_capability(flag: str) -> tuple[int, int]:
    digits = flag.split("_", 1)[1].rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def _flag_scope(flag: str) -> str:
    """"a": arch-specific (sm_90a, compute_100a) runs only on exactly that capability; "f": family-specific
    (sm_100f) runs only within its major, at or above it; "": the generic rules. Source: NVIDIA CUDA C++
    Programming Guide, "Feature Set Compiler Targets" (arch-specific and family-specific features)."""
    return flag[-1] if flag[-1] in "af" else ""


# Integrated (Tegra) GPUs: Jetson TX1 5.3, TX2 6.2, Xavier 7.2, Orin 8.7, Thor 10.1 in CUDA 12 numbering and 11.0 in
# CUDA 13's (NVIDIA CUDA GPUs page). "Binary compatibility is supported only for the desktop. It is not supported for
# Tegra. Also, the binary compatibility between desktop and Tegra is not supported" (CUDA C++ Programming Guide,
# "Binary Compatibility"); CUDA 13.2 unified Jetson with SBSA, so Orin and Xavier run their major's desktop cubins.
# The exceptions follow the tables torch's own wheel checks its cubins against (torch/cuda/__init__.py, torch 2.14.1:
# DEVICE_REQUIREMENT for builds before CUDA 13.2, DEVICE_REQUIREMENT_POST_JETSON_SBSA_UNIFICATION after), in its
# notation: a cubin's capability -> the device capabilities it never runs on, or -> the only ones it runs on.
TEGRA_EXCLUDED = {50: {53}, 52: {53}, 60: {62}, 61: {62}, 70: {72}, 80: {87}, 86: {87}, 100: {101}}
TEGRA_EXCLUDED_FROM_13_2 = {100: {101}}  # only Thor's CUDA 12 number stays apart
TEGRA_ONLY = {53: {53}, 62: {62}, 72: {72}, 87: {87}, 101: {101, 110}}  # a Tegra cubin: that GPU (Thor: both numbers)
JETSON_SBSA_UNIFICATION = (13, 2)


def _cubin_runs_on(built: tuple[int, int], capability: tuple[int, int], cuda: str | None) -> bool:
    """torch's rule for a plain cubin: the same major at or above its minor, but for the Tegra exceptions of the
    table for this CUDA build (before 13.2 where the build's CUDA is not known)."""
    code, device = built[0] * 10 + built[1], capability[0] * 10 + capability[1]
    unified = cuda is not None and tuple(int(part) for part in cuda.split(".")[:2]) >= JETSON_SBSA_UNIFICATION
    if code in TEGRA_ONLY:
        return device in TEGRA_ONLY[code]
    if device in (TEGRA_EXCLUDED_FROM_13_2 if unified else TEGRA_EXCLUDED).get(code, ()):
        return False
    return built[0] == capability[0] and built[1] <= capability[1]


def _flag_runs_on(flag: str, capability: tuple[int, int], cuda: str | None) -> bool:
    built, scope = _flag_capability(flag), _flag_scope(flag)
    if scope == "a":
        return built == capability
    if scope == "f":  # family code runs within its major, at or above its minor
        return built[0] == capability[0] and built[1] <= capability[1]
    if flag.startswith("sm_"):
        return _cubin_runs_on(built, capability, cuda)
    return built <= capability  # generic PTX: JIT-compiled for any newer GPU


def arch_covers(flags: list[str], capability: tuple[int, int], cuda: str | None = None) -> str | None:
    """How a device is covered by a build for CUDA `cuda`: a cubin of the same major with minor <= the device's (with
    torch's Tegra exceptions), or PTX at or below it; arch-specific (`a`) code only on its exact capability, family
    (`f`) code only within its major."""
    cubins = [f for f in flags if f.startswith("sm_") and _flag_runs_on(f, capability, cuda)]
    if cubins:
        return f"cubin {max(cubins, key=_flag_capability)}"
    ptx = [f for f in flags if f.startswith("compute_") and _flag_runs_on(f, capability, cuda)]
    if ptx:
        return f"PTX {max(ptx, key=_flag_capability)} (JIT-compiled on first use)"
    return None


def library_family(filename: str) -> str | None:
    """libcublas.so.12.6.4.1 -> libcublas; None for files that are not CUDA libraries."""
    match = CUDA_LIBRARY.match(filename)
    return match.group(1) if match else None


def group_library_copies(paths: list[str], resolve=os.path.realpath) -> dict[str, list[str]]:
    """Library files -> {family: one path per distinct file}: symlinks to the same file are one copy."""
    copies: dict[str, dict[str, str]] = {}
    for path in sorted(paths):
        family = library_family(os.path.basename(path))
        if family is None or "/stubs/" in path:
            continue
        real = resolve(path)
        copies.setdefault(family, {}).setdefault(real, path)
    return {family: sorted(files.values()) for family, files in sorted(copies.items())}


def secret_env_names(env: dict[str, str]) -> list[str]:
    """Names of non-empty variables that look like secrets, by name or by credentials in a URL value."""
    return sorted(name for name, value in env.items()
                  if value and (SECRET_NAME.search(name) or URL_CREDENTIALS.search(value)))


def redacted_env(env: dict[str, str]) -> dict[str, str]:
    """The environment with secret values hidden: the probe's output is stored in reports."""
    hidden = set(secret_env_names(env))
    return {name: (f"<redacted, {len(value)} characters>" if name in hidden else value) for name, value in sorted(env.items())}


def nvcc_release(version_text: str) -> str | None:
    """`nvcc --version` output -> "13.0"."""
    match = re.search(r"release (\d+\.\d+)", version_text)
    return match.group(1) if match else None


def os_tag(os_release: dict[str, str]) -> str:
    """/etc/os-release -> the matrix's os name: debian12, ubuntu24.04."""
    return f"{os_release.get('ID', '?')}{os_release.get('VERSION_ID', '?')}"


def last_error_line(error: BaseException) -> str:
    """DataLoader re-raises worker errors with the worker's traceback inside: its last line is the cause."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if re.match(r"^[A-Za-z_.]+(Error|Exception)\b", last) else f"{type(error).__name__}: {last}"


MIG_DEVICE_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):")


def parse_nvidia_smi_list(output: str) -> dict:
    """`nvidia-smi -L` -> its GPU lines and, per GPU, its MIG device lines (indented under the GPU)."""
    gpus: list[str] = []
    mig: dict[str, list[str]] = {}
    for line in output.splitlines():
        if line.startswith("GPU "):
            gpus.append(line)
        elif MIG_DEVICE_LINE.match(line) and gpus:
            mig.setdefault(str(len(gpus) - 1), []).append(line.strip())
    return {"nvidia_smi_gpus": gpus, "mig_devices": mig}


class ComputeModeLimits(typing.NamedTuple):
    exclusive: bool  # a GPU takes one CUDA context at a time
    children_skip: str  # why the probe's child processes must stay off the GPUs ("" if they may use them)
    unusable: str  # why no GPU work can run here at all ("" if it can)


def compute_mode_limits(host: dict) -> ComputeModeLimits:
    """What the GPUs' compute modes (nvidia-smi's view of the container's GPUs) allow the probe."""
    modes = host.get("compute_modes") or []
    names = host.get("nvidia_smi_gpus") or []
    prohibited = [names[index] if index < len(names) else f"GPU {index}"
                  for index, mode in enumerate(modes) if mode == PROHIBITED_COMPUTE_MODE]
    exclusive = next((mode for mode in modes if mode in EXCLUSIVE_COMPUTE_MODES), None)
    if prohibited:
        uuids = [match.group(1) if match else "UUID" for match in map(NVIDIA_SMI_UUID.search, prohibited)]
        reason = PROHIBITED_REASON.format(gpus=", ".join(prohibited) + (" is" if len(prohibited) == 1 else " are"),
                                          fix=" and ".join(f"`nvidia-smi -i {uuid} -c DEFAULT`" for uuid in uuids))
        return ComputeModeLimits(bool(exclusive), reason, reason)
    return ComputeModeLimits(bool(exclusive), EXCLUSIVE_REASON.format(mode=exclusive) if exclusive else "", "")


def mig_without_devices_reason(host: dict) -> str:
    """Why no GPU work can run where every GPU the container has is in MIG mode without a MIG device ("" where one
    can): nvidia-smi -L then lists the GPUs with no MIG line under them."""
    names, modes = host.get("nvidia_smi_gpus") or [], host.get("mig_modes") or []
    if not names or len(modes) != len(names) or any(mode != "Enabled" for mode in modes) or host.get("mig_devices"):
        return ""
    uuids = [match.group(1) if match else "UUID" for match in map(NVIDIA_SMI_UUID.search, names)]
    return MIG_WITHOUT_DEVICES_REASON.format(
        gpus=", ".join(names) + (" is" if len(names) == 1 else " are"),
        fix=" and ".join(f"`nvidia-smi mig -i {uuid} -cgi <profile> -C`" for uuid in uuids))


def mig_multi_gpu_reason(device_count: int, host: dict, device_names: typing.Sequence[str] = ()) -> str:
    """Why peer copies and NCCL must not run across these CUDA devices ("" where they must): 2+ devices, one of them
    a MIG device. One CUDA process enumerates one MIG device (NVIDIA MIG User Guide, "CUDA Device Enumeration"), so 2+
    devices with one of them MIG is a MIG device beside whole GPUs. Known before any context from nvidia-smi's MIG
    lines in the container; from torch's device names ("NVIDIA A100-SXM4-80GB MIG 3g.40gb") where nvidia-smi said
    nothing."""
    if device_count < 2:
        return ""
    named = [name for name in device_names if " MIG " in name]
    listed = [line for lines in (host.get("mig_devices") or {}).values() for line in lines]
    mig = (named or listed)[:1]
    return MIG_MULTI_GPU_REASON.format(count=device_count, mig=mig[0]) if mig else ""


# The GPUs torch runs cuDNN attention on: check_cudnn_hardware_support allows sm80 to sm121 (pytorch
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp); outside it, forcing the backend fails with "No available
# kernel" on a good image, and torch picks another backend by itself.
CUDNN_ATTENTION_CAPABILITIES = ((8, 0), (12, 1))
# And the cuDNN it prefers it with: cuDNN before 9.15.1 corrupts memory for sequence lengths not divisible by 128, so
# PyTorch turned cuDNN attention off by default for wheels that ship an older one (pytorch#171627, fixing #169849;
# check_prefer_cudnn_attention in sdp_utils.cpp: cudnn_version > 91500). The cu126 row's cuDNN 9.10 is one: forcing
# the path there would blame the image for a configuration its users never reach.
CUDNN_ATTENTION_FIRST_SAFE_VERSION = 91501


def cudnn_attention_forced(capability: tuple[int, int], cudnn_version: int | None) -> bool:
    """Whether the probe forces cuDNN attention: only where torch itself would run it by default (the GPU within
    check_cudnn_hardware_support's bounds and a cuDNN torch prefers); elsewhere the default dispatch runs, as
    upstream's test_sdpa does."""
    lowest, highest = CUDNN_ATTENTION_CAPABILITIES
    return lowest <= tuple(capability) <= highest and (cudnn_version or 0) >= CUDNN_ATTENTION_FIRST_SAFE_VERSION
