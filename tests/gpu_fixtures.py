"""What the GPU-simulation lane's modules share (test_gpu_simulation, test_gpu_arch_rows, test_gpu_diagnosis,
test_gpu_health, test_gpu_record): the fixture project's rows, the facts the probe's own functions gather on a recorded
host (tests/gpu_hosts/), and the real check suite's verdicts on them. The `host` fixture is conftest.py's."""
import json
import subprocess

from torchimages.checks import probe_base, probe_gpu, rules
from torchimages.checks.rules import arch_flags_for
from torchimages.matrix.load import load_matrix
from torchimages.verify import record

from . import gpu_hosts
from .conftest import FIXTURE_MATRIX, FIXTURE_PROJECT, run_cli_in_process

# The frozen matrix's rows and its Grace rows (their -arm64 images), so aarch64 hosts judge rows built for them.
SPECS = load_matrix(FIXTURE_MATRIX).specs + [spec for spec in load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs
                                             if spec.arch == "aarch64"]
BY_TAG = {spec.tag: spec for spec in SPECS}


def torch_facts(spec, flags: list[str]) -> dict:
    """What the row's image reports without a GPU (identity checks these against the real images in CI)."""
    major, minor, patch = (int(part) for part in spec.cudnn_version.split(".")[:3])
    return {"importable": True, "version": spec.torch, "cuda": spec.cuda, "arch_flags": flags,
            "cudnn_available": True, "cudnn_version": major * 10000 + minor * 100 + patch,
            "cudnn_compile_version": [major, minor, patch]}


def gather_gpu_facts(scenario: dict, spec, flags: list[str]) -> dict:
    """The probe's own GPU part (first CUDA call, nvidia-smi and the GPUs' health, every device, cuDNN, attention, AMP,
    multi-GPU, and the speed figures the host recorded), as verification gathers it."""
    import torch

    cudnn = torch_facts(spec, flags)["cudnn_version"]
    with (gpu_hosts.simulated_cuda(torch, scenario, spec.cuda, flags, rules.arch_covers, cudnn),
          gpu_hosts.recorded_speed(probe_gpu, scenario)):
        # The patched torch.cuda lives in this process: the multi-GPU part runs here, not in a subprocess.
        in_process = lambda: probe_base.section(probe_gpu.multi_gpu_facts, torch)  # noqa: E731
        original, probe_gpu.multi_gpu_in_subprocess = probe_gpu.multi_gpu_in_subprocess, in_process
        try:
            return probe_base.section(probe_gpu.gpu_facts, torch, flags, True)
        finally:
            probe_gpu.multi_gpu_in_subprocess = original


def judge(spec, run: dict, gpu: dict, flags: list[str]) -> dict:
    """The real check suite on these facts; {check: verdict} as verify.json records them."""
    return record.judge(spec, run["gpus"], torch_facts(spec, flags), gpu, SPECS)


CU130 = "2.14.1-cuda13.0-cudnn9-runtime"


def saved_facts(tmp_path, scenario: dict, tflops: float | None = None, row: str = CU130, **torch_changes) -> str:
    """What `probe.py --gpu-only` prints on that host (the host's raw answers, the GPU part), saved to a file."""
    spec = BY_TAG[row]
    flags = arch_flags_for(list(spec.arch_list))
    gpu = gather_gpu_facts(scenario, spec, flags)
    if tflops is not None:
        gpu["bf16_matmul"] = {"ok": True, "tflops": tflops}
    path = tmp_path / "gpu-only.json"
    torch = {**torch_facts(spec, flags), "version": f"{spec.torch}+cu{spec.cuda.replace('.', '')}", **torch_changes}
    path.write_text(json.dumps({"torch": torch, "host": probe_gpu.record_host_facts(), "gpu": gpu}, default=str))
    return str(path)


def gpu_record(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """`build.py gpu-record` on the fixture project's rows, its record written under tmp_path."""
    return run_cli_in_process("--project", str(FIXTURE_PROJECT), "--reports", str(tmp_path / "reports"), "gpu-record",
                              *args)
