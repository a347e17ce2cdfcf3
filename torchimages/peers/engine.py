"""Talking to the Docker engine: connecting with a clear error, asking it questions within a bound and checking the
shape of its answers, and explaining the engine's errors (without the credentials they may repeat)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests

from ..files import brief
from ..invocation import start_engine
from ..model import InputError, PeerError, Problem
from ..redaction import redact

NO_GPU_RUNTIME = 'could not select device driver "" with capabilities: [[gpu]]'
# For containers that must see no GPU: our images say NVIDIA_VISIBLE_DEVICES=all, which alone gives a container every
# GPU on an engine whose default runtime is nvidia (and fails its start where the host's driver does not load). "void"
# is the NVIDIA runtime's "no GPU" (NVIDIA Container Toolkit, "Specialized Configurations with Docker", GPU Enumeration).
NO_GPUS = {"NVIDIA_VISIBLE_DEVICES": "void"}
GPU_RUNTIME_HINT = ("this Docker engine has no NVIDIA runtime, so it cannot give containers GPUs. Install the NVIDIA "
                    "Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`, restart dockerd, "
                    "or verify without GPUs: --gpus none")


PING_TIMEOUT_S = 10  # an engine that accepts connections but never answers is reported in seconds, not minutes
# A question (info, an image's inspect) that a working engine answers at once: an engine that answered the ping and
# then stalls is reported after this, not after the client's long timeout (meant for transfers and builds).
QUESTION_TIMEOUT_S = 30


def where() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def client(timeout: int = 600) -> docker.DockerClient:
    """A client for $DOCKER_HOST that is known to answer; otherwise an InputError (exit 2) saying what to do.
    `timeout` bounds every later call (a build's stream waits that long for its next line)."""
    where_ = where()
    try:
        docker_client = docker.from_env(timeout=PING_TIMEOUT_S)
        docker_client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise InputError([Problem("DOCKER_HOST", 0, f"no Docker engine answers at {where_} within {PING_TIMEOUT_S} s "
                                                    f"({_short(error)}): {start_engine()}")]) from None
    docker_client.api.timeout = timeout
    return docker_client


# The /info fields the tool reads (GPU runtime, doctor), each of the type it must have when present: a Runtimes that
# is a string once made every row a GPU row ("nvidia" in "nvidia-free"), a number a traceback.
INFO_FIELDS = {"Runtimes": dict, "CDISpecDirs": list, "DiscoveredDevices": list, "ServerVersion": str, "OSType": str,
               "Architecture": str, "DockerRootDir": str}
JSON_KINDS = {dict: "an object", list: "a list", str: "text"}


def daemon_info(docker_client: docker.DockerClient) -> dict:
    """The engine's /info, asked within QUESTION_TIMEOUT_S; a PeerError when a field the tool reads has another type."""
    info = _ask(docker_client, "GET /info", "/info")
    for field, kind in INFO_FIELDS.items():
        if info.get(field) is not None and not isinstance(info[field], kind):
            raise PeerError(f"the Docker engine at {where()} answered GET /info with {field} "
                            f"{brief(info[field])}, not {JSON_KINDS[kind]}; is DOCKER_HOST a Docker engine?")
    return info


def inspect_image(docker_client: docker.DockerClient, reference: str) -> dict | None:
    """The engine's view of an image, or None when it has no such image; a PeerError when the answer is not an
    image's description (every caller reads Id, Size, Config.Labels, RepoTags and RepoDigests)."""
    try:
        image = _ask(docker_client, f"the inspect of image {brief(reference)}", "/images/{0}/json", reference)
    except docker.errors.ImageNotFound:
        return None
    return checked_image(image, reference)


def checked_image(image: object, reference: str) -> dict:
    """An engine's description of an image, once it has the shape every caller reads; a PeerError naming the engine
    otherwise."""
    problem = _image_shape_problem(image) if isinstance(image, dict) else "something that is not a JSON object"
    if problem:
        raise PeerError(f"the Docker engine at {where()} described image {brief(reference)} with {problem}: "
                        f"{brief(image)}; is DOCKER_HOST a Docker engine?")
    assert isinstance(image, dict)
    return image


def buildkit_build(api: docker.APIClient, context, params: dict, timeout: int) -> Iterator[dict]:
    """POST /build for the engine's BuildKit (params: buildkit.build_params), the context as the request's tar body:
    the engine's JSON events as they come, each within timeout. docker-py's build() cannot ask for BuildKit, so this
    posts with its client's own helpers (its registry credentials included, for a base `--pull` refreshes)."""
    headers = {"Content-Type": "application/x-tar"}
    api._set_auth_headers(headers)
    response = api._post(api._url("/build"), params=params, data=context, headers=headers, stream=True, timeout=timeout)
    return api._stream_helper(response, decode=True)


def cancel_build(docker_client: docker.DockerClient, build_id: str) -> None:
    """Cancel a running BuildKit build (POST /build/cancel); one that has ended already is no error."""
    api = docker_client.api
    with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
        api._raise_for_status(api._post(api._url("/build/cancel"), params={"id": build_id}, timeout=QUESTION_TIMEOUT_S))


def _image_shape_problem(image: dict) -> str | None:
    config = image.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    names_ok = all(isinstance(image.get(key) or [], list) and all(isinstance(name, str) for name in image.get(key) or [])
                   for key in ("RepoTags", "RepoDigests"))
    if not isinstance(image.get("Id"), str) or not image["Id"]:
        return "no Id"
    if not isinstance(config, dict) or not isinstance(labels or {}, dict):
        return "no Config object with Labels"
    if not isinstance(image.get("Size"), int) or not names_ok:
        return "a Size or RepoTags/RepoDigests of the wrong type"
    return None


def _ask(docker_client: docker.DockerClient, what: str, path: str, *arguments: str) -> dict:
    """GET path from the engine within QUESTION_TIMEOUT_S: a JSON object, or a PeerError naming the engine, what was
    asked and what it did. (docker-py's public calls wait the client's one timeout, meant for builds and pulls.)"""
    api = docker_client.api
    try:
        response = api._get(api._url(path, *arguments), timeout=QUESTION_TIMEOUT_S)
        answer = api._result(response, json=True)
    except docker.errors.NotFound:
        raise  # ImageNotFound: the caller's answer
    except requests.exceptions.Timeout:
        raise PeerError(f"the Docker engine at {where()} did not answer {what} within {QUESTION_TIMEOUT_S} s "
                        "(it answered its ping): it is overloaded or stuck; check dockerd's log") from None
    except ValueError:  # requests' JSONDecodeError (a RequestException too)
        raise PeerError(f"the Docker engine at {where()} answered {what} with what is not JSON: "
                        f"{brief(response.text)}; is DOCKER_HOST a Docker engine?") from None
    except (requests.exceptions.RequestException, docker.errors.DockerException) as error:
        raise PeerError(f"the Docker engine at {where()} failed {what}: {_short(error)}") from None
    if not isinstance(answer, dict):
        raise PeerError(f"the Docker engine at {where()} answered {what} with a JSON {type(answer).__name__}, not an "
                        f"object: {brief(answer)}; is DOCKER_HOST a Docker engine?")
    return answer


# dockerd registers its "nvidia" device driver (what --gpus asks for) where nvidia-container-runtime-hook is on its
# PATH, with or without an nvidia entry under Runtimes (moby daemon/devices_nvidia_linux.go, init(), v28.5.0 and
# docker-v29.1.5). nvidia-cdi-hook alone (nvidia-container-toolkit-base, NVIDIA's CDI-only setup) gives --gpus only from
# docker-v29.2.0, which maps --gpus to nvidia.com/gpu CDI requests (getNVIDIADeviceDrivers, moby commit 86f122af27);
# before, that host takes GPUs through CDI device requests alone (gpu-audit-3 C2).
RUNTIME_HOOK, CDI_HOOK = "nvidia-container-runtime-hook", "nvidia-cdi-hook"
NVIDIA_HOOKS = (RUNTIME_HOOK, CDI_HOOK)
CDI_HOOK_GPUS_FROM = (29, 2)
# What the NVIDIA container stack says when a GPU container cannot start for a GPU reason: nvidia-container-cli's
# "nvml error: driver not loaded", "device error: ...: unknown device", the cuda>= requirement of NVIDIA's images; in
# CDI mode dockerd's "CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=..." (moby's CDI injection,
# the CDI library's words) and a failing nvidia-cdi-hook createContainer hook.
GPU_START_ERRORS = ("nvidia-container-cli", "unsatisfied condition: cuda>=", "nvidia-container-runtime",
                    "CDI device injection failed", "unresolvable CDI devices", "nvidia-cdi-hook")
# The GPU start errors whose cause is the host driver itself (too old for the image, not loaded, not the loaded
# module's version): the driver check fails with them too.
DRIVER_START_ERRORS = ("unsatisfied condition: cuda>=", "driver not loaded", "driver/library version mismatch")
# The CDI kind NVIDIA's spec names GPUs with (`nvidia-ctk cdi generate`: nvidia.com/gpu=0, =GPU-<uuid>, =0:1 for a MIG
# device, =all), and the spec folders the engine reads when it does not list its own (moby's defaults).
CDI_GPU_KIND = "nvidia.com/gpu"
CDI_DEFAULT_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_HINT = ("or, where the engine supports CDI (Docker 25+ with the cdi feature; on by default from 28), generate a "
            "CDI spec with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` and GPUs are requested through CDI")


@dataclass(frozen=True)
class GpuAccess:
    """How this engine gives containers GPUs: "runtime" (--gpus, the NVIDIA runtime or its hook), "cdi" (a device
    request for nvidia.com/gpu=... that the engine resolves from the host's CDI spec), or "" (it cannot); and why."""

    path: str
    why: str


def nvidia_cdi_specs(folders) -> list[str]:
    """The CDI spec files in these folders that name NVIDIA GPUs (kind nvidia.com/gpu), as `nvidia-ctk cdi generate`
    writes them (YAML or JSON)."""
    found = []
    for folder in map(Path, folders):
        with contextlib.suppress(OSError):
            for spec in sorted(folder.iterdir()):
                if spec.suffix in (".yaml", ".yml", ".json") and spec.is_file() and spec.stat().st_size < 16 << 20:
                    with contextlib.suppress(OSError):
                        if CDI_GPU_KIND in spec.read_text(errors="replace"):
                            found.append(str(spec))
    return found


def docker_version(info: dict) -> tuple[int, int] | None:
    """/info's ServerVersion ("28.5.1", "29.2.0-rc.1") as (major, minor); None where it is not a release's ("dev")."""
    match = re.match(r"(\d+)\.(\d+)", str(info.get("ServerVersion") or ""), re.ASCII)
    return (int(match.group(1)), int(match.group(2))) if match else None


def gpus_hook(info: dict, hooks_on_path: Iterable[str]) -> str:
    """The hook on dockerd's PATH that makes it take --gpus, or "": the runtime hook always, the CDI hook alone only
    on Docker 29.2+ (an unknown version is not taken for one)."""
    found = set(hooks_on_path)
    if RUNTIME_HOOK in found:
        return RUNTIME_HOOK
    version = docker_version(info)
    return CDI_HOOK if CDI_HOOK in found and version is not None and version >= CDI_HOOK_GPUS_FROM else ""


def gpu_access_of(info: dict, hooks_on_path: Iterable[str], cdi_specs: list[str]) -> GpuAccess:
    """The GPU path an engine offers, from its /info, the NVIDIA hooks on its PATH (a local engine) and the host's
    NVIDIA CDI specs. The runtime path first: --gpus there needs no spec. CDI needs both an engine that takes
    CDI device requests (/info lists CDISpecDirs only where the cdi feature is on) and a spec naming NVIDIA GPUs (on
    this host, or the devices the engine discovered from one: DiscoveredDevices, Docker 28.2+)."""
    if "nvidia" in (info.get("Runtimes") or {}):
        return GpuAccess("runtime", "through the NVIDIA runtime (--gpus)")
    hook = gpus_hook(info, hooks_on_path)
    if hook == RUNTIME_HOOK:
        return GpuAccess("runtime", f"through {RUNTIME_HOOK} on dockerd's PATH (--gpus)")
    if hook:
        return GpuAccess("runtime", f"through {CDI_HOOK} on dockerd's PATH (--gpus, which Docker "
                                    f"{info.get('ServerVersion')} resolves from the host's {CDI_GPU_KIND} spec)")
    cdi_hook_alone = ("; " if CDI_HOOK in set(hooks_on_path) else "")
    if cdi_hook_alone:
        cdi_hook_alone += (f"{CDI_HOOK} alone gives --gpus only from Docker {'.'.join(map(str, CDI_HOOK_GPUS_FROM))} "
                           f"(this engine is {info.get('ServerVersion') or 'of an unknown version'})")
    discovered = [str(device.get("ID", device)) if isinstance(device, dict) else str(device)
                  for device in info.get("DiscoveredDevices") or [] if CDI_GPU_KIND in str(device)]
    if info.get("CDISpecDirs") and (cdi_specs or discovered):
        return GpuAccess("cdi", f"through CDI ({CDI_GPU_KIND}=..., from {', '.join(cdi_specs or discovered[:3])}): "
                                f"the engine has no NVIDIA runtime{cdi_hook_alone}")
    return GpuAccess("", f"{GPU_RUNTIME_HINT}{cdi_hook_alone}; {CDI_HINT}")


def gpu_access(docker_client: docker.DockerClient) -> GpuAccess:
    """How this engine gives containers GPUs (doctor says it; verification requests GPUs that way). A remote engine's
    PATH and spec folders are not this machine's: there only /info tells."""
    info = daemon_info(docker_client)
    local = _local_engine()
    hooks = [hook for hook in NVIDIA_HOOKS if shutil.which(hook)] if local else []
    specs = nvidia_cdi_specs(info.get("CDISpecDirs") or CDI_DEFAULT_DIRS) if local else []
    return gpu_access_of(info, hooks, specs)


def has_gpu_runtime(docker_client: docker.DockerClient) -> bool:
    """Whether the engine can likely give containers GPUs: a hint for doctor and the default selection. Verification
    does not refuse on it: the container's start decides, and its error says what is missing."""
    return bool(gpu_access(docker_client).path)


def _local_engine() -> bool:
    return os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")


def is_gpu_start_error(text: str) -> bool:
    """A container start that failed for a GPU reason: the GPU checks fail with it, the others run without GPUs."""
    return any(marker in text for marker in GPU_START_ERRORS)


def is_driver_start_error(text: str) -> bool:
    """A GPU start error whose cause is the host driver (the driver check fails with it as well)."""
    return any(marker in text.lower() for marker in DRIVER_START_ERRORS)


def explain_start_error(error: docker.errors.APIError) -> str:
    """Turn the daemon's container start errors into what the user should do."""
    text = _start_reason(error)
    if NO_GPU_RUNTIME in text:
        return GPU_RUNTIME_HINT
    if "unsatisfied condition: cuda>=" in text:
        return f"the host's NVIDIA driver is too old for this image ({text}); upgrade the driver or use a tag with an older CUDA"
    # libnvidia-container words NVML's errors in lower case ("nvml error: driver/library version mismatch"),
    # nvidia-smi capitalised: either may reach us.
    if "driver not loaded" in text.lower() or "driver/library version mismatch" in text.lower():
        return (f"the host's NVIDIA driver is not usable ({text}): check `nvidia-smi` on the host (a driver upgraded "
                "without a reboot or module reload gives a version mismatch)")
    if "unknown device" in text:
        return f"the requested GPU does not exist on this host ({text}): list them with `nvidia-smi -L`, pick --gpus again"
    if "unresolvable CDI devices" in text or "CDI device injection failed" in text:
        return (f"the host's CDI spec does not name the requested GPUs ({text}): list them with `nvidia-ctk cdi list`, "
                "and regenerate the spec after a driver or GPU change (`nvidia-ctk cdi generate "
                "--output=/etc/cdi/nvidia.yaml`)")
    return text


def _start_reason(error: docker.errors.APIError) -> str:
    """The start error in one line: the NVIDIA hook's own line where it wrote one. The daemon's first line ends at the
    hook's "Auto-detected mode as 'legacy'", the reason is on the next (NVIDIA/nvidia-container-toolkit#556)."""
    lines = str(error.explanation or error).splitlines()
    return next((line.strip() for line in lines if "nvidia-container-cli" in line or "nvidia-cdi-hook" in line),
                _short(error))


def _short(error: Exception) -> str:
    """The first line of an engine error, without credentials (a build's error repeats its URL with the build args)."""
    explanation = getattr(error, "explanation", None)
    text = str(explanation or error).strip()
    return redact(text.splitlines()[0]) if text else type(error).__name__
