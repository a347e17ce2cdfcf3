"""Supply chain: a CycloneDX SBOM of each published image, and the vulnerability-scan hook with its allowlist.

The SBOM lists what is really inside the image (the OS's package database, whichever of dpkg, rpm and apk the image
has, pip's view of the venv and every Python package's metadata file anywhere in the image, read in a container
started from it), so it cannot disagree with the bits users pull and needs nothing from the OS family's table. Its
PURLs are Trivy's (purls.py), checked against Trivy's own inventory of the same images (agreement.py). A scanner's findings (trivy or grype, run offline by the publish gate:
gate.scan_image, trivy.py) at the allowlist's `fail_on` severities block publishing unless allowlisted (with a
reason, until a date).
"""
from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from ..files import atomic_write_json, brief
from ..model import InputError, Problem, TorchImagesError
from ..peers.engine import NO_GPUS
from ..yamlsource import LineDict, LineList, load_yaml
from .purls import PURL_TYPES, RELEASE_FILES, os_purl, pypi_purl, release

SBOM_DIR = "sbom"
# One container run reads everything: sections start with a marker line.
INVENTORY_SCRIPT = r"""set -e
echo '### os-release'; cat /etc/os-release
for f in debian_version lsb-release alpine-release; do
  if [ -f "/etc/$f" ]; then echo "### $f"; cat "/etc/$f"; fi
done
if command -v dpkg-query >/dev/null 2>&1; then
  echo '### dpkg'; dpkg-query -W -f='${Package}\t${Version}\t${Architecture}\n'
fi
if command -v rpm >/dev/null 2>&1; then
  echo '### rpm'; rpm -qa --qf '%{NAME}\t%{VERSION}-%{RELEASE}\t%{ARCH}\n'
fi
if command -v apk >/dev/null 2>&1; then
  echo '### apk'; apk info -v 2>/dev/null | sed -E 's/^(.+)-([^-]+-r[0-9]+)$/\1\t\2\t/'
fi
if [ -d /etc/apt ]; then
  echo '### apt-suites'
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    if [ -f "$f" ]; then sed -n -E 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?[^[:space:]]+[[:space:]]+([^[:space:]]+).*/\2/p' "$f"; fi
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    if [ -f "$f" ]; then sed -n -E 's/^Suites:[[:space:]]*//p' "$f"; fi
  done
fi
echo '### pip'
if command -v python >/dev/null 2>&1; then python -m pip list --format=json --disable-pip-version-check; fi
echo '### python-metadata'
find / -xdev -type f \( -path '*.dist-info/*' -name METADATA -o -path '*.egg-info/PKG-INFO' \
    -o -path '*.egg-info/METADATA' -o -path '*/EGG-INFO/PKG-INFO' -o -name '*.egg-info' \) -exec awk '
  FNR == 1 { name = ""; version = ""; head = (FILENAME !~ /\n/) }
  head { sub(/\r$/, "") }
  head && $0 == "" { head = 0 }
  head && /^Name:/ { name = $0; sub(/^Name:[ \t]*/, "", name); sub(/[ \t]+$/, "", name) }
  head && /^Version:/ { version = $0; sub(/^Version:[ \t]*/, "", version); sub(/[ \t]+$/, "", version) }
  head && name != "" && version != "" { print FILENAME "\t" name "\t" version; head = 0 }' {} + 2>/dev/null || true
"""
SEVERITIES = ("CRITICAL", "HIGH", "MEDIUM", "LOW", "UNKNOWN")
DEFAULT_FAIL_ON = ("CRITICAL", "HIGH")
VULNERABILITY_ID = re.compile(r"CVE-[0-9]{4}-[0-9]{4,}|GHSA(?:-[23456789cfghjmpqrvwx]{4}){3}", re.ASCII)
ALLOWLIST_KEYS = ("reason", "expires")  # and one of ALLOWLIST_SUBJECTS
# An entry may also give OpenVEX's justification of why the image is not affected (its VEX statement says so)
OPTIONAL_ALLOWLIST_KEYS = ("justification",)
JUSTIFICATIONS = ("component_not_present", "vulnerable_code_not_present", "vulnerable_code_not_in_execute_path",
                  "vulnerable_code_cannot_be_controlled_by_adversary", "inline_mitigations_already_exist")
ALLOWLIST_SUBJECTS = ("cve", "package")  # a vulnerability, or an OS package whose security fixes are not taken yet
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+", re.ASCII)  # Debian policy 5.6.1


class SbomError(TorchImagesError):
    """The image's package lists could not be read."""


# ---------------------------------------------------------------------------------------------------------- SBOM

@dataclass(frozen=True)
class Inventory:
    os_release: dict[str, str]
    debs: list[tuple[str, str, str]]  # name, version, architecture
    python: list[tuple[str, str]]  # name, version
    rpms: list[tuple[str, str, str]] = field(default_factory=list)  # name, version-release, architecture
    apks: list[tuple[str, str, str]] = field(default_factory=list)  # name, version, "" (apk info -v has no arch)
    # The suites the image's apt sources name (bookworm, bookworm-security): whether a rebuild's apt upgrade can take
    # the security fixes. None where the image has no apt, or was listed before this was read.
    apt_suites: list[str] | None = None
    # The files scanners read the OS release from (debian_version: "12.15\n"), by name (purls.RELEASE_FILES)
    release_files: dict[str, str] = field(default_factory=dict)
    # Every Python package's metadata file in the image (path, name, version), where scanners find them: the venv's,
    # and those vendored below another package (setuptools/_vendor). None where listed before this was read.
    python_files: list[tuple[str, str, str]] | None = None


def _three_fields(line: str) -> tuple[str, str, str]:
    name, version, architecture = line.split("\t")
    return name, version, architecture


def parse_inventory(text: str) -> Inventory:
    """The inventory script's output -> Inventory."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    os_release = {}
    for line in sections.get("os-release", []):
        key, _, value = line.partition("=")
        if key and value:
            os_release[key.strip()] = value.strip().strip('"')
    listed = {manager: sorted(_three_fields(line) for line in sections.get(manager, []) if line.count("\t") == 2)
              for manager in PURL_TYPES}
    pip_text = "\n".join(sections.get("pip", [])).strip()
    python = [(package["name"], package["version"]) for package in json.loads(pip_text)] if pip_text else []
    suites = sorted({suite for line in sections.get("apt-suites", []) for suite in line.split()}) \
        if "apt-suites" in sections else None
    release_files = {name: "\n".join(sections[name]) for name in RELEASE_FILES.values() if name in sections}
    python_files = sorted(_three_fields(line) for line in sections["python-metadata"] if line.count("\t") == 2) \
        if "python-metadata" in sections else None
    return Inventory(os_release, listed["dpkg"], sorted(python, key=lambda item: item[0].lower()), listed["rpm"],
                     listed["apk"], suites, release_files, python_files)


def collect_inventory(docker_client: docker.DockerClient, image: str) -> Inventory:
    try:
        # Reading package lists needs no GPU: on a GPU host the image's NVIDIA_VISIBLE_DEVICES=all must not decide.
        # As root, so that every file a scanner reads from the layers is readable here too (the image's user may not).
        output = docker_client.containers.run(image, ["-c", INVENTORY_SCRIPT], entrypoint=["/bin/sh"], user="0",
                                              environment=NO_GPUS, network_disabled=True, remove=True, stdout=True,
                                              stderr=False)
    except docker.errors.ContainerError as error:
        stderr = (error.stderr or b"").decode(errors="replace").strip()
        raise SbomError(f"reading the package lists of {image} failed: {stderr or error}") from None
    except docker.errors.APIError as error:
        raise SbomError(f"could not start {image} to read its package lists: {error}") from None
    return parse_inventory(output.decode(errors="replace"))


def cyclonedx(inventory: Inventory, repository: str, digest: str, image_id: str, timestamp: str) -> dict:
    """A CycloneDX 1.5 document for the image repository@digest (deterministic for the same inputs)."""
    distro = inventory.os_release.get("ID", "linux")
    distro_version = release(inventory.os_release, inventory.release_files)
    components = [_os_component(manager, name, version, arch, distro, distro_version)
                  for manager, packages in (("dpkg", inventory.debs), ("rpm", inventory.rpms), ("apk", inventory.apks))
                  for name, version, arch in packages]
    components += _python_components(inventory)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{repository}@{digest}')}",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": {"components": [{"type": "application", "name": "torchimages"}]},
            "component": {
                "type": "container", "bom-ref": f"{repository}@{digest}", "name": repository, "version": digest,
                "properties": [
                    {"name": "io.torchimages:image-id", "value": image_id},
                    {"name": "io.torchimages:os", "value": inventory.os_release.get("PRETTY_NAME", distro)},
                ],
            },
        },
        "components": sorted(components, key=lambda component: component["bom-ref"]),
    }


def _os_component(manager: str, name: str, version: str, arch: str, distro: str, distro_version: str) -> dict:
    purl = os_purl(manager, name, version, arch, distro, distro_version)
    return {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl,
            "properties": [{"name": "io.torchimages:package-manager", "value": manager}]}


def _python_components(inventory: Inventory) -> list[dict]:
    """One component per Python package (name and version): each metadata file found for it is an occurrence (its
    location), as a scanner finds one package in each; then what pip lists that no metadata file gave."""
    components: dict[str, dict] = {}
    for path, name, version in inventory.python_files or []:
        component = components.setdefault(pypi_purl(name, version), _pypi_component(name, version))
        component.setdefault("evidence", {"occurrences": []})["occurrences"].append({"location": path})
    for name, version in inventory.python:
        components.setdefault(pypi_purl(name, version), _pypi_component(name, version))
    return list(components.values())


def _pypi_component(name: str, version: str) -> dict:
    purl = pypi_purl(name, version)
    return {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl,
            "properties": [{"name": "io.torchimages:package-manager", "value": "pip"}]}


def sbom_path(catalog_dir: Path, pinned_tag: str) -> Path:
    """SBOMs live beside the catalog, one per pinned tag (pruned with it)."""
    return catalog_dir / SBOM_DIR / f"{pinned_tag}.cdx.json"


def write_sbom(path: Path, document: dict) -> None:
    """Write an SBOM where sbom_path puts it: no link below the catalog folder is followed."""
    atomic_write_json(path, document, root=path.parent.parent)


# ---------------------------------------------------------------------------------------------------------- scan

@dataclass(frozen=True)
class AllowedVulnerability:
    id: str
    reason: str
    expires: dt.date
    justification: str = ""  # OpenVEX's, where the entry gives one: the image is not affected, and this is why
    line: int = field(default=0, compare=False)  # where scanner-allowlist.yaml gives it


@dataclass(frozen=True)
class Allowlist:
    entries: tuple[AllowedVulnerability, ...] = ()
    fail_on: tuple[str, ...] = DEFAULT_FAIL_ON
    path: str = ""


def load_allowlist(path: Path) -> Allowlist:
    """Read scanner-allowlist.yaml (a missing file allows nothing); every problem is an InputError naming its line."""
    if not path.exists():
        return Allowlist(path=str(path))
    document = load_yaml(path)
    problems: list[Problem] = []

    def report(line: int, message: str) -> None:
        problems.append(Problem(str(path), line, message))

    if document is None:
        return Allowlist(path=str(path))
    if not isinstance(document, LineDict) or set(document) - {"fail_on", "allow"}:
        report(getattr(document, "line", 1), "the allowlist must be a mapping with 'fail_on' (severities) and 'allow' "
                                             "(a list of {cve, reason, expires})")
        raise InputError(problems)
    fail_on = _fail_on(document, report)
    allow = document.get("allow")
    entries = _allowed(allow, document.line_of("allow"), report) if allow else []
    if problems:
        raise InputError(problems)
    return Allowlist(tuple(entries), fail_on, str(path))


def refuse_expired(allowlist: Allowlist, today: dt.date) -> None:
    """`publish` takes no entry past its expiry (exit 2, nothing published): it would sign a VEX statement accepting
    a finding nobody accepts any more. The nightly keeps running on such a file, blocking only the rows it covers, so
    that the fixes it ships are not held up by one stale entry."""
    problems = [Problem(allowlist.path, entry.line, f"{entry.id}: expired {entry.expires}: renew it with a fresh "
                                                    "reason and date, or remove it and fix the image")
                for entry in allowlist.entries if entry.expires < today]
    if problems:
        raise InputError(problems)


def _fail_on(document: LineDict, report) -> tuple[str, ...]:
    fail_on = document.get("fail_on", list(DEFAULT_FAIL_ON))
    if not isinstance(fail_on, list) or not all(isinstance(s, str) and s.upper() in SEVERITIES for s in fail_on):
        report(document.line_of("fail_on"), f"'fail_on' must be a list drawn from {', '.join(SEVERITIES)}")
        return DEFAULT_FAIL_ON
    return tuple(severity.upper() for severity in fail_on)


def _allowed(items, line: int, report) -> list[AllowedVulnerability]:
    if not isinstance(items, LineList):
        report(line, "'allow' must be a list of {cve: CVE-YYYY-NNNN, reason: why it does not apply, expires: YYYY-MM-DD}")
        return []
    entries = []
    for item, item_line in zip(items, items.item_lines, strict=False):
        subjects = [key for key in ALLOWLIST_SUBJECTS if isinstance(item, LineDict) and key in item]
        if not isinstance(item, LineDict) or len(subjects) != 1 or not (
                {*subjects, *ALLOWLIST_KEYS} <= set(item) <= {*subjects, *ALLOWLIST_KEYS, *OPTIONAL_ALLOWLIST_KEYS}):
            report(item_line, "each allowlist entry needs exactly: cve (or package), reason, expires (e.g. {cve: "
                              "CVE-2024-12345, reason: \"not reachable: no TLS server in the image\", expires: "
                              "2026-12-31}, or {package: libssl3, reason: ..., expires: ...})")
            continue
        subject = subjects[0]
        vulnerability, reason, expires = item[subject], item["reason"], item["expires"]
        if subject == "cve" and (not isinstance(vulnerability, str) or not VULNERABILITY_ID.fullmatch(vulnerability)):
            report(item.line_of("cve"), f"'cve' must look like CVE-2024-12345 (or a GHSA id), got {vulnerability!r}")
        elif subject == "package" and (not isinstance(vulnerability, str) or not PACKAGE_NAME.fullmatch(vulnerability)):
            report(item.line_of("package"), f"'package' must be an OS package name (e.g. libssl3), got {vulnerability!r}")
        elif not isinstance(reason, str) or not reason.strip():
            report(item.line_of("reason"), f"{vulnerability}: 'reason' must say why the finding is acceptable")
        elif not isinstance(expires, dt.date) or isinstance(expires, dt.datetime):  # the gate compares dates
            report(item.line_of("expires"), f"{vulnerability}: 'expires' must be a date, YYYY-MM-DD, got "
                                            f"{brief(str(expires))}")
        elif item.get("justification", JUSTIFICATIONS[0]) not in JUSTIFICATIONS:
            report(item.line_of("justification"), f"{vulnerability}: 'justification' must be one of OpenVEX's: "
                                                  f"{', '.join(JUSTIFICATIONS)}; got {brief(str(item['justification']))}")
        else:
            entries.append(AllowedVulnerability(vulnerability, reason.strip(), expires, item.get("justification", ""),
                                                item_line))
    return entries


@dataclass(frozen=True)
class Finding:
    id: str
    package: str
    version: str
    severity: str
    fixed: str = ""  # the version that fixes it, where the scanner names one

    def __str__(self) -> str:
        return f"{self.id} ({self.severity}) in {self.package} {self.version}"


@dataclass
class ScanResult:
    status: str  # passed | failed | skipped
    scanner: str = ""
    message: str = ""
    blocking: list[Finding] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    # Every finding a source reported (blocking or not): the VEX names their packages, the gate compares the sources.
    findings: list[Finding] = field(default_factory=list)

    def summary(self) -> dict:
        return {"status": self.status, "scanner": self.scanner, "message": self.message,
                "blocking": [str(finding) for finding in self.blocking], "allowed": self.allowed}


def trivy_finding(item: dict) -> Finding:
    """One of Trivy's JSON report's vulnerabilities (or a VEX-suppressed finding's `Finding`)."""
    return Finding(str(item.get("VulnerabilityID", "")), str(item.get("PkgName", "")),
                   str(item.get("InstalledVersion", "")), str(item.get("Severity") or "UNKNOWN").upper(),
                   str(item.get("FixedVersion", "")))


def parse_trivy(document: dict) -> list[Finding]:
    return [trivy_finding(item) for result in document.get("Results") or []
            for item in result.get("Vulnerabilities") or []]


def parse_grype(document: dict) -> list[Finding]:
    return [
        Finding(match["vulnerability"]["id"], match.get("artifact", {}).get("name", ""),
                match.get("artifact", {}).get("version", ""), match["vulnerability"].get("severity", "Unknown").upper(),
                ", ".join((match["vulnerability"].get("fix") or {}).get("versions") or []))
        for match in document.get("matches") or []
    ]


def judge(findings: list[Finding], allowlist: Allowlist, today: dt.date, scanner: str) -> ScanResult:
    """Findings at a fail_on severity block publishing unless allowlisted and the entry has not expired."""
    active = {entry.id: entry for entry in allowlist.entries if entry.expires >= today}
    expired = {entry.id: entry for entry in allowlist.entries if entry.expires < today}
    serious = [finding for finding in findings if finding.severity in allowlist.fail_on]
    blocking = sorted({finding for finding in serious if finding.id not in active}, key=lambda f: (f.id, f.package))
    allowed = sorted({f"{finding.id}: {active[finding.id].reason} (until {active[finding.id].expires})"
                      for finding in serious if finding.id in active})
    if not blocking:
        return ScanResult("passed", scanner, f"{scanner}: no unallowed {'/'.join(allowlist.fail_on)} findings "
                                             f"({len(findings)} findings in all, {len(allowed)} allowlisted)",
                          allowed=allowed, findings=list(findings))
    lines = [str(finding) + (f" [allowlist entry expired {expired[finding.id].expires}]" if finding.id in expired else "")
             for finding in blocking]
    message = (f"{scanner} found {len(blocking)} {'/'.join(allowlist.fail_on)} vulnerabilities: " + "; ".join(lines[:20])
               + f". Fix them (rebuild on a newer base) or allowlist each with a reason and expiry in "
                 f"{allowlist.path or 'scanner-allowlist.yaml'}")
    return ScanResult("failed", scanner, message, blocking, allowed, list(findings))
