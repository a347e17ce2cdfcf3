"""cudnn: cuDNN is available on the GPU, the loaded version is the compiled one and the row's, a conv2d runs forward
and backward with cudnn.benchmark on and matches the CPU, and attention runs as upstream's smoke test runs it."""
import pytest

from torchimages.checks.rules import decode_cudnn_version

pytestmark = pytest.mark.check("cudnn")


def test_cudnn_is_available_and_consistent(devices, torch_facts, spec):
    runtime = decode_cudnn_version(torch_facts["cudnn_version"])
    assert torch_facts["cudnn_available"] and runtime, (
        f"cuDNN is not available to torch, but row {spec.tag} promises cuDNN {spec.cudnn}: check that the "
        "nvidia-cudnn wheel is installed and loads (see the hygiene check's library copies)")
    compiled = tuple(torch_facts["cudnn_compile_version"] or runtime)
    assert compiled[:2] == runtime[:2] and runtime[0] == spec.cudnn, (
        f"torch loads cuDNN {'.'.join(map(str, runtime))}, compiled against {'.'.join(map(str, compiled))}, row "
        f"says cuDNN {spec.cudnn}: remove other cuDNN copies so torch loads its own wheel's")


@pytest.mark.gpu_work
def test_conv2d_forward_and_backward(gpu, devices):
    result = gpu["cudnn"]
    problem = result.get("error") or (f"max error {result.get('max_abs_error')} against the CPU, gradients' relative "
                                      f"errors {result.get('grad_relative_errors')}")
    assert result.get("ok"), (
        f"conv2d with cudnn.benchmark=True failed on {devices[0]['name']}: {problem}; a CUDNN_STATUS error usually "
        "means mixed cuDNN copies (see hygiene) or a GPU outside the arch list")


@pytest.mark.gpu_work
def test_scaled_dot_product_attention(gpu, devices):
    result = gpu["cudnn_attention"]
    problem = result.get("error") or (f"NaN in the output: {not result.get('no_nan')}, relative error "
                                      f"{result.get('relative_error')} against the CPU")
    forced = " with cuDNN attention forced" if result.get("cudnn_forced") else ""
    assert result.get("ok"), (
        f"fp16 scaled_dot_product_attention with a float mask{forced} failed on {devices[0]['name']}: {problem}; "
        "'No valid execution plans built' means cuDNN could not build an engine for this GPU or this cuDNN: a cuDNN "
        "without fused attention engines for this compute capability (pytorch#192843: cuDNN 9.24 on 10.7), or "
        "runtime-compiled engines without libnvrtc-builtins (install nvidia-cuda-nvrtc as torch's wheel pins it, "
        "one copy: pytorch#167602)")
