"""A verification that passed is kept: the same image id, verified the same way, is not verified again unless --force
(a run of the same checks on the same bytes would only say the same, minutes later). Pure decisions over the report
the last run left (reports.py) and the plan of this one."""
from __future__ import annotations

import dataclasses

from ..checks.selection import CheckSelection
from . import emulation
from .plan import CHECKS, Plan, VerifyResult
from .reports import VerifyReport


def reusable(report: VerifyReport | None, plan: Plan, selection: CheckSelection) -> bool:
    """Whether report, the last verification in this plan's folder, stands for this run: it passed, for this exact image
    and matrix row, with the same checks (every one this toolkit has, the same --only/--skip), the same GPUs and
    /dev/shm, and the same CPU identity (a stand-in under emulation, or the engine's own)."""
    if report is None or not report.passed:
        return False
    run = report.run or {}
    return (report.image_id == plan.image_id and report.spec_hash == plan.spec.spec_hash()
            and set(report.checks) == set(CHECKS) and report.selection == selection.to_json()
            and run.get("gpus") == plan.gpus.text and run.get("shm_size") == plan.shm_size
            and run.get("cpu_identity") == emulation.cpu_identity_note(plan.standin_cpus))


def reused_result(report: VerifyReport, plan: Plan, report_dir) -> VerifyResult:
    """The result the reused report records, as a fresh run would have returned it, with when it ran."""
    return VerifyResult(
        plan.spec.tag, plan.image, report.image_id, report.passed,
        {name: dataclasses.asdict(check) for name, check in report.checks.items()}, report_dir, report.duration_s,
        dict(report.stage_seconds), str((report.run or {}).get("cpu_identity", {}).get("why", "")),
        CheckSelection.from_json(report.selection), dict(report.host), reused_from=report.finished_at)


def reuse_line(result: VerifyResult) -> str:
    """What a run says of a verification it kept instead of running it again."""
    when = result.reused_from.replace("T", " ").removesuffix("Z") + " UTC" if result.reused_from else "an earlier run"
    return (f"{result.tag}: verification reused: passed on {when} for sha256:{short_id(result.image_id)} "
            "(--force to run it again)")


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]
