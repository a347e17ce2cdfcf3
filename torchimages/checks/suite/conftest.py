"""Fixtures of the image checks: the probe's facts by part, each failing loudly when its probe produced nothing.

The data fixtures (expect, spec, facts) read what torchimages.checks.plugin loaded from --expect and --probe, and
the container (host) is testinfra's --hosts; run these suites through `torchimages test`, which starts the container.
The fixtures are module-level functions: pytest 9 deprecates, and 10 removes, session fixtures defined as a plugin
class's methods.
"""

import pytest

from torchimages.checks.gpu_health import host_health, work_spoilers
from torchimages.checks.plugin import HOST_SKIP, RECORDER, CheckRecorder, failure_message
from torchimages.model import ImageSpec

from .helpers import gpu_skip_reason

# "no kernel image": the arch list misses the GPU, which no host causes (the arch test names the rows that cover it).
NO_KERNEL_IMAGE = "no kernel image is available"


def _recorder(config: pytest.Config) -> CheckRecorder:
    recorder = config.pluginmanager.get_plugin(RECORDER)
    if recorder is None:
        raise pytest.UsageError("the image checks need -p torchimages.checks.plugin with --expect and --probe: run "
                                "them through `torchimages test`")
    return recorder


@pytest.fixture(scope="session")
def expect(pytestconfig: pytest.Config) -> dict:
    """expect.json: the matrix row and how the container was run."""
    return _recorder(pytestconfig).expectations


@pytest.fixture(scope="session")
def spec(expect) -> ImageSpec:
    return ImageSpec.from_json(expect["spec"])


@pytest.fixture(scope="session")
def facts(pytestconfig: pytest.Config) -> dict:
    """facts.json: what the probe found in the container."""
    return _recorder(pytestconfig).probe_facts


@pytest.fixture(autouse=True)
def _in_the_container(host):
    """Every check is about the container, so every test is parametrized by it (and then named by the tag)."""
    return host


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A GPU whose own state spoils new work (uncorrected ECC errors, a failed row remap, a reset required:
    gpu_health.SPOILS_WORK) proves nothing of the image: a `gpu_work` test that fails on such a GPU (matched by UUID)
    is skipped, not judged, and charged to the host, naming the state; its check is then not judged either (never
    passed). Another GPU's sickness, or a pending remap, excuses nothing: the failure is the image's."""
    try:
        return (yield)
    except (AssertionError, pytest.fail.Exception) as error:
        marker = pyfuncitem.get_closest_marker("gpu_work")
        gpu = pyfuncitem.funcargs.get("gpu")
        gpu = gpu if isinstance(gpu, dict) else {}
        devices = [device for device in gpu.get("devices") or [] if isinstance(device, dict)]
        arch_missed = any(NO_KERNEL_IMAGE in str(device.get("kernel_error")) for device in devices)
        on = marker.kwargs.get("on", "cuda:0") if marker else ""
        health = host_health(gpu)
        per_device = [work_spoilers(health, [str(device.get("uuid") or "")]) for device in _worked_on(on, devices)]
        # Each failed device must be spoiled itself; work across every device (NCCL) is spoiled by any one of them.
        excused = marker and not arch_missed and per_device and (any if on == "all" else all)(per_device)
        spoilers = list(dict.fromkeys(cause for causes in per_device for cause in causes))
        if not excused:
            raise
        message = failure_message(pytest.ExceptionInfo.from_exception(error))
        pytest.skip(f"{HOST_SKIP}not judged on a GPU whose state spoils GPU work ({'; '.join(spoilers)}): {message}")


def _worked_on(on: str, devices: list[dict]) -> list[dict]:
    """The devices whose work the test judged, as its gpu_work marker says: "cuda:0" (the default: cuDNN and AMP run
    there), "each" (each device's own work: those whose work failed) or "all" (work across every device: NCCL)."""
    if on == "all":
        return devices
    if on == "each":
        return [device for device in devices if not device.get("kernel_ok")]
    return devices[:1]


def _part(facts: dict, name: str) -> dict:
    part = facts[name]
    if "probe_error" in part:
        pytest.fail(f"the {name} probe gave no facts: {part['probe_error']}; its stderr ended with: "
                    f"{part.get('stderr_tail', '')[-600:]!r}. Rerun with a larger --timeout if it timed out, "
                    "or run the probe by hand in the image to see why")
    return part


@pytest.fixture(scope="session")
def main(facts) -> dict:
    """The main probe: run as the image's own user, as `docker run IMAGE` would."""
    return _part(facts, "main")


@pytest.fixture(scope="session")
def files(facts) -> dict:
    """The file scan, run as root so that nothing is hidden from it."""
    return _part(facts, "files")


@pytest.fixture(scope="session")
def arbitrary_user(facts) -> dict:
    """The import probe, run as an arbitrary uid (`docker run --user 12345`)."""
    return _part(facts, "import")


@pytest.fixture(scope="session")
def image(facts) -> dict:
    """The image's configuration from the engine: labels, env, user, size, history."""
    return facts["image"]


@pytest.fixture(scope="session")
def torch_facts(main) -> dict:
    if not main["torch"]["importable"]:
        pytest.skip("torch does not import in this image (the identity check reports it)")
    return main["torch"]


@pytest.fixture(scope="session")
def gpu_host(spec, expect, torch_facts, main) -> dict:
    """The probe's GPU facts, for what the host's driver and the image say without using a GPU; skipped with the
    reason where GPU checks cannot run, never passed."""
    reason = gpu_skip_reason(spec, expect)
    if reason:
        pytest.skip(reason)
    facts = main["gpu"]
    if "error" in facts:
        pytest.fail(f"the probe's GPU part crashed: {facts['error']}")
    return facts


@pytest.fixture(scope="session")
def gpu(gpu_host) -> dict:
    """The GPU facts where the GPUs can be used: a GPU no process may use (Prohibited compute mode) skips every test
    that needs one, with the reason, rather than failing the image."""
    if gpu_host.get("unusable"):
        pytest.skip(gpu_host["unusable"])
    return gpu_host


@pytest.fixture(scope="session")
def devices(gpu) -> list[dict]:
    if not gpu["available"]:
        pytest.skip("torch sees no GPU (the gpu check reports why)")
    return gpu["devices"]
