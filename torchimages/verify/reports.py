"""Verification, step 4: what a run leaves behind: reports/<tag>/verify.json, the summary page, the console table."""
from __future__ import annotations

from datetime import datetime

from rich.table import Table
from rich.text import Text

from ..reporting import markdown_cell, utc_timestamp
from .plan import CHECKS, Plan, VerifyResult

REPORT_SCHEMA = 1
STATUS_MARK = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "⏭️ skipped"}
STATUS_STYLE = {"passed": "green", "failed": "red", "skipped": "yellow"}


def verify_document(result: VerifyResult, plan: Plan, started_at: datetime) -> dict:
    """reports/<tag>/verify.json: what publish reads to decide whether these exact bytes may be pushed."""
    return {
        "schema": REPORT_SCHEMA, "tag": result.tag, "image": result.image, "image_id": result.image_id,
        "spec_hash": plan.spec.spec_hash(), "passed": result.passed,
        "checks": {name: {"status": check["status"], "message": check["message"], "tests": check.get("tests", [])}
                   for name, check in result.checks.items()},
        "run": {"gpus": plan.gpus.text, "shm_size": plan.shm_size, "probe_timeout_s": plan.timeout},
        "started_at": utc_timestamp(started_at), "finished_at": utc_timestamp(),
        "duration_s": result.duration, "stage_seconds": result.stage_seconds, "junit": "junit.xml", "facts": "facts.json",
    }


def summary_markdown(results: list[VerifyResult]) -> str:
    """Checks x images, then what failed and what was skipped, for a CI step summary."""
    lines = ["# Image verification", "", "| check | " + " | ".join(f"`{r.tag}`" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in CHECKS:
        lines.append(f"| {name} | " + " | ".join(STATUS_MARK[r.checks[name]["status"]] for r in results) + " |")
    lines.append("| **image** | " + " | ".join("**passed**" if r.passed else "**FAILED**" for r in results) + " |")
    lines += ["", "Verified image ids: " + ", ".join(f"`{r.tag}` = `{r.image_id}`" for r in results), ""]
    for result in results:
        notes = [f"- **{name}** {check['status']}: {markdown_cell(check['message'])}"
                 for name, check in result.checks.items() if check["status"] != "passed"]
        if notes:
            lines += [f"## `{result.tag}`", "", *notes, ""]
    return "\n".join(lines) + "\n"


def checks_table(result: VerifyResult) -> Table:
    verdict = Text("passed", "green") if result.passed else Text("FAILED", "red")
    title = Text.assemble(f"{result.tag}: ", verdict, f" ({result.duration:.1f}s, {result.image_id[:19]})")
    table = Table(title=title, title_justify="left")
    for column in ("check", "status", "message"):
        table.add_column(column, no_wrap=column != "message")
    for name, check in result.checks.items():
        table.add_row(name, Text(check["status"], STATUS_STYLE[check["status"]]), Text(check["message"]))
    return table
