"""A package index to read torch's facts from: a PEP 691 index (PyPI's JSON simple API, a mirror, a local index)
whose wheels are read by HTTP range requests, or a wheelhouse folder. Either lists a project's wheels and reads the
members of one wheel that a caller picks, each bounded before it is read; anything it cannot read is one line naming
the index or the wheel."""
from __future__ import annotations

import hashlib
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import requests
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pypi_simple import DistributionPackage, NoSuchProjectError, PyPISimple, UnsupportedRepoVersionError
from remotezip import RangeNotSupported, RemoteZip, RemoteZipError

from ..files import brief
from ..model import PYPI, InputError, Problem
from ..redaction import inert, redact
from . import index_http

# What is read of a wheel is held in memory: libtorch_python.so is 34 MB in 2.14; a member claiming far more is not
# a torch wheel's, and neither are members adding up to more.
MAX_MEMBER_BYTES = 256 << 20
MAX_WHEEL_READ_BYTES = 320 << 20
# A wheel in a wheelhouse is hashed whole: torch's largest CUDA wheels are under 1 GiB.
MAX_WHEEL_BYTES = 4 << 30
# A wheel's file name is checked for its shape before it is used or written anywhere.
WHEEL_FILENAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,199}\.whl", re.ASCII)  # ! an epoch
# What the libraries reading an index page or a wheel raise on an answer they cannot read (pypi_simple's and
# pydantic's errors are ValueErrors; zipfile raises EOFError, zlib.error, NotImplementedError for an unknown method,
# RuntimeError for an encrypted member; a nested JSON page is a RecursionError).
UNREADABLE = (requests.RequestException, RemoteZipError, UnsupportedRepoVersionError, ValueError, LookupError,
              TypeError, RuntimeError, OSError, EOFError, zlib.error, zipfile.BadZipFile)


class Index:
    """A PEP 691 index; wheels inside it read with range requests. A login in its URL (a mirror's) is sent to the
    index's own host only, for its pages and files, and is never part of `url`, which sources and messages show."""

    whole_release = True  # it lists every wheel of a release, so the newest CPython among them is the release's

    def __init__(self, url: str = PYPI, session: requests.Session | None = None):
        parts = urlsplit(url.rstrip("/"))
        login = (unquote(parts.username or ""), unquote(parts.password or "")) if parts.username else None
        self.url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))  # [::1]:8080 stays as it is
        # The login goes with requests to the index's own origin, never on the session (pypi_simple's `auth=` sets
        # it there, and requests then sends it to every host a page names for its files).
        self.session = session or index_http.IndexSession(login, index_http.origin(self.url))
        self.client = PyPISimple(self.url + "/", session=self.session)
        self._pages: dict[str, list[DistributionPackage]] = {}  # a project's page is read once per run (torch: 1 MB)

    def packages(self, project: str) -> list[DistributionPackage]:
        """The project's wheels the index lists whose file names are wheels' (pip skips the others too)."""
        if project not in self._pages:
            self._pages[project] = [p for p in self._read_page(project) if _well_formed(p, project)]
        return self._pages[project]

    def _read_page(self, project: str) -> list[DistributionPackage]:
        try:
            page = self.client.get_project_page(project, timeout=index_http.TIMEOUT_S)
            return [p for p in page.packages if p.package_type == "wheel"]
        except NoSuchProjectError:
            return []
        except UNREADABLE as error:
            raise unreadable(self.url, f"cannot read {project}'s page: {why_unreadable(error)}") from None

    def read_members(self, package: DistributionPackage, want: Callable[[str], bool]) -> dict[str, bytes]:
        """The members of a remote wheel that `want` picks, read by range requests (not the whole wheel)."""
        if index_http.origin(package.url) is None:
            raise unreadable(self.url, f"{package.filename}: its URL {brief(redact(package.url))} is not http(s)")
        try:
            with RemoteZip(package.url, session=self.session) as wheel:
                return _read_wanted(wheel, package.url, want)
        except RangeNotSupported:
            raise unreadable(package.url, "the file host does not answer range requests (it would send the whole "
                                          "wheel)") from None
        except UNREADABLE as error:
            raise unreadable(package.url, f"cannot read the wheel as a zip: {why_unreadable(error)}") from None


def why_unreadable(error: BaseException) -> str:
    """One line for what a library raised (remotezip reports a timeout as its own error with the message)."""
    if isinstance(error, requests.Timeout) or "timed out" in str(error).lower():
        return f"timed out ({index_http.TIMEOUT_S:g} s per read, {index_http.COMMAND_TIME_S:g} s in all)"
    if isinstance(error, RecursionError):
        return "nested too deeply to be an index's answer"
    return brief(f"{type(error).__name__}: {error}", 300)


def _well_formed(package, project: str) -> bool:
    """A wheel whose file name is a safe wheel name of the project, with a PEP 440 version."""
    if not WHEEL_FILENAME.fullmatch(package.filename or ""):
        return False
    try:
        name, version, _, _ = parse_wheel_filename(package.filename)
        return name == project and str(version) == str(Version(package.version or ""))
    except (InvalidWheelFilename, InvalidVersion):
        return False


@dataclass(frozen=True)
class LocalWheel:
    """A wheel in a wheelhouse folder, with what the index's package records carry."""

    filename: str
    url: str  # its path
    version: str
    digests: dict
    upload_time: None = None
    is_yanked: bool = False


class Wheelhouse(Index):
    """A folder of wheels (offline; `build.py wheels --dest` makes one): the same facts, read from the files. It
    holds the wheels someone fetched, not the release: the newest Python is not read from it."""

    whole_release = False

    def __init__(self, folder: Path):
        self.url = str(folder)
        self.folder = folder
        self._pages = {}

    def _read_page(self, project: str) -> list:
        wheels = []
        for path in sorted([*self.folder.glob("*.whl"), *self.folder.glob("*/*.whl")]):
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            if name == project and WHEEL_FILENAME.fullmatch(path.name):
                with _open_wheel(path) as stream:
                    wheels.append(LocalWheel(path.name, str(path), str(version), {"sha256": _sha256(stream)}))
        return wheels

    def read_members(self, package, want: Callable[[str], bool]) -> dict[str, bytes]:
        try:
            with _open_wheel(Path(package.url)) as stream, zipfile.ZipFile(stream) as wheel:
                return _read_wanted(wheel, package.url, want)
        except UNREADABLE as error:
            raise unreadable(package.url, f"cannot read the wheel as a zip: {why_unreadable(error)}") from None


def _open_wheel(path: Path):
    """A wheelhouse file, opened only when it is a regular file within MAX_WHEEL_BYTES: a FIFO named *.whl is
    opened without waiting and refused, a link to /dev/zero refused before a byte is read."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as error:
        raise unreadable(str(path), f"cannot open it ({error.strerror})") from None
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_WHEEL_BYTES:
        os.close(handle)
        raise unreadable(str(path), f"not a regular file of at most {MAX_WHEEL_BYTES >> 30} GiB, as a wheel is")
    return os.fdopen(handle, "rb")


def _sha256(stream) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def open_index(url: str) -> Index:
    """The index a URL names: a PEP 691 index over HTTP(S), or a wheelhouse folder (a path or file:// URL)."""
    if not url.strip() or not url.isprintable() or url != url.strip():  # '' would read the current folder
        raise InputError([Problem("--index-url", 0, f"{brief(redact(url))} is no index: give --index-url "
                                                    "https://.../simple or a folder of wheels")])
    try:
        parts = urlsplit(url)
    except ValueError:  # 'http://[::1': an IPv6 host without its ']'
        raise InputError([Problem("--index-url", 0, f"{brief(redact(url))}: its host does not parse (an IPv6 "
                                                    "address is written in brackets: http://[::1]:8080/simple)")]) from None
    if parts.scheme in ("http", "https"):
        if index_http.origin(url) is None or "@" in parts.path:  # a login's '/' or '@' typed as it is
            raise InputError([Problem("--index-url", 0, f"{brief(redact(url))}: its host and port do not parse: "
                                                        "percent-encode '/', '?', '#' and '@' in a login (%2F, %3F, "
                                                        "%23, %40)")])
        return Index(url)
    folder = Path(unquote(parts.path) if parts.scheme == "file" else url)
    if parts.scheme not in ("", "file") or not folder.is_dir():
        raise InputError([Problem(redact(url), 0, "is neither an http(s) package index nor a wheelhouse folder: "
                                                  "give --index-url https://.../simple or a folder of wheels")])
    return Wheelhouse(folder)


def unreadable(url: str, what: str) -> InputError:
    """The index (or a wheel on it) could not be read: the URL given is wrong or out of reach."""
    return InputError([Problem(inert(redact(url)), 0, f"{inert(redact(what))}: check --index-url and the network (a "
                                                      "mirror must answer range requests)")])


def _read_wanted(wheel: zipfile.ZipFile, url: str, want: Callable[[str], bool]) -> dict[str, bytes]:
    """The members of an open wheel (remote or local) that `want` picks, each bounded before it is read."""
    members = [info for info in wheel.infolist() if want(info.filename)]
    too_large = [info.filename for info in members if info.file_size > MAX_MEMBER_BYTES]
    if too_large:
        raise unreadable(url, f"{', '.join(too_large)[:200]} is larger than a torch wheel's "
                              f"({MAX_MEMBER_BYTES >> 20} MiB): not a torch wheel")
    if sum(info.file_size for info in members) > MAX_WHEEL_READ_BYTES:
        raise unreadable(url, f"the members read add up to more than a torch wheel's ({MAX_WHEEL_READ_BYTES >> 20} "
                              "MiB): not a torch wheel")
    return {info.filename: wheel.read(info) for info in members}
