"""Reading a Debian security archive as a peer that may lie: every file within a byte limit, a read timeout and an
overall deadline; a file the signed index gives a size and hash for is checked against both before anything reads
it; in a saved index (a folder) only regular files are read, never a FIFO or a device a link points to."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path, PurePosixPath

import requests
import urllib3

from ..model import PeerError
from ..redaction import inert

READ_TIMEOUT_S = 30.0  # a silent peer
FETCH_DEADLINE_S = 300.0  # a peer that trickles bytes
GPGV_TIMEOUT_S = 60
CHUNK = 1 << 16


class SecurityIndexError(PeerError):
    """The security index could not be read or does not hold: nothing is judged (and nothing published) on it."""


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
        if limit < 0:
            raise SecurityIndexError(f"{self.where(path)}: a negative size; the index is not trusted")
        if not re.match(r"https?://", self.root):
            return _read_regular_file(Path(self.root) / path, limit)
        return self._download(path, limit)

    def get_vouched(self, path: str, size: int, sha256: str) -> bytes:
        """The file the signed index lists with this size and SHA-256, or an error: no more than `size` bytes are
        read, and none of them is used unless all match."""
        data = self.get(path, size)
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != size or actual != sha256:
            raise SecurityIndexError(f"{self.where(path)}: {len(data)} bytes, sha256 {actual[:16]}..., but the signed "
                                     f"index says {size} bytes, {sha256[:16]}... (truncated or replaced); not used")
        return data

    def _download(self, path: str, limit: int) -> bytes:
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
                        raise SecurityIndexError(f"{self.where(path)}: larger than {amount(limit)}; refused")
                    if time.monotonic() - started > self.deadline:
                        raise SecurityIndexError(f"{self.where(path)}: not read within {self.deadline:g} s (the "
                                                 "server is too slow); try again or name a mirror")
                return bytes(body)
        except (requests.RequestException, urllib3.exceptions.HTTPError) as error:  # the latter: read1's own
            timeout = (requests.Timeout, urllib3.exceptions.TimeoutError)
            kind = "timed out" if isinstance(error, timeout) or "timed out" in str(error).lower() else "failed"
            raise SecurityIndexError(f"{self.where(path)}: {kind} ({type(error).__name__}); try again or name a "
                                     "mirror") from None


def _read_regular_file(path: Path, limit: int) -> bytes:
    """A saved index's file: opened without waiting (a FIFO would wait for a writer for ever) and read only when it
    is a regular file (a link to /dev/zero never ends)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as error:
        raise SecurityIndexError(f"{path}: {error.strerror or error}") from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):  # before fdopen, which refuses a folder with its own error
        os.close(handle)
        raise SecurityIndexError(f"{path}: not a regular file (a FIFO, device or folder); the index is not trusted: "
                                 "save the index again")
    with os.fdopen(handle, "rb") as stream:
        try:
            data = stream.read(limit + 1)
        except OSError as error:
            raise SecurityIndexError(f"{path}: {error.strerror or error}") from None
    if len(data) > limit:
        raise SecurityIndexError(f"{path}: larger than {amount(limit)}; refused")
    return data


def amount(size: int) -> str:
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
        # gpgv repeats what the signature claims (a key's user ID): the signer's text, made inert
        why = inert(" ".join(checked.stderr.decode(errors="replace").split()[-12:]))
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
