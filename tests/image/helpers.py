"""Pure helpers of the image checks: expectations from the row and the run, and readable sizes."""
from __future__ import annotations

from torchimages.model import ImageSpec
from torchimages.probe import decode_cudnn_version, os_tag


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def gpu_skip_reason(spec: ImageSpec, expect: dict) -> str | None:
    """Why GPU checks cannot run in this container, or None when they must."""
    if not spec.is_gpu:
        return "CPU image: no GPU checks apply"
    if expect["gpus"]["wanted"]:
        return None
    why = "no GPUs were requested (--gpus none)"
    if not expect["host_gpu_runtime"]:
        why += " and this Docker engine has no NVIDIA runtime"
    return f"not run: {why}; verify on a GPU host with --gpus all"


def expected_device_count(expect: dict, gpu: dict) -> tuple[int | None, str]:
    """How many devices torch must see, and where that number comes from."""
    requested = expect["gpus"]["expected_count"]
    if requested is not None:
        expected, source = requested, f"--gpus {expect['gpus']['text']}"
    elif gpu.get("nvidia_smi_gpus") is not None:
        expected, source = len(gpu["nvidia_smi_gpus"]), "nvidia-smi -L in the container (--gpus all)"
    else:
        return None, "unknown: no nvidia-smi in the container to count the GPUs given to it"
    visible = gpu.get("cuda_visible_devices")
    if visible is not None:
        entries = [entry for entry in visible.split(",") if entry.strip()]
        if len(entries) < expected:
            expected, source = len(entries), f"CUDA_VISIBLE_DEVICES={visible}"
    return expected, source


def observed_label_values(main: dict) -> dict[str, str]:
    """io.torchimages.* label values as the image's contents say they should read."""
    torch = main["torch"]
    torchvision = torch.get("torchvision") or {}
    cudnn = decode_cudnn_version(torch.get("cudnn_version"))
    return {
        "torch": torch["version"].split("+")[0],
        "torchvision": (torchvision.get("version") or "").split("+")[0],
        "cuda": torch["cuda"] or "cpu",
        "cudnn": str(cudnn[0]) if cudnn else "",
        "python": main["python"]["major_minor"],
        "os": os_tag(main["os_release"]),
    }


def row_label_values(spec: ImageSpec) -> dict[str, str]:
    """Labels that describe the row rather than something measurable inside the image."""
    return {
        "io.torchimages.flavor": spec.flavor,
        "io.torchimages.arch-list": ";".join(spec.arch_list),
        "io.torchimages.min-driver": spec.min_driver or "",
        "org.opencontainers.image.version": spec.tag,
    }


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())
