"""distributed: `torchrun --standalone`, as users start a single-node job, runs an all-reduce: 2 processes over gloo
on the CPU, one process per GPU (up to 8, as DDP and FSDP run) over NCCL when 2 or more GPUs are visible, except
where one of them is a MIG device beside whole GPUs (NCCL supports MIG only experimentally: then gloo)."""
import pytest

from torchimages.checks.rules import mig_multi_gpu_reason

pytestmark = pytest.mark.check("distributed")

FIX = ("check that `torchrun` on PATH runs (`docker run IMAGE torchrun --help`) and that torch.distributed imports; "
       "a rendezvous that never forms usually means the container's hostname does not resolve (give it one with "
       "--hostname and --add-host NAME:127.0.0.1)")


def _what_happened(result: dict) -> str:
    ended = result["error"] or f"exit code {result['returncode']}"
    ranks = "; ".join(f"rank {r['rank']} over {r['backend']} on {r['device']} got {r['value']} (expected "
                      f"{r['expected']})" for r in result["ranks"]) or "no process reported a result"
    return f"`{result['command']}` ended with {ended}; {ranks}; its output ended with: {result['output'][-800:]!r}"


def _visible_gpus(main: dict) -> int:
    return (main.get("gpu") or {}).get("device_count") or 0


def _mig_reason(main: dict) -> str:
    """Why NCCL must not run across these devices: a MIG device beside whole GPUs (then gloo on the CPU)."""
    gpu = main.get("gpu") or {}
    return mig_multi_gpu_reason(_visible_gpus(main), gpu, [device["name"] for device in gpu.get("devices") or []])


def test_torchrun_all_reduce_over_gloo(main, torch_facts):
    if _visible_gpus(main) >= 2 and not _mig_reason(main):
        pytest.skip(f"{_visible_gpus(main)} GPUs visible: the all-reduce runs over NCCL (the NCCL test)")
    result = main["distributed"]
    assert result["ok"] and all(rank["backend"] == "gloo" for rank in result["ranks"]), (
        f"{_what_happened(result)}; expected {result['processes']} processes to all-reduce over gloo: {FIX}")


def test_torchrun_all_reduce_over_nccl(main, devices):
    if len(devices) < 2:
        pytest.skip(f"{len(devices)} GPU visible: an NCCL all-reduce needs 2 or more (--gpus all on a multi-GPU host)")
    if _mig_reason(main):
        pytest.skip(f"{_mig_reason(main)}; the all-reduce runs over gloo (the gloo test)")
    result = main["distributed"]
    assert result["processes"] == min(len(devices), 8), (
        f"torchrun ran {result['processes']} processes for {len(devices)} GPUs: DDP and FSDP run one per GPU")
    assert result["ok"] and all(rank["backend"] == "nccl" for rank in result["ranks"]), (
        f"{_what_happened(result)}; expected {result['processes']} processes, one per GPU, to all-reduce over NCCL: "
        f"{FIX}. With NCCL errors about shared memory, raise --shm-size or use --ipc=host")
