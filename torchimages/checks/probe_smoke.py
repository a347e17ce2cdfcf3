"""The probe's smoke test (the assertions of PyTorch's own smoke test: eager on each device, torch.compile, the errors
that must reach Python), its torch extension build, and the small AMP training loop the AMP checks run.

Standard library only (torch is passed in): copied into the container beside probe.py (verify.container.PROBE_MODULES)
and imported there as a plain module.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import typing

try:
    from . import probe_base, rules
except ImportError:  # a module of the probe run as a script: probe.py put its folder on sys.path
    import probe_base  # type: ignore[no-redef]
    import rules  # type: ignore[no-redef]


# ---------------------------------------------------------------- AMP: a small training loop

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
        return [f"cuda:{index}" for index in range(probe_base.cuda_device_count(torch))]
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
    facts = {"openmp": probe_base.section(openmp_facts, torch), "numpy": probe_base.section(numpy_interop, torch),
             "cpu_capability": probe_base.section(cpu_capability, torch), "devices": {}}
    for device in ["cpu", *gpu_devices(torch)]:
        facts["devices"][device] = {"conv2d": probe_base.section(conv2d_on, torch, device),
                                    "linalg": probe_base.section(linalg_on, torch, device)}
    if torch.version.cuda:
        facts["cuda_wheels"] = probe_base.section(cuda_wheel_versions, torch)
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
    runtime = rules.decode_cudnn_version(torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                                         else None)
    compiled = tuple(torch._C._cudnn.getCompileVersion()) if hasattr(torch._C, "_cudnn") else None
    return {"cudnn_runtime": list(runtime) if runtime else None, "cudnn_compiled": list(compiled) if compiled else None,
            "cudnn_wheel": cudnn_wheel, "nccl": probe_base.nccl_version(torch), "nccl_wheel": nccl_wheel}


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
            facts["devices"][device] = {"compile": probe_base.section(compile_matches_eager, torch, device)}
            if device == "cpu":
                facts["vectorized_isa"] = probe_base.section(vectorized_isa, torch)
            facts["devices"][device]["max_autotune"] = probe_base.section(max_autotune_compile, torch, device)
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
    facts = {"nvshmem": probe_base.section(nvshmem_built_in, torch)}
    if tuple(int(part) for part in torch.version.cuda.split(".")[:2]) >= (12, 6):
        facts["gds"] = probe_base.section(gds_errors_reach_python, torch)
    facts["runtime_error"] = probe_base.section(cuda_errors_reach_python, torch)
    return facts


def smoke_facts() -> dict:
    """The smoke test's assertions alone, one after the other in this process, as upstream runs them."""
    torch, facts = probe_base.import_torch()
    if torch is None:
        return {"part": "smoke", "torch": facts}
    smoke = smoke_eager(torch)
    smoke["compiles"] = probe_base.section(smoke_compiles, torch)
    if gpu_devices(torch):
        smoke["gpu_errors"] = probe_base.section(smoke_gpu_errors, torch)
    return {"part": "smoke", "torch": facts, "smoke": smoke}
