"""Stage 4: verify images inside their containers: one container and one probe per image, pytest checks, reports.

For each image: start one container through the Docker SDK (GPUs and /dev/shm as asked), copy the probe
(torchimages/checks/probe.py) and a small wheel in and run the probe once per identity (the image's user; root for
the file scan; an arbitrary uid), while the host builds an image FROM it that pip-installs the wheel
(torchimages/checks/downstream.py). Then the pytest-testinfra suite in torchimages/checks/suite runs against the
container with the row's expectations and those facts. The container and the derived image are removed on success,
failure and Ctrl-C. Reports: reports/<tag>/{verify.json,junit.xml,facts.json,pytest.log} and
reports/verify-summary.md. The checks ship inside the package: `build.py test` needs no source checkout.
`--only`/`--skip` run some of the checks (selection.py), never enough to publish.
"""
from ..checks.selection import CheckSelection, parse_selection
from .container import PROBE_SOURCE, container_name, copy_probe, create_container, run_probe
from .plan import (
    CHECKS,
    DEVEL_TIMEOUT_S,
    GPU_CHECKS,
    RUNTIME_TIMEOUT_S,
    SUITE,
    VERIFY_LABEL,
    GpuRequest,
    Plan,
    Progress,
    VerifyOptions,
    VerifyResult,
    parse_gpus,
    plan_all,
)
from .reports import selective_note, summary_markdown
from .run import verify_images
from .suite import complete_checks

__all__ = [
    "CHECKS", "DEVEL_TIMEOUT_S", "GPU_CHECKS", "PROBE_SOURCE", "RUNTIME_TIMEOUT_S", "SUITE", "VERIFY_LABEL",
    "CheckSelection", "GpuRequest", "Plan", "Progress", "VerifyOptions", "VerifyResult", "complete_checks",
    "container_name", "copy_probe", "create_container", "parse_gpus", "parse_selection", "plan_all", "run_probe",
    "selective_note", "summary_markdown", "verify_images",
]
