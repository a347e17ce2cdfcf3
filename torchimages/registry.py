"""Talking to a container registry: its address, the HTTP API v2 calls publishing needs, and retries with backoff."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .files import brief
from .model import InputError, Problem

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
HOST_PATTERN = re.compile(r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::\d{1,5})?")
REPOSITORY_PATTERN = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
# What a registry or the engine says when the same request may work a little later.
TRANSIENT_MESSAGE = re.compile(
    r"connection refused|connection reset|broken pipe|timed? ?out|\beof\b|temporar|too many requests|"
    r"service unavailable|bad gateway|gateway time|internal server error|no such host|tls handshake",
    re.IGNORECASE,
)
HTTP_TIMEOUT_S = 30
MAX_NAME_LENGTH = 255  # Docker's limit on a repository name
HTTP_HINTS = {
    401: "it wants credentials, and torchimages uses the registry API anonymously",
    403: "access denied",
    405: "the registry refuses this operation (deleting needs storage.delete.enabled: true in its config)",
}

T = TypeVar("T")


@dataclass(frozen=True)
class Registry:
    """Where images go: HOST[:PORT]/REPO, e.g. 127.0.0.1:5000/ml/pytorch."""

    host: str
    repository: str

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"

    @property
    def base_url(self) -> str:
        # Docker speaks plain HTTP only to loopback registries (unless configured otherwise); so do we.
        hostname = self.host.rsplit(":", 1)[0]
        scheme = "http" if hostname == "localhost" or hostname.startswith("127.") else "https"
        return f"{scheme}://{self.host}"


def parse_registry(text: str, flag: str = "--registry") -> Registry:
    """'HOST[:PORT]/REPO' -> Registry, or an InputError saying what a valid value looks like."""
    example = "e.g. 127.0.0.1:5000/ml/pytorch or registry.example.com/ml/pytorch"
    host, _, repository = (text or "").partition("/")
    quoted = brief(text)
    # Without a dot, a port or 'localhost', Docker reads the first part as a Docker Hub namespace.
    if not repository or not HOST_PATTERN.fullmatch(host) or not ("." in host or ":" in host or host == "localhost"):
        raise InputError([Problem(flag, 0, f"{flag} {quoted} must be HOST[:PORT]/REPO, a registry host first ({example})")])
    _, _, port = host.partition(":")
    if port and not 1 <= int(port) <= 65535:
        raise InputError([Problem(flag, 0, f"{flag} {quoted}: port {port} is not a TCP port (1 to 65535) ({example})")])
    if not REPOSITORY_PATTERN.fullmatch(repository) or len(text) > MAX_NAME_LENGTH:
        raise InputError([Problem(flag, 0, f"{flag} {quoted}: the repository may hold lower case letters and digits "
                                           f"separated by '.', '_', '-' or '/', {MAX_NAME_LENGTH} characters in all "
                                           f"({example})")])
    return Registry(host, repository)


class RegistryError(Exception):
    """A registry operation failed; transient failures (network, 5xx, 429) are worth another try."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3
    first_delay_s: float = 1.0

    def delays(self) -> list[float]:
        """Exponential backoff: 1 s, 2 s, 4 s, ..."""
        return [self.first_delay_s * 2**attempt for attempt in range(self.retries)]


def with_retries(operation: Callable[[], T], policy: RetryPolicy, on_retry: Callable[[str, float], None]) -> T:
    """Run operation, trying again after each transient RegistryError while the policy allows."""
    for delay in policy.delays():
        try:
            return operation()
        except RegistryError as error:
            if not error.transient:
                raise
            on_retry(str(error), delay)
            time.sleep(delay)
    return operation()


def is_transient(message: str) -> bool:
    return bool(TRANSIENT_MESSAGE.search(message))


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str

    def download_size(self) -> int:
        """Compressed bytes a pull transfers (config + layers) for a single-platform manifest; 0 for an index."""
        document = json.loads(self.body)
        return sum(part.get("size", 0) for part in [document.get("config") or {}, *(document.get("layers") or [])])


class RegistryClient:
    """The registry HTTP API v2 calls publishing needs, each retried when the failure is transient."""

    def __init__(self, registry: Registry, policy: RetryPolicy, log: Callable[[str], None]):
        self.registry = registry
        self.policy = policy
        self.log = log

    def ping(self) -> None:
        self._request("GET", "/v2/")

    def answers(self) -> bool:
        """One quick try, no retries."""
        try:
            self._request_once("GET", "/v2/", None, {}, missing_ok=False)
        except RegistryError:
            return False
        return True

    def tags(self) -> list[str]:
        status, _, body = self._request("GET", f"/v2/{self.registry.repository}/tags/list", missing_ok=True)
        return [] if status == 404 else sorted(json.loads(body).get("tags") or [])

    def digest_of(self, reference: str) -> str | None:
        status, headers, _ = self._request("HEAD", self._manifest_path(reference), missing_ok=True)
        return None if status == 404 else headers.get("Docker-Content-Digest")

    def tag_digests(self, tags: list[str]) -> dict[str, str]:
        """tag -> digest, for those of tags that exist."""
        digests = {tag: self.digest_of(tag) for tag in tags}
        return {tag: digest for tag, digest in digests.items() if digest}

    def manifest(self, reference: str) -> Manifest:
        _, headers, body = self._request("GET", self._manifest_path(reference))
        return Manifest(body, headers.get("Content-Type", ""), headers.get("Docker-Content-Digest", ""))

    def put_manifest(self, tag: str, manifest: Manifest) -> str:
        """Point tag at a manifest the registry already holds; returns the digest it stored."""
        _, headers, _ = self._request("PUT", self._manifest_path(tag), manifest.body,
                                      {"Content-Type": manifest.media_type})
        return headers.get("Docker-Content-Digest", "")

    def delete(self, digest: str) -> None:
        """Delete a manifest; the registry drops every tag naming it."""
        self._request("DELETE", self._manifest_path(digest))

    def _manifest_path(self, reference: str) -> str:
        return f"/v2/{self.registry.repository}/manifests/{reference}"

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                 missing_ok: bool = False) -> tuple[int, dict, bytes]:
        def note(message: str, delay: float) -> None:
            self.log(f"{message}; retrying in {delay:g} s")

        return with_retries(lambda: self._request_once(method, path, body, headers or {}, missing_ok), self.policy, note)

    def _request_once(self, method: str, path: str, body: bytes | None, headers: dict,
                      missing_ok: bool) -> tuple[int, dict, bytes]:
        request = urllib.request.Request(self.registry.base_url + path, data=body, method=method,
                                         headers={"Accept": ", ".join(MANIFEST_TYPES), **headers})
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            if error.code == 404 and missing_ok:
                return 404, dict(error.headers), b""
            detail = error.read().decode(errors="replace").strip()[:300]
            message = f"registry {self.registry.host}: {method} {path}: HTTP {error.code} {HTTP_HINTS.get(error.code, '')} {detail}"
            raise RegistryError(" ".join(message.split()), transient=error.code in (408, 429) or error.code >= 500) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError) as error:
            reason = getattr(error, "reason", error)
            raise RegistryError(f"registry {self.registry.host} does not answer ({reason})", transient=True) from None
