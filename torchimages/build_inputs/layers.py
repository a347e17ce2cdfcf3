"""The final image's venv in layers, ordered by how rarely they change; templates/macros.j2 writes one RUN per row.

A layer holds the distributions whose normalised names match its patterns, among those the row's requirements resolve
to; the last layer, "rest", holds whatever is left (pip's own venv files come from the venv stage before them).
A new layer is a new row here."""
from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VenvLayer:
    name: str
    gpu: bool  # only GPU rows install it
    what: str  # the comment above its RUN
    distributions: tuple[str, ...]  # fnmatch patterns over normalised names; () for the rest

    @property
    def arg(self) -> str:
        """The build argument that carries this layer's wheel identity into the engine's cache key."""
        return f"WHEELS_{self.name.upper()}"


# The nvidia-* wheels of a CUDA 13.0 row are 2.3 GB compressed: one layer of them would be the one that a cold node
# waits for, and image streaming (GKE) and registries' limits (GHCR: 10 GB) judge by the largest layer. Split by what
# a start reads first (libcublasLt and libnvrtc lead the reads of `import torch` on an H100: issue 58), then cuDNN,
# then the math libraries a first kernel of them needs, then the rest: each under 1 GB compressed (the layout check),
# and every CUDA row has wheels for each, so none is empty. All change with the CUDA version, so their order is free.
VENV_LAYERS = (
    VenvLayer("cuda_start", True, "cuBLAS, NVRTC, nvJitLink, the CUDA runtime, CUPTI, NVTX: what `import torch` reads "
              "first", ("nvidia-cublas*", "nvidia-cuda-nvrtc*", "nvidia-nvjitlink*", "nvidia-cuda-runtime*",
                        "nvidia-cuda-cupti*", "nvidia-nvtx*")),
    VenvLayer("cudnn", True, "cuDNN: read by a first convolution or attention", ("nvidia-cudnn*",)),
    VenvLayer("cuda_math", True, "cuFFT, cuRAND, cuSOLVER, cuSPARSE(Lt): read by a first kernel of theirs",
              ("nvidia-cufft*", "nvidia-curand*", "nvidia-cusolver*", "nvidia-cusparse*")),
    VenvLayer("cuda", True, "the other nvidia-* and cuda-* wheels (NCCL, NVSHMEM, cuFile, the compiler parts): "
              "change with the CUDA version", ("nvidia-*", "cuda-*")),
    VenvLayer("triton", True, "Triton: changes with the torch minor", ("triton",)),
    VenvLayer("torch", False, "torch and torchvision: change with every torch build", ("torch", "torchvision")),
    VenvLayer("rest", False, "the rest: NumPy and the other dependencies, their scripts", ()),
)


def normalise(name: str) -> str:
    """PEP 503's normal form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> str:
    return normalise(filename.split("-", 1)[0])


def layer_of(name: str, layers=VENV_LAYERS) -> VenvLayer:
    for layer in layers:
        if any(fnmatch.fnmatchcase(normalise(name), pattern) for pattern in layer.distributions):
            return layer
    return layers[-1]


def layer_args(wheels: dict[str, int], sources: bytes, gpu: bool) -> dict[str, str]:
    """Build arguments naming each layer's inputs (wheel names and sizes, the index settings without credentials, the
    install script): the classic builder's cache key has no other view of wheels it fetches over HTTP, so a changed
    torch wheel must change WHEELS_TORCH and leave WHEELS_CUDA as it was. The rest layer sees every wheel."""
    args = {}
    for layer in (layer for layer in VENV_LAYERS if gpu or not layer.gpu):
        digest = hashlib.sha256(sources)
        for filename, size in sorted(wheels.items()):
            if layer is VENV_LAYERS[-1] or layer_of(wheel_name(filename)) is layer:
                digest.update(f"{filename}:{size}\n".encode())
        args[layer.arg] = digest.hexdigest()[:16]
    return args


INSTALL_SCRIPT = Path(__file__).with_name("install_layer.py")
# What writes a layer's files: the step's script and, for served wheels, the server's unpacker.
INSTALL_CODE = (INSTALL_SCRIPT, Path(__file__).with_name("unpack.py"))


def install_code_digest() -> str:
    digest = hashlib.sha256()
    for path in INSTALL_CODE:
        digest.update(path.read_bytes())
    return digest.hexdigest()
