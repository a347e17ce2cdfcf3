"""amp: mixed precision trains: fp16 autocast with torch.amp.GradScaler on GPUs, bf16 where the GPU has it
natively (capability 8.0+), bf16 autocast on the CPU for CPU images."""
import pytest

pytestmark = pytest.mark.check("amp")


def _training_problem(result: dict) -> str:
    if result.get("error"):
        return result["error"]
    return (f"loss went {result['first_loss']:.4g} -> {result['last_loss']:.4g} over {result['steps']} steps "
            f"(finite: {result['finite']}), outputs were {result['output_dtype']}")


@pytest.mark.gpu_work
def test_fp16_autocast_with_grad_scaler(gpu, devices):
    result = gpu["amp_fp16"]
    assert result.get("ok") and result.get("output_dtype") == "torch.float16", (
        f"fp16 autocast with GradScaler did not train on {devices[0]['name']}: {_training_problem(result)}; "
        "expected a finite, falling loss with float16 outputs")


@pytest.mark.gpu_work
def test_bf16_autocast_on_gpu(gpu, devices):
    result = gpu["amp_bf16"]
    if not result.get("error") and not result.get("supported"):
        pytest.skip(result["reason"])
    assert result.get("ok") and result.get("output_dtype") == "torch.bfloat16", (
        f"bf16 autocast did not train on {devices[0]['name']} although it supports bf16: {_training_problem(result)}")


def test_bf16_autocast_on_cpu(main, torch_facts, spec):
    if spec.is_gpu:
        pytest.skip("GPU image: AMP is checked on the GPU")
    result = main["amp_cpu"]
    assert result.get("ok") and result.get("output_dtype") == "torch.bfloat16", (
        f"bf16 autocast on the CPU did not train: {_training_problem(result)}; expected a finite, falling loss "
        "with bfloat16 outputs")
