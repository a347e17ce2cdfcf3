"""Security freshness: which OS packages of an image already have a fix in its distribution's security archive.

No scanner database is needed: the image's SBOM lists each OS package with its version, the security pocket's index
(Release file, signed, and its Packages.xz) lists the fixed versions, and the fixed package's own
changelog.Debian.gz names the CVEs it closes. Versions are compared as the package manager compares them
(python-debian implements dpkg's algorithm: epochs, tildes). Where each OS's security archive is comes from
compat.yaml (`os.<name>.security`, and the family's `security.index` format). Every fetch is bounded in time and bytes.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import io
import lzma
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path, PurePosixPath

import requests
import urllib3
from debian import changelog as debian_changelog
from debian import deb822
from debian.debian_support import version_compare

from .files import read_json_document
from .model import InputError, PeerError, Problem
from .sbom import Allowlist, Finding, ScanResult

INDEX_FORMATS = {"deb": "dpkg"}  # a family's security index format -> the SBOM package database it is compared with
MAX_RELEASE_BYTES = 4 << 20
MAX_INDEX_BYTES = 64 << 20  # a compressed Packages file (bookworm-security's: 0.4 MB)
MAX_UNPACKED_BYTES = 512 << 20
MAX_PACKAGE_BYTES = 256 << 20  # a .deb read for its changelog
READ_TIMEOUT_S = 30.0  # a silent peer
FETCH_DEADLINE_S = 300.0  # a peer that trickles bytes
GPGV_TIMEOUT_S = 60
CHUNK = 1 << 16


class SecurityIndexError(PeerError):
    """The security index could not be read or does not hold: nothing is judged (and nothing published) on it."""


# ------------------------------------------------------------------------------------------------------ the data

@dataclass(frozen=True)
class Archive:
    """An OS's security pocket, as compat.yaml places it."""

    os: str
    url: str  # the archive root (http(s) mirror) or a folder laid out like one (a saved index)
    suite: str
    components: tuple[str, ...]
    keyring: str = ""  # the distribution's keyring the Release file is checked with, where this host has it
    database: str = "dpkg"


@dataclass(frozen=True)
class Installed:
    name: str
    version: str
    arch: str


@dataclass(frozen=True)
class Candidate:
    name: str
    version: str
    arch: str
    filename: str  # the .deb's path below the archive root


@dataclass(frozen=True)
class Fixable:
    package: str
    arch: str
    installed: str
    fixed: str
    cves: tuple[str, ...] = ()
    since: str = ""  # YYYY-MM-DD of the oldest fix after the installed version, where the changelog says
    filename: str = ""

    def to_json(self) -> dict:
        return {"package": self.package, "arch": self.arch, "installed": self.installed, "fixed": self.fixed,
                "cves": list(self.cves), "since": self.since}


@dataclass(frozen=True)
class SecurityIndex:
    archive: Archive
    candidates: dict[tuple[str, str], Candidate]
    signature: str  # what was checked about the Release file, in words


@dataclass
class RowSecurity:
    subject: str  # a row's tag or an image reference
    os: str
    source: str = ""  # the index that judged
    signature: str = ""
    fixable: list[Fixable] = field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict:
        return {"subject": self.subject, "os": self.os, "source": self.source, "signature": self.signature,
                "fixable": [item.to_json() for item in self.fixable], "error": self.error}


# ------------------------------------------------------------------------------------------ compat.yaml and SBOMs

def archive_for(compat: dict, os_name: str, compat_path: str = "compat.yaml", mirror: str | None = None) -> Archive | None:
    """The OS's security archive, or None when compat.yaml lists none for it; a malformed entry is an InputError."""
    os_facts = (compat.get("os") or {}).get(os_name)
    if not isinstance(os_facts, dict) or "security" not in os_facts:
        return None
    entry = os_facts["security"]
    family = (compat.get("families") or {}).get(os_facts.get("family"), {})
    index = (family.get("security") or {}).get("index") if isinstance(family, dict) else None
    line = getattr(os_facts, "line_of", lambda key: 0)("security")
    if index not in INDEX_FORMATS:
        raise InputError([Problem(compat_path, line, f"os {os_name} names a security archive, but its family "
                                                     f"{os_facts.get('family')!r} has no `security: {{index: deb}}` "
                                                     f"(formats: {', '.join(INDEX_FORMATS)}): add it to `families`")])
    if not (isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("suite"), str)
            and isinstance(entry.get("components"), list) and entry["components"]):
        raise InputError([Problem(compat_path, line, f"os {os_name}: security needs url: (the archive root), suite: "
                                                     "(e.g. bookworm-security) and components: (e.g. [main])")])
    return Archive(os_name, mirror or entry["url"], entry["suite"], tuple(str(c) for c in entry["components"]),
                   str(entry.get("keyring") or ""), INDEX_FORMATS[index])


def os_for_release(compat: dict, os_release: dict[str, str]) -> str | None:
    """The compat.yaml OS an image's /etc/os-release names (its ID + VERSION_ID, or the entry's `os_release`)."""
    found = f"{os_release.get('ID', '')}{os_release.get('VERSION_ID', '')}"
    return next((name for name, facts in (compat.get("os") or {}).items()
                 if str((facts or {}).get("os_release", name)) == found), None)


def sbom_packages(document, path: str, database: str = "dpkg") -> list[Installed]:
    """The OS packages a CycloneDX SBOM (as sbom.cyclonedx writes it) lists for one package database."""
    components = document.get("components") if isinstance(document, dict) else None
    if not isinstance(components, list):
        raise InputError([Problem(path, 0, "not a CycloneDX SBOM (no components list): delete it, publish writes it "
                                           "again")])
    packages = []
    for component in components:
        if not isinstance(component, dict):
            continue
        manager = {p.get("name"): p.get("value") for p in component.get("properties") or [] if isinstance(p, dict)}
        if manager.get("io.torchimages:package-manager") != database:
            continue
        arch = re.search(r"[?&]arch=([^&]+)", str(component.get("purl", "")))
        packages.append(Installed(str(component.get("name")), str(component.get("version")),
                                  arch.group(1) if arch else "all"))
    if not packages:
        raise InputError([Problem(path, 0, f"the SBOM lists no {database} packages, so nothing can be compared with the "
                                           "security index: write it again from the image (publish does)")])
    return packages


# ------------------------------------------------------------------------------------------------- pure parsing

def parse_release(text: str, source: str) -> dict[str, tuple[str, int]]:
    """A Release file's SHA256 list: path -> (sha256, size)."""
    release = deb822.Release(text)
    valid_until = _when(release.get("Valid-Until"))
    if valid_until is not None and valid_until < dt.datetime.now(dt.timezone.utc):
        raise SecurityIndexError(f"{source}: the Release file expired {valid_until:%Y-%m-%d %H:%M} UTC (Valid-Until): "
                                 "a stale mirror, or an old index replayed; use a current mirror")
    entries = release.get("SHA256") or []
    if not entries:
        raise SecurityIndexError(f"{source}: not a Release file (no SHA256 list): the index is damaged or not an archive")
    return {entry["name"]: (entry["sha256"], int(entry["size"])) for entry in entries}


def parse_packages(text: str) -> dict[tuple[str, str], Candidate]:
    """A Packages index -> the newest version of each (package, architecture)."""
    newest: dict[tuple[str, str], Candidate] = {}
    for paragraph in deb822.Packages.iter_paragraphs(io.StringIO(text), use_apt_pkg=False):
        name, version, arch = paragraph.get("Package"), paragraph.get("Version"), paragraph.get("Architecture", "all")
        if not (name and version):
            continue
        key = (name, arch)
        if key not in newest or version_compare(version, newest[key].version) > 0:
            newest[key] = Candidate(name, version, arch, paragraph.get("Filename", ""))
    return newest


def fixable_updates(installed: list[Installed], candidates: dict[tuple[str, str], Candidate]) -> list[Fixable]:
    """Each installed package whose security pocket holds a newer version (dpkg's order, not string order)."""
    updates = []
    for package in installed:
        candidate = candidates.get((package.name, package.arch))
        if candidate and version_compare(candidate.version, package.version) > 0:
            updates.append(Fixable(package.name, package.arch, package.version, candidate.version,
                                   filename=candidate.filename))
    return sorted(updates, key=lambda item: (item.package, item.arch))


def changelog_fixes(text: str, installed: str) -> tuple[tuple[str, ...], str]:
    """The CVE IDs the changelog's entries newer than the installed version name, and the date of the oldest such
    entry (when the first fix the image lacks was released)."""
    cves: set[str] = set()
    since = ""
    for block in debian_changelog.Changelog(text, strict=False):
        if block.version is None or version_compare(str(block.version), installed) <= 0:
            continue
        cves.update(re.findall(r"CVE-[0-9]{4}-[0-9]{4,}", "\n".join(block.changes())))
        since = _date(block.date) or since
    return tuple(sorted(cves)), since


def _date(text: str | None) -> str:
    when = _when(text)
    return when.date().isoformat() if when else ""


def _when(text: str | None) -> dt.datetime | None:
    """An RFC 2822 date (changelogs, Release files), in UTC when it names no zone; None when it is not one."""
    try:
        when = parsedate_to_datetime(text) if text else None
    except (TypeError, ValueError, IndexError):
        return None
    return when.replace(tzinfo=dt.timezone.utc) if when and when.tzinfo is None else when


def deb_changelog(data: bytes, package: str) -> str | None:
    """The package's changelog from a .deb (an ar archive holding data.tar.*), or None."""
    member = _ar_member(data, "data.tar")
    if member is None:
        return None
    # changelog.Debian.gz, or changelog.gz for a native package (apt, base-files)
    wanted = {f"{prefix}usr/share/doc/{package}/{name}" for prefix in ("./", "")
              for name in ("changelog.Debian.gz", "changelog.gz")}
    try:
        with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as archive:
            for info in archive:
                stream = archive.extractfile(info) if info.name in wanted and info.isfile() else None
                if stream is not None and info.size <= MAX_UNPACKED_BYTES:
                    return _gunzip(stream.read()).decode("utf-8", errors="replace")
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error):
        return None
    return None


def _gunzip(data: bytes) -> bytes:
    """A gzip member, unpacked to at most MAX_UNPACKED_BYTES (a changelog is kilobytes; a bomb is not read)."""
    unpacked = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, MAX_UNPACKED_BYTES)
    if len(unpacked) >= MAX_UNPACKED_BYTES:
        raise OSError("a changelog larger than the bound")
    return unpacked


def _ar_member(data: bytes, prefix: str) -> bytes | None:
    if not data.startswith(b"!<arch>\n"):
        return None
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name = header[:16].decode(errors="replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode().strip())
        except ValueError:
            return None
        if name.startswith(prefix):
            return data[offset + 60:offset + 60 + size]
        offset += 60 + size + (size % 2)
    return None


def judge(rows: list[RowSecurity], allowlist: Allowlist, today: dt.date) -> ScanResult:
    """Fixable updates block publishing unless the package, or each CVE it fixes, has an allowlist entry that has not
    expired. An index that could not be read blocks too: nothing is published on doubt."""
    source = ", ".join(sorted({row.source for row in rows if row.source})) or "security index"
    errors = [row.error for row in rows if row.error]
    if errors:
        return ScanResult("failed", source, f"security index not judged: {'; '.join(errors)}")
    if not any(row.source for row in rows):
        return ScanResult("skipped", message="security index skipped: " + "; ".join(row.signature for row in rows))
    active = {entry.id: entry for entry in allowlist.entries if entry.expires >= today}
    expired = {entry.id: entry for entry in allowlist.entries if entry.expires < today}
    blocking, allowed = [], []
    for item in (item for row in rows for item in row.fixable):
        covering = [item.package] if item.package in active else (
            list(item.cves) if item.cves and all(cve in active for cve in item.cves) else [])
        if covering:
            allowed += [f"{item.package} {item.fixed} ({key}): {active[key].reason} (until {active[key].expires})"
                        for key in covering]
            continue
        lapsed = [key for key in (item.package, *item.cves) if key in expired]
        note = f" [allowlist entry expired {expired[lapsed[0]].expires}]" if lapsed else ""
        blocking.append(Finding(",".join(item.cves) or "no CVE named", item.package, f"{item.installed} -> {item.fixed}",
                                "FIXABLE" + note))
    if not blocking:
        return ScanResult("passed", source, f"{source}: no unallowed fixable OS updates ({len(allowed)} allowlisted)",
                          allowed=sorted(allowed))
    lines = [f"{f.package} {f.version} ({f.id}){f.severity.removeprefix('FIXABLE')}" for f in blocking]
    return ScanResult("failed", source, f"{source}: {len(blocking)} OS packages have security fixes the image lacks: "
                                        + "; ".join(lines[:20]) + ". Rebuild the row (its OS layer takes them) or "
                                        f"allowlist each package or CVE with a reason and expiry in "
                                        f"{allowlist.path or 'scanner-allowlist.yaml'}", blocking, sorted(allowed))


def gate(checker: Checker | None, tag: str, os_name: str, debs: list[tuple[str, str, str]], allowlist: Allowlist,
         today: dt.date) -> ScanResult:
    """The publish gate's verdict from the security index on an image's dpkg packages (skipped without a checker)."""
    if checker is None:
        return ScanResult("skipped", message="security index skipped: not asked for")
    if not debs:
        if archive_for(checker.compat, os_name, checker.compat_path) is None:
            return judge([checker.check(tag, os_name, [])], allowlist, today)
        return judge([RowSecurity(tag, os_name, "security index", error="the image lists no dpkg packages")],
                     allowlist, today)
    return judge([checker.check(tag, os_name, [Installed(*deb) for deb in debs])], allowlist, today)


def refresh_token(updates: list[Fixable]) -> str:
    """What a security rebuild takes, as a short stable token (the OS layer's cache depends on it): the same fixes
    give the same token, a newer fix another."""
    text = "\n".join(sorted(f"{item.package}:{item.arch}={item.fixed}" for item in updates))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fixes_line(row: RowSecurity) -> str:
    """'libssl3 3.0.19-1~deb12u1 -> 3.0.22-1~deb12u2 (CVE-..., ...)' for each update, for summaries."""
    return "; ".join(f"{item.package} {item.installed} -> {item.fixed}"
                     + (f" ({', '.join(item.cves)})" if item.cves else "") for item in row.fixable)


def merge(verdicts: list[ScanResult]) -> ScanResult:
    """One verdict from the security index's and a scanner's: failed if any failed; it names every source."""
    judged = [verdict for verdict in verdicts if verdict.status != "skipped"]
    sources = " + ".join(verdict.scanner for verdict in judged if verdict.scanner) or "none"
    status = "failed" if any(v.status == "failed" for v in judged) else ("passed" if judged else "skipped")
    message = "; ".join(verdict.message for verdict in verdicts if verdict.message)
    return ScanResult(status, sources, f"judged by {sources}: {message}",
                      [f for v in judged for f in v.blocking], [a for v in judged for a in v.allowed])


# ----------------------------------------------------------------------------------------------------- fetching

class Fetcher:
    """Reads files below an archive root (http(s), or a local folder holding a saved index), each within a byte limit,
    a read timeout and an overall deadline."""

    def __init__(self, root: str, session: requests.Session | None = None, read_timeout: float = READ_TIMEOUT_S,
                 deadline: float = FETCH_DEADLINE_S):
        self.root = root.rstrip("/")
        self.session = session or requests.Session()
        self.read_timeout, self.deadline = read_timeout, deadline

    def where(self, path: str) -> str:
        return f"{self.root}/{path}"

    def get(self, path: str, limit: int) -> bytes:
        if PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
            raise SecurityIndexError(f"{self.where(path)}: a path outside the archive root; the index is not trusted")
        if not re.match(r"https?://", self.root):
            return self._read_file(Path(self.root) / path, limit)
        started = time.monotonic()
        try:
            with self.session.get(self.where(path), stream=True, timeout=(10, self.read_timeout)) as response:
                if response.status_code != 200:
                    raise SecurityIndexError(f"{self.where(path)}: HTTP {response.status_code}")
                body = bytearray()
                # read1 returns what has come, up to a chunk: iter_content waits for a whole chunk, so a server
                # sending a few bytes at a time held one read (and the deadline's next look) for as long as it liked.
                while chunk := response.raw.read1(CHUNK, decode_content=True):
                    body += chunk
                    if len(body) > limit:
                        raise SecurityIndexError(f"{self.where(path)}: larger than {_amount(limit)}; refused")
                    if time.monotonic() - started > self.deadline:
                        raise SecurityIndexError(f"{self.where(path)}: not read within {self.deadline:g} s (the "
                                                 "server is too slow); try again or name a mirror")
                return bytes(body)
        except (requests.RequestException, urllib3.exceptions.HTTPError) as error:  # the latter: read1's own
            timeout = (requests.Timeout, urllib3.exceptions.TimeoutError)
            kind = "timed out" if isinstance(error, timeout) or "timed out" in str(error).lower() else "failed"
            raise SecurityIndexError(f"{self.where(path)}: {kind} ({type(error).__name__}); try again or name a "
                                     "mirror") from None

    def _read_file(self, path: Path, limit: int) -> bytes:
        try:
            with path.open("rb") as handle:
                data = handle.read(limit + 1)
        except OSError as error:
            raise SecurityIndexError(f"{path}: {error.strerror or error}") from None
        if len(data) > limit:
            raise SecurityIndexError(f"{path}: larger than {_amount(limit)}; refused")
        return data


def _amount(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} bytes"


def verify_release(data: bytes, keyring: str, source: str) -> tuple[str, str]:
    """The InRelease file's signed text and what was checked: gpgv with the distribution's keyring where this host has
    it; a bad signature is an error, a keyring this host lacks is said, not hidden."""
    if not keyring or not Path(keyring).is_file() or not shutil.which("gpgv"):
        missing = "gpgv" if keyring and Path(keyring).is_file() else (keyring or "no keyring named in compat.yaml")
        return _cleartext(data, source), f"signature not checked ({missing} not on this host)"
    with tempfile.TemporaryDirectory(prefix="torchimages-release-") as folder:
        signed = Path(folder) / "InRelease"
        signed.write_bytes(data)
        try:
            checked = subprocess.run(["gpgv", "--keyring", keyring, "--output", "-", str(signed)], capture_output=True,
                                     timeout=GPGV_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise SecurityIndexError(f"{source}: gpgv did not finish in {GPGV_TIMEOUT_S} s") from None
    if checked.returncode != 0:
        why = " ".join(checked.stderr.decode(errors="replace").split()[-12:])
        raise SecurityIndexError(f"{source}: the Release signature does not verify with {keyring} ({why}); the index "
                                 "is not trusted")
    return checked.stdout.decode("utf-8", errors="replace"), f"signature verified with {keyring}"


def _cleartext(data: bytes, source: str) -> str:
    text = data.decode("utf-8", errors="replace")
    match = re.search(r"-----BEGIN PGP SIGNED MESSAGE-----\n(?:Hash:[^\n]*\n)*\n(.*?)\n-----BEGIN PGP SIGNATURE",
                      text, re.DOTALL)
    if "-----BEGIN PGP" in text and not match:
        raise SecurityIndexError(f"{source}: a damaged signed Release file")
    return match.group(1) if match else text


def read_index(archive: Archive, fetcher: Fetcher, arch: str) -> SecurityIndex:
    """The suite's Packages lists for one architecture, each checked against the (signed) Release file's hash."""
    release_path = f"dists/{archive.suite}/InRelease"
    text, signature = verify_release(fetcher.get(release_path, MAX_RELEASE_BYTES), archive.keyring,
                                     fetcher.where(release_path))
    hashes = parse_release(text, fetcher.where(release_path))
    candidates: dict[tuple[str, str], Candidate] = {}
    for component in archive.components:
        name = f"{component}/binary-{arch}/Packages.xz"
        where = fetcher.where(f"dists/{archive.suite}/{name}")
        if name not in hashes:
            raise SecurityIndexError(f"{where}: the Release file lists no such index (components: "
                                     f"{', '.join(archive.components)}); fix compat.yaml's security entry")
        digest, size = hashes[name]
        data = fetcher.get(f"dists/{archive.suite}/{name}", min(MAX_INDEX_BYTES, size) if size else MAX_INDEX_BYTES)
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise SecurityIndexError(f"{where}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}..., "
                                     f"but the Release file says {size} bytes, {digest[:16]}... (truncated or "
                                     "replaced); nothing judged")
        candidates.update(parse_packages(_unxz(data, where)))
    return SecurityIndex(archive, candidates, signature)


def _unxz(data: bytes, where: str) -> str:
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        text = decompressor.decompress(data, max_length=MAX_UNPACKED_BYTES + 1)
    except lzma.LZMAError as error:
        raise SecurityIndexError(f"{where}: not xz-compressed as its name says ({error})") from None
    if len(text) > MAX_UNPACKED_BYTES:
        raise SecurityIndexError(f"{where}: unpacks to more than {_amount(MAX_UNPACKED_BYTES)}; refused")
    if not decompressor.eof:
        raise SecurityIndexError(f"{where}: the xz stream ends early (truncated)")
    return text.decode("utf-8", errors="replace")


def with_cves(updates: list[Fixable], fetcher: Fetcher, log: Callable[[str], None]) -> list[Fixable]:
    """Each update with the CVE IDs and date its package's changelog gives (kept without them where it cannot be read:
    the fixed version alone already makes the update fixable)."""
    read: dict[str, str | None] = {}
    found = []
    for item in updates:
        if item.filename not in read:
            try:
                read[item.filename] = deb_changelog(fetcher.get(item.filename, MAX_PACKAGE_BYTES), item.package)
            except SecurityIndexError as error:
                log(f"{item.package} {item.fixed}: changelog not read ({error})")
                read[item.filename] = None
        text = read[item.filename]
        cves, since = changelog_fixes(text, item.installed) if text else ((), "")
        found.append(Fixable(item.package, item.arch, item.installed, item.fixed, cves, since, item.filename))
    return found


class Checker:
    """Judges rows and images against their OS's security index; each index is read once per run."""

    def __init__(self, compat: dict, compat_path: str, mirror: str | None = None,
                 log: Callable[[str], None] = lambda line: None, fetcher_factory=Fetcher):
        self.compat, self.compat_path, self.mirror, self.log = compat, compat_path, mirror, log
        self.fetcher_factory = fetcher_factory
        self.indexes: dict[tuple[str, str], SecurityIndex | SecurityIndexError] = {}

    def check(self, subject: str, os_name: str | None, installed: list[Installed]) -> RowSecurity:
        if os_name is None:
            return RowSecurity(subject, "", error=f"{subject}: its /etc/os-release names no OS of {self.compat_path}")
        archive = archive_for(self.compat, os_name, self.compat_path, self.mirror)
        if archive is None:  # not judged, and said so: the family table is where an OS gets its archive
            return RowSecurity(subject, os_name, signature=f"{os_name} has no security archive in {self.compat_path} "
                                                           f"(os.{os_name}.security)")
        arch = next((p.arch for p in installed if p.arch != "all"), "amd64")
        fetcher = self.fetcher_factory(archive.url)
        index = self._index(archive, fetcher, arch)
        source = f"{archive.suite} index"
        if isinstance(index, SecurityIndexError):
            return RowSecurity(subject, os_name, source, error=str(index))
        updates = with_cves(fixable_updates(installed, index.candidates), fetcher, self.log)
        return RowSecurity(subject, os_name, source, index.signature, updates)

    def check_published(self, tag: str, os_name: str, sbom_path: Path) -> RowSecurity:
        """A published row, by the SBOM the catalog keeps of its digest: what its OS has fixed since."""
        try:
            installed = sbom_packages(read_json_document(sbom_path, "delete it: publish writes it again"),
                                      str(sbom_path))
        except InputError as error:
            return RowSecurity(tag, os_name, error=str(error))
        return self.check(tag, os_name, installed)

    def _index(self, archive: Archive, fetcher: Fetcher, arch: str) -> SecurityIndex | SecurityIndexError:
        key = (archive.url + "|" + archive.suite, arch)
        if key not in self.indexes:
            try:
                self.indexes[key] = read_index(archive, fetcher, arch)
            except SecurityIndexError as error:
                self.indexes[key] = error
        return self.indexes[key]

