#!/usr/bin/env python3
"""The in-container probe: computes every fact the image checks assert on, once, as one JSON document.

It is copied into the container and run with the image's own Python, so it needs only the standard library
and torch (imported lazily: the pure helpers below are also imported on the host by the check suites).

    python probe.py                      # main part, as the image's user: versions, torch, shm, AMP, GPU, smoke
                                         # test, torchrun all-reduce, libraries (--devel: a torch extension too)
    python probe.py --checks shm,devel   # main part, leaving out the slow work of the checks not named
    python probe.py --part files         # as root: CUDA library copies, package caches, credential files
    python probe.py --part import --wheel W  # as an arbitrary uid: import torch, HOME writable, pip install --user W
    python probe.py --part smoke         # PyTorch's smoke-test assertions alone (the benchmark's yardstick)
    python probe.py --gpu-only           # on any GPU host with torch: visibility, arch coverage, cuDNN, AMP, bf16
                                         # speed, the smoke test on each GPU, and the host's raw answers (nvidia-smi,
                                         # /proc, NVML's and CUDA's counts) that gpu-record keeps as a lane host

The JSON document goes to stdout; everything libraries print goes to stderr, so stdout is always parseable.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import typing
import warnings

try:
    from . import gpu_health, gpu_speed
except ImportError:  # run as a script: its helper modules are copied beside it (verify.container.copy_probe), and
    # its folder is not on sys.path where the image sets PYTHONSAFEPATH (or under -I)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_health  # type: ignore[no-redef]
    import gpu_speed  # type: ignore[no-redef]

PROBE_VERSION = 3
# Every time bound below is used through bound(), which multiplies it by --slowdown: the factor the host gives where
# its engine runs the image under emulation (torchimages/verify/emulation.py, SLOWDOWN), 1 natively.
SLOWDOWN: float = 1
# A DataLoader test only means something when more than Docker's 64 MB default /dev/shm is in flight.
DATALOADER_WORKERS = 4
DATALOADER_ITEM_MB = 16
DATALOADER_ITEMS = 12
DATALOADER_TIMEOUT_S = 90
MULTI_GPU_TIMEOUT_S = 120
TOOL_TIMEOUT_S = 30
# The smoke test's compiles (cold inductor cache, max-autotune) take half a minute on 2 cores; allow for load.
SMOKE_COMPILE_TIMEOUT_S = 300  # the compiles' bound where nothing kills the probe (--part smoke, --gpu-only)
# What the probe needs after its compile child's deadline, inside the kill budget it is given (--budget-s): the join
# and kill of the child, the last sections and the JSON document.
BUDGET_MARGIN_S = 45
# torchrun's processes import torch beside the rest of the probe; a rendezvous that cannot form must not hang it.
DISTRIBUTED_TIMEOUT_S = 150
DISTRIBUTED_PROCESSES = 2  # gloo on the CPU; with 2+ GPUs one process per GPU, as DDP and FSDP run
DISTRIBUTED_MAX_PROCESSES = 8
PIP_TIMEOUT_S = 120
EXTENSION_TIMEOUT_S = 540  # a CUDA extension for six arches on two cores
# The main part creates this file once its `import torch` is done. Images may ship without bytecode; where the venv
# is writable, that import leaves it behind, and processes started after it (torchrun's, the arbitrary uid's) import
# torch in a third of the time instead of compiling the same bytecode again side by side.
TORCH_IMPORTED = "/tmp/torchimages-torch-imported"
NVIDIA_DRIVER_PROC = "/proc/driver/nvidia/version"  # the loaded kernel module's version, readable without NVML
TORCH_IMPORTED_WAIT_S = 60
PROBE_STARTED = time.monotonic()
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
LIBRARY_ROOTS = ("/usr/lib", "/usr/lib64", "/usr/local", "/opt", "/lib", "/lib64")
# Headers, docs and caches hold no shared libraries; skipping them keeps the walk well under a second.
PRUNED_DIRS = {"include", "share", "doc", "man", "__pycache__", "pkgconfig", "cmake", "src", "proc", "sys"}
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|(^|_)AUTH($|_))", re.I)
URL_CREDENTIALS = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
PASSWORD_LINE = re.compile(r"^\s*(password|token|_authToken|_auth|aws_secret_access_key|oauth_token)\s*[=:]", re.I | re.M)
HOME_CREDENTIAL_FILES = (
    ".netrc", ".pypirc", ".docker/config.json", ".config/pip/pip.conf", ".pip/pip.conf", ".git-credentials",
    ".aws/credentials", ".huggingface/token", ".cache/huggingface/token", ".config/gh/hosts.yml", ".npmrc",
)
GLOBAL_CREDENTIAL_FILES = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "/etc/netrc")
# Files that are credentials by their mere presence; the others only when they hold a secret.
ALWAYS_SECRET = (".netrc", ".git-credentials", ".aws/credentials", ".huggingface/token", ".cache/huggingface/token", "/etc/netrc")


# ---------------------------------------------------------------- pure helpers (also used on the host)

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


def bound(seconds: float) -> float:
    """One of the time bounds above, as this run uses it: multiplied by --slowdown."""
    return seconds * SLOWDOWN


# ---------------------------------------------------------------- sections that need no torch

def section(function, *args) -> dict:
    """Run one fact-gathering step; an exception becomes part of the facts instead of ending the probe."""
    started = time.monotonic()
    try:
        result = function(*args)
    except BaseException as error:  # noqa: BLE001 - a probe reports every failure, SystemExit included
        result = {"ok": False, "error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc(limit=-3)[-2000:]}
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def run_tool(command: list[str], timeout: float = TOOL_TIMEOUT_S) -> dict:
    """The command's exit and output, killed after timeout (one of the bounds above, unscaled: bound() applies)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=bound(timeout), check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    return {"ok": done.returncode == 0, "returncode": done.returncode, "output": (done.stdout + done.stderr)[-4000:]}


class ChildSection:
    """A section run in a forked child, started now and collected later, so that it runs beside the rest of the
    probe; a crash or a hang ends the child, not the probe. Fork before CUDA or thread pools start: a forked child
    must not inherit them (so the child finds its own GPUs)."""

    def __init__(self, name: str, timeout: float, function, *args):
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self.name, self.deadline = name, time.monotonic() + timeout
        self.receiver, sender = context.Pipe(duplex=False)
        self.child = context.Process(target=_send_section, args=(sender, function, *args), daemon=False)
        self.child.start()
        sender.close()

    def result(self) -> dict:
        result = None
        if self.receiver.poll(max(0.0, self.deadline - time.monotonic())):
            with contextlib.suppress(EOFError):
                result = self.receiver.recv()
        self.child.join(10)
        if self.child.is_alive():
            self.child.kill()
            self.child.join()
        if result is None:
            code = self.child.exitcode
            how = f"was killed by signal {-code}" if code and code < 0 else f"exited with code {code}"
            result = {"ok": False, "error": f"{self.name} {how} without a result"
                      + (" (timed out)" if code is None or code == -9 else "")}
        return result


def _send_section(connection, function, *args) -> None:
    try:
        connection.send(section(function, *args))
    finally:
        connection.close()


def python_facts() -> dict:
    return {"version": ".".join(map(str, sys.version_info[:3])), "major_minor": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "executable": sys.executable, "prefix": sys.prefix}


def os_release() -> dict:
    values = {}
    try:
        with open("/etc/os-release", encoding="utf-8") as stream:
            for line in stream:
                key, _, value = line.strip().partition("=")
                if key:
                    values[key] = value.strip('"')
    except OSError:
        pass
    return values


def writable(directory: str) -> tuple[bool, str]:
    try:
        with tempfile.NamedTemporaryFile(dir=directory):
            return True, ""
    except OSError as error:
        return False, f"{type(error).__name__}: {error}"


def user_facts() -> dict:
    import pwd

    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = None
    home = os.environ.get("HOME", "")
    home_writable, home_error = writable(home) if home else (False, "HOME is not set")
    return {"uid": uid, "gid": gid, "groups": sorted(os.getgroups()), "name": name, "home": home,
            "home_exists": bool(home) and os.path.isdir(home), "home_writable": home_writable, "home_error": home_error}


def find_nvcc(env: dict[str, str], exists=os.path.exists, which=shutil.which) -> str | None:
    """The nvcc torch.utils.cpp_extension compiles with, found its way: $CUDA_HOME (or $CUDA_PATH)/bin, else nvcc on
    PATH, else /usr/local/cuda. A toolkit from the CUDA wheels sits in site-packages, not /usr/local/cuda."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        return f"{home}/bin/nvcc" if exists(f"{home}/bin/nvcc") else None
    return which("nvcc", path=env.get("PATH")) or ("/usr/local/cuda/bin/nvcc" if exists("/usr/local/cuda/bin/nvcc") else None)


def tool_facts() -> dict:
    nvcc = find_nvcc(dict(os.environ))
    nvcc_facts: dict[str, typing.Any] = {"path": nvcc, "cuda_home": os.environ.get("CUDA_HOME")}
    if nvcc:
        nvcc_facts.update(run_tool([nvcc, "--version"]))
        nvcc_facts["release"] = nvcc_release(nvcc_facts.get("output", ""))
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    compiler_facts: dict[str, typing.Any] = {"path": compiler}
    if compiler:
        compiler_facts.update(run_tool([compiler, "--version"]))
        compiler_facts["version"] = compiler_facts.get("output", "").splitlines()[0] if compiler_facts.get("output") else ""
    return {"nvcc": nvcc_facts, "cxx": compiler_facts, "ninja": shutil.which("ninja")}


def shm_size(path: str = "/dev/shm") -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize


def loaded_libraries(maps_path: str = "/proc/self/maps") -> dict[str, list[str]]:
    """The CUDA libraries this process has mapped, by family: which copy torch really loaded."""
    paths = set()
    with open(maps_path, encoding="utf-8", errors="replace") as stream:
        for line in stream:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                paths.add(fields[5].strip())
    return group_library_copies(sorted(paths), resolve=lambda path: path)


# ---------------------------------------------------------------- the files part (runs as root)

def library_files(roots=LIBRARY_ROOTS) -> list[str]:
    found: list[str] = []
    seen_roots: set[str] = set()
    for root in roots:
        real_root = os.path.realpath(root)
        if real_root in seen_roots or not os.path.isdir(real_root):
            continue
        seen_roots.add(real_root)
        for directory, subdirs, files in os.walk(real_root):
            subdirs[:] = [d for d in subdirs if d not in PRUNED_DIRS]
            found.extend(os.path.join(directory, name) for name in files if name.startswith("lib") and library_family(name))
    return found


def home_directories() -> list[str]:
    homes = {"/root", os.environ.get("HOME", "/root")}
    if os.path.isdir("/home"):
        homes.update(os.path.join("/home", name) for name in os.listdir("/home"))
    return sorted(h for h in homes if os.path.isdir(h))


def directory_bytes(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total


# What a package manager keeps in an empty cache or list folder (apt's lock and partial/, its auxfiles/).
EMPTY_CACHE_ENTRIES = {"lock", "partial", "auxfiles"}


def package_caches(homes: list[str], os_caches: list[str]) -> list[dict]:
    """pip's caches, and the OS family's package caches and lists (compat.yaml `families.<family>.caches`), that hold
    anything: an image should not ship them."""
    candidates = [os.path.join(home, ".cache", "pip") for home in homes]
    candidates += [p for p in (os.environ.get("PIP_CACHE_DIR"), "/var/cache/pip") if p]
    leftovers = [{"path": p, "bytes": directory_bytes(p), "kind": "pip cache"}
                 for p in sorted(set(candidates)) if os.path.isdir(p) and os.listdir(p)]
    for path in os_caches:
        entries = [n for n in os.listdir(path) if n not in EMPTY_CACHE_ENTRIES] if os.path.isdir(path) else []
        if entries:
            leftovers.append({"path": path, "bytes": directory_bytes(path), "kind": "OS package cache",
                              "files": len(entries)})
    return leftovers


def _holds_secret(path: str, content: str) -> str | None:
    if path.endswith(ALWAYS_SECRET):
        return "credential file"
    if path.endswith(".docker/config.json"):
        try:
            config = json.loads(content or "{}")
        except ValueError:
            return None
        auths = config.get("auths") or {}
        if any(isinstance(entry, dict) and (entry.get("auth") or entry.get("identitytoken")) for entry in auths.values()):
            return "registry credentials in auths"
        return None
    if URL_CREDENTIALS.search(content):
        return "a URL with user:password"
    if PASSWORD_LINE.search(content):
        return "a password or token entry"
    return None


def credential_files(homes: list[str]) -> list[dict]:
    candidates = [os.path.join(home, name) for home in homes for name in HOME_CREDENTIAL_FILES]
    candidates += list(GLOBAL_CREDENTIAL_FILES)
    if os.environ.get("PIP_CONFIG_FILE"):
        candidates.append(os.environ["PIP_CONFIG_FILE"])
    found = []
    for path in sorted(set(candidates)):
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as stream:
                content = stream.read(200_000)
        except OSError as error:
            found.append({"path": path, "reason": f"unreadable even as root ({error})"})
            continue
        reason = _holds_secret(path, content)
        if reason:
            found.append({"path": path, "reason": reason})
    if os.path.isdir("/build-inputs"):
        found.append({"path": "/build-inputs", "reason": "build inputs (wheelhouse, CA bundle) left in the image"})
    return found


def files_facts(os_caches: list[str]) -> dict:
    homes = home_directories()
    return {"part": "files", "uid": os.getuid(), "homes": homes,
            "library_copies": group_library_copies(library_files()),
            "package_caches": package_caches(homes, os_caches), "credential_files": credential_files(homes)}


# ---------------------------------------------------------------- the import part (runs as an arbitrary uid)

def import_facts(wheel: str | None, after_main: bool) -> dict:
    facts: dict[str, typing.Any] = {"part": "import", "user": user_facts()}
    if after_main:
        facts["waited_for_main_import_s"] = wait_for_file(TORCH_IMPORTED, bound(TORCH_IMPORTED_WAIT_S))
    try:
        import torch

        facts["torch_ok"] = bool(torch.ones(2).sum().item() == 2)
        facts["torch_error"] = ""
    except BaseException as error:  # noqa: BLE001
        facts["torch_ok"], facts["torch_error"] = False, f"{type(error).__name__}: {error}"
    if wheel:
        facts["user_install"] = section(user_install, wheel)
    return facts


def wait_for_file(path: str, timeout: float) -> float:
    """Seconds waited until path existed (or timeout passed: then go on regardless)."""
    started = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - started < timeout:
        time.sleep(0.1)
    return round(time.monotonic() - started, 3)


def wheel_module(wheel: str) -> str:
    """The module a downstream wheel installs: the host names its wheels after their one module."""
    return os.path.basename(wheel).split("-", 1)[0]


def user_install(wheel: str) -> dict:
    """What a notebook user under an arbitrary uid does: `pip install --user` (no index: the wheel is local), then
    import the package in a new interpreter, which is when Python reads the user site directory."""
    pip = shutil.which("pip")
    if pip is None:
        return {"ok": False, "step": "pip install --user", "error": "no pip on PATH"}
    install = run_tool([pip, "install", "--user", "--no-index", "--disable-pip-version-check", wheel], PIP_TIMEOUT_S)
    if not install["ok"]:
        return {**install, "step": "pip install --user", "pip": pip}
    module = wheel_module(wheel)
    imported = run_tool([sys.executable, "-c", f"import {module}; print({module}.__file__)"])
    return {**imported, "step": f"import {module}", "pip": pip, "pip_output": install["output"][-1500:]}


# ---------------------------------------------------------------- torch facts

@contextlib.contextmanager
def captured_output(sink: list[str]):
    """Whatever reaches fd 1 and 2 inside the block (C++ writes there directly, not through sys.stderr) is appended
    to sink, then passed on to stderr for the log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            sink.append(text)
            sys.stderr.write(text)


def quiet_import(name: str) -> tuple[object | None, dict]:
    """Import a module as users do, recording what it warned and printed: `import torch` must say nothing."""
    started, printed = time.monotonic(), typing.cast(list[str], [])
    with warnings.catch_warnings(record=True) as caught, captured_output(printed):
        warnings.simplefilter("always")
        try:
            module, error = importlib.import_module(name), None
        except BaseException as raised:  # noqa: BLE001 - a broken install is a fact too
            module, error = None, raised
    facts = {"import_seconds": round(time.monotonic() - started, 3),
             "import_warnings": [f"{w.category.__name__}: {w.message}" for w in caught], "import_output": "".join(printed)}
    if error is not None:
        facts.update({"error": f"{type(error).__name__}: {error}", "missing": isinstance(error, ModuleNotFoundError)
                      and error.name == name, "traceback": "".join(traceback.format_exception(error, limit=-3))[-2000:]})
    return module, facts


def import_torch() -> tuple[object | None, dict]:
    torch, facts = quiet_import("torch")
    facts["importable"] = torch is not None
    if torch is not None:
        facts["torchvision"] = torchvision_facts()
    return torch, facts


def torchvision_facts() -> dict | None:
    """None when torchvision is not installed; its version, or why it does not import, otherwise."""
    torchvision, facts = quiet_import("torchvision")
    if torchvision is None and facts["missing"]:
        return None
    facts["version"] = getattr(torchvision, "__version__", None)
    facts.setdefault("error", "")
    return facts


def torch_versions(torch) -> dict:
    cudnn = torch.backends.cudnn
    try:
        compile_version = torch._C._cudnn.getCompileVersion() if hasattr(torch._C, "_cudnn") else None
    except RuntimeError:
        compile_version = None
    return {
        "version": torch.__version__, "cuda": torch.version.cuda, "git_version": getattr(torch.version, "git_version", ""),
        "location": os.path.dirname(torch.__file__), "arch_flags": compiled_arch_flags(torch),
        "cudnn_available": bool(cudnn.is_available()), "cudnn_version": cudnn.version() if cudnn.is_available() else None,
        "cudnn_compile_version": list(compile_version) if compile_version else None,
        "nccl_version": _nccl_version(torch),
    }


def compiled_arch_flags(torch) -> list[str]:
    """What torch.cuda.get_arch_list() reports (torch._C._cuda_getArchFlags; get_arch_list() gates on
    _is_compiled() in 2.14, so both work without a GPU), as a list; [] for CPU builds."""
    read_flags = getattr(torch._C, "_cuda_getArchFlags", None)  # absent from CPU builds
    return (read_flags() or "").split() if read_flags else []


def _nccl_version(torch) -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def train_steps(torch, device: str, dtype, steps: int = 20, scaler=None) -> dict:
    """A tiny regression under autocast: the loss must stay finite and fall."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    # torch.optim imports torch._dynamo (seconds on a small CPU); only GradScaler needs a real optimizer.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1) if scaler is not None else None
    inputs = torch.randn(64, 32, device=device)
    targets = inputs[:, :1] * 0.5 + 0.1
    losses, output_dtype = [], None
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.split(":")[0], dtype=dtype):
            prediction = model(inputs)
            output_dtype = str(prediction.dtype)
            loss = torch.nn.functional.mse_loss(prediction.float(), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter -= 0.1 * parameter.grad
        losses.append(float(loss.detach()))
    finite = all(loss == loss and abs(loss) != float("inf") for loss in losses)
    return {"ok": finite and losses[-1] < losses[0], "finite": finite, "first_loss": losses[0], "last_loss": losses[-1],
            "output_dtype": output_dtype, "steps": steps,
            "scale": float(scaler.get_scale()) if scaler is not None else None}


def cpu_bf16_autocast(torch) -> dict:
    return train_steps(torch, "cpu", torch.bfloat16)


class _BigItems:
    """A dataset of large tensors, so worker batches must travel through /dev/shm."""

    def __init__(self, torch, items: int, item_mb: int):
        self.torch, self.items, self.numel = torch, items, item_mb * 2**20 // 4

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int):
        return self.torch.full((self.numel,), float(index))


def _dataloader_through_shm(torch) -> dict:
    from torch.utils.data import DataLoader

    try:
        loader: typing.Any = DataLoader(typing.cast(typing.Any, _BigItems(torch, DATALOADER_ITEMS, DATALOADER_ITEM_MB)), batch_size=1,
                            num_workers=DATALOADER_WORKERS, prefetch_factor=2, timeout=bound(DATALOADER_TIMEOUT_S))
        held, peak = [], 0
        for index, batch in enumerate(loader):
            if float(batch[0, -1]) != float(index):
                raise ValueError(f"batch {index} arrived with the wrong contents")
            held.append(batch)  # keep them: the shared-memory segments stay allocated, as in a real input pipeline
            peak = max(peak, sum(b.numel() * 4 for b in held))
        return {"ok": True, "batches": len(held), "peak_bytes_in_shm": peak}
    except BaseException as error:  # noqa: BLE001
        return {"ok": False, "error": last_error_line(error), "details": str(error)[-3000:]}


def start_dataloader(torch) -> ChildSection:
    """In a forked child: a bus error or a hang kills the child, not the probe."""
    return ChildSection("the DataLoader process", bound(DATALOADER_TIMEOUT_S + 10), _dataloader_through_shm, torch)


def dataloader_facts(run: ChildSection) -> dict:
    result = run.result()
    result.update({"workers": DATALOADER_WORKERS, "item_bytes": DATALOADER_ITEM_MB * 2**20, "items": DATALOADER_ITEMS})
    return result


# ---------------------------------------------------------------- GPU facts

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


def driver_facts() -> dict:
    """The host driver as the container sees it: nvidia-smi's GPU and MIG lines, compute modes, driver version;
    when nvidia-smi fails, its exit code and words (an NVML error is the cause to report, not "no GPUs")."""
    facts: dict[str, typing.Any] = {"driver_version": None, "nvidia_smi_gpus": None, "mig_devices": {}, "compute_modes": None,
             "mig_modes": None, "nvidia_smi_error": None}
    smi = shutil.which("nvidia-smi")
    facts["nvidia_smi"] = smi
    if smi:
        listing = run_tool([smi, "-L"])
        if listing.get("ok"):
            facts.update(parse_nvidia_smi_list(listing["output"]))
        else:
            facts["nvidia_smi_error"] = {"returncode": listing.get("returncode"),
                                         "output": (listing.get("output") or listing.get("error") or "").strip()[-500:]}
        # mig.mode.current: Enabled, Disabled, or [N/A] where the GPU has no MIG (nvidia-smi documentation).
        query = run_tool([smi, "--query-gpu=driver_version,compute_mode,mig.mode.current", "--format=csv,noheader"])
        rows = [[part.strip() for part in line.split(",")] for line in query.get("output", "").splitlines()
                if line.count(",") == 2] if query.get("ok") else []
        if rows:
            facts["driver_version"] = rows[0][0]
            facts["compute_modes"] = [row[1] for row in rows]
            facts["mig_modes"] = [row[2] for row in rows]
        # Read before any GPU work, so that a sick host is told apart from a bad image (checks/gpu_health.py).
        facts["health"] = gpu_health.read_health(smi, run_tool)
    if facts["driver_version"] is None:
        try:
            with open(NVIDIA_DRIVER_PROC, encoding="utf-8") as stream:
                match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", stream.read())
            facts["driver_version"] = match.group(1) if match else None
        except OSError:
            pass
    facts["libcuda_driver_version"] = libcuda_driver_version()
    return facts


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


def libcuda_driver_version() -> int | None:
    """cuDriverGetVersion from the libcuda.so.1 this process loads (13000 = CUDA 13.0): a forward-compatible libcuda
    (cuda-compat) supports a newer CUDA than the kernel driver's branch; None without a libcuda."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        return version.value if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
    except (OSError, AttributeError):
        return None


def device_facts(torch, index: int, flags: list[str]) -> dict:
    properties = torch.cuda.get_device_properties(index)
    capability = [properties.major, properties.minor]
    facts = {"index": index, "name": properties.name, "capability": capability,
             "uuid": str(getattr(properties, "uuid", "")), "total_memory": properties.total_memory,
             "covered_by": arch_covers(flags, tuple(capability), torch.version.cuda)}
    try:
        device = f"cuda:{index}"
        # A torch kernel made on the device (libtorch's own cubins: "no kernel image" shows here) and a cuBLAS GEMM
        # (cuBLAS carries its own SASS and PTX, so it runs even where libtorch has no kernel for this GPU).
        doubled_sum = float(torch.arange(4096, device=device, dtype=torch.float32).mul_(2).sum())
        a = torch.randn(256, 256)
        on_device = (a.to(device) @ a.to(device)).cpu()
        torch.cuda.synchronize(device)
        facts["torch_kernel_ok"] = doubled_sum == 4095 * 4096.0
        facts["matmul_ok"] = bool(torch.allclose(on_device, a @ a, rtol=1e-2, atol=1e-2))
        facts["kernel_ok"] = facts["torch_kernel_ok"] and facts["matmul_ok"]
        facts["kernel_error"] = "; ".join(
            why for ok, why in ((facts["torch_kernel_ok"], f"torch's own kernel (arange*2, sum) gave {doubled_sum}"),
                                (facts["matmul_ok"], "the cuBLAS matmul differs from the CPU's")) if not ok)
    except RuntimeError as error:
        facts["kernel_ok"], facts["kernel_error"] = False, str(error)[-1000:]
    return facts


CUDNN_TOLERANCE = 5e-2  # TF32 convolutions (cuDNN's default) against the CPU's float32


def cudnn_conv(torch) -> dict:
    """conv2d forward and backward with cudnn.benchmark: output and the three gradients match the CPU's."""
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1)
    x = torch.randn(8, 3, 64, 64, requires_grad=True)
    expected = conv(x)
    expected.square().mean().backward()
    reference = {"x": x.grad, "weight": conv.weight.grad, "bias": conv.bias.grad}
    conv_gpu = torch.nn.Conv2d(3, 16, 3, padding=1).cuda()
    conv_gpu.load_state_dict(conv.state_dict())
    x_gpu = x.detach().cuda().requires_grad_(True)
    output = conv_gpu(x_gpu)
    output.square().mean().backward()
    torch.cuda.synchronize()
    error = float((output.detach().cpu() - expected.detach()).abs().max())
    gradients = {"x": x_gpu.grad, "weight": conv_gpu.weight.grad, "bias": conv_gpu.bias.grad}
    grad_errors = {name: relative_error(torch, gradients[name], reference[name].double()) for name in reference}
    grads_ok = all(value <= CUDNN_TOLERANCE for value in grad_errors.values())
    return {"ok": error < CUDNN_TOLERANCE and grads_ok, "max_abs_error": error, "grad_relative_errors": grad_errors,
            "grads_ok": grads_ok, "benchmark": True, "runtime_version": torch.backends.cudnn.version()}


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


def cudnn_attention(torch) -> dict:
    """Upstream's smoke test_sdpa on CUDA (fp16 q/k/v 1x16x77x64, float mask, no NaN): the regression test for
    pytorch#167602 (cuDNN's runtime-compiled engines need libnvrtc-builtins). Where torch runs cuDNN attention by
    default, it is forced, so that path really runs (elsewhere torch picks another backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    functional = torch.nn.functional
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 16, 77, 64, dtype=torch.float16, device="cuda") for _ in range(3))
    mask = torch.randn(1, 1, 77, 77, dtype=torch.float16, device="cuda")
    reference = functional.scaled_dot_product_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(),
                                                        attn_mask=mask.float().cpu())
    cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    forced = cudnn_attention_forced(torch.cuda.get_device_capability(), cudnn_version)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if forced else contextlib.nullcontext():
        output = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.cuda.synchronize()
    no_nan = not bool(output.isnan().any())
    error = relative_error(torch, output, reference.double())
    return {"ok": no_nan and error < CUDNN_TOLERANCE, "no_nan": no_nan, "relative_error": error,
            "cudnn_forced": forced, "cudnn_version": cudnn_version}


def fp16_grad_scaler(torch) -> dict:
    return train_steps(torch, "cuda", torch.float16, scaler=torch.amp.GradScaler("cuda"))


def bf16_on_gpu(torch) -> dict:
    capability = torch.cuda.get_device_capability(0)
    try:
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch older than the including_emulation argument
        supported = capability >= (8, 0)
    if not supported:
        return {"ok": True, "supported": False, "capability": list(capability),
                "reason": f"{torch.cuda.get_device_name(0)} is sm_{capability[0]}{capability[1]}: bf16 needs "
                          "compute capability 8.0+ (it would be emulated)"}
    result = train_steps(torch, "cuda", torch.bfloat16)
    result.update({"supported": True, "capability": list(capability)})
    return result


def bf16_matmul_throughput(torch, size: int = 8192, repeats: int = 20) -> dict:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"ok": True, "size": size, "repeats": repeats, "tflops": round(2 * size**3 * repeats / seconds / 1e12, 1)}


def multi_gpu_facts(torch) -> dict:
    """Tensors on each device, peer copies, and an NCCL all-reduce across all of them."""
    count = cuda_device_count(torch)
    tensors = [torch.full((1 << 20,), float(i + 1), device=f"cuda:{i}") for i in range(count)]
    peers, copies_ok = {}, True
    for i in range(count):
        for j in range(count):
            if i != j:
                peers[f"{i}->{j}"] = bool(torch.cuda.can_device_access_peer(i, j))
                copies_ok &= bool(torch.equal(tensors[i].to(f"cuda:{j}").cpu(), tensors[i].cpu()))
    torch.cuda.nccl.all_reduce(tensors)
    expected = float(sum(range(1, count + 1)))
    reduced_ok = all(bool((t == expected).all()) for t in tensors)
    facts = {"ok": copies_ok and reduced_ok, "devices": count, "peer_access": peers, "peer_copies_ok": copies_ok,
             "all_reduce_ok": reduced_ok, "nccl_version": _nccl_version(torch)}
    if reduced_ok:  # its speed, judged against the topology's floor (checks/gpu_speed.py)
        facts["bandwidth"] = section(gpu_speed.all_reduce_bus_bandwidth, torch, count)
    return facts


def multi_gpu_in_subprocess() -> dict:
    """NCCL can hang; a separate process with a timeout keeps the rest of the facts."""
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--part", "multi-gpu"],
                              capture_output=True, text=True, timeout=bound(MULTI_GPU_TIMEOUT_S), check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"peer copies / NCCL all-reduce did not finish in {bound(MULTI_GPU_TIMEOUT_S)}s"}
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"ok": False, "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}


def cuda_device_count(torch) -> int:
    """CUDA's own count of the devices this process can use, for a torch whose CUDA is available. torch.cuda.
    device_count() asks CUDA only once torch has initialised it: before, it answers NVML's count of physical GPUs
    (torch/cuda/__init__.py: `_device_count_nvml` until `_initialized`), and MIG devices are not NVML devices, so on a
    node with MIG on two GPUs it says 2 where CUDA has 1 and get_device_properties(1) raises "Invalid device id"
    (pytorch#130181). torch.cuda.init() initialises torch's CUDA state without making a context on any GPU."""
    torch.cuda.init()
    return torch.cuda.device_count()


def nvml_device_count(torch) -> int | None:
    """What torch.cuda.device_count() answers before CUDA is initialised: NVML's count (-1 where NVML fails, and torch
    then asks CUDA); None where this torch has no such function. Recorded, as the number that tells MIG nodes apart."""
    count_nvml = getattr(torch.cuda, "_device_count_nvml", None)
    try:
        return int(count_nvml()) if count_nvml else None
    except Exception:  # noqa: BLE001 - a private function: any failure means "not known", not a broken image
        return None


def cuda_availability(torch) -> dict:
    """The process's first CUDA call: torch warns why CUDA cannot start ("CUDA initialization: ...") only once, there
    (c10::cuda::device_count's static initialiser), so it must run under a warnings recorder."""
    init_error = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nvml_count = nvml_device_count(torch)  # before torch initialises CUDA, as device_count() would answer it
        available = bool(torch.cuda.is_available())
        try:
            count = cuda_device_count(torch) if available else 0
        except Exception as error:  # noqa: BLE001 - CUDA answered a count, then torch could not start it: say why
            available, count, init_error = False, 0, f"torch.cuda.init() failed: {type(error).__name__}: {error}"
    return {"available": available, "device_count": count, "nvml_device_count": nvml_count,
            "warnings": [str(w.message) for w in caught] + ([init_error] if init_error else [])}


def gpu_facts(torch, flags: list[str], throughput: bool = False, availability: dict | None = None,
              host: dict | None = None, multi_gpu: dict | None = None) -> dict:
    """What torch does with the GPUs it sees; `availability`, `host` and `multi_gpu` when the caller already has
    them (the first CUDA call, nvidia-smi's view, a multi-GPU run done before this process made its contexts)."""
    availability = availability or cuda_availability(torch)
    facts = {"ok": True, **availability, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             **(host or driver_facts())}
    facts["unusable"] = compute_mode_limits(facts).unusable or mig_without_devices_reason(facts)
    if not facts["available"] or facts["unusable"]:
        return facts
    count = facts["device_count"]
    facts["devices"] = [device_facts(torch, index, flags) for index in range(count)]
    mig_reason = mig_multi_gpu_reason(count, facts, [device["name"] for device in facts["devices"]])
    facts["cudnn"] = section(cudnn_conv, torch)
    facts["cudnn_attention"] = section(cudnn_attention, torch)
    facts["amp_fp16"] = section(fp16_grad_scaler, torch)
    facts["amp_bf16"] = section(bf16_on_gpu, torch)
    if throughput and facts["amp_bf16"].get("supported"):
        facts["bf16_matmul"] = section(bf16_matmul_throughput, torch)
    if throughput:
        facts["copy_bandwidth"] = section(gpu_speed.pinned_copy_bandwidth, torch)
    if count < 2:
        facts["multi_gpu"] = {"ok": True, "skipped": f"{count} GPU visible"}
    elif mig_reason:
        facts["multi_gpu"] = {"ok": True, "skipped": mig_reason}
    else:
        facts["multi_gpu"] = multi_gpu or multi_gpu_in_subprocess()
    return facts


# ---------------------------------------------------------------- devel: a torch extension

CPP_SOURCE = """#include <torch/extension.h>
torch::Tensor add_one(torch::Tensor x) { return x + 1; }
"""
CUDA_DECLARATION = "torch::Tensor add_one_cuda(torch::Tensor x);\n"
# The kernel for every arch of the row, and its launcher in torch's types for the host. nvcc reads a .cu once per
# arch for the device code (with __CUDA_ARCH__ set) and once for the host's: the torch headers only in the host's
# pass, as extensions that keep their kernels apart from torch's types do, make this build 31 s instead of 104 s
# (six arches, CUDA 13.0 devel image, two cores), and every arch's device code is still compiled; on an H100 the
# kernel ran with the right result (docs/gpu-validation.md).
CUDA_SOURCE = r"""#include <cstdint>
__global__ void add_one_kernel(float* x, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
#ifndef __CUDA_ARCH__
#include <torch/types.h>
torch::Tensor add_one_cuda(torch::Tensor x) {
    auto y = x.contiguous().clone();
    int64_t n = y.numel();
    add_one_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), n);
    return y;
}
#endif
"""


def extension_sources(with_cuda: bool) -> dict[str, str]:
    """file name -> source of the probe's extension: its C++ binding, and its CUDA kernel on GPU rows."""
    functions = ["add_one"] + (["add_one_cuda"] if with_cuda else [])
    module = "".join(f'    m.def("{name}", &{name});\n' for name in functions)
    binding = (CPP_SOURCE + (CUDA_DECLARATION if with_cuda else "")
               + f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{module}}}\n")
    return {"binding.cpp": binding, **({"kernel.cu": CUDA_SOURCE} if with_cuda else {})}


def build_extension(torch, with_cuda: bool, arch_list: list[str], skip_gpu: str = "") -> dict:
    """Compile, link and load a small extension the way users do (torch.utils.cpp_extension): C++ on CPU rows, CUDA
    for every arch of the row on GPU rows (no GPU needed); run its CPU function, and its kernel where a GPU is
    visible."""
    from torch.utils.cpp_extension import load

    if with_cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_list)
    build_dir = tempfile.mkdtemp(prefix="torchimages-extension-")
    sources = []
    for name, text in extension_sources(with_cuda).items():
        path = os.path.join(build_dir, name)
        with open(path, "w", encoding="utf-8") as source:
            source.write(text)
        sources.append(path)
    module = load(name="torchimages_probe_extension", sources=sources, build_directory=build_dir,
                  extra_cflags=["-O0"], verbose=False)
    cpu_ok = bool(torch.equal(module.add_one(torch.zeros(4)), torch.ones(4)))
    facts = {"ok": cpu_ok, "compiled": True, "language": "CUDA" if with_cuda else "C++", "cpu_ok": cpu_ok,
             "arch_list": arch_list if with_cuda else [], "cuda_ran": False}
    if with_cuda and skip_gpu:
        facts["cuda_skipped"] = skip_gpu
    elif with_cuda and torch.cuda.is_available():
        result = module.add_one_cuda(torch.zeros(1000, device="cuda"))
        torch.cuda.synchronize()
        facts["cuda_ran"] = True
        facts["cuda_ok"] = bool(torch.equal(result.cpu(), torch.ones(1000)))
        facts["ok"] = cpu_ok and facts["cuda_ok"]
    return facts


# ---------------------------------------------------------------- smoke: the assertions of PyTorch's own smoke test
# After pytorch/pytorch .ci/pytorch/smoke_test/smoke_test.py (--package torchonly), in our own code and with the
# results compared to expected values. Each assertion is its own section: one failure does not hide the others.

SMOKE_DTYPES = ("float16", "float32", "float64")
# Largest error relative to the result's magnitude, against the CPU's float32 result. float32 convolutions on GPUs
# may use TF32 (10-bit mantissa), as cuDNN does by default.
CONV_TOLERANCE = {"float16": 2e-2, "float32": 5e-3, "float64": 5e-3}


def gpu_devices(torch) -> list[str]:
    """The CUDA devices to run the smoke test on; none where CUDA cannot start. Under PYTORCH_NVML_BASED_CUDA_CHECK=1
    is_available() answers NVML's count without asking CUDA, and torch.cuda.init() then raises (torch/cuda/__init__.py
    is_available, _lazy_init): cuda_availability records why, the smoke test runs on the CPU."""
    if not torch.cuda.is_available():
        return []
    try:
        return [f"cuda:{index}" for index in range(cuda_device_count(torch))]
    except Exception:  # noqa: BLE001 - whatever torch.cuda.init() raises, CUDA did not start
        return []


def openmp_facts(torch) -> dict:
    return {"ok": bool(torch.backends.openmp.is_available()), "parallel_info": torch.__config__.parallel_info()[-1500:]}


def relative_error(torch, result, reference) -> float:
    return float((result.detach().cpu().double() - reference).abs().max() / reference.abs().max().clamp_min(1e-12))


def conv2d_on(torch, device: str) -> dict:
    """A conv of ones sums each 3x3 window; upstream's conv (non-square kernel, stride, padding, dilation) gives the
    right shape, finite on the CPU; on a GPU it matches the CPU in float16/32/64 and runs under autocast."""
    functional = torch.nn.functional
    windows = functional.conv2d(torch.ones(1, 1, 4, 4, device=device), torch.ones(1, 1, 3, 3, device=device))
    facts = {"window_sums": windows.flatten().tolist()}
    torch.manual_seed(0)
    x, weight, bias = torch.randn(20, 16, 50, 100), torch.randn(33, 16, 3, 5), torch.randn(33)
    shape = {"stride": (2, 1), "padding": (4, 2), "dilation": (3, 1)}
    reference = functional.conv2d(x, weight, bias, **shape).double()
    errors = {}
    for name in (SMOKE_DTYPES if device != "cpu" else ()):
        dtype = getattr(torch, name)
        output = functional.conv2d(x.to(device, dtype), weight.to(device, dtype), bias.to(device, dtype), **shape)
        errors[name] = relative_error(torch, output, reference) if output.shape == reference.shape else float("inf")
    facts.update({"shape": list(reference.shape), "finite": bool(torch.isfinite(reference).all()),
                  "relative_errors": errors})
    facts["ok"] = (facts["window_sums"] == [9.0] * 4 and facts["shape"] == [20, 33, 26, 100] and facts["finite"]
                   and all(error <= CONV_TOLERANCE[name] for name, error in errors.items()))
    if device != "cpu":
        with torch.autocast("cuda"):
            autocast_dtype = str(torch.nn.Conv2d(3, 3, 3).to(device)(torch.randn(1, 3, 24, 24, device=device)).dtype)
        facts["autocast_dtype"] = autocast_dtype
        facts["ok"] = facts["ok"] and autocast_dtype == "torch.float16"
    return facts


def linalg_on(torch, device: str) -> dict:
    """A 2x2 solve and determinant with known answers, and upstream's SVDs (reduced, full, batched; on a GPU also
    its 20x16 batch of 50x100 matrices) with the right shapes that reconstruct their input; float32 on the CPU,
    float32 and float64 on a GPU."""
    system = torch.tensor([[3.0, 1.0], [1.0, 2.0]], device=device)
    solution = torch.linalg.solve(system, torch.tensor([9.0, 8.0], device=device)).cpu().tolist()
    determinant = float(torch.linalg.det(system))
    ok = all(abs(a - b) < 1e-5 for a, b in zip(solution, (2.0, 3.0), strict=False)) and abs(determinant - 5.0) < 1e-5
    reconstruction = {}
    for name in (("float32", "float64") if device != "cpu" else ("float32",)):
        dtype = getattr(torch, name)
        a = torch.randn(5, 3, device=device, dtype=dtype)
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        full_u, _, _ = torch.linalg.svd(a)
        ok &= (tuple(u.shape), tuple(s.shape), tuple(vh.shape), tuple(full_u.shape)) == ((5, 3), (3,), (3, 3), (5, 5))
        batches = [a.unsqueeze(0), torch.randn(7, 5, 3, device=device, dtype=dtype)]
        if device != "cpu":
            batches.append(torch.randn(20, 16, 50, 100, device=device, dtype=dtype))
        reconstruction[name] = max(_svd_reconstruction_error(torch, batch) for batch in batches)
        ok &= reconstruction[name] < 1e-4
    return {"ok": bool(ok), "solve": solution, "det": determinant, "svd_reconstruction_error": reconstruction}


def _svd_reconstruction_error(torch, batch) -> float:
    u, s, vh = torch.linalg.svd(batch, full_matrices=False)
    return float(torch.linalg.matrix_norm(batch - u @ torch.diag_embed(s) @ vh).max()
                 / torch.linalg.matrix_norm(batch).min())


def numpy_interop(torch) -> dict:
    """torch.from_numpy shares the array's memory, .numpy() gives the values back, torch.tensor copies an array."""
    import numpy

    array = numpy.arange(5, dtype=numpy.float32)
    shared = torch.from_numpy(array)
    array[0] = 42.0
    back = torch.arange(5, dtype=torch.float64).numpy()
    copied = torch.tensor(numpy.arange(5))
    return {"ok": float(shared[0]) == 42.0 and back.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
            and copied.tolist() == [0, 1, 2, 3, 4] and copied.dtype == torch.int64,
            "numpy_version": numpy.__version__, "shares_memory": float(shared[0]) == 42.0}


def cpu_capability(torch) -> dict:
    """The ISA ATen's CPU kernels dispatch to: on x86_64 a vectorized one (AVX2, AVX512), not DEFAULT."""
    import platform

    capability, machine = torch.backends.cpu.get_cpu_capability(), platform.machine()
    return {"ok": machine != "x86_64" or capability not in ("DEFAULT", "NO AVX"), "capability": capability,
            "machine": machine}


def smoke_eager(torch) -> dict:
    """The smoke test's parts that need no compiler, run in the probe's own process, beside the compiles."""
    facts = {"openmp": section(openmp_facts, torch), "numpy": section(numpy_interop, torch),
             "cpu_capability": section(cpu_capability, torch), "devices": {}}
    for device in ["cpu", *gpu_devices(torch)]:
        facts["devices"][device] = {"conv2d": section(conv2d_on, torch, device), "linalg": section(linalg_on, torch, device)}
    if torch.version.cuda:
        facts["cuda_wheels"] = section(cuda_wheel_versions, torch)
    return facts


def cuda_wheel_versions(torch) -> dict:
    """The cuDNN torch loads is the one it was compiled against, and cuDNN and NCCL are the nvidia-* wheels' versions
    (no GPU needed: the libraries load without one)."""
    from importlib import metadata

    wheels = {dist.metadata["Name"].lower(): dist.version for dist in metadata.distributions() if dist.metadata["Name"]}
    cudnn_wheel = next((f"{name} {version}" for name, version in sorted(wheels.items())
                        if name.startswith("nvidia-cudnn")), None)
    nccl_wheel = next((f"{name} {version}" for name, version in sorted(wheels.items())
                       if name.startswith("nvidia-nccl")), None)
    runtime = decode_cudnn_version(torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    compiled = tuple(torch._C._cudnn.getCompileVersion()) if hasattr(torch._C, "_cudnn") else None
    return {"cudnn_runtime": list(runtime) if runtime else None, "cudnn_compiled": list(compiled) if compiled else None,
            "cudnn_wheel": cudnn_wheel, "nccl": _nccl_version(torch), "nccl_wheel": nccl_wheel}


def compile_matches_eager(torch, device: str) -> dict:
    """torch.compile of sin(x) + cos(x) gives eager's result in float16, float32 and float64."""
    def sin_plus_cos(x):
        return torch.sin(x) + torch.cos(x)

    outcomes = {}
    for name in SMOKE_DTYPES:
        x = torch.rand(3, 3, device=device).to(getattr(torch, name))
        try:
            torch.testing.assert_close(torch.compile(sin_plus_cos)(x), sin_plus_cos(x))
            outcomes[name] = "ok"
        except Exception as error:  # noqa: BLE001 - each dtype's outcome is a fact
            outcomes[name] = f"{type(error).__name__}: {error}"[-1500:]
    return {"ok": all(outcome == "ok" for outcome in outcomes.values()), "dtypes": outcomes}


def vectorized_isa(torch) -> dict:
    """Inductor's pick of a vector ISA for CPU kernels: it compiles a probe program, so it needs a working compiler."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # torch before 2.5
        from torch._inductor.codecache import pick_vec_isa
    isa = pick_vec_isa()
    return {"ok": bool(isa), "isa": str(isa) if isa else None, "bit_width": isa.bit_width() if isa else 0}


def max_autotune_compile(torch, device: str) -> dict:
    """Upstream's small conv net compiled with mode="max-autotune" runs and agrees with eager."""
    nn = torch.nn
    torch._dynamo.reset()  # a new mode: start from no compiled code, as upstream does
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(9216, 1)).to(device)
    x = torch.rand(64, 1, 28, 28, device=device)
    compiled = torch.compile(model, mode="max-autotune")(x)
    error = relative_error(torch, compiled, model(x).detach().double().cpu())
    return {"ok": error < 1e-2, "relative_error": error}


def smoke_compiles(torch, skip_gpu: str = "") -> dict:
    """The smoke test's compiles on the CPU and on cuda:0, as upstream's smoke_test_compile does (one GPU: a cold
    max-autotune per GPU would outlast any budget on an 8-GPU node). Runs in a forked child that finds its own GPUs;
    `skip_gpu` says why the GPU part must not run (a GPU in an exclusive compute mode)."""
    facts: dict[str, typing.Any] = {"devices": {}}
    gpus = gpu_devices(torch)[:1]
    if gpus and skip_gpu:
        facts["gpu_skipped"], gpus = skip_gpu, []
    try:
        for device in ["cpu", *gpus]:
            facts["devices"][device] = {"compile": section(compile_matches_eager, torch, device)}
            if device == "cpu":
                facts["vectorized_isa"] = section(vectorized_isa, torch)
            facts["devices"][device]["max_autotune"] = section(max_autotune_compile, torch, device)
    finally:
        # The child ends with os._exit: no atexit handler would stop inductor's compile workers.
        with contextlib.suppress(Exception):  # nothing to stop where inductor did not even import
            from torch._inductor.async_compile import shutdown_compile_workers

            shutdown_compile_workers()
    return facts


def cuda_errors_reach_python(torch) -> dict:
    """A failed device-side assert surfaces as a RuntimeError naming CUDA. It poisons the CUDA context: run it last."""
    try:
        torch._assert_async(torch.tensor(0, device="cuda"))
        torch._assert_async(torch.tensor(0 + 0j, device="cuda"))
        torch.cuda.synchronize()
    except RuntimeError as error:
        return {"ok": "CUDA" in str(error), "error_seen": str(error)[-500:]}
    return {"ok": False, "error_seen": None}


def gds_errors_reach_python(torch) -> dict:
    """cuFile (GPUDirect Storage, CUDA 12.6+) loads, and its failure to register a plain file reaches Python."""
    try:
        with tempfile.NamedTemporaryFile() as file:
            torch.cuda.gds.GdsFile(file.name, os.O_CREAT | os.O_RDWR)
    except RuntimeError as error:
        return {"ok": "cuFileHandleRegister failed" in str(error), "error_seen": str(error)[-500:]}
    except (OSError, AttributeError) as error:
        # GdsFile opens with O_DIRECT first (tmpfs before Linux 6.6 and some overlays refuse it), and builds without
        # cuFile (aarch64) lack torch._C._gds_register_handle: the host or build cannot test it, the image is not wrong.
        return {"ok": True, "not_testable": f"{type(error).__name__}: {error}"[-500:]}
    return {"ok": False, "error_seen": None}


def nvshmem_built_in(torch) -> dict:
    """torch 2.9+ CUDA wheels are built with NVSHMEM."""
    try:
        from torch._C._distributed_c10d import _is_nvshmem_available
    except ImportError as error:
        return {"ok": False, "error": f"torch is not built with NVSHMEM ({error})"}
    return {"ok": True, "available_at_run_time": bool(_is_nvshmem_available())}


def smoke_gpu_errors(torch) -> dict:
    facts = {"nvshmem": section(nvshmem_built_in, torch)}
    if tuple(int(part) for part in torch.version.cuda.split(".")[:2]) >= (12, 6):
        facts["gds"] = section(gds_errors_reach_python, torch)
    facts["runtime_error"] = section(cuda_errors_reach_python, torch)
    return facts


# ---------------------------------------------------------------- distributed: torchrun, an all-reduce

class AllReduceRun:
    """`torchrun --standalone --nproc-per-node N`, as users start single-node jobs, started when the probe knows how
    many GPUs it sees, and collected at its end: it runs while the probe does its own work. 2 processes over gloo on
    the CPU; one per GPU (up to 8) over NCCL with 2+ GPUs (`all_reduce_plan`)."""

    def __init__(self, processes: int = DISTRIBUTED_PROCESSES, backend: str = "gloo"):
        self.started, self.processes = time.monotonic(), processes
        self.result_dir = tempfile.mkdtemp(prefix="torchimages-all-reduce-")
        self.log = tempfile.TemporaryFile()
        self.process: subprocess.Popen | None = None
        self.command = ["torchrun", "--standalone", "--nproc-per-node", str(processes),
                        os.path.abspath(__file__), "--part", "all-reduce", "--backend", backend,
                        "--result-dir", self.result_dir, "--slowdown", str(SLOWDOWN)]
        try:
            # Its own session: on a timeout the whole tree (launcher and workers) is killed at once.
            self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
            self.error = ""
        except OSError as error:
            self.process, self.error = None, f"{type(error).__name__}: {error}"

    def result(self) -> dict:
        facts = {"command": " ".join(self.command[:5]), "processes": self.processes, "returncode": None}
        timeout = bound(DISTRIBUTED_TIMEOUT_S)
        if self.process is not None:
            try:
                facts["returncode"] = self.process.wait(max(1.0, timeout - (time.monotonic() - self.started)))
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
                self.error = f"did not finish in {timeout}s (killed)"
        self.log.seek(0)
        ranks = []
        for name in sorted(os.listdir(self.result_dir)):
            with open(os.path.join(self.result_dir, name), encoding="utf-8") as stream:
                ranks.append(json.load(stream))
        facts.update({"ranks": ranks, "error": self.error, "output": self.log.read().decode(errors="replace")[-3000:],
                      "ok": facts["returncode"] == 0 and len(ranks) == self.processes
                      and all(rank["ok"] for rank in ranks)})
        return facts


def all_reduce_worker(result_dir: str, backend: str) -> None:
    """One torchrun process: all-reduce (sum) rank + 1 across the processes over the backend the probe chose (from
    CUDA's count, which a worker's torch.cuda.device_count() is not before CUDA starts), and write what it got."""
    import datetime

    import torch
    import torch.distributed as dist

    rank, world, local_rank = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    nccl = backend == "nccl"
    device = f"cuda:{local_rank}" if nccl else "cpu"
    if nccl:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if nccl else "gloo", timeout=datetime.timedelta(seconds=bound(DISTRIBUTED_TIMEOUT_S)))
    try:
        tensor = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        expected = world * (world + 1) / 2
        facts = {"rank": rank, "world_size": world, "backend": dist.get_backend(), "device": device,
                 "value": float(tensor[0]), "expected": expected, "ok": bool((tensor == expected).all())}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(result_dir, f"rank-{rank}.json"), "w", encoding="utf-8") as stream:
        json.dump(facts, stream)


# ---------------------------------------------------------------- the parts

# The main part's slow work, each read by one check alone: `--checks` without that check leaves it undone (and its
# facts out), which is where a selective `build.py test` saves its time.
SELECTIVE_WORK = ("smoke", "devel", "shm", "distributed")


def runs_work_of(checks: typing.AbstractSet[str] | None, check: str) -> bool:
    """Whether the main part does the work only `check` reads: always without --checks (checks None)."""
    return checks is None or check in checks


def main_facts(devel: bool, cuda_extension: bool, arch_list: list[str], budget_s: float | None = None,
               checks: typing.AbstractSet[str] | None = None) -> dict:
    facts = {"part": "main", "python": python_facts(), "os_release": os_release(), "user": user_facts(),
             "env": redacted_env(dict(os.environ)), "secret_env": secret_env_names(dict(os.environ)),
             "tools": tool_facts(), "shm": {"size_bytes": shm_size()}}
    torch, facts["torch"] = import_torch()
    with open(TORCH_IMPORTED, "w", encoding="utf-8"):
        os.chmod(TORCH_IMPORTED, 0o644)
    if torch is None:
        if runs_work_of(checks, "distributed"):
            facts["distributed"] = AllReduceRun().result()
    else:
        add_torch_facts(facts, torch, devel, cuda_extension, arch_list, budget_s, checks)
    return facts


def compile_timeout(budget_s: float | None) -> float:
    """The compile child's bound: inside the kill budget the probe was given (the container's `timeout -s KILL`),
    counted from the probe's start, so that a slow compile is reported as such and never costs every fact."""
    if budget_s is None:
        return bound(SMOKE_COMPILE_TIMEOUT_S)
    return max(1.0, budget_s - (time.monotonic() - PROBE_STARTED) - bound(BUDGET_MARGIN_S))


def distributed_processes(device_count: int) -> int:
    return min(device_count, DISTRIBUTED_MAX_PROCESSES) if device_count >= 2 else DISTRIBUTED_PROCESSES


def all_reduce_plan(device_count: int, mig_reason: str) -> tuple[int, str]:
    """torchrun's processes and backend: one per GPU over NCCL with 2+ CUDA devices, 2 over gloo otherwise, and where
    a MIG device sits beside whole GPUs (`mig_multi_gpu_reason`)."""
    if device_count >= 2 and not mig_reason:
        return distributed_processes(device_count), "nccl"
    return DISTRIBUTED_PROCESSES, "gloo"


def add_torch_facts(facts: dict, torch, devel: bool, cuda_extension: bool, arch_list: list[str],
                    budget_s: float | None = None, checks: typing.AbstractSet[str] | None = None) -> None:
    # Fork first, before anything starts CUDA or CPU thread pools: the children run beside everything below. The
    # two long ones, the smoke test's compiles and the extension build, each get a child from the start. Under an
    # exclusive compute mode a GPU takes one CUDA context at a time: the children stay off the GPUs, and torchrun's
    # ranks and the multi-GPU process run to their end before this process makes its own contexts. The work of a
    # check that is not selected (`checks`) is not started at all.
    host = driver_facts()
    limits = compute_mode_limits(host)
    skip_gpu, exclusive = limits.children_skip, limits.exclusive
    smoke = runs_work_of(checks, "smoke")
    compiles = (ChildSection("the torch.compile process", compile_timeout(budget_s), smoke_compiles, torch, skip_gpu)
                if smoke else None)
    extension = (ChildSection("the extension build", bound(EXTENSION_TIMEOUT_S), build_extension, torch, cuda_extension,
                              arch_list, skip_gpu) if devel and runs_work_of(checks, "devel") else None)
    dataloader = start_dataloader(torch) if runs_work_of(checks, "shm") else None
    facts["torch"].update(torch_versions(torch))
    availability = cuda_availability(torch)  # the first CUDA call: no context yet, and torch's warnings recorded
    mig_reason = mig_multi_gpu_reason(availability["device_count"], host)
    all_reduce = (AllReduceRun(*all_reduce_plan(availability["device_count"], mig_reason))
                  if runs_work_of(checks, "distributed") else None)
    multi_gpu = None
    if exclusive:
        if all_reduce:
            facts["distributed"] = all_reduce.result()
        multi_gpu = multi_gpu_in_subprocess() if availability["device_count"] >= 2 and not mig_reason else None
    facts["amp_cpu"] = section(cpu_bf16_autocast, torch)
    if smoke:
        facts["smoke"] = smoke_eager(torch)
    facts["gpu"] = section(gpu_facts, torch, facts["torch"]["arch_flags"], True, availability, host, multi_gpu)
    if dataloader:
        facts["shm"]["dataloader"] = dataloader_facts(dataloader)
    if extension:
        facts["extension"] = extension.result()
    if compiles:
        facts["smoke"]["compiles"] = compiles.result()
        if gpu_devices(torch):  # its device-side assert poisons the CUDA context: the last GPU work
            facts["smoke"]["gpu_errors"] = section(smoke_gpu_errors, torch)
    if all_reduce and not exclusive:
        facts["distributed"] = all_reduce.result()
    facts["libraries_loaded"] = loaded_libraries()


def smoke_facts() -> dict:
    """The smoke test's assertions alone, one after the other in this process, as upstream runs them."""
    torch, facts = import_torch()
    if torch is None:
        return {"part": "smoke", "torch": facts}
    smoke = smoke_eager(torch)
    smoke["compiles"] = section(smoke_compiles, torch)
    if gpu_devices(torch):
        smoke["gpu_errors"] = section(smoke_gpu_errors, torch)
    return {"part": "smoke", "torch": facts, "smoke": smoke}


def record_gpu_facts(torch, flags: list[str]) -> dict:
    """gpu_facts with the bf16 throughput, for the record: under an exclusive compute mode the multi-GPU process runs
    to its end before this process makes its own contexts (it would find every GPU busy after)."""
    host = driver_facts()
    availability = cuda_availability(torch)
    exclusive = compute_mode_limits(host).exclusive
    count = availability["device_count"]
    multi_gpu = (multi_gpu_in_subprocess() if exclusive and count >= 2 and not mig_multi_gpu_reason(count, host)
                 else None)
    return gpu_facts(torch, flags, True, availability, host, multi_gpu)


# nvidia-smi's per-GPU fields a record keeps, as printed: what a lane host (tests/gpu_hosts/*.yaml) lists per GPU.
RECORD_QUERY_FIELDS = "name,uuid,compute_cap,driver_version,compute_mode,mig.mode.current"


def record_host_facts() -> dict:
    """The host's raw answers a record keeps, so that it replays as a lane host: nvidia-smi's -L and per-GPU query as
    it printed them, /proc/driver/nvidia/version, the CPU architecture and how the GPUs were selected."""
    import platform

    facts: dict[str, typing.Any] = {"machine": platform.machine(), "hostname": platform.node(),
             "proc_driver_version": None,
             "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    with contextlib.suppress(OSError):
        with open(NVIDIA_DRIVER_PROC, encoding="utf-8") as stream:
            facts["proc_driver_version"] = stream.read().strip()
    smi = shutil.which("nvidia-smi")
    if smi:
        facts["nvidia_smi_list"] = run_tool([smi, "-L"])
        facts["nvidia_smi_query"] = run_tool([smi, f"--query-gpu={RECORD_QUERY_FIELDS}", "--format=csv,noheader"])
    return facts


def gpu_only_facts(budget_s: float | None = None) -> dict:
    """For a GPU host's own torch (docs/gpu-validation.md): the host's raw answers, the GPU facts, then the smoke test
    on each GPU. The compiles run in a child forked before any CUDA call, bounded inside `budget_s` (the record's
    kill timeout) as in the main part, so that a slow max-autotune is reported rather than costing every fact."""
    torch, facts = import_torch()
    host = record_host_facts()
    if torch is None:
        return {"part": "gpu-only", "torch": facts, "host": host}
    skip_gpu = compute_mode_limits(driver_facts()).children_skip
    compiles = ChildSection("the torch.compile process", compile_timeout(budget_s), smoke_compiles, torch, skip_gpu)
    facts.update(torch_versions(torch))
    result = {"part": "gpu-only", "torch": facts, "host": host,
              "gpu": section(record_gpu_facts, torch, facts["arch_flags"])}
    smoke = smoke_eager(torch)
    smoke["compiles"] = compiles.result()
    if gpu_devices(torch):
        smoke["gpu_errors"] = section(smoke_gpu_errors, torch)
    result.update({"smoke": smoke, "libraries_loaded": loaded_libraries()})
    return result


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("main", "files", "import", "smoke", "multi-gpu", "all-reduce"), default="main")
    parser.add_argument("--devel", action="store_true", help="also compile and run a torch extension")
    parser.add_argument("--cuda-extension", action="store_true", help="make that extension a CUDA one")
    parser.add_argument("--arch-list", default="", help="the row's TORCH_CUDA_ARCH_LIST for the CUDA extension")
    parser.add_argument("--wheel", help="the import part: pip install --user this wheel and import it")
    parser.add_argument("--after-main", action="store_true",
                        help="the import part: start once the main part imported torch (it leaves bytecode behind)")
    parser.add_argument("--result-dir", help="the all-reduce part: where each process writes its result")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="the all-reduce part: the process group's backend, as the main part chose it")
    parser.add_argument("--gpu-only", action="store_true", help="only the GPU facts, with a bf16 matmul throughput figure")
    parser.add_argument("--package-caches", default="", help="the files part: the OS family's caches, ';'-separated")
    parser.add_argument("--budget-s", type=float,
                        help="the main part and --gpu-only: seconds until the probe is killed (its compiles end before)")
    parser.add_argument("--slowdown", type=float, default=1,
                        help="multiply the probe's own time bounds by this (the image runs under emulation)")
    parser.add_argument("--checks", type=lambda text: frozenset(text.split(",")),
                        help="the main part: the checks to gather facts for, ','-separated (default: every check); the "
                             f"work only an unnamed check reads ({', '.join(SELECTIVE_WORK)}) is not done")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global SLOWDOWN
    arguments = parse_arguments(argv)
    SLOWDOWN = arguments.slowdown
    if arguments.part == "all-reduce":
        all_reduce_worker(arguments.result_dir, arguments.backend)
        return 0
    # Keep stdout for the JSON document: whatever torch, compilers or workers print goes to stderr.
    json_out = os.dup(1)
    os.dup2(2, 1)
    started = time.monotonic()
    try:
        facts = gathered_facts(arguments)
    except Exception as error:  # noqa: BLE001 - the report is printed whatever happened, naming what stopped it
        facts = {"part": "gpu-only" if arguments.gpu_only else arguments.part,
                 "probe_error": f"the probe stopped: {type(error).__name__}: {error}",
                 "traceback": traceback.format_exc(limit=-3)[-2000:]}
    facts.update({"probe_version": PROBE_VERSION, "probe_seconds": round(time.monotonic() - started, 3)})
    sys.stdout.flush()
    with os.fdopen(json_out, "w") as stream:
        json.dump(facts, stream, default=str)
        stream.write("\n")
    return 0


def gathered_facts(arguments: argparse.Namespace) -> dict:
    """The facts of the part the arguments name."""
    if arguments.gpu_only:
        facts = gpu_only_facts(arguments.budget_s)
    elif arguments.part == "files":
        facts = files_facts([path for path in arguments.package_caches.split(";") if path])
    elif arguments.part == "import":
        facts = import_facts(arguments.wheel, arguments.after_main)
    elif arguments.part == "smoke":
        facts = smoke_facts()
    elif arguments.part == "multi-gpu":
        import torch

        facts = section(multi_gpu_facts, torch)
    else:
        arch_list = [entry for entry in arguments.arch_list.split(";") if entry]
        facts = main_facts(arguments.devel, arguments.cuda_extension, arch_list, arguments.budget_s, arguments.checks)
    return facts


if __name__ == "__main__":
    sys.exit(main())
