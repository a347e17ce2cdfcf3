"""gpu, driver and multi-gpu: the container sees the GPUs it was given, can run kernels on each of them, the host
driver is new enough, and with 2+ GPUs peers copy and NCCL all-reduces."""
import warnings

import pytest

from torchimages.checks.plugin import CheckWarning
from torchimages.checks.rules import arch_covers, arch_flags_for, mig_multi_gpu_reason

from .helpers import (
    driver_start_failure,
    driver_verdict,
    expected_device_count,
    hiding_visible_devices,
    host_start_failure,
    minimum_driver,
    ptx_only_without_jit,
)


def _torch_warnings(gpu: dict) -> str:
    return "; torch warned: " + " | ".join(gpu["warnings"]) if gpu["warnings"] else ""


def _nvidia_smi_says(gpu: dict) -> str:
    failure = gpu.get("nvidia_smi_error")
    if failure:
        return f"fails (exit {failure.get('returncode')}: {failure.get('output') or 'no output'!r})"
    smi = gpu.get("nvidia_smi_gpus")
    return f"lists {len(smi)}" if smi is not None else "lists nothing (not present)"


def _why_no_gpu(gpu: dict, image: dict) -> str:
    """The cause torch sees no GPU and its fix: CUDA_VISIBLE_DEVICES hiding the GPUs nvidia-smi lists, the host's
    driver or a host service; else where to look."""
    hidden = hiding_visible_devices(gpu, image.get("env"))
    if hidden:
        return hidden
    cause = host_start_failure(gpu)
    return (f"The host is the cause: {cause}" if cause else "Check the host driver (see the driver check) and "
            "that the NVIDIA runtime passes GPUs to containers (`docker run --gpus all ... nvidia-smi`)")


@pytest.mark.check("gpu")
def test_cuda_is_available(gpu, expect, image):
    fix = _why_no_gpu(gpu, image)
    assert gpu["available"], (
        f"torch.cuda.is_available() is False although GPUs were requested (--gpus {expect['gpus']['text']}); "
        f"nvidia-smi in the container {_nvidia_smi_says(gpu)}{_torch_warnings(gpu)}. {fix}")


@pytest.mark.check("gpu")
def test_device_count_is_what_was_requested(gpu, expect):
    if not gpu["available"]:
        pytest.skip("torch sees no GPU (test_cuda_is_available says why)")
    expected, source = expected_device_count(expect, gpu)
    if expected is None:
        pytest.skip(f"cannot tell how many GPUs the container was given: {source}")
    allowed = expected if isinstance(expected, range) else range(expected, expected + 1)
    means = f"{allowed.start} to {allowed.stop - 1}" if len(allowed) > 1 else str(allowed.start)
    assert gpu["device_count"] in allowed, (
        f"torch sees {gpu['device_count']} GPU(s), but {source} means {means}: check CUDA_VISIBLE_DEVICES "
        f"({gpu.get('cuda_visible_devices') or 'unset'}) and the --gpus request")


@pytest.mark.check("gpu")
@pytest.mark.gpu_work(on="each")
def test_a_kernel_runs_on_every_device(devices, gpu):
    failing = [f"cuda:{d['index']} ({d['name']}, sm_{d['capability'][0]}{d['capability'][1]}): {d['kernel_error']}"
               for d in devices if not d["kernel_ok"]]
    assert not failing, ("a torch kernel or the cuBLAS matmul failed or gave wrong results on " + "; ".join(failing)
                         + ": 'no kernel image is available' means the arch list misses this GPU (see the arch test)")


@pytest.mark.check("gpu")
def test_every_device_is_covered_by_the_arch_list(devices, gpu, torch_facts, expect, spec):
    flags = torch_facts["arch_flags"]
    driver = gpu.get("driver_version")
    driver_status = driver_verdict(driver, gpu.get("libcuda_driver_version"), spec)[0] if driver else "ok"
    uncovered = []
    for device in devices:
        capability = tuple(device["capability"])
        coverage = arch_covers(flags, capability, spec.cuda)
        sm = f"sm_{capability[0]}{capability[1]}"
        if ptx_only_without_jit(coverage, driver_status):
            uncovered.append(f"{device['name']} is {sm}: only {coverage} covers it, and the host driver {driver} is "
                             f"older than CUDA {spec.cuda}'s own ({spec.min_driver}), which cannot JIT-compile that "
                             "PTX (NVIDIA CUDA Compatibility, minor-version compatibility): upgrade the driver")
            continue
        if coverage:
            continue
        rows = [tag for tag, row in expect["arch_rows"].items() if row["arch"] == spec.arch
                and arch_covers(arch_flags_for(row["arch_list"]), capability, row["cuda"])]
        uncovered.append(f"{device['name']} is {sm}, but this image's torch has {' '.join(flags)} (no cubin "
                         f"sm_{capability[0]}x at or below it, no PTX at or below {capability[0]}.{capability[1]}); "
                         f"rows that cover it: {', '.join(rows) or 'none in the matrix'}")
    assert not uncovered, "; ".join(uncovered)


@pytest.mark.check("driver")
def test_host_driver_meets_the_cuda_minimum(gpu_host, image, spec):
    gpu = gpu_host
    cause = driver_start_failure(gpu)
    assert not cause, f"CUDA cannot start on this host, whatever the versions: {cause}"
    found = gpu.get("driver_version")
    assert found, (
        f"could not read the host's NVIDIA driver version (nvidia-smi in the container {_nvidia_smi_says(gpu)}, no "
        f"/proc/driver/nvidia/version){_torch_warnings(gpu)}: start the container with NVIDIA_DRIVER_CAPABILITIES "
        "including utility")
    # The libcuda's version says what it supports only where CUDA started with it.
    libcuda = gpu.get("libcuda_driver_version") if gpu["available"] else None
    status, why = driver_verdict(found, libcuda, spec, minimum_driver(image, spec))
    assert status != "fail", (f"{why}{_torch_warnings(gpu)}: upgrade the host driver, or use a tag built for an "
                              "older CUDA")
    if status == "warn":
        warnings.warn(CheckWarning(why), stacklevel=2)


@pytest.mark.check("multi-gpu")
@pytest.mark.gpu_work(on="all")
def test_peer_copies_and_nccl_all_reduce(devices, gpu):
    if len(devices) < 2:
        pytest.skip(f"{len(devices)} GPU visible: multi-GPU checks need 2 or more (--gpus all on a multi-GPU host)")
    mig_reason = mig_multi_gpu_reason(len(devices), gpu, [device["name"] for device in devices])
    if mig_reason:
        pytest.skip(mig_reason)
    result = gpu["multi_gpu"]
    assert result.get("ok") and not result.get("skipped"), (
        f"across {len(devices)} GPUs: {result.get('error') or result}; peer copies ok: {result.get('peer_copies_ok')}, "
        f"NCCL all-reduce ok: {result.get('all_reduce_ok')}. With NCCL errors about shared memory, raise --shm-size "
        "or use --ipc=host")
