"""The real cosign CLI for the signing tests, installed by the project's own files on Debian 12 and 13 alike.

Debian 13's `cosign` package (2.5) needs only glibc 2.34, so it runs on Debian 12 too. It is fetched with
`apt-get download` through a private sources list and package lists under .tools/, and unpacked there: the
machine's apt setup is not touched. A cosign already on PATH (Debian 13's `apt-get install cosign`) is used as it is.

    python -m devtools.cosign     # prints the path of a working cosign, installing it when needed
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from devtools.localengine import MIRRORS

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"
UNPACKED = TOOLS / "cosign"
BINARY = UNPACKED / "usr" / "bin" / "cosign"
SUITE = "trixie"  # the first Debian release with a cosign package
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SYSTEM_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))


def cosign_path() -> Path | None:
    """A cosign that runs: the one on PATH, else the one unpacked under .tools/."""
    for candidate in (shutil.which("cosign"), BINARY):
        if candidate and Path(candidate).is_file() and _runs(Path(candidate)):
            return Path(candidate)
    return None


def ensure_cosign() -> Path:
    found = cosign_path()
    if found:
        return found
    unpack_debian_package("cosign", SUITE, UNPACKED)
    if not _runs(BINARY):
        raise RuntimeError(f"{BINARY} was unpacked but does not run (`{BINARY} version`)")
    return BINARY


def unpack_debian_package(package: str, suite: str, into: Path) -> None:
    """Debian's package from suite, fetched with `apt-get download` through a private sources list and package lists
    under .tools/ and unpacked into `into`: the machine's apt setup is not touched."""
    with tempfile.TemporaryDirectory(prefix=f"{package}-apt-", dir=_tools_dir()) as scratch:
        work = Path(scratch)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        sources = work / "sources.list"
        sources.write_text(f"deb [signed-by={KEYRING}] {debian_mirror()} {suite} main\n")
        options = ["-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/dev/null",
                   "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}",
                   "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
        subprocess.run(["apt-get", *options, "-qq", "update"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", *options, "-qq", "download", package], check=True, cwd=work,
                       stdout=subprocess.DEVNULL)
        downloaded = next(work.glob(f"{package}_*.deb"))
        shutil.rmtree(into, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(downloaded), str(into)], check=True)


def debian_mirror() -> str:
    """The Debian archive this machine's apt uses (a local mirror where there is one)."""
    for path in SYSTEM_SOURCES:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+/debian)/?\s", text + "\n", re.MULTILINE):
            return uri
    return MIRRORS["debian"]


def _tools_dir() -> Path:
    TOOLS.mkdir(exist_ok=True)
    return TOOLS


def _runs(binary: Path) -> bool:
    try:
        return subprocess.run([str(binary), "version"], capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


if __name__ == "__main__":
    try:
        print(ensure_cosign())
    except (subprocess.CalledProcessError, StopIteration, RuntimeError, OSError) as error:
        print(f"cosign: could not install it: {error}", file=sys.stderr)
        sys.exit(1)
