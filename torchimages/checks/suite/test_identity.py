"""identity: the tag tells the truth: torch, torchvision, Python, OS, CUDA, cuDNN and arch list equal the row,
and the labels and PYTORCH_VERSION agree with what is inside."""
import pytest

from torchimages.checks.rules import arch_flags_for, decode_cudnn_version, os_tag
from torchimages.invocation import command
from torchimages.model import LABEL_PREFIX

from .helpers import observed_label_values, os_is_the_rows, row_label_values

pytestmark = pytest.mark.check("identity")


def rebuild_hint(spec) -> str:
    return f"rebuild it from the matrix ({command(f'build {spec.tag} --force')})"


def test_torch_is_the_rows_build(main, spec):
    torch = main["torch"]
    assert torch["importable"], (
        f"torch does not import ({torch.get('error')}), but row {spec.tag} promises torch {spec.torch_local_version}: "
        f"{rebuild_hint(spec)} and check that pip installed torch into {main['python']['prefix']}")
    assert torch["version"] == spec.torch_local_version, (
        f"torch is {torch['version']}, but row {spec.tag} expects {spec.torch_local_version}: {rebuild_hint(spec)}; "
        f"a wrong local suffix means the wrong wheel index (expected {spec.wheel_index})")


def test_torch_cuda_version_is_the_rows(torch_facts, spec):
    built_for = torch_facts["cuda"]
    expected = spec.cuda
    assert built_for == expected, (
        f"torch was built for CUDA {built_for or 'none (CPU wheel)'}, but row {spec.tag} expects "
        f"{expected or 'a CPU wheel'}: install torch from the {spec.wheel_index} index ({rebuild_hint(spec)})")


def test_torchvision_is_the_rows(torch_facts, spec):
    torchvision = torch_facts.get("torchvision")
    if not spec.torchvision:
        pytest.skip("the row pins no torchvision")
    assert torchvision and torchvision.get("version"), (
        f"torchvision {spec.torchvision} is missing or does not import "
        f"({(torchvision or {}).get('error') or 'not installed'}): {rebuild_hint(spec)}")
    found = torchvision["version"].split("+")[0]
    assert found == spec.torchvision, (
        f"torchvision is {torchvision['version']}, but row {spec.tag} expects {spec.torchvision} "
        f"(the release paired with torch {spec.torch}): {rebuild_hint(spec)}")


def test_python_is_the_rows(main, spec):
    python = main["python"]
    assert python["major_minor"] == spec.python, (
        f"the image runs Python {python['version']} ({python['executable']}), but row {spec.tag} expects Python "
        f"{spec.python}: build it from this row, or check the image against the row for Python {python['major_minor']}")


def test_os_is_the_rows(main, spec):
    found = os_tag(main["os_release"])
    assert os_is_the_rows(found, spec), (
        f"the image is {main['os_release'].get('PRETTY_NAME', found)} ({found}), but row {spec.tag} expects "
        f"{spec.os} ({spec.os_release or spec.os}): its base image is {spec.base_image}; {rebuild_hint(spec)}")


def test_cudnn_is_the_rows(torch_facts, spec):
    if not spec.is_gpu:
        pytest.skip("CPU row: no cuDNN")
    runtime = decode_cudnn_version(torch_facts["cudnn_version"])
    assert runtime, (f"torch loads no cuDNN (torch.backends.cudnn.is_available() is False), but row {spec.tag} "
                     f"promises cuDNN {spec.cudnn}: check that nvidia-cudnn is installed ({rebuild_hint(spec)})")
    assert runtime[0] == spec.cudnn, (f"torch loads cuDNN {'.'.join(map(str, runtime))}, but the tag says cuDNN "
                                      f"{spec.cudnn}: {rebuild_hint(spec)}")
    compiled = tuple(torch_facts["cudnn_compile_version"] or ())
    assert not compiled or compiled[:2] == runtime[:2], (
        f"torch was compiled against cuDNN {'.'.join(map(str, compiled))} but loads "
        f"{'.'.join(map(str, runtime))}: another cuDNN shadows the pip wheel (see the hygiene check's library copies)")
    if spec.cudnn_version:
        pinned = tuple(int(part) for part in spec.cudnn_version.split(".")[:3])
        assert runtime == pinned, (f"torch loads cuDNN {'.'.join(map(str, runtime))}, but the row pins "
                                   f"{spec.cudnn_version}: {rebuild_hint(spec)}")


def test_arch_list_is_the_rows(torch_facts, spec):
    if not spec.is_gpu:
        pytest.skip("CPU row: no CUDA arch list")
    expected = arch_flags_for(list(spec.arch_list))
    found = torch_facts["arch_flags"]
    assert sorted(found) == sorted(expected), (
        f"torch was built for {' '.join(found) or 'no CUDA arch'}, but row {spec.tag} promises {' '.join(expected)} "
        f"(arch_list {';'.join(spec.arch_list)}): the wheel is not the row's ({spec.wheel_index}); {rebuild_hint(spec)}")


def test_labels_agree_with_the_contents(torch_facts, main, image, spec):
    labels = image["labels"]
    if not any(name.startswith(f"{LABEL_PREFIX}.") for name in labels):
        pytest.skip(f"the image carries no {LABEL_PREFIX}.* labels (not built by torchimages): nothing to compare")
    wrong = []
    for key, observed in observed_label_values(main).items():
        label = labels.get(f"{LABEL_PREFIX}.{key}")
        if key == "os" and os_is_the_rows(observed, spec):
            observed = spec.os  # the label names the matrix's OS (rocky9), the contents its release (rocky9.6)
        if label is None or (label == "" and observed != ""):
            wrong.append(f"{LABEL_PREFIX}.{key} is missing (contents: {observed or 'none'})")
        elif label != observed:
            wrong.append(f"{LABEL_PREFIX}.{key}={label} but the contents say {observed or 'none'}")
    for name, expected in row_label_values(spec).items():
        if labels.get(name, "") != expected:
            wrong.append(f"{name}={labels.get(name, '(missing)')} but row {spec.tag} says {expected or '(empty)'}")
    assert not wrong, ("labels do not tell the truth: " + "; ".join(wrong)
                       + f"; {rebuild_hint(spec)} so that the labels are set from the row")


def test_pytorch_version_env_agrees(torch_facts, main, spec):
    declared = main["env"].get("PYTORCH_VERSION")
    actual = torch_facts["version"].split("+")[0]
    assert declared == actual, (
        f"PYTORCH_VERSION is {declared or 'not set'}, but torch is {actual}: set ENV PYTORCH_VERSION={actual} "
        f"({rebuild_hint(spec)})")
