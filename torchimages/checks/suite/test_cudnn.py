"""cudnn: cuDNN is available on the GPU, the loaded version is the compiled one and the row's, and a conv2d
runs forward and backward with cudnn.benchmark on."""
import pytest

from torchimages.checks.probe import decode_cudnn_version

pytestmark = pytest.mark.check("cudnn")


def test_cudnn_is_available_and_consistent(gpu, torch_facts, spec):
    runtime = decode_cudnn_version(torch_facts["cudnn_version"])
    assert torch_facts["cudnn_available"] and runtime, (
        f"cuDNN is not available to torch, but row {spec.tag} promises cuDNN {spec.cudnn}: check that the "
        "nvidia-cudnn wheel is installed and loads (see the hygiene check's library copies)")
    compiled = tuple(torch_facts["cudnn_compile_version"] or runtime)
    assert compiled[:2] == runtime[:2] and runtime[0] == spec.cudnn, (
        f"torch loads cuDNN {'.'.join(map(str, runtime))}, compiled against {'.'.join(map(str, compiled))}, row "
        f"says cuDNN {spec.cudnn}: remove other cuDNN copies so torch loads its own wheel's")


def test_conv2d_forward_and_backward(gpu, devices):
    result = gpu["cudnn"]
    problem = result.get("error") or (f"max error {result.get('max_abs_error')} against the CPU, "
                                      f"finite gradients: {result.get('grads_finite')}")
    assert result.get("ok"), (
        f"conv2d with cudnn.benchmark=True failed on {devices[0]['name']}: {problem}; a CUDNN_STATUS error usually "
        "means mixed cuDNN copies (see hygiene) or a GPU outside the arch list")
