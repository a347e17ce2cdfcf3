"""Every check the verification reports, declared once: its stable name (reports and the suite's
`@pytest.mark.check(...)` use it), what it needs, what it proves, and when it is skipped. verify's CHECKS, the check
plugin, the README's check table (tests/test_checklist.py holds it equal to `markdown_table()`), and `build.py test
--help` follow this table. A new check: a row here, its suite file `checks/suite/test_<name>.py`, the probe's facts
it reads, and a broken image in tests/data/broken/."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    proves: str  # one table cell of the README: what passing it means for a user of the image
    needs: str = ""  # "": any image and host; "gpu": a GPU row with GPUs given; "gpus": 2+ GPUs; "devel": a devel row
    skipped_when: str = ""  # what makes it (or a part of it) skip with the reason, never pass


NEEDS = {"": "any host", "gpu": "a GPU row given GPUs", "gpus": "2+ GPUs", "devel": "a devel row"}

DECLARED = (
    Check("identity",
          "torch, torchvision, Python, `torch.version.cuda`, cuDNN equal the row; labels and `PYTORCH_VERSION` "
          "tell the truth"),
    Check("gpu",
          "CUDA available; the devices visible as requested (one per process under MIG); on each, a torch "
          "kernel (libtorch's own code) and a cuBLAS matmul give the right values; each device's capability is "
          "covered by the build's arch list (`sm_90a`-style arch-specific code only on its exact GPU, `f` "
          "family code within its major)",
          needs="gpu", skipped_when="CPU rows; GPU rows run with --gpus none; a GPU in Prohibited compute mode"),
    Check("driver",
          "the host driver is at or above the CUDA major's floor (minor-version compatibility: 12.x >= "
          "525.60.13, 13.x >= 580); below the release's own driver it passes *with a warning* naming what will "
          "not work (PTX JIT, newer features); a forward-compatible libcuda (`cuDriverGetVersion`) is "
          "recognised",
          needs="gpu", skipped_when="CPU rows; GPU rows run with --gpus none"),
    Check("cudnn",
          "runtime = compiled version = row's major; conv2d forward and backward with `cudnn.benchmark`, output"
          " and gradients equal to the CPU's; fp16 SDPA with a float mask as upstream's smoke test runs it, "
          "cuDNN attention forced where torch runs it by default, sm80 to sm121 with cuDNN 9.15.1+ "
          "(pytorch#167602, #171627)",
          needs="gpu",
          skipped_when="CPU rows; GPU rows run with --gpus none; torch sees no GPU, or a GPU is in Prohibited "
                       "compute mode (no conv or attention ran: identity checks the loaded cuDNN without a GPU)"),
    Check("amp",
          "fp16 autocast + GradScaler training steps with finite, falling loss; bf16 where native (CPU bf16 on "
          "CPU rows)",
          skipped_when="bf16 below compute capability 8.0; the GPU half on GPU rows with --gpus none or a GPU in "
                       "Prohibited compute mode"),
    Check("shm",
          "`/dev/shm` as configured; a 4-worker DataLoader moves large tensors without a bus error"),
    Check("multi-gpu",
          "peer copies and an NCCL all-reduce on 2+ GPUs",
          needs="gpus", skipped_when="fewer than 2 visible GPUs; a MIG device beside whole GPUs (no CUDA P2P, "
                                  "NCCL on MIG experimental); a GPU in Prohibited compute mode"),
    Check("devel",
          "nvcc matches torch's CUDA; a C++ (CPU) or CUDA (GPU) torch extension compiles and links for the "
          "row's arch list, and runs where a GPU is",
          needs="devel",
          skipped_when="runtime images (their extension part); the CUDA kernel where no GPU is visible or a GPU is in "
                       "an exclusive or Prohibited compute mode"),
    Check("smoke",
          "PyTorch's own binary smoke test (`.ci/pytorch/smoke_test`): OpenMP, conv2d and linalg, NumPy "
          "interop, `torch.compile` equal to eager in fp16/fp32/fp64, a vectorized CPU ISA, a max-autotune "
          "compile; conv2d and linalg on each GPU, the compiles on `cuda:0` as upstream does; `import "
          "torch`/`torchvision` print no warning",
          skipped_when="the GPU compile under an exclusive compute mode; every GPU part with a GPU in Prohibited "
                       "compute mode"),
    Check("distributed",
          "`torchrun --standalone` runs an all-reduce: 2 processes over gloo on CPU, one process per GPU (up to"
          " 8) over NCCL with 2+ GPUs",
          skipped_when="NCCL with fewer than 2 GPUs or a MIG device beside whole GPUs (gloo then), gloo with 2+ "
                       "GPUs (NCCL then); NCCL with a GPU in Prohibited compute mode"),
    Check("downstream",
          "a derived image `FROM` it pip-installs a local wheel into the image's environment as its default "
          "user (no `USER root`); `pip install --user` works under an arbitrary uid; the derived image is "
          "removed"),
    Check("hygiene",
          "runs as the row's user and as an arbitrary `--user UID`; one copy of each CUDA library across system"
          " paths and site-packages (Triton's profiler CUPTI aside: torch never loads it); no pip cache, OS "
          "package caches (the family's, from `compat.yaml`) or credentials; size under budget"),
    Check("layout",
          "layers a cold node, image streaming and registries take: none empty, no two with the same content, none "
          "over 1 GB compressed (a pull waits for its largest layer whole)"),
)

NAMES = tuple(check.name for check in DECLARED)
GPU_CHECKS = tuple(check.name for check in DECLARED if check.needs in ("gpu", "gpus"))


def markdown_table() -> str:
    """The README's "What verification proves" table."""
    lines = ["| check | proves |", "|---|---|"]
    return "\n".join(lines + [f"| {check.name} | {check.proves} |" for check in DECLARED]) + "\n"


def help_text() -> str:
    """The checks, for `build.py test --help`."""
    return "; ".join(f"{check.name} ({NEEDS[check.needs]})" for check in DECLARED)
