"""Talking to the Docker engine: connecting with a clear error, and explaining the engine's errors."""
from __future__ import annotations

import os
import shutil

import docker
import docker.errors
import requests

from .model import InputError, Problem

NO_ENGINE_HINT = "start one with `make engine` (then `source .engine/env`), or export DOCKER_HOST=unix:///path/to/docker.sock"
NO_GPU_RUNTIME = 'could not select device driver "" with capabilities: [[gpu]]'
# For containers that must see no GPU: our images say NVIDIA_VISIBLE_DEVICES=all, which alone gives a container every
# GPU on an engine whose default runtime is nvidia (and fails its start where the host's driver does not load). "void"
# is the NVIDIA runtime's "no GPU" (NVIDIA Container Toolkit, "Specialized Configurations with Docker", GPU Enumeration).
NO_GPUS = {"NVIDIA_VISIBLE_DEVICES": "void"}
GPU_RUNTIME_HINT = ("this Docker engine has no NVIDIA runtime, so it cannot give containers GPUs. Install the NVIDIA "
                    "Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`, restart dockerd, "
                    "or verify without GPUs: --gpus none")


PING_TIMEOUT_S = 10  # an engine that accepts connections but never answers is reported in seconds, not minutes


def client(timeout: int = 600) -> docker.DockerClient:
    """A client for $DOCKER_HOST that is known to answer; otherwise an InputError (exit 2) saying what to do.
    `timeout` bounds every later call (a build's stream waits that long for its next line)."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        docker_client = docker.from_env(timeout=PING_TIMEOUT_S)
        docker_client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise InputError([Problem("DOCKER_HOST", 0, f"no Docker engine answers at {where} within {PING_TIMEOUT_S} s "
                                                    f"({_short(error)}): {NO_ENGINE_HINT}")]) from None
    docker_client.api.timeout = timeout
    return docker_client


def inspect_image(docker_client: docker.DockerClient, reference: str) -> dict | None:
    """The engine's view of an image, or None when it has no such image."""
    try:
        return docker_client.api.inspect_image(reference)
    except docker.errors.ImageNotFound:
        return None


# dockerd registers its "nvidia" device driver (what --gpus asks for) whenever one of these is on its PATH, with or
# without an nvidia entry under Runtimes (moby daemon/nvidia_linux.go, init()).
NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-cdi-hook")
# What the NVIDIA container stack says when a GPU container cannot start for a GPU reason (nvidia-container-cli's
# "nvml error: driver not loaded", "device error: ...: unknown device", the cuda>= requirement of NVIDIA's images).
GPU_START_ERRORS = ("nvidia-container-cli", "unsatisfied condition: cuda>=", "nvidia-container-runtime")


def has_gpu_runtime(docker_client: docker.DockerClient) -> bool:
    """Whether the engine can likely give containers GPUs: a hint for doctor and the default selection. Verification
    does not refuse on it: the container's start decides, and its error says what is missing."""
    info = docker_client.info()
    return ("nvidia" in (info.get("Runtimes") or {}) or bool(info.get("CDISpecDirs") and _has_cdi_gpus(info))
            or (_local_engine() and any(shutil.which(hook) for hook in NVIDIA_HOOKS)))


def _local_engine() -> bool:
    return os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")


def is_gpu_start_error(text: str) -> bool:
    """A container start that failed for a GPU reason: the GPU checks fail with it, the others did not run."""
    return any(marker in text for marker in GPU_START_ERRORS)


def _has_cdi_gpus(info: dict) -> bool:
    return any("nvidia.com/gpu" in str(device) for device in info.get("DiscoveredDevices") or [])


def explain_start_error(error: docker.errors.APIError) -> str:
    """Turn the daemon's container start errors into what the user should do."""
    text = _start_reason(error)
    if NO_GPU_RUNTIME in text:
        return GPU_RUNTIME_HINT
    if "unsatisfied condition: cuda>=" in text:
        return f"the host's NVIDIA driver is too old for this image ({text}); upgrade the driver or use a tag with an older CUDA"
    if "driver not loaded" in text or "Driver/library version mismatch" in text:
        return (f"the host's NVIDIA driver is not usable ({text}): check `nvidia-smi` on the host (a driver upgraded "
                "without a reboot or module reload gives a version mismatch)")
    if "unknown device" in text:
        return f"the requested GPU does not exist on this host ({text}): list them with `nvidia-smi -L`, pick --gpus again"
    return text


def _start_reason(error: docker.errors.APIError) -> str:
    """The start error in one line: the NVIDIA hook's own line where it wrote one. The daemon's first line ends at the
    hook's "Auto-detected mode as 'legacy'", the reason is on the next (NVIDIA/nvidia-container-toolkit#556)."""
    lines = str(error.explanation or error).splitlines()
    return next((line.strip() for line in lines if "nvidia-container-cli" in line), _short(error))


def _short(error: Exception) -> str:
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip().splitlines()[0] if str(explanation or error).strip() else type(error).__name__
