"""The probe's GPU side: the host driver as the container sees it, what torch does on each GPU (kernels, cuDNN,
attention, AMP, bf16), peer copies and NCCL across the GPUs, torchrun's all-reduce, and `--gpu-only`, the GPU facts a
record keeps with the host's raw answers.

Standard library only (torch is passed in or imported lazily): copied into the container beside probe.py
(verify.container.PROBE_MODULES) and imported there as a plain module.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import typing
import warnings

try:
    from . import gpu_health, gpu_speed, probe_base, probe_files, probe_smoke, rules
except ImportError:  # a module of the probe run as a script: probe.py put its folder on sys.path
    import gpu_health  # type: ignore[no-redef]
    import gpu_speed  # type: ignore[no-redef]
    import probe_base  # type: ignore[no-redef]
    import probe_files  # type: ignore[no-redef]
    import probe_smoke  # type: ignore[no-redef]
    import rules  # type: ignore[no-redef]

NVIDIA_DRIVER_PROC = "/proc/driver/nvidia/version"  # the loaded kernel module's version, readable without NVML


def driver_facts() -> dict:
    """The host driver as the container sees it: nvidia-smi's GPU and MIG lines, compute modes, driver version;
    when nvidia-smi fails, its exit code and words (an NVML error is the cause to report, not "no GPUs")."""
    facts: dict[str, typing.Any] = {"driver_version": None, "nvidia_smi_gpus": None, "mig_devices": {}, "compute_modes": None,
             "mig_modes": None, "nvidia_smi_error": None}
    smi = shutil.which("nvidia-smi")
    facts["nvidia_smi"] = smi
    if smi:
        listing = probe_base.run_tool([smi, "-L"])
        if listing.get("ok"):
            facts.update(rules.parse_nvidia_smi_list(listing["output"]))
        else:
            facts["nvidia_smi_error"] = {"returncode": listing.get("returncode"),
                                         "output": (listing.get("output") or listing.get("error") or "").strip()[-500:]}
        # mig.mode.current: Enabled, Disabled, or [N/A] where the GPU has no MIG (nvidia-smi documentation).
        query = probe_base.run_tool([smi, "--query-gpu=driver_version,compute_mode,mig.mode.current",
                                     "--format=csv,noheader"])
        rows = [[part.strip() for part in line.split(",")] for line in query.get("output", "").splitlines()
                if line.count(",") == 2] if query.get("ok") else []
        if rows:
            facts["driver_version"] = rows[0][0]
            facts["compute_modes"] = [row[1] for row in rows]
            facts["mig_modes"] = [row[2] for row in rows]
        # Read before any GPU work, so that a sick host is told apart from a bad image (checks/gpu_health.py).
        facts["health"] = gpu_health.read_health(smi, probe_base.run_tool)
    if facts["driver_version"] is None:
        try:
            with open(NVIDIA_DRIVER_PROC, encoding="utf-8") as stream:
                match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", stream.read())
            facts["driver_version"] = match.group(1) if match else None
        except OSError:
            pass
    facts["libcuda_driver_version"] = libcuda_driver_version()
    return facts


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
             "covered_by": rules.arch_covers(flags, tuple(capability), torch.version.cuda)}
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
    grad_errors = {name: probe_smoke.relative_error(torch, gradients[name], reference[name].double())
                   for name in reference}
    grads_ok = all(value <= CUDNN_TOLERANCE for value in grad_errors.values())
    return {"ok": error < CUDNN_TOLERANCE and grads_ok, "max_abs_error": error, "grad_relative_errors": grad_errors,
            "grads_ok": grads_ok, "benchmark": True, "runtime_version": torch.backends.cudnn.version()}


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
    forced = rules.cudnn_attention_forced(torch.cuda.get_device_capability(), cudnn_version)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if forced else contextlib.nullcontext():
        output = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.cuda.synchronize()
    no_nan = not bool(output.isnan().any())
    error = probe_smoke.relative_error(torch, output, reference.double())
    return {"ok": no_nan and error < CUDNN_TOLERANCE, "no_nan": no_nan, "relative_error": error,
            "cudnn_forced": forced, "cudnn_version": cudnn_version}


def fp16_grad_scaler(torch) -> dict:
    return probe_smoke.train_steps(torch, "cuda", torch.float16, scaler=torch.amp.GradScaler("cuda"))


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
    result = probe_smoke.train_steps(torch, "cuda", torch.bfloat16)
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
    count = probe_base.cuda_device_count(torch)
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
             "all_reduce_ok": reduced_ok, "nccl_version": probe_base.nccl_version(torch)}
    if reduced_ok:  # its speed, judged against the topology's floor (checks/gpu_speed.py)
        facts["bandwidth"] = probe_base.section(gpu_speed.all_reduce_bus_bandwidth, torch, count)
    return facts


def multi_gpu_in_subprocess() -> dict:
    """NCCL can hang; a separate process with a timeout keeps the rest of the facts."""
    try:
        done = subprocess.run([sys.executable, probe_base.PROBE_SCRIPT, "--part", "multi-gpu"], capture_output=True,
                              text=True, timeout=probe_base.bound(probe_base.MULTI_GPU_TIMEOUT_S), check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "peer copies / NCCL all-reduce did not finish in "
                                      f"{probe_base.bound(probe_base.MULTI_GPU_TIMEOUT_S)}s"}
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"ok": False, "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}


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
            count = probe_base.cuda_device_count(torch) if available else 0
        except Exception as error:  # noqa: BLE001 - CUDA answered a count, then torch could not start it: say why
            available, count, init_error = False, 0, f"torch.cuda.init() failed: {type(error).__name__}: {error}"
    return {"available": available, "device_count": count, "nvml_device_count": nvml_count,
            "warnings": [str(w.message) for w in caught] + ([init_error] if init_error else [])}


def gpu_facts(torch, flags: list[str], throughput: bool = False, availability: dict | None = None,
              host: dict | None = None, multi_gpu: dict | None = None) -> dict:
    """What torch does with the GPUs it sees; `availability`, `host` and `multi_gpu` when the caller already has
    them (the first CUDA call, nvidia-smi's view, a multi-GPU run done before this process made its contexts)."""
    return timed_gpu_facts(torch, gpu_work_facts(torch, flags, availability, host), throughput, multi_gpu)


def gpu_work_facts(torch, flags: list[str], availability: dict | None = None, host: dict | None = None) -> dict:
    """Whether torch's work on each GPU is right (kernels, cuDNN, attention, AMP): nothing timed, so it may run beside
    the probe's other children."""
    availability = availability or cuda_availability(torch)
    facts = {"ok": True, **availability, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             **(host or driver_facts())}
    facts["unusable"] = rules.compute_mode_limits(facts).unusable or rules.mig_without_devices_reason(facts)
    if not facts["available"] or facts["unusable"]:
        return facts
    facts["devices"] = [device_facts(torch, index, flags) for index in range(facts["device_count"])]
    facts["cudnn"] = probe_base.section(cudnn_conv, torch)
    facts["cudnn_attention"] = probe_base.section(cudnn_attention, torch)
    facts["amp_fp16"] = probe_base.section(fp16_grad_scaler, torch)
    facts["amp_bf16"] = probe_base.section(bf16_on_gpu, torch)
    return facts


def timed_gpu_facts(torch, facts: dict, throughput: bool = True, multi_gpu: dict | None = None) -> dict:
    """The multi-GPU part (peer copies, NCCL and its bus bandwidth) and the speed figures, added to gpu_work_facts'
    facts. Timed: run with none of the probe's own GPU work beside them (its compile child's max-autotune and
    torchrun's NCCL ranks collected before), as two images' checks would halve each other's figures."""
    if not isinstance(facts.get("devices"), list) or not facts.get("available") or facts.get("unusable"):
        return facts
    count = facts["device_count"]
    mig_reason = rules.mig_multi_gpu_reason(count, facts, [device["name"] for device in facts["devices"]])
    if count < 2:
        facts["multi_gpu"] = {"ok": True, "skipped": f"{count} GPU visible"}
    elif mig_reason:
        facts["multi_gpu"] = {"ok": True, "skipped": mig_reason}
    else:
        # one run before this process made its contexts (an exclusive compute mode), else now
        facts["multi_gpu"] = multi_gpu or facts.get("multi_gpu") or multi_gpu_in_subprocess()
    if throughput and facts.get("amp_bf16", {}).get("supported"):
        facts["bf16_matmul"] = probe_base.section(bf16_matmul_throughput, torch)
        # Idle, a GPU reads "GPU idle": what slows the matmul down shows under load only (a failing cooler, a lowered
        # power limit), read per GPU while matmuls run again on cuda:0.
        facts[gpu_health.CLOCKS_UNDER_LOAD] = probe_base.section(gpu_speed.clocks_under_load, torch,
                                                                 facts.get("nvidia_smi"))
    if throughput:
        facts["copy_bandwidth"] = probe_base.section(gpu_speed.pinned_copy_bandwidth, torch)
        # Idle, the link reads slower than it is (power saving): its state is judged as read under load only.
        facts[gpu_health.LINK_UNDER_LOAD] = probe_base.section(gpu_speed.link_under_load, torch,
                                                               facts.get("nvidia_smi"))
    return facts


def record_gpu_facts(torch, flags: list[str], host: dict | None = None) -> dict:
    """gpu_work_facts for the record, with the multi-GPU part where it must run first: under an exclusive compute mode
    the multi-GPU process runs to its end before this process makes its own contexts (it would find every GPU busy
    after). The caller adds the timed facts (timed_gpu_facts) once nothing else runs on the GPUs."""
    host = host or driver_facts()
    availability = cuda_availability(torch)
    exclusive = rules.compute_mode_limits(host).exclusive
    count = availability["device_count"]
    multi_gpu = (multi_gpu_in_subprocess() if exclusive and count >= 2 and not rules.mig_multi_gpu_reason(count, host)
                 else None)
    facts = gpu_work_facts(torch, flags, availability, host)
    if multi_gpu:
        facts["multi_gpu"] = multi_gpu
    return facts


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
        facts["nvidia_smi_list"] = probe_base.run_tool([smi, "-L"])
        facts["nvidia_smi_query"] = probe_base.run_tool([smi, f"--query-gpu={RECORD_QUERY_FIELDS}",
                                                         "--format=csv,noheader"])
    return facts


def gpu_only_facts(budget_s: float | None = None) -> dict:
    """For a GPU host's own torch (docs/gpu-validation.md): the host's raw answers, the GPU facts, then the smoke test
    on each GPU. The compiles run in a child forked before any CUDA call, bounded inside `budget_s` (the record's
    kill timeout) as in the main part, so that a slow max-autotune is reported rather than costing every fact."""
    torch, facts = probe_base.import_torch()
    host = record_host_facts()
    if torch is None:
        return {"part": "gpu-only", "torch": facts, "host": host}
    driver = driver_facts()
    skip_gpu = rules.compute_mode_limits(driver).children_skip
    after = probe_base.timed_work_s(len(driver.get("nvidia_smi_gpus") or []))
    compiles = probe_base.ChildSection("the torch.compile process", probe_base.compile_timeout(budget_s, after),
                                       probe_smoke.smoke_compiles, torch, skip_gpu)
    facts.update(probe_base.torch_versions(torch))
    gpu = probe_base.section(record_gpu_facts, torch, facts["arch_flags"], driver)
    result = {"part": "gpu-only", "torch": facts, "host": host, "gpu": gpu}
    smoke = probe_smoke.smoke_eager(torch)
    smoke["compiles"] = compiles.result()
    # The speed figures once the compile child has ended: nothing of the probe's own runs beside them.
    result["gpu"] = timed_gpu_facts(torch, gpu)
    if probe_smoke.gpu_devices(torch):
        smoke["gpu_errors"] = probe_base.section(probe_smoke.smoke_gpu_errors, torch)
    result.update({"smoke": smoke, "libraries_loaded": probe_files.loaded_libraries()})
    return result


# ---------------------------------------------------------------- distributed: torchrun, an all-reduce

class AllReduceRun:
    """`torchrun --standalone --nproc-per-node N`, as users start single-node jobs, started when the probe knows how
    many GPUs it sees, and collected at its end: it runs while the probe does its own work. 2 processes over gloo on
    the CPU; one per GPU (up to 8) over NCCL with 2+ GPUs (`all_reduce_plan`)."""

    def __init__(self, processes: int = probe_base.DISTRIBUTED_PROCESSES, backend: str = "gloo"):
        self.started, self.processes = time.monotonic(), processes
        self.result_dir = tempfile.mkdtemp(prefix="torchimages-all-reduce-")
        self.log = tempfile.TemporaryFile()
        self.process: subprocess.Popen | None = None
        self.command = ["torchrun", "--standalone", "--nproc-per-node", str(processes),
                        probe_base.PROBE_SCRIPT, "--part", "all-reduce", "--backend", backend,
                        "--result-dir", self.result_dir, "--slowdown", str(probe_base.SLOWDOWN)]
        try:
            # Its own session: on a timeout the whole tree (launcher and workers) is killed at once.
            self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
            self.error = ""
        except OSError as error:
            self.process, self.error = None, f"{type(error).__name__}: {error}"

    def result(self) -> dict:
        facts = {"command": " ".join(self.command[:5]), "processes": self.processes, "returncode": None}
        timeout = probe_base.bound(probe_base.DISTRIBUTED_TIMEOUT_S)
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
    dist.init_process_group("nccl" if nccl else "gloo",
                            timeout=datetime.timedelta(seconds=probe_base.bound(probe_base.DISTRIBUTED_TIMEOUT_S)))
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


def distributed_processes(device_count: int) -> int:
    if device_count >= 2:
        return min(device_count, probe_base.DISTRIBUTED_MAX_PROCESSES)
    return probe_base.DISTRIBUTED_PROCESSES


def all_reduce_plan(device_count: int, mig_reason: str) -> tuple[int, str]:
    """torchrun's processes and backend: one per GPU over NCCL with 2+ CUDA devices, 2 over gloo otherwise, and where
    a MIG device sits beside whole GPUs (`rules.mig_multi_gpu_reason`)."""
    if device_count >= 2 and not mig_reason:
        return distributed_processes(device_count), "nccl"
    return probe_base.DISTRIBUTED_PROCESSES, "gloo"
