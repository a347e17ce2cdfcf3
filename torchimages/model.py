"""The typed data model passed between the pipeline stages: one ImageSpec per tag."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field

LABEL_PREFIX = "io.torchimages"
# The proxy variables a build passes on as build args (and whose logins every run keeps out of its output).
PROXY_ARGS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
PYPI = "https://pypi.org/simple"


@dataclass(frozen=True)
class User:
    name: str
    uid: int


@dataclass(frozen=True)
class ImageSpec:
    """Everything the later stages need to know about one image, resolved from matrix + compat data."""

    tag: str
    torch: str
    cuda: str | None  # "13.0"; None for CPU images
    cudnn: int | None  # major; None for CPU images
    python: str
    os: str
    flavor: str
    base_image: str
    wheel_index: str  # "cu130" or "cpu"
    python_from_os: bool
    torchvision: str | None = None
    numpy: str | None = None  # the NumPy release installed beside torch
    index_url: str = ""  # where pip finds this torch build: PyPI when its own wheel is it, else download.pytorch.org
    glibc: str = ""  # the OS's glibc: which manylinux wheels it runs
    os_family: str = "apt"  # the OS's package manager: templates/os/<os_family>.j2 installs packages with it
    os_release: str = ""  # /etc/os-release's ID + VERSION_ID in the image (debian12); the os name unless compat says
    package_caches: tuple[str, ...] = ()  # the family's package caches and lists: empty in a clean image
    arch: str = "x86_64"  # the machine the image is for
    platform: str = "linux/amd64"  # ... as an OCI platform (compat.yaml's architectures)
    index_tag: str = ""  # the row's tag, which a manifest list over every arch's image is published under; `tag` is
    # this arch's own (the same for x86_64, + -arm64 for aarch64)
    python_packages: tuple[str, ...] = ()  # OS packages the Python stage installs (certificates, the OS's Python)
    venv_packages: tuple[str, ...] = ()  # ... and what `python -m venv` needs from the OS
    download_packages: tuple[str, ...] = ()  # ... and what fetches python-build-standalone (when not the OS's)
    system_packages: tuple[str, ...] = ()  # OS packages every flavor shares (compiler, Python headers)
    flavor_packages: tuple[str, ...] = ()  # OS packages this flavor adds on top
    builds_extensions: bool = False  # the flavor is for building torch extensions (compiler, nvcc on GPU rows)
    cuda_toolkit: str | None = None  # devel GPU rows: the cuda-toolkit version whose nvcc and headers they get
    cuda_toolkit_packages: tuple[str, ...] = ()  # ... as pip requirements (nvcc, crt, nvvm, cccl)
    cuda_home: str | None = None  # devel GPU rows: the toolkit's folder inside site-packages (nvidia/cu13)
    remove_from_base: tuple[str, ...] = ()  # files of the base image the wheels replace (a second libcudart)
    cuda_full: str | None = None
    cudnn_version: str | None = None  # the pip-pinned cuDNN, e.g. "9.24.0.43"
    nccl_version: str | None = None
    min_driver: str | None = None  # the CUDA release's GA driver: everything works at or above it
    driver_floor: str | None = None  # minor-version compatibility: below it CUDA does not start
    arch_list: tuple[str, ...] = ()
    user: User | None = None
    shm_size: str = "8g"
    size_budget: str | None = None
    deprecated: str | None = None
    aliases: tuple[str, ...] = ()
    repository: str = ""
    matrix_line: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.cuda is not None

    @property
    def site_packages(self) -> str:
        return f"/opt/venv/lib/python{self.python}/site-packages"

    @property
    def torch_local_version(self) -> str:
        """The version string torch reports, e.g. 2.14.0+cu130 or 2.13.0+cpu."""
        return f"{self.torch}+{self.wheel_index}"

    @property
    def torch_requirement(self) -> str:
        """What pip is asked for: the row's own build (2.13.0+cpu, 2.14.1+cu126), so that no fallback index can put
        another build into the image. PyPI holds one build per release, under the plain version."""
        return f"torch=={self.torch}" if self.index_url == PYPI else f"torch=={self.torch_local_version}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ImageSpec:
        values = dict(data)
        values["user"] = User(**values["user"]) if values.get("user") else None
        values["arch_list"] = tuple(values.get("arch_list") or ())
        for name in ("aliases", "system_packages", "flavor_packages", "remove_from_base", "cuda_toolkit_packages",
                     "python_packages", "venv_packages", "download_packages", "package_caches"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)

    def spec_hash(self) -> str:
        """Hash of what defines the image's contents (not where its matrix row sits)."""
        # platform and index_tag follow from arch and tag: left out, so an x86_64 row's hash is what it always was.
        content = {k: v for k, v in self.to_json().items()
                   if k not in ("matrix_line", "aliases", "deprecated", "platform", "index_tag")}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


# ASCII: in Unicode mode IGNORECASE lets the Kelvin sign (U+212A) pass as 'k'.
SIZE_PATTERN = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?)([kmgt]?)(?:i?b)?", re.IGNORECASE | re.ASCII)
SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """'8g' / '512m' / '7.5GB' / '1024' -> bytes (binary units, as docker's --shm-size); above zero, finite."""
    match = SIZE_PATTERN.fullmatch(str(text).strip())
    size = int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]) if match else 0
    if size <= 0:
        raise ValueError(f"not a size above zero: {str(text)[:40]!r} (use e.g. 8g, 512m)")
    return size


@dataclass
class Problem:
    """One user-facing input error: where it is and how to fix it."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        # Line 0: the problem has no line (an environment variable, a flag, a key file): `file:0:` would read as a bug.
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}" if where else self.message


class TorchImagesError(Exception):
    """The base of every error this toolkit raises on purpose: a caller that drives the stages from Python catches this
    one class (as docker-py's callers catch DockerException); the command line maps each kind to its exit code."""


@dataclass
class InputError(TorchImagesError):
    """Bad input (matrix, CLI, templates): reported as a list of problems, exit code 2."""

    problems: list[Problem] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


class PeerError(TorchImagesError):
    """A peer (the Docker engine, a registry, pip) did not answer within its bound or answered what cannot be used:
    exit 1, one line naming the peer and what it did or sent."""
