#!/usr/bin/env python3
"""What issue 44's GPU work adds to one image's verification, timed on a GPU host (issue 44 item 5: at most 60 s per
image on one GPU): the host-health read (checks/gpu_health.py: four nvidia-smi calls, R535's --query-gpu fields,
R535's reset flags, the later recovery fields and --query-remapped-rows, nvidia-smi -q where a remapper answers neither
Yes nor No, and one call per field more where a driver refuses a name; the calls made are counted) and the speed floors' measurements (the bf16 matmul, the clocks read while matmuls run, pinned
host<->device copies, the link read while copies run, and with 2+ GPUs the NCCL all-reduce's bus bandwidth,
checks/gpu_speed.py), each called as the probe calls it. Prints one JSON line; until it has run on a GPU host, every
duration here is "not measured" (docs/benchmarks.md).

Needs only python3 and a CUDA build of torch on a host with a GPU: no Docker, no network, no installed package (the
probe's modules are imported from this checkout, as the container has them beside the probe). Where torch or a GPU
is missing it prints why, as the same one line, and exits 0: `make bench` runs every bench/*_bench.py.

CUDA is started before the clock runs: the probe's earlier GPU checks (devices, cuDNN, AMP) have paid for the
context by the time it reads health and measures speed, so that start is not an added cost.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
import typing
from pathlib import Path

CHECKS = Path(__file__).resolve().parent.parent / "torchimages" / "checks"
TARGET_S = 60.0  # issue 44 item 5


def timed(function: typing.Callable[..., dict], *args: object) -> tuple[float, dict]:
    started = time.perf_counter()
    result = function(*args)
    return round(time.perf_counter() - started, 3), result


def why_not_measured() -> str:
    """Why this host cannot measure it ("" where it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not importable by this python3: install a CUDA build of torch"
    if not torch.cuda.is_available():
        return (f"no CUDA GPU visible to torch {torch.__version__} (torch.cuda.is_available() is False): run this on "
                "a GPU host")
    return ""


def start_cuda(torch, count: int) -> None:
    """A context and a small tensor on every GPU, as the probe's earlier checks leave them."""
    for index in range(count):
        torch.ones(1, device=f"cuda:{index}").sum().item()


def measure() -> dict:
    import torch

    sys.path.insert(0, str(CHECKS))
    import gpu_health  # the probe's modules, top-level as beside the probe
    import gpu_speed
    import probe_base
    import probe_gpu

    count = probe_base.cuda_device_count(torch)
    start_cuda(torch, count)
    smi = shutil.which("nvidia-smi")
    calls: list[list[str]] = []

    def counted(command: list[str], timeout: float = probe_base.TOOL_TIMEOUT_S) -> dict:
        calls.append(command)
        return probe_base.run_tool(command, timeout)

    health_s, health = timed(gpu_health.read_health, smi, counted) if smi else (0.0, {"rows": []})
    bf16_s, bf16 = timed(probe_gpu.bf16_matmul_throughput, torch)
    clocks_s, _ = timed(gpu_speed.clocks_under_load, torch, smi)
    copies_s, copies = timed(gpu_speed.pinned_copy_bandwidth, torch)
    link_s, _ = timed(gpu_speed.link_under_load, torch, smi)
    reduce_s, reduced = timed(gpu_speed.all_reduce_bus_bandwidth, torch, count) if count > 1 else (0.0, {})
    added = round(health_s + bf16_s + clocks_s + copies_s + link_s + reduce_s, 3)
    return {"device": torch.cuda.get_device_name(0), "gpus": count, "torch": torch.__version__,
            "nvidia_smi": smi, "health_rows": len(health["rows"]), "health_calls": len(calls),
            "seconds": {"health_read": health_s, "bf16_matmul": bf16_s, "clocks_under_load": clocks_s,
                        "pinned_copies": copies_s, "link_under_load": link_s,
                        "all_reduce": reduce_s if count > 1 else None, "added": added},
            "figures": {"bf16_tflops": bf16.get("tflops"), "h2d_gbps": copies.get("h2d_gbps"),
                        "d2h_gbps": copies.get("d2h_gbps"), "busbw_gbps": reduced.get("busbw_gbps")},
            "target_s": TARGET_S, "within_target": added <= TARGET_S}


def main() -> None:
    reason = why_not_measured()
    result = {"skipped": reason} if reason else measure()
    print(json.dumps({"bench": "gpu_cost", **result}))
    if reason:
        print(f"gpu_cost_bench: skipped: {reason}", file=sys.stderr)


if __name__ == "__main__":
    main()
