"""The probe's groundwork, shared by its parts: the time bounds (scaled by --slowdown), a section that turns an
exception into facts, a bounded tool run, a section in a forked child, the quiet `import torch` and the facts every
part reads from torch itself.

Standard library only (torch is passed in or imported lazily): copied into the container beside probe.py
(verify.container.PROBE_MODULES) and imported there as a plain module.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import tempfile
import time
import traceback
import typing
import warnings

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
TORCH_IMPORTED_WAIT_S = 60
PROBE_STARTED = time.monotonic()
# The script the probe's own child processes run (`--part multi-gpu`, torchrun's `--part all-reduce`): probe.py, under
# the name it was copied as (verify.container.PROBE_PATH), which probe.py sets here when it loads.
PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")


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
        if result is None and self.child.exitcode == 0 and self.receiver.poll(0):
            # It finished in the grace after its bound (a loaded host): its result was sent, and is what it found.
            with contextlib.suppress(EOFError):
                result = self.receiver.recv()
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
        "nccl_version": nccl_version(torch),
    }


def compiled_arch_flags(torch) -> list[str]:
    """What torch.cuda.get_arch_list() reports (torch._C._cuda_getArchFlags; get_arch_list() gates on
    _is_compiled() in 2.14, so both work without a GPU), as a list; [] for CPU builds."""
    read_flags = getattr(torch._C, "_cuda_getArchFlags", None)  # absent from CPU builds
    return (read_flags() or "").split() if read_flags else []


def nccl_version(torch) -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def cuda_device_count(torch) -> int:
    """CUDA's own count of the devices this process can use, for a torch whose CUDA is available. torch.cuda.
    device_count() asks CUDA only once torch has initialised it: before, it answers NVML's count of physical GPUs
    (torch/cuda/__init__.py: `_device_count_nvml` until `_initialized`), and MIG devices are not NVML devices, so on a
    node with MIG on two GPUs it says 2 where CUDA has 1 and get_device_properties(1) raises "Invalid device id"
    (pytorch#130181). torch.cuda.init() initialises torch's CUDA state without making a context on any GPU."""
    torch.cuda.init()
    return torch.cuda.device_count()


def compile_timeout(budget_s: float | None, after_s: float = 0) -> float:
    """The compile child's bound: inside the kill budget the probe was given (the container's `timeout -s KILL`),
    counted from the probe's start, less `after_s` for the work that must follow the compiles (the speed figures, timed
    with nothing else on the GPUs), so that a slow compile is reported as such and never costs every fact."""
    if budget_s is None:
        return bound(SMOKE_COMPILE_TIMEOUT_S)
    return max(1.0, budget_s - (time.monotonic() - PROBE_STARTED) - bound(BUDGET_MARGIN_S + after_s))


# The speed figures' bound after the compiles: the matmul, the copies and two nvidia-smi reads under load (10 s each
# at most, gpu_speed.LINK_READ_TIMEOUT_S), and with 2+ GPUs the multi-GPU process that times the NCCL all-reduce.
TIMED_WORK_S = 30


def timed_work_s(gpus_listed: int) -> float:
    return TIMED_WORK_S + (MULTI_GPU_TIMEOUT_S if gpus_listed >= 2 else 0)
