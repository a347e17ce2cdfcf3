"""smoke: the assertions of PyTorch's own binary smoke test (pytorch/pytorch .ci/pytorch/smoke_test/smoke_test.py,
--package torchonly) hold in the image: OpenMP, conv2d, linalg, NumPy interop, torch.compile matching eager in
float16/32/64, a vectorized CPU ISA, a max-autotune compile; on the CPU, and on each GPU where GPUs are visible.
And `import torch` (and torchvision, where the row pins it) prints and warns nothing."""
import pytest

from .helpers import compile_fix, distinct_errors

pytestmark = pytest.mark.check("smoke")


@pytest.fixture(scope="session")
def smoke(main, torch_facts) -> dict:
    return main["smoke"]


@pytest.fixture(scope="session")
def compiles(smoke) -> dict:
    """The compiles ran in a child process of the probe; without its result every compile test fails saying why."""
    result = smoke["compiles"]
    if "devices" not in result:
        pytest.fail(f"the smoke test's torch.compile process gave no result ({result.get('error')}): rerun with a "
                    "larger --timeout if it timed out, or run `torch.compile` in the image by hand to see why")
    return result


def _problem(result: dict) -> str:
    return result.get("error") or ", ".join(f"{key}={value}" for key, value in result.items()
                                            if key not in ("ok", "seconds", "traceback", "parallel_info"))


def test_openmp_is_available(smoke, spec):
    result = smoke["openmp"]
    assert result.get("ok"), (
        f"torch.backends.openmp.is_available() is {result.get('ok')} ({_problem(result)}), but PyTorch's release "
        f"wheels are built with OpenMP: install torch from the {spec.wheel_index} index")


def test_conv2d_on_the_cpu(smoke):
    result = smoke["devices"]["cpu"]["conv2d"]
    assert result.get("ok"), (
        f"conv2d on the CPU gave wrong results: {_problem(result)}; expected 3x3 window sums of 9.0 and a finite "
        "result of shape [20, 33, 26, 100]: check which libgomp/oneDNN torch loads (another one on LD_LIBRARY_PATH "
        "shadows the wheel's)")


def test_linalg_on_the_cpu(smoke):
    result = smoke["devices"]["cpu"]["linalg"]
    assert result.get("ok"), (
        f"torch.linalg on the CPU gave wrong results: {_problem(result)}; expected solve = [2.0, 3.0], det = 5.0 and "
        "SVDs that reconstruct their input within 1e-4: check which BLAS/LAPACK torch loads (another one on "
        "LD_LIBRARY_PATH shadows the wheel's)")


def test_numpy_interop(smoke, torch_facts):
    result = smoke["numpy"]
    assert result.get("ok"), (
        f"NumPy interop failed: {_problem(result)}; expected torch.from_numpy to share memory and .numpy() to round-"
        f"trip. Install numpy into the image's venv next to torch {torch_facts['version']} (torch 2.3+ works with "
        "NumPy 1.x and 2.x)")


def test_torch_compile_matches_eager_on_the_cpu(compiles):
    result = compiles["devices"]["cpu"]["compile"]
    failures = distinct_errors(result.get("dtypes") or {}) or result.get("error")
    assert result.get("ok"), (
        f"torch.compile of sin(x) + cos(x) on the CPU did not match eager: {failures}; expected float16, float32 and "
        f"float64 to match. {compile_fix(str(failures))}")


def test_a_vectorized_cpu_isa_is_picked(smoke, compiles):
    capability, isa = smoke["cpu_capability"], compiles.get("vectorized_isa") or {"error": "not run"}
    assert capability.get("ok"), (
        f"ATen dispatches CPU kernels to {capability.get('capability')} on {capability.get('machine')}: expected a "
        "vectorized ISA (AVX2 or AVX512); ATEN_CPU_CAPABILITY in the environment may force DEFAULT: unset it")
    assert isa.get("ok"), (
        f"inductor picked no vectorized CPU ISA ({_problem(isa)}): it tests each ISA by compiling a small program, "
        f"so this means the compiler does not work. {compile_fix(_problem(isa))}")


def test_max_autotune_compile_on_the_cpu(compiles):
    result = compiles["devices"]["cpu"]["max_autotune"]
    assert result.get("ok"), (
        f"torch.compile(mode=\"max-autotune\") of a small conv net on the CPU failed or disagreed with eager: "
        f"{_problem(result)}; expected it to run within 1e-2 of eager. {compile_fix(_problem(result))}")


def test_import_torch_prints_and_warns_nothing(torch_facts, spec):
    said = {"torch": torch_facts}
    if spec.torchvision and torch_facts.get("torchvision"):
        said["torchvision"] = torch_facts["torchvision"]
    noise = [f"`import {name}` warned {facts['import_warnings']}" for name, facts in said.items() if facts["import_warnings"]]
    noise += [f"`import {name}` printed {facts['import_output'].strip()[-500:]!r}" for name, facts in said.items()
              if facts["import_output"].strip()]
    hint = ("install numpy into the image's venv" if "numpy" in " ".join(noise).lower()
            else "fix what it complains about: every user's program prints it")
    assert not noise, "; ".join(noise) + f"; expected no warning and no output: {hint}"


def test_cuda_libraries_are_their_wheels_versions(smoke, spec):
    if not spec.is_gpu:
        pytest.skip("CPU row: no cuDNN or NCCL")
    if "cuda_wheels" not in smoke:
        pytest.skip("torch in this image is a CPU build (the identity check reports it)")
    result = smoke["cuda_wheels"]
    runtime, compiled = result.get("cudnn_runtime"), result.get("cudnn_compiled")
    assert runtime and runtime == compiled, (
        f"torch loads cuDNN {runtime} but was compiled against {compiled} ({_problem(result)}): expected the same "
        "version; install the nvidia-cudnn wheel torch pins, and remove other cuDNN copies (see hygiene)")
    runtime_text = ".".join(map(str, runtime))
    assert result["cudnn_wheel"] and result["cudnn_wheel"].split()[-1].startswith(runtime_text), (
        f"the installed cuDNN wheel is {result['cudnn_wheel'] or 'missing'}, but torch loads cuDNN {runtime_text}: "
        "install the nvidia-cudnn wheel torch's metadata pins")
    assert result["nccl_wheel"] and result["nccl"] and result["nccl_wheel"].split()[-1].startswith(result["nccl"]), (
        f"the installed NCCL wheel is {result['nccl_wheel'] or 'missing'}, but torch reports NCCL {result['nccl']}: "
        "install the nvidia-nccl wheel torch's metadata pins")


def test_conv2d_and_linalg_on_each_gpu(smoke, devices):
    wrong = [f"{device}: {name}: {_problem(result)}" for device, parts in smoke["devices"].items() if device != "cpu"
             for name, result in parts.items() if not result.get("ok")]
    assert not wrong, ("conv2d or linalg failed on a GPU: " + "; ".join(wrong) + "; expected float16/32/64 convs "
                       "and float32/64 SVDs to match the CPU. A CUDNN_STATUS or cuBLAS error usually means mixed "
                       "library copies (see hygiene) or a GPU outside the arch list (see gpu)")


def test_torch_compile_on_the_first_gpu(compiles, devices):
    if compiles.get("gpu_skipped"):
        pytest.skip(compiles["gpu_skipped"])
    wrong = [f"{device}: {name}: {distinct_errors(result.get('dtypes') or {}) or _problem(result)}"
             for device, parts in compiles["devices"].items() if device != "cpu"
             for name, result in parts.items() if not result.get("ok")]
    assert not wrong, ("torch.compile failed on a GPU: " + "; ".join(wrong) + "; expected sin+cos in float16/32/64 "
                       f"and a max-autotune conv net to match eager. {compile_fix(' '.join(wrong))}")


def test_cuda_errors_reach_python(smoke, devices):
    wrong = [f"{name}: {_problem(result)}" for name, result in smoke["gpu_errors"].items() if not result.get("ok")]
    assert not wrong, ("CUDA errors or features are missing: " + "; ".join(wrong) + "; expected a failed device-side "
                       "assert and a cuFile registration failure to raise RuntimeErrors, and torch built with NVSHMEM: "
                       "install torch's own CUDA wheels and their nvidia-* dependencies")
