"""The real-hardware record (docs/gpu-validation.md): the probe's GPU side on a GPU host, judged by the real check
suite, as one line of the record table. Runs with the host's own torch, or in an image's container (Docker)."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..checks import checklist
from ..model import ImageSpec
from .plan import SUITE, parse_gpus

# The suites that judge GPU facts alone; the others need a container's files, users and smoke run.
GPU_SUITES = ("test_gpu.py", "test_cudnn.py", "test_amp.py")
GPU_ONLY_TIMEOUT_S = 900
# Dense (no sparsity) BF16 Tensor Core peaks, TFLOPS, by a part of the device name torch reports; the first match
# wins (GH200 before H200, GB200 before B200, L40S and L40 before L4). NVIDIA datasheets: H100 (SXM5 989.4, PCIe 756.5, NVL 835: "H100 Tensor Core GPU" datasheet,
# BF16 1,979/1,513/1,671 with sparsity, halved), H200 and GH200 (H200 datasheet, GH200 datasheet: 989.4 dense),
# A100 (A100 datasheet: 312), L40S (L40S datasheet: 362.05), L40 (L40 datasheet: 181.05), L4 (L4 datasheet: 121),
# GB200 (GB200 NVL72 datasheet: 360 PFLOPS with sparsity for 72 GPUs, 2,500 dense each), B200 (HGX B200 datasheet:
# 2.25 PFLOPS dense per GPU).
PEAK_BF16_DENSE_TFLOPS = (
    ("GH200", 989.4), ("H200", 989.4), ("H100 PCIe", 756.5), ("H100 NVL", 835.0), ("H100", 989.4),
    ("A100", 312.0), ("L40S", 362.05), ("L40", 181.05), ("L4", 121.0), ("GB200", 2500.0), ("B200", 2250.0),
)


@dataclass(frozen=True)
class Record:
    line: str  # the docs/gpu-validation.md table row
    passed: bool  # no GPU check failed, and the GPU work ran (only multi-gpu may skip, on one GPU)
    checks: dict[str, dict]


def peak_tflops(device_name: str) -> float | None:
    return next((peak for part, peak in PEAK_BF16_DENSE_TFLOPS if part in device_name), None)


def judge(spec: ImageSpec, gpus: str, torch_facts: dict, gpu: dict, matrix: list[ImageSpec]) -> dict[str, dict]:
    """The real check suite's GPU checks on these facts, as `build.py test` runs them on a container's."""
    expect = {"tag": spec.tag, "image": spec.tag, "image_id": "", "container_id": "gpu-record",
              "spec": spec.to_json(), "gpus": parse_gpus(gpus).to_json(), "host_gpu_runtime": True,
              "shm_size": spec.shm_size, "arbitrary_uid": 12345,
              "arch_rows": {row.tag: list(row.arch_list) for row in matrix if row.is_gpu}}
    with tempfile.TemporaryDirectory(prefix="torchimages-record-") as scratch:
        paths = {name: Path(scratch) / f"{name}.json" for name in ("expect", "facts", "checks")}
        paths["expect"].write_text(json.dumps(expect))
        paths["facts"].write_text(json.dumps({"main": {"torch": torch_facts, "gpu": gpu}, "image": {"labels": {}}},
                                             default=str))
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the record line alone
            code = pytest.main([*(str(SUITE / name) for name in GPU_SUITES), "--hosts=local://",
                                "-p", "torchimages.checkplugin", f"--expect={paths['expect']}",
                                f"--probe={paths['facts']}", f"--check-results={paths['checks']}", "-c", str(SUITE / "pytest.ini"), "--rootdir",
                                str(SUITE), "--confcutdir", str(SUITE), "-q", "-p", "no:cacheprovider",
                                "-p", "no:unraisableexception", "--no-header", "--no-summary",
                                "-W", "ignore::DeprecationWarning"])
        if code not in (0, 1):
            raise RuntimeError(f"the check suite could not run on the GPU facts (pytest exit {code})")
        return json.loads(paths["checks"].read_text())


def record(date: str, spec: ImageSpec, source: str, facts: dict, checks: dict[str, dict]) -> Record:
    """One row: date | device | driver | image / torch | result | bf16 matmul."""
    gpu = facts["gpu"]
    devices = gpu.get("devices") or []
    names = sorted({device["name"] for device in devices}) or ["no GPU seen"]
    device = ", ".join(f"{name} x{sum(d['name'] == name for d in devices)}" if len(devices) > 1 else name
                       for name in names)
    mine = {name: checks[name] for name in checklist.GPU_CHECKS + ("amp",) if name in checks}
    failed = [name for name, check in mine.items() if check["status"] == "failed"]
    # A record says passed only where the GPU work ran: multi-gpu alone may skip (one GPU).
    not_run = [name for name, check in mine.items() if check["status"] == "skipped" and name != "multi-gpu"]
    warned = [name for name, check in mine.items() if check.get("warnings") or "warning:" in check["message"]]
    if failed:
        result = f"failed: {', '.join(failed)}"
    elif not_run:
        result = f"not run: {', '.join(not_run)} ({mine[not_run[0]]['message'][:200]})"
    else:
        result = "passed" + (f" (with a warning: {', '.join(warned)})" if warned else "")
    throughput = (gpu.get("bf16_matmul") or {}).get("tflops")
    peak = peak_tflops(names[0])
    bf16 = ("not measured" if throughput is None
            else f"{throughput} TFLOPS" + (f" ({throughput / peak:.0%} of {peak} dense peak)" if peak else
                                           " (peak unknown)"))
    line = (f"| {date} | {device} | {gpu.get('driver_version') or 'unknown'} | {source} / torch "
            f"{facts['torch'].get('version')} ({spec.tag}) | {result} | {bf16} |")
    return Record(line, not failed and not not_run, checks)


def host_gpu_facts() -> dict:
    """The probe's --gpu-only part with this Python's torch (a GPU host without Docker)."""
    from .container import PROBE_SOURCE

    done = subprocess.run([sys.executable, str(PROBE_SOURCE), "--gpu-only"], capture_output=True, text=True,
                          timeout=GPU_ONLY_TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the probe's GPU part exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(lines[-1])


def image_gpu_facts(docker_client, spec: ImageSpec, image: str) -> dict:
    """The probe's --gpu-only part in a container of the image, given every GPU (a GPU host with Docker)."""
    from .. import engine
    from ..model import InputError, Problem
    from .container import container_name, copy_probe, create_container, remove_container, run_probe
    from .plan import Plan

    inspected = engine.inspect_image(docker_client, image)
    if inspected is None:
        raise InputError([Problem(image, 0, f"image {image} is not on the engine: pull or build it first")])
    plan = Plan(spec, image, inspected["Id"], parse_gpus("all"), spec.shm_size, GPU_ONLY_TIMEOUT_S)
    name = container_name(spec)
    try:
        container = create_container(docker_client, plan, name, reports="")
        container.start()
        copy_probe(container)
        facts = run_probe(container, ["--gpu-only"], "", GPU_ONLY_TIMEOUT_S)
    finally:
        remove_container(docker_client, name)
    if "probe_error" in facts:
        raise RuntimeError(f"the probe's GPU part gave no facts in {image}: {facts['probe_error']} "
                           f"{facts.get('stderr_tail', '')[-1000:]}")
    return facts
