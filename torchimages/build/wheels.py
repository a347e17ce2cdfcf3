"""Package sources: fetch on the host the wheels rows install, for offline (air-gapped) builds."""
from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import certifi
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from ..files import make_folder
from ..invocation import command
from ..model import PROXY_ARGS, PYPI, ImageSpec, InputError, PeerError, Problem
from ..redaction import Secrets, inert
from .context import wheel_dir

OLDEST_MANYLINUX_MINOR = 17  # manylinux2014 = manylinux_2_17, the oldest tag torch's dependencies use
# pip's own socket timeout (15 s) bounds an index that falls silent, not one that trickles: a whole row's fetch has
# this bound too. A CUDA row's set is about 4 GB: two hours is 0.5 MB/s.
FETCH_BOUND_S = 2 * 3600
# pip's lines about each file as it gets it: "Downloading URL-or-name (SIZE)" (PyPI's file host by name only),
# "Using cached NAME (SIZE)", "Processing /path" (a find-links folder of pip.conf), "File was already downloaded PATH".
PIP_DOWNLOADING = re.compile(r"^\s*(Downloading|Using cached) (\S+)(?: \(([^)]+)\))?\s*$", re.ASCII)
PIP_LOCAL = re.compile(r"^\s*(Processing|File was already downloaded) (\S+\.whl)\s*$", re.ASCII)
PYPI_FILES = "files.pythonhosted.org"


def requirements(spec: ImageSpec) -> list[str]:
    """What the row's Dockerfile installs with pip: torch, torchvision, NumPy, and the devel toolkit."""
    packages = [spec.torch_requirement]
    packages += [f"torchvision=={spec.torchvision}"] if spec.torchvision else []
    packages += [f"numpy=={spec.numpy}" if spec.numpy else "numpy"]
    return packages + list(spec.cuda_toolkit_packages)


def platform_tags(glibc: str, machine: str = "x86_64") -> list[str]:
    """Every manylinux tag a glibc runs on a machine: pip matches --platform exactly, and one wheel set mixes
    several (nvidia-cudnn-cu13 is manylinux_2_27 only, torch manylinux_2_28)."""
    newest = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(newest, OLDEST_MANYLINUX_MINOR - 1, -1)]
    return tags + [f"manylinux2014_{machine}", f"linux_{machine}"]


def wheelhouse_gaps(spec: ImageSpec, wheelhouse: Path) -> list[str]:
    """The row's requirements (what `wheels` fetches for it) that its folder in the wheelhouse holds no wheel for,
    by name and pinned version; [] when it has them all. Their own dependencies are pip's to find there: a build from
    a wheelhouse runs pip with no index, so a gap among them fails that build without a byte from the network."""
    folder = wheel_dir(wheelhouse, spec)
    held: dict[str, list] = {}
    for path in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        held.setdefault(str(name), []).append(version)
    gaps = []
    for text in requirements(spec):
        try:
            wanted = Requirement(text)
        except InvalidRequirement:  # compat.yaml's own pins: not expected, and then not this check's to judge
            continue
        versions = held.get(canonicalize_name(wanted.name), [])
        if not any(wanted.specifier.contains(version, prereleases=True) for version in versions):
            gaps.append(text)
    return gaps


def uncovered_rows(specs: list[ImageSpec], wheelhouse: Path) -> list[ImageSpec]:
    """The rows whose wheels the wheelhouse lacks (wheelhouse_gaps)."""
    return [spec for spec in specs if wheelhouse_gaps(spec, wheelhouse)]


def wheelhouse_refusal(spec: ImageSpec, wheelhouse: Path) -> str:
    """The one line for a row a wheelhouse does not cover, with the command that fills it."""
    folder, gaps = wheel_dir(wheelhouse, spec), wheelhouse_gaps(spec, wheelhouse)
    # A folder that holds some of them says which are missing (another release's wheels, an interrupted fetch).
    partial = len(gaps) < len(requirements(spec))
    fetch = command(f"wheels '{spec.tag}' --dest {wheelhouse}")
    return (f"--wheelhouse {wheelhouse} has no wheels for {spec.tag} ({folder.name}"
            f"{' lacks ' + ', '.join(gaps) if partial else ''}): run {fetch}")


def check_wheelhouse(specs: list[ImageSpec], wheelhouse: Path) -> None:
    """Before anything is built: --wheelhouse promises a build with no network to an index, so a row it does not
    cover is refused (exit 2), never left to fall back on the index (newcomer trial 2, finding 5)."""
    lacking = uncovered_rows(specs, wheelhouse)
    if lacking:
        raise InputError([Problem(str(wheelhouse), 0, wheelhouse_refusal(spec, wheelhouse)) for spec in lacking])


@dataclass(frozen=True)
class Download:
    """One pip download: the rows sharing a wheel folder (same index and Python) share it."""

    dest: Path
    python: str
    glibc: str
    machine: str  # the rows' arch: the manylinux platform suffix
    index: str
    index_url: str
    requirements: tuple[str, ...]


def plan_downloads(specs: list[ImageSpec], wheelhouse: Path) -> list[Download]:
    """Rows sharing a folder get one download of the union of their requirements, on the oldest glibc among
    them (a wheel for an older glibc runs on a newer one)."""
    grouped: dict[Path, list[ImageSpec]] = {}
    for spec in specs:
        grouped.setdefault(wheel_dir(wheelhouse, spec), []).append(spec)
    downloads = []
    for dest, rows in grouped.items():
        wanted = list(dict.fromkeys(r for spec in rows for r in requirements(spec)))
        glibc = min((spec.glibc for spec in rows if spec.glibc), key=lambda v: tuple(map(int, v.split("."))), default="2.28")
        downloads.append(Download(dest, rows[0].python, glibc, rows[0].arch, rows[0].wheel_index, rows[0].index_url,
                                  tuple(wanted)))
    return downloads


def download_command(download: Download, index_url: str | None, extra_index_url: str | None) -> list[str]:
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--dest", str(download.dest),
               "--only-binary=:all:", "--python-version", download.python, "--implementation", "cp"]
    for platform in platform_tags(download.glibc, download.machine):
        command += ["--platform", platform]
    command += ["--index-url", index_url or download.index_url]
    command += ["--extra-index-url", extra_index_url or PYPI]
    return command + list(download.requirements)


@dataclass(frozen=True)
class Fetched:
    dest: Path
    files: int
    new_files: int
    new_bytes: int
    total_bytes: int


def progress_line(pip_line: str) -> str | None:
    """One wheel pip gets, from its output line, as `wheels` says it: the file, its size, and where it came from
    (the index's host, PyPI, pip's cache or a local folder); None for pip's other lines."""
    downloading = PIP_DOWNLOADING.match(pip_line)
    if downloading:
        how, where, size = downloading.groups()
        name = where.rsplit("/", 1)[-1].replace("%2B", "+")
        source = ("pip's cache" if how == "Using cached" else
                  urlsplit(where).hostname or where if "://" in where else PYPI_FILES)
        return f"  {name}{f' ({size})' if size else ''} from {source}"
    local = PIP_LOCAL.match(pip_line)
    if local:
        path = Path(local.group(2))
        return f"  {path.name} from {'this wheelhouse (fetched before)' if local.group(1).startswith('File') else path.parent}"
    return None


def fetch_wheels(specs: list[ImageSpec], wheelhouse: Path, index_url: str | None = None,
                 extra_index_url: str | None = None, log: Callable[[str], None] = lambda message: None) -> list[Fetched]:
    """Download each folder's wheel set once; say each wheel as pip gets it (a CUDA row's set is gigabytes: minutes
    of silence otherwise) and what was fetched. Raises WheelFetchError on pip failure."""
    fetched = []
    for download in plan_downloads(specs, wheelhouse):
        make_folder(download.dest, wheelhouse)  # a linked row folder would take the wheels elsewhere
        before = {path.name for path in download.dest.iterdir()}
        log(f"fetching {' '.join(download.requirements)} for Python {download.python}, glibc {download.glibc} "
            f"({download.index}) into {download.dest}")
        with staging(download.dest) as folder:
            _run_pip(download, folder, index_url, extra_index_url, log)
            for path in folder.iterdir():
                os.replace(path, download.dest / path.name)
        files = sorted(path for path in download.dest.iterdir() if path.is_file())
        new = [path for path in files if path.name not in before]
        fetched.append(Fetched(download.dest, len(files), len(new), sum(p.stat().st_size for p in new),
                               sum(p.stat().st_size for p in files)))
    return fetched


@contextmanager
def staging(dest: Path) -> Iterator[Path]:
    """A hidden folder in dest that pip downloads into, holding links to the wheels dest has (pip skips those): a wheel
    enters dest whole, by rename, once pip is done, so a cancelled or failed fetch leaves no truncated wheel there for
    the next build to take. Removed however the fetch ends."""
    with tempfile.TemporaryDirectory(prefix=".fetching-", dir=dest) as folder:
        for path in dest.iterdir():
            if path.is_file() and not path.is_symlink():
                with suppress(OSError):  # a file the system will not link (another owner's) is fetched again
                    os.link(path, Path(folder) / path.name)
        yield Path(folder)


def _run_pip(download: Download, into: Path, index_url: str | None, extra_index_url: str | None,
             log: Callable[[str], None] = lambda message: None) -> None:
    command = download_command(replace(download, dest=into), index_url, extra_index_url)
    secrets = Secrets.in_urls(index_url, extra_index_url, *(os.environ.get(name) for name in PROXY_ARGS))
    # pip's temporary folders go beside the staging folder and are removed with it: a pip killed at the bound
    # removes none of its own, which would stay in the system's temporary folder.
    try:
        with tempfile.TemporaryDirectory(prefix=".pip-tmp-", dir=into.parent) as pip_tmp:
            result = _pip_said(command, {**os.environ, "TMPDIR": pip_tmp},
                               lambda line: log(secrets.redact(line)))
    except subprocess.TimeoutExpired:  # pip is killed
        index = secrets.redact(index_url or download.index_url)
        raise WheelFetchError(f"pip did not fetch the wheels of {download.dest.name} within {FETCH_BOUND_S} s from "
                              f"{index}: the index sends too slowly; try again, or use a nearer mirror "
                              f"(--pip-index-url)") from None
    if result.returncode != 0:
        said = secrets.redact(result.stderr.strip())[-2000:]  # redacted first: a cut may not split a secret
        raise WheelFetchError(f"pip could not fetch the wheels of {download.dest.name}:\n{said}")


def _pip_said(command: list[str], env: dict[str, str], say: Callable[[str], None]) -> subprocess.CompletedProcess:
    """pip run to its end, or killed at FETCH_BOUND_S (TimeoutExpired); each wheel said as pip names it. stderr is
    kept for the error, in a file: a pipe left unread while stdout is read could fill and stall pip."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
                                   text=True, errors="replace")  # stdin: pip never waits for a login typed in
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            process.kill()

        timer = threading.Timer(FETCH_BOUND_S, kill)
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                shown = progress_line(line)
                if shown:
                    say(shown)
            returncode = process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:  # Ctrl-C while reading: pip goes too
                process.kill()
                process.wait()
        if killed.is_set():
            raise subprocess.TimeoutExpired(command, FETCH_BOUND_S)
        stderr.seek(0)
        return subprocess.CompletedProcess(command, returncode, "", stderr.read())


class WheelFetchError(PeerError):
    """pip, or the index behind it, could not give the wheels (exit 1, one line, as every peer's error)."""


# ------------------------------------------------------------------------------- can the build reach its index?

# A probe of an index waits at most this long: doctor answers in seconds, and a build's pip would wait 15 s per try.
INDEX_PROBE_TIMEOUT_S = 5.0
CA_BUNDLE_REMEDY = ("a TLS-intercepting proxy: pass --ca-bundle FILE (its CA's PEM; the host may trust it, the build's "
                    "pip trusts only its own CAs and that file)")


@dataclass(frozen=True)
class WheelSources:
    """Where the build would take the rows' wheels from: doctor's --wheelhouse, --pip-index-url, --extra-index-url and
    --ca-bundle, as build takes them."""
    wheelhouse: Path | None = None
    index_url: str | None = None
    extra_index_url: str | None = None
    ca_bundle: Path | None = None


def index_pages(spec: ImageSpec, sources: WheelSources) -> list[str]:
    """The index pages the row's build asks first (builder.pip_settings): torch's on its index, NumPy's on the extra
    one (PyPI unless told), where torch's dependencies come from."""
    pages = [f"{(sources.index_url or spec.index_url).rstrip('/')}/torch/",
             f"{(sources.extra_index_url or PYPI).rstrip('/')}/numpy/"]
    return list(dict.fromkeys(pages))


def probe_index(url: str, ca_bundle: Path | None, timeout: float = INDEX_PROBE_TIMEOUT_S) -> str | None:
    """None when an HTTP GET of url answers as a package index would (through the environment's proxies, trusting
    the CAs the build's pip trusts: certifi's and ca_bundle); else why not, with what to do about it."""
    if urlsplit(url).scheme not in ("http", "https"):
        return "a build's pip cannot read this host's files: build with --wheelhouse"
    context = ssl.create_default_context(cafile=certifi.where())
    if ca_bundle is not None:
        try:
            context.load_verify_locations(cafile=str(ca_bundle))
        except (OSError, ssl.SSLError) as error:
            return f"--ca-bundle {ca_bundle} is not a readable PEM CA file ({inert(str(error))[:200]})"
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(urllib.request.Request(url), timeout=timeout):  # the headers only: no body is read
            return None
    except urllib.error.HTTPError as error:
        if error.code in (401, 403, 407):
            return f"it refused access (HTTP {error.code}): give the index's login in the URL, or the proxy's"
        return f"it answered HTTP {error.code}" if error.code >= 500 else None  # 404, 405: the index is there
    except (urllib.error.URLError, OSError) as error:
        return unreachable_reason(getattr(error, "reason", error), timeout)


def unreachable_reason(cause: object, timeout: float) -> str:
    """Why a probe got no answer, in the words that point at the fix."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"its TLS certificate is not trusted ({inert(cause.verify_message or str(cause))[:120]}): {CA_BUNDLE_REMEDY}"
    if isinstance(cause, socket.gaierror):
        return "its host name does not resolve here"
    if isinstance(cause, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s"
    if isinstance(cause, ConnectionRefusedError):
        return "the connection was refused"
    return inert(str(cause))[:200]


def probe_all(pages: list[str], probe: Callable[[str], str | None],
              bound_s: float = INDEX_PROBE_TIMEOUT_S + 0.5) -> dict[str, str | None]:
    """Every page probed at once, the whole within bound_s: a socket timeout bounds neither a name lookup nor an
    answer that trickles, so a probe still running then is "no answer", and its thread (a daemon) is left behind."""
    answers: dict[str, str | None] = {}

    def one(page: str) -> None:
        answers[page] = probe(page)

    threads = [threading.Thread(target=one, args=(page,), daemon=True) for page in pages]
    deadline = time.monotonic() + bound_s
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {page: answers[page] if page in answers else f"no answer within {INDEX_PROBE_TIMEOUT_S:g} s"
            for page in pages}
