"""Fixtures of the image checks: the probe's facts by part, each failing loudly when its probe produced nothing.

The data fixtures (expect, spec, facts) and the container (host, from testinfra's --hosts) come from
torchimages.checks.plugin; run these suites through `python build.py test`, which starts the container.
"""

import pytest

from torchimages.checks.gpu_health import host_causes, host_health
from torchimages.checks.plugin import HOST_SKIP, failure_message

from .helpers import gpu_skip_reason

# "no kernel image": the arch list misses the GPU, which no host causes (the arch test names the rows that cover it).
NO_KERNEL_IMAGE = "no kernel image is available"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A GPU with memory errors (uncorrected ECC errors, a failed or pending row remap or page retirement) spoils GPU
    work whatever the image: a `gpu_work` test that fails there is skipped, not judged, and charged to the host, naming
    the errors (never passed: nothing of the image was proven)."""
    try:
        return (yield)
    except (AssertionError, pytest.fail.Exception) as error:
        gpu = pyfuncitem.funcargs.get("gpu")
        gpu = gpu if isinstance(gpu, dict) else {}
        memory = host_causes(host_health(gpu), ("memory",))
        arch_missed = any(NO_KERNEL_IMAGE in str(device.get("kernel_error")) for device in gpu.get("devices") or [])
        if not pyfuncitem.get_closest_marker("gpu_work") or not memory or arch_missed:
            raise
        message = failure_message(pytest.ExceptionInfo.from_exception(error))
        pytest.skip(f"{HOST_SKIP}not judged on a GPU with memory errors ({'; '.join(memory)}): {message}")


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
