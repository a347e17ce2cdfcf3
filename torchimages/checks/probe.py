#!/usr/bin/env python3
"""The in-container probe: computes every fact the image checks assert on, once, as one JSON document.

It is copied into the container and run with the image's own Python, so it needs only the standard library
and torch (imported lazily). Its parts live in the modules copied beside it (verify.container.PROBE_MODULES):
probe_base.py (sections, time bounds, the quiet `import torch`), probe_gpu.py, probe_smoke.py, probe_files.py, and
rules.py, the pure rules the check suites and the host import too.

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
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import typing

try:
    from . import probe_base, probe_files, probe_gpu, probe_smoke, rules
except ImportError:  # run as a script: its helper modules are copied beside it (verify.container.copy_probe), and
    # its folder is not on sys.path where the image sets PYTHONSAFEPATH (or under -I)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import probe_base  # type: ignore[no-redef]
    import probe_files  # type: ignore[no-redef]
    import probe_gpu  # type: ignore[no-redef]
    import probe_smoke  # type: ignore[no-redef]
    import rules  # type: ignore[no-redef]

PROBE_VERSION = 3
probe_base.PROBE_SCRIPT = os.path.abspath(__file__)  # the child processes run this file, under the name it has here


# ---------------------------------------------------------------- sections that need no torch

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
        nvcc_facts.update(probe_base.run_tool([nvcc, "--version"]))
        nvcc_facts["release"] = rules.nvcc_release(nvcc_facts.get("output", ""))
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    compiler_facts: dict[str, typing.Any] = {"path": compiler}
    if compiler:
        compiler_facts.update(probe_base.run_tool([compiler, "--version"]))
        compiler_facts["version"] = compiler_facts.get("output", "").splitlines()[0] if compiler_facts.get("output") else ""
    return {"nvcc": nvcc_facts, "cxx": compiler_facts, "ninja": shutil.which("ninja")}


def shm_size(path: str = "/dev/shm") -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize


# ---------------------------------------------------------------- the import part (runs as an arbitrary uid)

def import_facts(wheel: str | None, after_main: bool) -> dict:
    facts: dict[str, typing.Any] = {"part": "import", "user": user_facts()}
    if after_main:
        facts["waited_for_main_import_s"] = wait_for_file(probe_base.TORCH_IMPORTED,
                                                          probe_base.bound(probe_base.TORCH_IMPORTED_WAIT_S))
    try:
        import torch

        facts["torch_ok"] = bool(torch.ones(2).sum().item() == 2)
        facts["torch_error"] = ""
    except BaseException as error:  # noqa: BLE001
        facts["torch_ok"], facts["torch_error"] = False, f"{type(error).__name__}: {error}"
    if wheel:
        facts["user_install"] = probe_base.section(user_install, wheel)
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
    install = probe_base.run_tool([pip, "install", "--user", "--no-index", "--disable-pip-version-check", wheel],
                                  probe_base.PIP_TIMEOUT_S)
    if not install["ok"]:
        return {**install, "step": "pip install --user", "pip": pip}
    module = wheel_module(wheel)
    imported = probe_base.run_tool([sys.executable, "-c", f"import {module}; print({module}.__file__)"])
    return {**imported, "step": f"import {module}", "pip": pip, "pip_output": install["output"][-1500:]}


def cpu_bf16_autocast(torch) -> dict:
    return probe_smoke.train_steps(torch, "cpu", torch.bfloat16)


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
        items = _BigItems(torch, probe_base.DATALOADER_ITEMS, probe_base.DATALOADER_ITEM_MB)
        loader: typing.Any = DataLoader(typing.cast(typing.Any, items), batch_size=1,
                                        num_workers=probe_base.DATALOADER_WORKERS, prefetch_factor=2,
                                        timeout=probe_base.bound(probe_base.DATALOADER_TIMEOUT_S))
        held, peak = [], 0
        for index, batch in enumerate(loader):
            if float(batch[0, -1]) != float(index):
                raise ValueError(f"batch {index} arrived with the wrong contents")
            held.append(batch)  # keep them: the shared-memory segments stay allocated, as in a real input pipeline
            peak = max(peak, sum(b.numel() * 4 for b in held))
        return {"ok": True, "batches": len(held), "peak_bytes_in_shm": peak}
    except BaseException as error:  # noqa: BLE001
        return {"ok": False, "error": rules.last_error_line(error), "details": str(error)[-3000:]}


def start_dataloader(torch) -> probe_base.ChildSection:
    """In a forked child: a bus error or a hang kills the child, not the probe."""
    return probe_base.ChildSection("the DataLoader process", probe_base.bound(probe_base.DATALOADER_TIMEOUT_S + 10),
                                   _dataloader_through_shm, torch)


def dataloader_facts(run: probe_base.ChildSection) -> dict:
    result = run.result()
    result.update({"workers": probe_base.DATALOADER_WORKERS, "item_bytes": probe_base.DATALOADER_ITEM_MB * 2**20,
                   "items": probe_base.DATALOADER_ITEMS})
    return result


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
             "env": rules.redacted_env(dict(os.environ)), "secret_env": rules.secret_env_names(dict(os.environ)),
             "tools": tool_facts(), "shm": {"size_bytes": shm_size()}}
    torch, facts["torch"] = probe_base.import_torch()
    with open(probe_base.TORCH_IMPORTED, "w", encoding="utf-8"):
        os.chmod(probe_base.TORCH_IMPORTED, 0o644)
    if torch is None:
        if runs_work_of(checks, "distributed"):
            facts["distributed"] = probe_gpu.AllReduceRun().result()
    else:
        add_torch_facts(facts, torch, devel, cuda_extension, arch_list, budget_s, checks)
    return facts


def add_torch_facts(facts: dict, torch, devel: bool, cuda_extension: bool, arch_list: list[str],
                    budget_s: float | None = None, checks: typing.AbstractSet[str] | None = None) -> None:
    # Fork first, before anything starts CUDA or CPU thread pools: the children run beside the GPU work that is not
    # timed. The two long ones, the smoke test's compiles and the extension build, each get a child from the start.
    # Under an exclusive compute mode a GPU takes one CUDA context at a time: the children stay off the GPUs, and
    # torchrun's ranks and the multi-GPU process run to their end before this process makes its own contexts. The
    # speed figures are timed once every child is collected, with nothing else of the probe's on the GPUs (the compile
    # child's max-autotune and torchrun's NCCL ranks would lower them). The work of a check that is not selected
    # (`checks`) is not started at all.
    host = probe_gpu.driver_facts()
    limits = rules.compute_mode_limits(host)
    skip_gpu, exclusive = limits.children_skip, limits.exclusive
    smoke = runs_work_of(checks, "smoke")
    after = probe_base.timed_work_s(len(host.get("nvidia_smi_gpus") or []))
    compiles = (probe_base.ChildSection("the torch.compile process", probe_base.compile_timeout(budget_s, after),
                                        probe_smoke.smoke_compiles, torch, skip_gpu) if smoke else None)
    extension = (probe_base.ChildSection("the extension build", probe_base.bound(probe_base.EXTENSION_TIMEOUT_S),
                                         probe_smoke.build_extension, torch, cuda_extension, arch_list, skip_gpu)
                 if devel and runs_work_of(checks, "devel") else None)
    dataloader = start_dataloader(torch) if runs_work_of(checks, "shm") else None
    facts["torch"].update(probe_base.torch_versions(torch))
    # The first CUDA call: no context yet, and torch's warnings recorded.
    availability = probe_gpu.cuda_availability(torch)
    mig_reason = rules.mig_multi_gpu_reason(availability["device_count"], host)
    all_reduce = (probe_gpu.AllReduceRun(*probe_gpu.all_reduce_plan(availability["device_count"], mig_reason))
                  if runs_work_of(checks, "distributed") else None)
    multi_gpu = None
    if exclusive:
        if all_reduce:
            facts["distributed"] = all_reduce.result()
        multi_gpu = (probe_gpu.multi_gpu_in_subprocess() if availability["device_count"] >= 2 and not mig_reason
                     else None)
    facts["amp_cpu"] = probe_base.section(cpu_bf16_autocast, torch)
    if smoke:
        facts["smoke"] = probe_smoke.smoke_eager(torch)
    facts["gpu"] = probe_base.section(probe_gpu.gpu_work_facts, torch, facts["torch"]["arch_flags"], availability, host)
    if dataloader:
        facts["shm"]["dataloader"] = dataloader_facts(dataloader)
    if extension:
        facts["extension"] = extension.result()
    if compiles:
        facts["smoke"]["compiles"] = compiles.result()
    if all_reduce and not exclusive:
        facts["distributed"] = all_reduce.result()
    facts["gpu"] = probe_gpu.timed_gpu_facts(torch, facts["gpu"], True, multi_gpu)
    # the device-side assert poisons the CUDA context: the last GPU work
    if compiles and probe_smoke.gpu_devices(torch):
        facts["smoke"]["gpu_errors"] = probe_base.section(probe_smoke.smoke_gpu_errors, torch)
    facts["libraries_loaded"] = probe_files.loaded_libraries()


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
    arguments = parse_arguments(argv)
    probe_base.SLOWDOWN = arguments.slowdown
    if arguments.part == "all-reduce":
        probe_gpu.all_reduce_worker(arguments.result_dir, arguments.backend)
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
        facts = probe_gpu.gpu_only_facts(arguments.budget_s)
    elif arguments.part == "files":
        facts = probe_files.files_facts([path for path in arguments.package_caches.split(";") if path])
    elif arguments.part == "import":
        facts = import_facts(arguments.wheel, arguments.after_main)
    elif arguments.part == "smoke":
        facts = probe_smoke.smoke_facts()
    elif arguments.part == "multi-gpu":
        import torch

        facts = probe_base.section(probe_gpu.multi_gpu_facts, torch)
    else:
        arch_list = [entry for entry in arguments.arch_list.split(";") if entry]
        facts = main_facts(arguments.devel, arguments.cuda_extension, arch_list, arguments.budget_s, arguments.checks)
    return facts


if __name__ == "__main__":
    sys.exit(main())
