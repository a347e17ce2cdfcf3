"""Verification, step 4: what a run leaves behind: reports/<tag>/verify.json (read back by publish) and the summary
page."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from ..checks.gpu_speed import host_report
from ..files import read_json_document
from ..invocation import command
from ..reporting import DIGEST, DIGEST_RULE, Shape, known_fields, markdown_cell, require_schema, utc_timestamp
from . import emulation
from .plan import CHECKS, Plan, VerifyResult

REPORT_SCHEMA = 2  # 2: host is the judged host (kind, GPUs, driver, health, speed), what publish signs
REPORT_NAME = "verify.json"
FACTS_NAME = "facts.json"
NO_GPU = "no GPU: GPU checks skipped"
STATUS_MARK = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "⏭️ skipped"}


@dataclass(frozen=True)
class CheckVerdict:
    status: str  # passed | failed | skipped
    message: str = ""
    tests: list = field(default_factory=list)  # the pytest outcomes behind the verdict
    warnings: list = field(default_factory=list)  # a passed check's limits worth knowing; publishing gates on status
    blame: str = ""  # "image" (it failed), "host" (it passed warning about a sick host: checks/gpu_health.py) or ""


@dataclass(frozen=True)
class VerifyReport:
    """reports/<tag>/verify.json: what publish reads to decide whether these exact bytes may be pushed."""

    image_id: str
    passed: bool
    checks: dict[str, CheckVerdict]
    tag: str = ""
    image: str = ""
    spec_hash: str = ""
    run: dict = field(default_factory=dict)  # gpus, shm_size, probe_timeout_s, cpu_identity
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    stage_seconds: dict = field(default_factory=dict)
    # The checks selected (--only/--skip): {} where every check ran, the only report publish accepts.
    selection: dict[str, list[str]] = field(default_factory=dict)
    junit: str = "junit.xml"
    facts: str = FACTS_NAME
    # The host as this verification judged it (judged_host): what the signed report names, so publish never reads
    # the probe's raw facts. A report made without GPU facts ran on no GPU the checks judged.
    host: dict = field(default_factory=lambda: judged_host({}, {}))

    def to_json(self) -> dict:
        return {"schema": REPORT_SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> VerifyReport:
        """From a document of this shape (read_verify_report checks it); fields it does not know are left out."""
        return cls(**{**known_fields(cls, data),
                      "checks": {name: CheckVerdict(**known_fields(CheckVerdict, check))
                                 for name, check in data["checks"].items()}})

    def with_status(self, status: str) -> list[str]:
        """The names of the checks that ended with status, sorted."""
        return sorted(name for name, check in self.checks.items() if check.status == status)


def judged_host(checks: dict[str, dict], gpu: dict) -> dict:
    """The host the checks ran on: its GPUs as the probe saw them where the gpu check passed, else that it had none;
    with either, the GPUs' health (healthy: true, false, or null where unread) and the speed figures against their
    floors (checks/gpu_speed.host_report), so that a policy can require "gpu passed on a healthy H100, driver >= 580".
    gpu: the main probe's GPU facts ({} where there are none)."""
    health_and_speed = host_report(gpu)
    if (checks.get("gpu") or {}).get("status") != "passed":
        return {"kind": "cpu-only", "gpu_models": [], "gpus": [], "driver": "", "driver_major": 0,
                "cuda_driver": "", "note": NO_GPU, **health_and_speed}
    devices = [device for device in gpu.get("devices") or [] if isinstance(device, dict)]
    driver = str(gpu.get("driver_version") or "")
    return {
        "kind": "gpu",
        "gpu_models": sorted({str(device.get("name")) for device in devices}),
        "gpus": [{"name": str(device.get("name")), "capability": ".".join(map(str, device.get("capability") or []))}
                 for device in devices],
        "driver": driver,
        "driver_major": int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0,
        "cuda_driver": str(gpu.get("libcuda_driver_version") or ""),
        "note": "",
        **health_and_speed,
    }


def verify_report(result: VerifyResult, plan: Plan, started_at: datetime) -> VerifyReport:
    return VerifyReport(
        tag=result.tag, image=result.image, image_id=result.image_id, spec_hash=plan.spec.spec_hash(),
        passed=result.passed,
        checks={name: CheckVerdict(check["status"], check["message"], check.get("tests", []), check.get("warnings", []),
                                   check.get("blame", ""))
                for name, check in result.checks.items()},
        run={"gpus": plan.gpus.text, "shm_size": plan.shm_size, "probe_timeout_s": plan.timeout,
             "cpu_identity": emulation.cpu_identity_note(plan.standin_cpus)},
        started_at=utc_timestamp(started_at), finished_at=utc_timestamp(), duration_s=result.duration,
        stage_seconds=result.stage_seconds, selection=result.selection.to_json(), host=result.host,
    )


def verify_report_path(reports_dir: Path, tag: str) -> Path:
    return reports_dir / tag / REPORT_NAME


def read_verify_report(path: Path) -> VerifyReport | None:
    """reports/<tag>/verify.json, None when the image was never verified; a damaged one, or one of another schema,
    is an InputError."""
    fix = f"verify again with {command(f'test {path.parent.name}')}"
    report = read_json_document(path, fix, default=None)
    if report is None:
        return None
    require_schema(report, REPORT_SCHEMA, path, "a verification report", fix)
    shape = Shape("verification report")
    if shape.document(report, VerifyReport) and not DIGEST.fullmatch(report["image_id"]):
        shape.wrong(("image_id",), f"must be {DIGEST_RULE}")
    shape.raise_if_wrong(path, fix)
    return VerifyReport.from_json(report)


def selective_note(result: VerifyResult) -> str:
    """What a verification of some checks is not: one to publish."""
    return (f"only some checks ran ({result.selection.flags}): publishing needs every check, "
            f"{command(f'test {result.tag}')}")


def _mark(check: dict) -> str:
    return "⚠️ passed" if check["status"] == "passed" and check.get("warnings") else STATUS_MARK[check["status"]]


HOST_BLAMED = " charged to the host, not the image"


def host_notes(host: dict) -> list[str]:
    """The summary's lines on the GPU host: its findings (a sick host), and the speed figures below their floors."""
    health = host.get("health") or {}
    notes = [f"- **host health**: {markdown_cell(finding['cause'])} on GPU {finding['gpu']}: "
             f"{markdown_cell(finding['fix'])}" for finding in health.get("findings") or []]
    below = [name for name, figure in (host.get("performance") or {}).items()
             if figure.get("verdict") in ("host", "image")]
    return notes + ([f"- **speed below its floor**: {', '.join(below)} (see the gpu and multi-gpu checks)"]
                    if below else [])


def summary_markdown(results: list[VerifyResult]) -> str:
    """Checks x images, then what failed and what was skipped, for a CI step summary."""
    lines = ["# Image verification", "", "| check | " + " | ".join(f"`{r.tag}`" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in CHECKS:
        lines.append(f"| {name} | " + " | ".join(_mark(r.checks[name]) for r in results) + " |")
    lines.append("| **image** | " + " | ".join("**passed**" if r.passed else "**FAILED**" for r in results) + " |")
    lines += ["", "Verified image ids: " + ", ".join(f"`{r.tag}` = `{r.image_id}`" for r in results), ""]
    for result in results:
        notes = [f"- **{name}** {check['status']}: {markdown_cell(check['message'])}"
                 for name, check in result.checks.items() if check["status"] != "passed"]
        notes += [f"- **{name}** passed with a warning{HOST_BLAMED if check.get('blame') == 'host' else ''}: "
                  f"{markdown_cell(warning)}"
                  for name, check in result.checks.items() for warning in check.get("warnings", [])]
        notes += host_notes(result.host)
        notes += [f"- **CPU identity** was a stand-in: {markdown_cell(result.cpu_standin)}"] if result.cpu_standin else []
        notes += [] if result.selection.full else [f"- **selection**: {selective_note(result)}"]
        if notes:
            lines += [f"## `{result.tag}`", "", *notes, ""]
    return "\n".join(lines) + "\n"
