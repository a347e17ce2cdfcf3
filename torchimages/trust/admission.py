"""What `verify-image` decides, the way an admission policy does: pure functions of the evidence a key vouches for.

The report rule, one for `verify-image` and every shipped policy (docs/policies/): **every verification report a
trusted key signed about the digest must say `result: passed` and meet every requirement.** It is Kyverno's own
semantics (it judges every statement of the attestation's type), and it holds no surprise for a republish: publish
replaces its key's older report when an image is verified again (signatures.SignatureStore.attest), so a digest
carries one report per key, the one the catalog records. Two reports by one key (a second pipeline's `cosign attest`)
must both pass.

A requirement is what a cluster admits on: `--require gpu=passed` (a check's status) and `--require-host kind=gpu`,
`--require-host gpu_model="NVIDIA H100 80GB HBM3"`, `--require-host driver_major>=580` (the host the report ran on).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..model import InputError, Problem
from ..reporting import as_object

REPORT_RULE = "every verification report by the key must say passed and meet every requirement"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
HOST_FIELDS = ("kind", "gpu_model", "driver", "driver_major", "cuda_driver")
_REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)\s*(?P<operator>>=|=)\s*(?P<value>.+)", re.ASCII)


@dataclass(frozen=True)
class Requirement:
    """One condition every report must meet: `checks.<name>.status = value` or `host.<field> = / >= value`."""

    subject: str  # "check" or "host"
    name: str
    operator: str  # "=" or ">="
    value: str

    def __str__(self) -> str:
        where = f"checks.{self.name}.status" if self.subject == "check" else f"host.{self.name}"
        return f"{where} {self.operator} {self.value}"

    def failure(self, report: dict) -> str | None:
        """Why report does not meet this requirement, None when it does."""
        found = self._found(report)
        if self.operator == ">=":
            number = _number(found)
            return None if number is not None and number >= float(self.value) else f"{self} (it has {found!r})"
        if isinstance(found, list):
            return None if self.value in found else f"{self} (it has {', '.join(map(str, found)) or 'none'})"
        return None if str(found) == self.value else f"{self} (it has {found!r})"

    def _found(self, report: dict):
        if self.subject == "check":
            check = as_object(as_object(report.get("checks")).get(self.name))
            return check.get("status", "absent")
        host = as_object(report.get("host"))
        return host.get("gpu_models", []) if self.name == "gpu_model" else host.get(self.name, "")


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past any float (10**400 in a report)
        return None


def parse_requirement(text: str, subject: str) -> Requirement:
    """`--require CHECK=STATUS` (subject "check") or `--require-host FIELD=VALUE|FIELD>=NUMBER` (subject "host");
    an InputError (exit 2) naming the flag and the form otherwise."""
    flag = "--require" if subject == "check" else "--require-host"
    form = ("CHECK=STATUS, e.g. gpu=passed" if subject == "check"
            else f"FIELD=VALUE or FIELD>=NUMBER with FIELD one of {', '.join(HOST_FIELDS)}, e.g. driver_major>=580")
    match = _REQUIREMENT.fullmatch(text.strip())
    if not match:
        raise InputError([Problem(flag, 0, f"{text!r} is not {form}")])
    name, operator, value = match["name"], match["operator"], match["value"].strip().strip('"')
    if subject == "check" and (operator != "=" or value not in ("passed", "failed", "skipped")):
        raise InputError([Problem(flag, 0, f"{text!r}: a check's status is passed, failed or skipped ({form})")])
    if subject == "host" and name not in HOST_FIELDS:
        raise InputError([Problem(flag, 0, f"{text!r}: {name!r} is no host field ({form})")])
    if operator == ">=" and _number(value) is None:
        raise InputError([Problem(flag, 0, f"{text!r}: >= compares numbers ({form})")])
    return Requirement(subject, name, operator, value)


@dataclass
class ReportVerdict:
    """One verification report and what keeps it from admitting the image."""

    report: dict
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def admits(self) -> bool:
        return not self.failures


def judge_report(report: dict, requirements: list[Requirement], manifest_media_type: str,
                 config_digest: str) -> ReportVerdict:
    """The report rule applied to one report about an image whose manifest has manifest_media_type and config_digest.

    A report names the image id it was made for: an image pushed with gzip layers keeps Docker's v2 manifest, whose
    config digest is the engine's image id, so there a different id means the report is about another image; a zstd
    push rewrites the config as OCI's, and an index has none, so there it cannot be compared and is only shown."""
    verdict = ReportVerdict(report)
    if report.get("result") != "passed":
        verdict.failures.append(f"the report says {report.get('result')!r}, not 'passed'")
    verdict.failures += [why for requirement in requirements if (why := requirement.failure(report))]
    image_id = str(report.get("image_id") or "")
    if manifest_media_type == DOCKER_MANIFEST and image_id != config_digest:
        verdict.failures.append(f"the report is about image {image_id or 'none'}, not this image ({config_digest})")
    elif image_id and image_id != config_digest:
        verdict.notes.append(f"its image id {image_id} is the engine's; this manifest's config is {config_digest} "
                             "(an OCI push rewrites the config): compare by tag")
    return verdict


def judge_reports(reports: list[dict], requirements: list[Requirement], manifest_media_type: str,
                  config_digest: str) -> tuple[list[ReportVerdict], list[str]]:
    """Every report's verdict, and the problems that keep the digest from being verified under the report rule."""
    verdicts = [judge_report(report, requirements, manifest_media_type, config_digest) for report in reports]
    problems = [f"verification report {index} of {len(verdicts)} ({verdict.report.get('verified_at') or 'undated'}): "
                + "; ".join(verdict.failures)
                for index, verdict in enumerate(verdicts, start=1) if verdict.failures]
    return verdicts, problems
