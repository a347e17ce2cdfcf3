"""Verification, step 1: what to verify and how, decided and checked before any container starts."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import docker.types

from ..build.builder import local_name
from ..checks import checklist
from ..checks.selection import CheckSelection
from ..invocation import command
from ..model import LABEL_PREFIX, ImageSpec, InputError, Problem, parse_size
from ..peers import engine

CHECKS, GPU_CHECKS = checklist.NAMES, checklist.GPU_CHECKS  # declared once, in torchimages/checks/checklist.py
VERIFY_LABEL = f"{LABEL_PREFIX}.verify"
CHECKS_DIR = Path(__file__).resolve().parent.parent / "checks"
SUITE = CHECKS_DIR / "suite"
RUNTIME_TIMEOUT_S = 300  # the smoke test's compiles, cold inductor cache, on a loaded 2-core machine
DEVEL_TIMEOUT_S = 600  # compiling a torch extension takes minutes on small machines
GPU_EXTRA_S = 300  # with GPUs: a cold max-autotune on cuda:0 (Triton templates), NCCL over every GPU, SDPA, AMP


@dataclass(frozen=True)
class GpuRequest:
    """What --gpus asked for: all, none, a count, or a device list."""

    text: str
    count: int = 0  # -1: all GPUs
    device_ids: tuple[str, ...] = ()

    @property
    def wanted(self) -> bool:
        return self.count != 0 or bool(self.device_ids)

    @property
    def mig(self) -> bool:
        """MIG devices asked for by UUID (MIG-...) or GPU:instance index (0:1)."""
        return any(device.startswith("MIG-") or ":" in device for device in self.device_ids)

    @property
    def expected_count(self) -> int | None:
        """How many GPUs torch must see; None for 'all', which only the container can tell. One CUDA process
        enumerates a single MIG device however many it is given (NVIDIA MIG User Guide, "CUDA Device Enumeration")."""
        if self.mig:
            return 1
        if self.device_ids:
            return len(self.device_ids)
        return self.count if self.count > 0 else None

    def device_requests(self, via: str = "runtime") -> list[docker.types.DeviceRequest]:
        """The engine's device requests: --gpus's own ("runtime"), or CDI device names ("cdi": nvidia.com/gpu=all,
        =0, =GPU-<uuid>, =MIG-<uuid>, as `nvidia-ctk cdi generate` names them; a count is the first N indices)."""
        if not self.wanted:
            return []
        if via == "cdi":
            names = self.device_ids or (tuple(map(str, range(self.count))) if self.count > 0 else ("all",))
            return [docker.types.DeviceRequest(driver="cdi", device_ids=[f"{engine.CDI_GPU_KIND}={name}"
                                                                         for name in names])]
        if self.device_ids:
            return [docker.types.DeviceRequest(device_ids=list(self.device_ids), capabilities=[["gpu"]])]
        return [docker.types.DeviceRequest(count=self.count, capabilities=[["gpu"]])]

    def to_json(self) -> dict:
        return {"text": self.text, "wanted": self.wanted, "expected_count": self.expected_count, "mig": self.mig,
                "device_ids": list(self.device_ids)}


def parse_gpus(text: str) -> GpuRequest:
    """--gpus all | none | N | device=0,1 (Docker's own syntax)."""
    value = text.strip()
    if value in ("all", "none"):
        return GpuRequest(value, -1 if value == "all" else 0)
    if value.isascii() and value.isdigit():  # not full-width digits, which int() would take
        return GpuRequest(value, int(value))
    if value.startswith("device="):
        devices = tuple(d.strip() for d in value.removeprefix("device=").split(",") if d.strip())
        if devices:
            return GpuRequest(value, device_ids=devices)
    raise InputError([Problem("--gpus", 0, f"--gpus {text!r} is not all, none, a number or device=0,1")])


@dataclass(frozen=True)
class VerifyOptions:
    reports_dir: Path
    gpus: str | None = None  # None: all for GPU rows, none for CPU rows
    shm_size: str | None = None  # None: the row's shm_size
    image: str | None = None  # check this image instead of the row's own (exactly one row)
    timeout: int | None = None  # seconds for the main probe; None: by flavor (times the slowdown under emulation)
    matrix_specs: tuple[ImageSpec, ...] = ()  # every row, to name the ones covering a GPU that is not covered
    suite: Path = SUITE
    jobs: int = 1  # images verified at once where no GPU is given (verification.jobs says why not with GPUs)
    selection: CheckSelection = CheckSelection()  # the checks to run (--only/--skip); by default every one
    force: bool = False  # verify again where a passing verification of the same image id is kept (reuse.py)


@dataclass
class VerifyResult:
    tag: str
    image: str
    image_id: str
    passed: bool
    checks: dict[str, dict]
    report_dir: Path
    duration: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    cpu_standin: str = ""  # why the CPU identity the image saw was a stand-in (emulation.py); "" for the engine's own
    selection: CheckSelection = CheckSelection()  # the checks it ran: a selective result is never one to publish
    host: dict = field(default_factory=dict)  # the GPUs' health and speed figures (checks/gpu_speed.host_report)
    reused_from: str = ""  # when the passing verification kept instead of running it again finished ("": it ran now)


@dataclass(frozen=True)
class Plan:
    """One image to verify, decided before any container starts."""

    spec: ImageSpec
    image: str
    image_id: str
    gpus: GpuRequest
    shm_size: str
    timeout: int
    gpu_path: str = "runtime"  # how the engine gives GPUs (engine.GpuAccess): the NVIDIA runtime's --gpus, or CDI
    image_architecture: str = ""  # the image's machine as its config names it (amd64, arm64)
    # The CPUs a stand-in CPU identity describes where the engine emulates the image's arm64 machine (emulation.py);
    # 0 where the engine runs the image's machine itself.
    standin_cpus: int = 0
    slowdown: int = 1  # what every time bound is multiplied by: emulation.SLOWDOWN under emulation, 1 natively
    # The folder below reports/<tag>/ for an image given by --image (image_folder): its checks never stand in the
    # row's own verify.json, which publish reads. "" for the row's own image.
    folder: str = ""

    def report_dir(self, reports_dir: Path) -> Path:
        return reports_dir / self.spec.tag / self.folder if self.folder else reports_dir / self.spec.tag


IMAGE_FOLDER_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+", re.ASCII)
IMAGE_FOLDER_MAX = 100


def image_folder(reference: str) -> str:
    """reports/<tag>/<this>/ for the checks of an image given by --image: image-<the reference, every character a
    file name should not hold made _>, cut short with 12 characters of its sha256 where it is long (a digest)."""
    name = "image-" + IMAGE_FOLDER_CHARACTERS.sub("_", reference)
    if len(name) > IMAGE_FOLDER_MAX:
        name = f"{name[:IMAGE_FOLDER_MAX - 13]}-{hashlib.sha256(reference.encode()).hexdigest()[:12]}"
    return name


class Progress:
    """Receives verification events; the CLI shows them with rich."""

    def stage(self, tag: str, text: str) -> None: ...
    def finished(self, result: VerifyResult) -> None: ...


# ---------------------------------------------------------------- planning (input checks before anything starts)

def plan_all(docker_client: docker.DockerClient, specs: list[ImageSpec], options: VerifyOptions,
             progress: Progress) -> list[Plan]:
    if options.image and len(specs) != 1:
        tags = ", ".join(spec.tag for spec in specs)
        raise InputError([Problem("--image", 0, f"--image checks one image against one row, but the selectors "
                                                f"chose {len(specs)}: {tags}; name exactly one tag")])
    problems: list[Problem] = []
    plans = []
    for spec in specs:
        try:
            plans.append(_plan(docker_client, spec, options, progress))
        except InputError as error:
            problems.extend(error.problems)
    if problems:
        raise InputError(problems)
    # No refusal on the engine's Runtimes: dockerd gives GPUs without an nvidia runtime entry (engine.NVIDIA_HOOKS);
    # the first container's start decides, and "could not select device driver" is exit 2 with the fix.
    return plans


def _plan(docker_client: docker.DockerClient, spec: ImageSpec, options: VerifyOptions, progress: Progress) -> Plan:
    gpus = parse_gpus(options.gpus or ("all" if spec.is_gpu else "none"))
    shm_size = options.shm_size or spec.shm_size
    try:
        parse_size(shm_size)
    except ValueError as error:
        raise InputError([Problem("--shm-size", 0, str(error))]) from None
    if options.timeout is not None and options.timeout < 1:
        raise InputError([Problem("--timeout", 0, "--timeout must be at least 1 second")])
    image = options.image or local_name(spec)
    inspected = _inspect_image(docker_client, image, pull=bool(options.image), progress=progress, tag=spec.tag)
    timeout = options.timeout or ((DEVEL_TIMEOUT_S if spec.builds_extensions else RUNTIME_TIMEOUT_S)
                                  + (GPU_EXTRA_S if gpus.wanted else 0))
    return Plan(spec, image, inspected["Id"], gpus, shm_size, timeout,
                image_architecture=str(inspected.get("Architecture") or ""),
                folder=image_folder(options.image) if options.image else "")


def _inspect_image(docker_client: docker.DockerClient, image: str, pull: bool, progress: Progress, tag: str) -> dict:
    """The engine's description of image (pulled first where asked and missing), checked for the shape every caller
    reads (engine.checked_image: a PeerError naming the engine otherwise)."""
    try:
        return engine.checked_image(docker_client.api.inspect_image(image), image)
    except docker.errors.ImageNotFound:
        pass
    if not pull:
        raise InputError([Problem(image, 0, f"the local image {image} (a name on this engine, not pushed anywhere) "
                                            f"is not on the engine: build it with {command(f'build {tag}')}, or "
                                            "check another with --image")])
    progress.stage(tag, f"pulling {image}")
    try:
        docker_client.images.pull(image)
        return engine.checked_image(docker_client.api.inspect_image(image), image)
    except docker.errors.APIError as error:
        raise InputError([Problem(image, 0, f"image {image} is not on the engine and could not be pulled "
                                            f"({engine.explain_start_error(error)})")]) from None
