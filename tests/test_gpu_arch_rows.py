"""C10 (gpu-audit-3.md): the arch check's "rows that cover it" names only rows for the host's machine, each judged with
its own CUDA (torch's Tegra table changes at CUDA 13.2), as doctor's row_findings already does."""
import pytest

from torchimages.checks.rules import arch_flags_for

from . import gpu_hosts
from .gpu_fixtures import BY_TAG, gather_gpu_facts, judge

CU126 = "2.14.1-cuda12.6-cudnn9-runtime"


@pytest.mark.parametrize("host", ["rtx-pro-6000-blackwell"], indirect=True)
def test_an_uncovered_gpu_is_told_the_rows_of_its_own_machine_only(host):
    """An RTX PRO 6000 Blackwell (12.0) fails the cu126 row; the -arm64 rows' lists include 12.0, but they are aarch64
    images (rtx-pro-6000-blackwell.yaml: the cu126 wheel stops at sm_90)."""
    spec = BY_TAG[CU126]
    flags = arch_flags_for(list(spec.arch_list))
    run = {"gpus": "all"}
    message = judge(spec, run, gather_gpu_facts(gpu_hosts.as_run(host, host["runs"][0]), spec, flags), flags)["gpu"][
        "message"]
    covering = message.split("rows that cover it: ")[1]
    assert "2.14.1-cuda13.0-cudnn9-runtime" in covering and "-arm64" not in covering, covering
