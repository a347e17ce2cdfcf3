"""The publish gate: the security index's findings on an image judged against the project's allowlist, in one
verdict, and a refusal a person can act on (what freshness.py reads, judged here; the scanner's verdict merged in).
The scanner (trivy, else grype, where installed) runs offline against the database the team gives, or not at all:
never a download of its own."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path

from ..invocation import command
from ..model import InputError
from . import trivy
from .freshness import Checker, Fixable, Installed, RowSecurity, archive_for, fix_age
from .sbom import Allowlist, Finding, ScanResult, parse_grype
from .sbom import judge as judge_findings

SHOWN_PACKAGES = 3  # packages a refusal names; the publish report lists every one with its CVEs


def judge(rows: list[RowSecurity], allowlist: Allowlist, today: dt.date, missing_suite: str = "") -> ScanResult:
    """Fixable updates block publishing unless the package, or each CVE it fixes, has an allowlist entry that has not
    expired. An index that could not be read blocks too: nothing is published on doubt. missing_suite: the security
    suite the image's apt sources lack, where they lack it (a rebuild cannot take the fixes then)."""
    source = ", ".join(sorted({row.source for row in rows if row.source})) or "security index"
    errors = [row.error for row in rows if row.error]
    if errors:
        return ScanResult("failed", source, f"security index not judged: {'; '.join(errors)}")
    if not any(row.source for row in rows):
        return ScanResult("skipped", message="security index skipped: " + "; ".join(row.signature for row in rows))
    active = {entry.id: entry for entry in allowlist.entries if entry.expires >= today}
    expired = {entry.id: entry for entry in allowlist.entries if entry.expires < today}
    blocking, allowed, unallowed, lapsed_on = [], [], [], []
    for item in (item for row in rows for item in row.fixable):
        covering = [item.package] if item.package in active else (
            list(item.cves) if item.cves and all(cve in active for cve in item.cves) else [])
        if covering:
            allowed += [f"{item.package} {item.fixed} ({key}): {active[key].reason} (until {active[key].expires})"
                        for key in covering]
            continue
        lapsed = [key for key in (item.package, *item.cves) if key in expired]
        note = f" [allowlist entry expired {expired[lapsed[0]].expires}]" if lapsed else ""
        if lapsed:
            lapsed_on.append(f"{item.package}'s allowlist entry expired {expired[lapsed[0]].expires}")
        blocking.append(Finding(",".join(item.cves) or "no CVE named", item.package, f"{item.installed} -> {item.fixed}",
                                "FIXABLE" + note))
        unallowed.append(item)
    found = [Finding(cve, item.package, item.installed, "FIXABLE", item.fixed)
             for row in rows for item in row.fixable for cve in item.cves]
    if not blocking:
        return ScanResult("passed", source, f"{source}: no unallowed fixable OS updates ({len(allowed)} allowlisted)",
                          allowed=sorted(allowed), findings=found)
    return ScanResult("failed", source, refusal(rows[0].subject, unallowed, lapsed_on, missing_suite, today,
                                                allowlist.path or "scanner-allowlist.yaml"),
                      blocking, sorted(allowed), found)


def refusal(tag: str, unallowed: list[Fixable], lapsed_on: list[str], missing_suite: str, today: dt.date,
            allowlist_path: str) -> str:
    """The gate's refusal in one line, whatever the image carries (thousands of CVEs in kernel headers alone): the
    counts, the first packages, the oldest fix's age, and the remedy that fits. A rebuild takes the fixes only where
    the image's apt sources have the security suite: without it, the base must change. Every CVE is in the report."""
    cves = {cve for item in unallowed for cve in item.cves}
    shown = "; ".join(f"{item.package} {item.installed} -> {item.fixed}" for item in unallowed[:SHOWN_PACKAGES])
    more = f" and {len(unallowed) - SHOWN_PACKAGES} more" if len(unallowed) > SHOWN_PACKAGES else ""
    age = fix_age(unallowed, today)
    oldest = f"; oldest fix dated {age['oldest_missing_fix']} ({age['fix_age_days']} days)" \
        if age["oldest_missing_fix"] else ""
    lapsed = f"; {', '.join(lapsed_on[:SHOWN_PACKAGES])}" if lapsed_on else ""
    if missing_suite:
        remedy = (f"the image's apt sources have no {missing_suite} suite, so a rebuild would not take them: give "
                  "the base that suite (docs/building.md, \"Offline bases\"), then rebuild")
    else:
        remedy = f"rebuild the row ({command(f'build {tag} --force')}) to take the fixes"
    packages = f"{len(unallowed)} OS package{'s lack' if len(unallowed) != 1 else ' lacks'} security fixes"
    return (f"{packages} ({len(cves)} CVE{'s' if len(cves) != 1 else ''}): {shown}{more}{oldest}{lapsed}; "
            f"{remedy}, or allowlist each package or CVE with a reason and expiry in {allowlist_path}")


def lacking_suite(checker: Checker | None, os_name: str, apt_suites: list[str] | None) -> str:
    """The security suite of os_name's archive when the image's apt sources (its inventory's) do not name it; '' when
    they do, or when either is unknown."""
    archive = archive_for(checker.compat, os_name, checker.compat_path) if checker is not None else None
    if archive is None or apt_suites is None or archive.suite in apt_suites:
        return ""
    return archive.suite


def gate(checker: Checker | None, tag: str, os_name: str, debs: list[tuple[str, str, str]], allowlist: Allowlist,
         today: dt.date, apt_suites: list[str] | None = None) -> ScanResult:
    """The publish gate's verdict from the security index on an image's dpkg packages (skipped without a checker).
    apt_suites: the suites the image's apt sources name (None where not read)."""
    if checker is None:
        return ScanResult("skipped", message="security index skipped: not asked for")
    if not debs:
        if archive_for(checker.compat, os_name, checker.compat_path) is None:
            return judge([checker.check(tag, os_name, [])], allowlist, today)
        return judge([RowSecurity(tag, os_name, "security index", error="the image lists no dpkg packages")],
                     allowlist, today)
    return judge([checker.check(tag, os_name, [Installed(*deb) for deb in debs])], allowlist, today,
                 lacking_suite(checker, os_name, apt_suites))


def merge(verdicts: list[ScanResult]) -> ScanResult:
    """One verdict from the security index's and a scanner's: failed if any failed; it names every source."""
    judged = [verdict for verdict in verdicts if verdict.status != "skipped"]
    sources = " + ".join(verdict.scanner for verdict in judged if verdict.scanner) or "none"
    status = "failed" if any(v.status == "failed" for v in judged) else ("passed" if judged else "skipped")
    # Each verdict's message without its own source in front: "judged by" names them all once.
    message = "; ".join(verdict.message.removeprefix(f"{verdict.scanner}: ") for verdict in verdicts if verdict.message)
    differing = disagreements(judged)
    if differing:
        message += f"; the sources disagree: {'; '.join(differing[:10])}" + (
            f" (and {len(differing) - 10} more)" if len(differing) > 10 else "")
    return ScanResult(status, sources, f"judged by {sources}: {message}",
                      [f for v in judged for f in v.blocking], [a for v in judged for a in v.allowed],
                      [f for v in judged for f in v.findings])


def disagreements(verdicts: list[ScanResult]) -> list[str]:
    """Where the security index and a scanner, both run on one image, disagree: a fixable OS package (and CVE) one
    reports and the other does not. Said, never decided: each has its own reach (the index knows only the fixes
    published in the security suite; a scanner's database may know a CVE before a fix, or be older)."""
    fixable = {verdict.scanner: {(finding.package, finding.id) for finding in verdict.findings if finding.fixed}
               for verdict in verdicts if verdict.status != "skipped"}
    scanners = [name for name in fixable if name in ("trivy", "grype")]
    index = next((name for name in fixable if name not in scanners), None)  # named by its archive
    if index is None or not scanners:
        return []
    lines = []
    for scanner in scanners:
        lines += [f"the security index ({index}) has {package} fixable for {cve}, {scanner} does not report it"
                  for package, cve in sorted(fixable[index] - fixable[scanner])]
        lines += [f"{scanner} reports {package} fixable for {cve}, the security index does not list it"
                  for package, cve in sorted(fixable[scanner] - fixable[index])]
    return lines


def scan_image(image: str, allowlist: Allowlist, scanner_db: Path | None = None) -> ScanResult:
    """The installed scanner's verdict on image, in the Docker engine (DOCKER_HOST), read offline from scanner_db:
    trivy (trivy.find_trivy) or else grype. Skipped, saying why in one line, when neither is installed or no
    database was given; failed, saying why, when the scanner cannot run."""
    found = trivy.find_trivy()
    scanner = "trivy" if found else ("grype" if shutil.which("grype") else "")
    if not scanner:
        return ScanResult("skipped", message="vulnerability scan skipped: neither trivy nor grype is installed")
    if scanner_db is None:
        return ScanResult("skipped", message=f"vulnerability scan skipped: {scanner} is installed but was given no "
                                             f"database to read offline (--scanner-db DIR or "
                                             f"${trivy.SCANNER_DB_VARIABLE}; docs/security.md, \"Scanning offline\")")
    today = dt.date.today()
    if found:
        try:
            report = trivy.run_trivy(image, scanner_db, source="docker", trivy=found)
        except (trivy.ScannerError, InputError) as error:
            return ScanResult("failed", "trivy", f"{' '.join(str(error).split())}; fix the scanner's database "
                                                 f"({scanner_db}) or uninstall trivy")
        return judge_findings(report.findings, allowlist, today, "trivy")
    return _grype(image, allowlist, scanner_db, today)


def _grype(image: str, allowlist: Allowlist, scanner_db: Path, today: dt.date) -> ScanResult:
    """Grype from its database cache folder, with no update or version check (untested here: Grype is not
    installable on the test hosts)."""
    environment = {**os.environ, "GRYPE_DB_CACHE_DIR": str(scanner_db), "GRYPE_DB_AUTO_UPDATE": "false",
                   "GRYPE_CHECK_FOR_APP_UPDATE": "false"}
    try:
        finished = subprocess.run(["grype", "--quiet", "--output", "json", f"docker:{image}"], capture_output=True,
                                  text=True, timeout=trivy.TIMEOUT_S, check=False, env=environment,
                                  stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ScanResult("failed", "grype", f"grype did not finish scanning {image} in {trivy.TIMEOUT_S} s")
    if finished.returncode != 0:
        return ScanResult("failed", "grype", f"grype could not scan {image} (exit {finished.returncode}: "
                                             f"{trivy.failure_line(finished.stderr)}); fix its database "
                                             f"({scanner_db}) or uninstall it")
    try:
        document = json.loads(finished.stdout or "{}")
    except ValueError:
        return ScanResult("failed", "grype", f"grype's report on {image} is not JSON")
    return judge_findings(parse_grype(document), allowlist, today, "grype")
