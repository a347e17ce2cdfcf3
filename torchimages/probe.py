#!/usr/bin/env python3
"""The in-container probe: computes every fact the image checks assert on, once, as one JSON document.

It is copied into the container and run with the image's own Python, so it needs only the standard library
and torch (imported lazily: the pure helpers below are also imported on the host by the check suites).

    python probe.py                      # main part, as the image's user: versions, torch, shm, AMP, GPU, libraries
    python probe.py --part files         # as root: CUDA library copies, package caches, credential files
    python probe.py --part import        # as an arbitrary uid: can torch be imported, is HOME writable
    python probe.py --gpu-only           # on any GPU host with torch: visibility, arch coverage, cuDNN, AMP, bf16 speed

The JSON document goes to stdout; everything libraries print goes to stderr, so stdout is always parseable.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

PROBE_VERSION = 1
# A DataLoader test only means something when more than Docker's 64 MB default /dev/shm is in flight.
DATALOADER_WORKERS = 4
DATALOADER_ITEM_MB = 16
DATALOADER_ITEMS = 12
DATALOADER_TIMEOUT_S = 90
MULTI_GPU_TIMEOUT_S = 120
TOOL_TIMEOUT_S = 30

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


def arch_flags_for(arch_list: list[str]) -> list[str]:
    """A TORCH_CUDA_ARCH_LIST (["7.5", "12.0+PTX"]) -> what torch.cuda.get_arch_list() reports for it."""
    flags = []
    for entry in arch_list:
        number = entry.removesuffix("+PTX").replace(".", "")
        flags.append(f"sm_{number}")
        if entry.endswith("+PTX"):
            flags.append(f"compute_{number}")
    return flags


def _flag_capability(flag: str) -> tuple[int, int]:
    digits = flag.split("_", 1)[1].rstrip("af")  # sm_90a / sm_100f are arch-specific variants of sm_90 / sm_100
    return int(digits[:-1]), int(digits[-1])


def arch_covers(flags: list[str], capability: tuple[int, int]) -> str | None:
    """How a device is covered: a cubin of the same major with minor <= the device's, or PTX at or below it."""
    major, minor = capability
    cubins = [f for f in flags if f.startswith("sm_") and _flag_capability(f)[0] == major and _flag_capability(f)[1] <= minor]
    if cubins:
        return f"cubin {max(cubins, key=_flag_capability)}"
    ptx = [f for f in flags if f.startswith("compute_") and _flag_capability(f) <= capability]
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
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    return {"ok": done.returncode == 0, "returncode": done.returncode, "output": (done.stdout + done.stderr)[-4000:]}


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


def tool_facts() -> dict:
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
    nvcc_facts = {"path": nvcc}
    if nvcc:
        nvcc_facts.update(run_tool([nvcc, "--version"]))
        nvcc_facts["release"] = nvcc_release(nvcc_facts.get("output", ""))
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    compiler_facts = {"path": compiler}
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
    found, seen_roots = [], set()
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


def package_caches(homes: list[str]) -> list[dict]:
    candidates = [os.path.join(home, ".cache", "pip") for home in homes]
    candidates += [p for p in (os.environ.get("PIP_CACHE_DIR"), "/var/cache/pip") if p]
    leftovers = [{"path": p, "bytes": directory_bytes(p), "kind": "pip cache"}
                 for p in sorted(set(candidates)) if os.path.isdir(p) and os.listdir(p)]
    apt_lists = "/var/lib/apt/lists"
    if os.path.isdir(apt_lists):
        entries = [n for n in os.listdir(apt_lists) if n not in ("lock", "partial", "auxfiles")]
        if entries:
            leftovers.append({"path": apt_lists, "bytes": directory_bytes(apt_lists), "kind": "apt lists",
                              "files": len(entries)})
    archives = "/var/cache/apt/archives"
    if os.path.isdir(archives) and any(n.endswith(".deb") for n in os.listdir(archives)):
        leftovers.append({"path": archives, "bytes": directory_bytes(archives), "kind": "apt package archive"})
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


def files_facts() -> dict:
    homes = home_directories()
    return {"part": "files", "uid": os.getuid(), "homes": homes,
            "library_copies": group_library_copies(library_files()),
            "package_caches": package_caches(homes), "credential_files": credential_files(homes)}


# ---------------------------------------------------------------- the import part (runs as an arbitrary uid)

def import_facts() -> dict:
    facts = {"part": "import", "user": user_facts()}
    try:
        import torch

        facts["torch_ok"] = bool(torch.ones(2).sum().item() == 2)
        facts["torch_error"] = ""
    except BaseException as error:  # noqa: BLE001
        facts["torch_ok"], facts["torch_error"] = False, f"{type(error).__name__}: {error}"
    return facts


# ---------------------------------------------------------------- torch facts

def import_torch() -> tuple[object | None, dict]:
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch
        except BaseException as error:  # noqa: BLE001
            return None, {"importable": False, "error": f"{type(error).__name__}: {error}",
                          "traceback": traceback.format_exc(limit=-3)[-2000:]}
    return torch, {"importable": True, "import_seconds": round(time.monotonic() - started, 3),
                   "import_warnings": [str(w.message) for w in caught]}


def torch_versions(torch) -> dict:
    cudnn = torch.backends.cudnn
    try:
        compile_version = torch._C._cudnn.getCompileVersion() if hasattr(torch._C, "_cudnn") else None
    except RuntimeError:
        compile_version = None
    facts = {
        "version": torch.__version__, "cuda": torch.version.cuda, "git_version": getattr(torch.version, "git_version", ""),
        "location": os.path.dirname(torch.__file__), "arch_flags": compiled_arch_flags(torch),
        "cudnn_available": bool(cudnn.is_available()), "cudnn_version": cudnn.version() if cudnn.is_available() else None,
        "cudnn_compile_version": list(compile_version) if compile_version else None,
        "nccl_version": _nccl_version(torch),
    }
    try:
        import torchvision

        facts["torchvision"] = {"version": torchvision.__version__, "error": ""}
    except ModuleNotFoundError:
        facts["torchvision"] = None
    except BaseException as error:  # noqa: BLE001 - installed but broken is a fact too
        facts["torchvision"] = {"version": None, "error": f"{type(error).__name__}: {error}"}
    return facts


def compiled_arch_flags(torch) -> list[str]:
    """What torch.cuda.get_arch_list() reports, read where it works without a GPU (it returns [] there)."""
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


def _dataloader_in_child(torch, connection) -> None:
    from torch.utils.data import DataLoader

    try:
        loader = DataLoader(_BigItems(torch, DATALOADER_ITEMS, DATALOADER_ITEM_MB), batch_size=1,
                            num_workers=DATALOADER_WORKERS, prefetch_factor=2, timeout=DATALOADER_TIMEOUT_S)
        held, peak = [], 0
        for index, batch in enumerate(loader):
            if float(batch[0, -1]) != float(index):
                raise ValueError(f"batch {index} arrived with the wrong contents")
            held.append(batch)  # keep them: the shared-memory segments stay allocated, as in a real input pipeline
            peak = max(peak, sum(b.numel() * 4 for b in held))
        connection.send({"ok": True, "batches": len(held), "peak_bytes_in_shm": peak})
    except BaseException as error:  # noqa: BLE001
        connection.send({"ok": False, "error": last_error_line(error), "details": str(error)[-3000:]})
    finally:
        connection.close()


def dataloader_with_workers(torch) -> dict:
    """Run the loader in a forked child: a bus error or a hang kills the child, not the probe."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_dataloader_in_child, args=(torch, sender), daemon=False)
    child.start()
    sender.close()
    result = receiver.recv() if receiver.poll(DATALOADER_TIMEOUT_S + 10) else None
    child.join(10)
    if child.is_alive():
        child.kill()
        child.join()
    if result is None:
        exit_code = child.exitcode
        how = f"was killed by signal {-exit_code}" if exit_code and exit_code < 0 else f"exited with code {exit_code}"
        result = {"ok": False, "error": f"the DataLoader process {how} without a result"
                  + (" (timed out)" if exit_code is None or exit_code == -9 else "")}
    result.update({"workers": DATALOADER_WORKERS, "item_bytes": DATALOADER_ITEM_MB * 2**20, "items": DATALOADER_ITEMS})
    return result


# ---------------------------------------------------------------- GPU facts

def driver_facts() -> dict:
    facts = {"driver_version": None, "nvidia_smi_gpus": None}
    smi = shutil.which("nvidia-smi")
    facts["nvidia_smi"] = smi
    if smi:
        listing = run_tool([smi, "-L"])
        if listing.get("ok"):
            facts["nvidia_smi_gpus"] = [line for line in listing["output"].splitlines() if line.startswith("GPU ")]
        query = run_tool([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
        if query.get("ok") and query["output"].strip():
            facts["driver_version"] = query["output"].split()[0]
    if facts["driver_version"] is None:
        try:
            with open("/proc/driver/nvidia/version", encoding="utf-8") as stream:
                match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", stream.read())
            facts["driver_version"] = match.group(1) if match else None
        except OSError:
            pass
    return facts


def device_facts(torch, index: int, flags: list[str]) -> dict:
    properties = torch.cuda.get_device_properties(index)
    capability = [properties.major, properties.minor]
    facts = {"index": index, "name": properties.name, "capability": capability,
             "uuid": str(getattr(properties, "uuid", "")), "total_memory": properties.total_memory,
             "covered_by": arch_covers(flags, tuple(capability))}
    try:
        device = f"cuda:{index}"
        a = torch.randn(256, 256)
        on_device = (a.to(device) @ a.to(device)).cpu()
        torch.cuda.synchronize(device)
        facts["kernel_ok"] = bool(torch.allclose(on_device, a @ a, rtol=1e-2, atol=1e-2))
        facts["kernel_error"] = "" if facts["kernel_ok"] else "matmul result differs from the CPU's"
    except RuntimeError as error:
        facts["kernel_ok"], facts["kernel_error"] = False, str(error)[-1000:]
    return facts


def cudnn_conv(torch) -> dict:
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1)
    x = torch.randn(8, 3, 64, 64)
    expected = conv(x)
    conv_gpu, x_gpu = conv.cuda(), x.cuda().requires_grad_(True)
    output = conv_gpu(x_gpu)
    output.square().mean().backward()
    torch.cuda.synchronize()
    error = float((output.detach().cpu() - expected).abs().max())
    grads_finite = bool(torch.isfinite(x_gpu.grad).all() and torch.isfinite(conv_gpu.weight.grad).all())
    return {"ok": error < 5e-2 and grads_finite, "max_abs_error": error, "grads_finite": grads_finite,
            "benchmark": True, "runtime_version": torch.backends.cudnn.version()}


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
    count = torch.cuda.device_count()
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
    return {"ok": copies_ok and reduced_ok, "devices": count, "peer_access": peers, "peer_copies_ok": copies_ok,
            "all_reduce_ok": reduced_ok, "nccl_version": _nccl_version(torch)}


def multi_gpu_in_subprocess() -> dict:
    """NCCL can hang; a separate process with a timeout keeps the rest of the facts."""
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--part", "multi-gpu"],
                              capture_output=True, text=True, timeout=MULTI_GPU_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"peer copies / NCCL all-reduce did not finish in {MULTI_GPU_TIMEOUT_S}s"}
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"ok": False, "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}


def gpu_facts(torch, flags: list[str], throughput: bool = False) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if available else 0
    facts = {"ok": True, "available": available, "device_count": count, "warnings": [str(w.message) for w in caught],
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **driver_facts()}
    if not available:
        return facts
    facts["devices"] = [device_facts(torch, index, flags) for index in range(count)]
    facts["cudnn"] = section(cudnn_conv, torch)
    facts["amp_fp16"] = section(fp16_grad_scaler, torch)
    facts["amp_bf16"] = section(bf16_on_gpu, torch)
    if throughput and facts["amp_bf16"].get("supported"):
        facts["bf16_matmul"] = section(bf16_matmul_throughput, torch)
    facts["multi_gpu"] = multi_gpu_in_subprocess() if count >= 2 else {"ok": True, "skipped": f"{count} GPU visible"}
    return facts


# ---------------------------------------------------------------- devel: a torch extension

CPP_SOURCE = "torch::Tensor add_one(torch::Tensor x) { return x + 1; }\n"
CUDA_DECLARATION = "torch::Tensor add_one_cuda(torch::Tensor x);\n"
CUDA_SOURCE = r"""
__global__ void add_one_kernel(float* x, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
torch::Tensor add_one_cuda(torch::Tensor x) {
    auto y = x.contiguous().clone();
    int64_t n = y.numel();
    add_one_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), n);
    return y;
}
"""


def _extension_arch(torch, gpu: bool) -> str:
    """One arch keeps the compile quick: the GPU's own, or without a GPU the lowest the wheel was built for."""
    if gpu:
        major, minor = torch.cuda.get_device_capability(0)
    else:
        major, minor = min(_flag_capability(f) for f in compiled_arch_flags(torch) if f.startswith("sm_"))
    return f"{major}.{minor}"


def build_extension(torch, with_cuda: bool) -> dict:
    """Compile and run a small extension the way users do (load_inline): C++ on CPU rows, CUDA on GPU rows."""
    from torch.utils.cpp_extension import load_inline

    gpu = with_cuda and torch.cuda.is_available()
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", _extension_arch(torch, gpu))
    build_dir = tempfile.mkdtemp(prefix="torchimages-extension-")
    module = load_inline(
        name="torchimages_probe_extension", cpp_sources=[CPP_SOURCE + (CUDA_DECLARATION if with_cuda else "")],
        cuda_sources=[CUDA_SOURCE] if with_cuda else None,
        functions=["add_one"] + (["add_one_cuda"] if with_cuda else []),
        build_directory=build_dir, extra_cflags=["-O0"], verbose=False,
    )
    cpu_ok = bool(torch.equal(module.add_one(torch.zeros(4)), torch.ones(4)))
    facts = {"ok": cpu_ok, "language": "CUDA" if with_cuda else "C++", "cpu_ok": cpu_ok, "cuda_ran": False}
    if gpu:
        result = module.add_one_cuda(torch.zeros(1000, device="cuda"))
        torch.cuda.synchronize()
        facts["cuda_ran"] = True
        facts["ok"] = cpu_ok and bool(torch.equal(result.cpu(), torch.ones(1000)))
    return facts


# ---------------------------------------------------------------- the parts

def main_facts(devel: bool, cuda_extension: bool) -> dict:
    facts = {"part": "main", "python": python_facts(), "os_release": os_release(), "user": user_facts(),
             "env": redacted_env(dict(os.environ)), "secret_env": secret_env_names(dict(os.environ)),
             "tools": tool_facts(), "shm": {"size_bytes": shm_size()}}
    torch, facts["torch"] = import_torch()
    if torch is None:
        return facts
    # Fork before anything starts CUDA or CPU thread pools: a forked child must not inherit them.
    facts["shm"]["dataloader"] = section(dataloader_with_workers, torch)
    facts["torch"].update(torch_versions(torch))
    facts["amp_cpu"] = section(cpu_bf16_autocast, torch)
    facts["gpu"] = section(gpu_facts, torch, facts["torch"]["arch_flags"])
    if devel:
        facts["extension"] = section(build_extension, torch, cuda_extension)
    facts["libraries_loaded"] = loaded_libraries()
    return facts


def gpu_only_facts() -> dict:
    torch, facts = import_torch()
    if torch is None:
        return {"part": "gpu-only", "torch": facts}
    facts.update(torch_versions(torch))
    return {"part": "gpu-only", "torch": facts, "gpu": section(gpu_facts, torch, facts["arch_flags"], True),
            "libraries_loaded": loaded_libraries()}


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("main", "files", "import", "multi-gpu"), default="main")
    parser.add_argument("--devel", action="store_true", help="also compile and run a torch extension")
    parser.add_argument("--cuda-extension", action="store_true", help="make that extension a CUDA one")
    parser.add_argument("--gpu-only", action="store_true", help="only the GPU facts, with a bf16 matmul throughput figure")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    # Keep stdout for the JSON document: whatever torch, compilers or workers print goes to stderr.
    json_out = os.dup(1)
    os.dup2(2, 1)
    started = time.monotonic()
    if arguments.gpu_only:
        facts = gpu_only_facts()
    elif arguments.part == "files":
        facts = files_facts()
    elif arguments.part == "import":
        facts = import_facts()
    elif arguments.part == "multi-gpu":
        import torch

        facts = section(multi_gpu_facts, torch)
    else:
        facts = main_facts(arguments.devel, arguments.cuda_extension)
    facts.update({"probe_version": PROBE_VERSION, "probe_seconds": round(time.monotonic() - started, 3)})
    sys.stdout.flush()
    with os.fdopen(json_out, "w") as stream:
        json.dump(facts, stream, default=str)
        stream.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
