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
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path

from debian import changelog as debian_changelog
from debian import deb822
from debian.debian_support import version_compare

from ..files import brief, read_json_document
from ..model import InputError, Problem
from ..peers.security_archive import Fetcher, SecurityIndexError, amount, verify_release

INDEX_FORMATS = {"deb": "dpkg"}  # a family's security index format -> the SBOM package database it is compared with
MAX_RELEASE_BYTES = 4 << 20
MAX_INDEX_BYTES = 64 << 20  # a compressed Packages file (bookworm-security's: 0.4 MB)
MAX_UNPACKED_BYTES = 512 << 20
MAX_PACKAGE_BYTES = 256 << 20  # a .deb read for its changelog
CLOCK_SKEW = dt.timedelta(hours=1)  # a Release file dated later than this is from the future
MAX_VERSION_CHARS = 256  # Debian's longest is under 100; thousands of digits cost int() its limit
# What dpkg accepts: an optional epoch, an upstream version starting with a digit, a revision not empty
DPKG_VERSION = re.compile(r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~-]*(?<!-)", re.ASCII)
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,127}", re.ASCII)
ARCHITECTURE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}", re.ASCII)
POOL_PATH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+~%/-]{0,511}", re.ASCII)
SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
SIZE = re.compile(r"[0-9]{1,15}", re.ASCII)


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
    size: int = 0  # and its size and SHA-256, as the signed index gives them
    sha256: str = ""


@dataclass(frozen=True)
class Fixable:
    package: str
    arch: str
    installed: str
    fixed: str
    cves: tuple[str, ...] = ()
    since: str = ""  # YYYY-MM-DD of the oldest fix after the installed version, where the changelog says
    filename: str = ""
    size: int = 0
    sha256: str = ""

    def to_json(self) -> dict:
        return {"package": self.package, "arch": self.arch, "installed": self.installed, "fixed": self.fixed,
                "cves": list(self.cves), "since": self.since}


@dataclass(frozen=True)
class SecurityIndex:
    archive: Archive
    candidates: dict[tuple[str, str], Candidate]
    signature: str  # what was checked about the Release file, in words
    published: dt.datetime | None = None  # the Release file's Date: no fix it lists was released after it


@dataclass
class RowSecurity:
    subject: str  # a row's tag or an image reference
    os: str
    source: str = ""  # the index that judged
    signature: str = ""
    fixable: list[Fixable] = field(default_factory=list)
    error: str = ""

    def to_json(self, today: dt.date) -> dict:
        return {"subject": self.subject, "os": self.os, "source": self.source, "signature": self.signature,
                "fixable": [item.to_json() for item in self.fixable], "error": self.error, **fix_age(self.fixable, today)}


def fix_age(fixable: list[Fixable], today: dt.date) -> dict:
    """How far an image is behind its security pocket: how many fixable OS packages it carries, the release date of
    the oldest fix it lacks (its changelog's) and that fix's age in days (0 with none, or none dated)."""
    oldest = min((item.since for item in fixable if item.since), default="")
    return {"fixable_count": len(fixable), "oldest_missing_fix": oldest,
            "fix_age_days": (today - dt.date.fromisoformat(oldest)).days if oldest else 0}


def fix_record(row: RowSecurity | None, today: dt.date) -> dict:
    """What the verification report and the catalog keep about a digest's fixes ({} where no index judged it)."""
    if row is None or not row.source or row.error:
        return {}
    return {"source": row.source, "fixable": [item.to_json() for item in row.fixable], **fix_age(row.fixable, today)}


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
        package = Installed(str(component.get("name")), str(component.get("version")), arch.group(1) if arch else "all")
        if why := installed_problem(package):
            raise InputError([Problem(path, 0, f"{why}: write it again from the image (publish does)")])
        packages.append(package)
    if not packages:
        raise InputError([Problem(path, 0, f"the SBOM lists no {database} packages, so nothing can be compared with the "
                                           "security index: write it again from the image (publish does)")])
    return packages


# ------------------------------------------------------------------------------------------------- pure parsing

def is_dpkg_version(text: str) -> bool:
    """Whether dpkg (and python-debian, which compares them) takes text as a version; bounded, so that no version of
    thousands of digits reaches int()."""
    if len(text) > MAX_VERSION_CHARS or not DPKG_VERSION.fullmatch(text):
        return False
    try:
        version_compare(text, "0")
    except ValueError:
        return False
    return True


def installed_problem(package: Installed) -> str:
    """What is wrong with an installed package as an SBOM or an image lists it, or ''."""
    if not PACKAGE_NAME.fullmatch(package.name):
        return f"package name {brief(package.name)} is not a Debian package name"
    if not is_dpkg_version(package.version):
        return f"package {package.name} has version {brief(package.version)}, which dpkg refuses"
    if not ARCHITECTURE.fullmatch(package.arch):
        return f"package {package.name} has architecture {brief(package.arch)}, not a Debian architecture"
    return ""


def parse_release(text: str, source: str) -> tuple[dict[str, tuple[str, int]], dt.datetime | None]:
    """A Release file's SHA256 list (path -> (sha256, size)) and Date (None where it has none); any entry or date not
    of its shape refuses the file."""
    release = deb822.Release(text)
    _check_valid_until(release.get("Valid-Until"), source)
    published = _release_date(release.get("Date"), source)
    entries = release.get("SHA256") or []
    if not entries:
        raise SecurityIndexError(f"{source}: not a Release file (no SHA256 list): the index is damaged or not an archive")
    hashes = {}
    for entry in entries:
        name, digest, size = (str(entry.get(key, "")) for key in ("name", "sha256", "size"))
        if not (POOL_PATH.fullmatch(name) and SHA256.fullmatch(digest) and SIZE.fullmatch(size)):
            raise SecurityIndexError(f"{source}: a SHA256 entry that is not `HASH SIZE PATH` ({brief(digest)} "
                                     f"{brief(size)} {brief(name)}): the index is damaged or not an archive")
        hashes[name] = (digest, int(size))
    return hashes, published


def _check_valid_until(text: str | None, source: str) -> None:
    if text is None:
        return
    valid_until = _when(text)
    if valid_until is None:
        raise SecurityIndexError(f"{source}: Valid-Until {brief(text)} is not a date: the index is damaged")
    if valid_until < utc_now():
        raise SecurityIndexError(f"{source}: the Release file expired {valid_until:%Y-%m-%d %H:%M} UTC (Valid-Until): "
                                 "a stale mirror, or an old index replayed; use a current mirror")


def utc_now() -> dt.datetime:
    """This host's clock, in one place (a replay of recorded index snapshots freezes it)."""
    return dt.datetime.now(dt.timezone.utc)


def _release_date(text: str | None, source: str) -> dt.datetime | None:
    """A Release file's Date. One dated after now is a snapshot no archive has published yet (a wrong clock, or a
    forged one): the ages of the fixes it lists would be negative. Bad input, exit 2; a little clock skew is allowed.
    A Date that is not a date is the index's error: read as none, it would skip this check altogether."""
    if text is None:
        return None
    when = _when(text)
    if when is None:
        raise SecurityIndexError(f"{source}: Date {brief(text)} is not a date: the index is damaged")
    if when > utc_now() + CLOCK_SKEW:
        raise InputError([Problem(source, 0, f"the Release file is dated {when:%Y-%m-%d %H:%M} UTC, after this "
                                             f"host's clock ({utc_now():%Y-%m-%d %H:%M} UTC): use a snapshot the "
                                             "archive has published, or set the clock right")])
    return when


def parse_packages(text: str, source: str = "Packages") -> dict[tuple[str, str], Candidate]:
    """A Packages index -> the newest version of each (package, architecture); a paragraph with a field not of its
    shape refuses the index (one line naming it, the value quoted inert)."""
    newest: dict[tuple[str, str], Candidate] = {}
    for paragraph in deb822.Packages.iter_paragraphs(io.StringIO(text), use_apt_pkg=False):
        candidate = _candidate(paragraph, source)
        key = (candidate.name, candidate.arch)
        if key not in newest or version_compare(candidate.version, newest[key].version) > 0:
            newest[key] = candidate
    return newest


# Each field a Packages paragraph must have, and what it must look like (dpkg's and the archive's rules)
PACKAGES_FIELDS: dict[str, Callable[[str], object]] = {
    "Package": PACKAGE_NAME.fullmatch, "Version": is_dpkg_version, "Architecture": ARCHITECTURE.fullmatch,
    "Filename": POOL_PATH.fullmatch, "Size": SIZE.fullmatch, "SHA256": SHA256.fullmatch}


def _candidate(paragraph, source: str) -> Candidate:
    fields = {key: str(paragraph.get(key, "")) for key in PACKAGES_FIELDS}
    for key, valid in PACKAGES_FIELDS.items():
        if not valid(fields[key]):
            raise SecurityIndexError(f"{source}: package {brief(fields['Package'])} has {key} {brief(fields[key])}, "
                                     "not of its shape (dpkg would refuse it); the index is damaged or hostile")
    return Candidate(fields["Package"], fields["Version"], fields["Architecture"], fields["Filename"],
                     int(fields["Size"]), fields["SHA256"])


def fixable_updates(installed: list[Installed], candidates: dict[tuple[str, str], Candidate]) -> list[Fixable]:
    """Each installed package whose security pocket holds a newer version (dpkg's order, not string order)."""
    updates = []
    for package in installed:
        candidate = candidates.get((package.name, package.arch))
        if candidate and version_compare(candidate.version, package.version) > 0:
            updates.append(Fixable(package.name, package.arch, package.version, candidate.version,
                                   filename=candidate.filename, size=candidate.size, sha256=candidate.sha256))
    return sorted(updates, key=lambda item: (item.package, item.arch))


def changelog_fixes(text: str, installed: str, latest: dt.datetime | None = None) -> tuple[tuple[str, ...], str]:
    """The CVE IDs the changelog's entries newer than the installed version name, and the date of the oldest such
    entry (when the first fix the image lacks was released). An entry dated after latest (the index that lists the
    fix was published then) has an impossible date: the fix is undated, so a promise lists it as behind instead of
    aging it by a negative number of days."""
    cves: set[str] = set()
    since, impossible = "", False
    for block in debian_changelog.Changelog(text, strict=False):
        version = _entry_version(block)
        if not version or version_compare(version, installed) <= 0:
            continue
        cves.update(re.findall(r"CVE-[0-9]{4}-[0-9]{4,}", "\n".join(block.changes())))
        when = _when(block.date)
        impossible = impossible or (when is not None and latest is not None and when > latest)
        since = (when.date().isoformat() if when else "") or since
    return tuple(sorted(cves)), "" if impossible else since


def _entry_version(block) -> str:
    """A changelog entry's version, or '' for one dpkg refuses: it says nothing that can be placed after the
    installed version."""
    try:
        version = "" if block.version is None else str(block.version)
    except ValueError:  # python-debian parses the version when it is asked for
        return ""
    return version if is_dpkg_version(version) else ""


def _when(text: str | None) -> dt.datetime | None:
    """An RFC 2822 date (changelogs, Release files), in UTC when it names no zone; None when it is not one."""
    try:
        when = parsedate_to_datetime(text) if text else None
    except (TypeError, ValueError, IndexError, OverflowError):
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
    """The first member whose name starts with prefix; None for an archive whose member sizes are not decimal or
    run past its end (a negative size walked the offset backwards for ever)."""
    if not data.startswith(b"!<arch>\n"):
        return None
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name = header[:16].decode(errors="replace").strip().rstrip("/")
        size_field = header[48:58].strip()
        if not re.fullmatch(rb"[0-9]+", size_field) or int(size_field) > len(data) - offset - 60:
            return None
        size = int(size_field)
        if name.startswith(prefix):
            return data[offset + 60:offset + 60 + size]
        offset += 60 + size + (size % 2)
    return None


def refresh_token(updates: list[Fixable]) -> str:
    """What a security rebuild takes, as a short stable token (the OS layer's cache depends on it): the same fixes
    give the same token, a newer fix another."""
    text = "\n".join(sorted(f"{item.package}:{item.arch}={item.fixed}" for item in updates))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fixes_line(row: RowSecurity) -> str:
    """'libssl3 3.0.19-1~deb12u1 -> 3.0.22-1~deb12u2 (CVE-..., ...)' for each update, for summaries."""
    return "; ".join(f"{item.package} {item.installed} -> {item.fixed}"
                     + (f" ({', '.join(item.cves)})" if item.cves else "") for item in row.fixable)


# ----------------------------------------------------------------------------------------------------- fetching

def read_index(archive: Archive, fetcher: Fetcher, arch: str) -> SecurityIndex:
    """The suite's Packages lists for one architecture, each checked against the (signed) Release file's hash."""
    release_path = f"dists/{archive.suite}/InRelease"
    text, signature = verify_release(fetcher.get(release_path, MAX_RELEASE_BYTES), archive.keyring,
                                     fetcher.where(release_path))
    hashes, published = parse_release(text, fetcher.where(release_path))
    candidates: dict[tuple[str, str], Candidate] = {}
    for component in archive.components:
        name = f"{component}/binary-{arch}/Packages.xz"
        where = fetcher.where(f"dists/{archive.suite}/{name}")
        if name not in hashes:
            raise SecurityIndexError(f"{where}: the Release file lists no such index (components: "
                                     f"{', '.join(archive.components)}); fix compat.yaml's security entry")
        digest, size = hashes[name]
        if size > MAX_INDEX_BYTES:
            raise SecurityIndexError(f"{where}: larger than {amount(MAX_INDEX_BYTES)} (the Release file says "
                                     f"{size} bytes); refused")
        data = fetcher.get_vouched(f"dists/{archive.suite}/{name}", size, digest)
        candidates.update(parse_packages(_unxz(data, where), where))
    return SecurityIndex(archive, candidates, signature, published)


def _unxz(data: bytes, where: str) -> str:
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        text = decompressor.decompress(data, max_length=MAX_UNPACKED_BYTES + 1)
    except lzma.LZMAError as error:
        raise SecurityIndexError(f"{where}: not xz-compressed as its name says ({error})") from None
    if len(text) > MAX_UNPACKED_BYTES:
        raise SecurityIndexError(f"{where}: unpacks to more than {amount(MAX_UNPACKED_BYTES)}; refused")
    if not decompressor.eof:
        raise SecurityIndexError(f"{where}: the xz stream ends early (truncated)")
    return text.decode("utf-8", errors="replace")


def with_cves(updates: list[Fixable], fetcher: Fetcher, log: Callable[[str], None],
              published: dt.datetime | None = None) -> list[Fixable]:
    """Each update with the CVE IDs and date its package's changelog gives (kept without them where it cannot be read:
    the fixed version alone already makes the update fixable). No fix was released after its index was published
    (its Date; this host's clock where it has none): a later date is impossible, and the fix undated."""
    latest = published or utc_now() + CLOCK_SKEW
    read: dict[str, str | None] = {}
    found = []
    for item in updates:
        if item.filename not in read:
            try:
                read[item.filename] = deb_changelog(_vouched_package(item, fetcher), item.package)
            except SecurityIndexError as error:
                log(f"{item.package} {item.fixed}: changelog not read ({error})")
                read[item.filename] = None
        text = read[item.filename]
        cves, since = _changelog_fixes_or_none(text, item.installed, latest)
        found.append(Fixable(item.package, item.arch, item.installed, item.fixed, cves, since, item.filename,
                             item.size, item.sha256))
    return found


def _vouched_package(item: Fixable, fetcher: Fetcher) -> bytes:
    """The fixed package's .deb, only as the signed Packages index lists it (its size and SHA-256): a changelog the
    index does not vouch for could name any CVE, and an allowlisted one would pass the gate."""
    if not item.sha256 or item.size > MAX_PACKAGE_BYTES:
        raise SecurityIndexError(f"{fetcher.where(item.filename)}: the index gives no SHA256 for it, or a size over "
                                 f"{amount(MAX_PACKAGE_BYTES)}")
    return fetcher.get_vouched(item.filename, item.size, item.sha256)


def _changelog_fixes_or_none(text: str | None, installed: str, latest: dt.datetime) -> tuple[tuple[str, ...], str]:
    """changelog_fixes, or none for a changelog python-debian cannot read (the update stays fixable without them)."""
    try:
        return changelog_fixes(text, installed, latest) if text else ((), "")
    except debian_changelog.ChangelogParseError:
        return (), ""


class Checker:
    """Judges rows and images against their OS's security index; each index is read once per run."""

    def __init__(self, compat: dict, compat_path: str, mirror: str | None = None,
                 log: Callable[[str], None] = lambda line: None, fetcher_factory=Fetcher):
        self.compat, self.compat_path, self.mirror, self.log = compat, compat_path, mirror, log
        self.fetcher_factory = fetcher_factory
        self.indexes: dict[tuple[str, str], SecurityIndex | SecurityIndexError] = {}
        self.judged: dict[str, RowSecurity] = {}  # subject -> its latest verdict: what publish attests and records

    def check(self, subject: str, os_name: str | None, installed: list[Installed]) -> RowSecurity:
        self.judged[subject] = self._check(subject, os_name, installed)
        return self.judged[subject]

    def _check(self, subject: str, os_name: str | None, installed: list[Installed]) -> RowSecurity:
        if os_name is None:
            return RowSecurity(subject, "", error=f"{subject}: its /etc/os-release names no OS of {self.compat_path}")
        archive = archive_for(self.compat, os_name, self.compat_path, self.mirror)
        if archive is None:  # not judged, and said so: the family table is where an OS gets its archive
            return RowSecurity(subject, os_name, signature=f"{os_name} has no security archive in {self.compat_path} "
                                                           f"(os.{os_name}.security)")
        if problems := [why for why in map(installed_problem, installed) if why]:
            return RowSecurity(subject, os_name, error=f"{subject}: {problems[0]}; nothing judged")
        arch = next((p.arch for p in installed if p.arch != "all"), "amd64")
        fetcher = self.fetcher_factory(archive.url)
        index = self._index(archive, fetcher, arch)
        source = f"{archive.suite} index"
        if isinstance(index, SecurityIndexError):
            return RowSecurity(subject, os_name, source, error=str(index))
        updates = with_cves(fixable_updates(installed, index.candidates), fetcher, self.log, index.published)
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

