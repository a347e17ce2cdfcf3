"""Package sources: fetch on the host the wheels rows install, for offline (air-gapped) builds."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from ..files import make_folder
from ..model import PROXY_ARGS, PYPI, ImageSpec, PeerError
from ..redaction import Secrets
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
