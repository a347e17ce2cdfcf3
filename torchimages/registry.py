"""Talking to a container registry: its address, how to reach it the way Docker would (credentials, trusted CAs, TLS),
and the operations publishing needs, each retried with backoff when the failure is transient.

The operations run skopeo (Debian's `skopeo` package, containers/image underneath) rather than an HTTP client of our
own. skopeo already does what every real registry (Harbor, Artifactory, ECR, GHCR) wants: Basic and Bearer-token
logins, Docker's config.json with its credential helpers, CAs in Docker's certs.d layout, and it copies images between
the engine and a registry, and from one tag to another by digest, without pulling them. The Docker SDK only pushes
through the engine (whose TLS trust is the daemon's own /etc/docker/certs.d) and cannot list tags or delete; oras-py
and requests + tenacity would mean writing the token flows and credential-helper calls by hand again.

Credentials are found as Docker finds them: `$DOCKER_CONFIG/config.json` (default ~/.docker/config.json), as
`docker login` writes it: `auths`, `credHelpers`, and a `credsStore` (which containers/image does not read, so it is
passed on as a credential helper for the one registry). A private CA is trusted from `<certs.d>/<host:port>/ca.crt`
(default /etc/docker/certs.d) or `--registry-ca FILE`. Plain HTTP (and unverified TLS) only for a loopback registry
with no CA configured, as Docker does, or with `--insecure-registry`. No credential ever reaches a message: whatever
skopeo says is stripped of the secrets the Docker config holds for the registry.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .files import brief, read_json_document
from .model import InputError, Problem

HOST_PATTERN = re.compile(r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::\d{1,5})?")
REPOSITORY_PATTERN = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
# What a registry or the engine says when the same request may work a little later.
TRANSIENT_MESSAGE = re.compile(
    r"connection refused|connection reset|broken pipe|timed? ?out|\beof\b|temporar|too many requests|"
    r"service unavailable|bad gateway|gateway time|internal server error|no such host|tls handshake",
    re.IGNORECASE,
)
UNREACHABLE_MESSAGE = re.compile(r"dial tcp|connection refused|connection reset|no such host|i/o timeout", re.IGNORECASE)
MISSING_MESSAGE = re.compile(r"manifest unknown|name unknown|404 \(Not Found\)|repository name not known", re.IGNORECASE)
AUTH_MESSAGE = re.compile(r"unauthorized|authentication required|invalid username/password|denied|\b403\b", re.IGNORECASE)
TLS_MESSAGE = re.compile(r"x509|certificate|server gave HTTP response to HTTPS client", re.IGNORECASE)
DELETE_REFUSED = re.compile(r"unsupported|405|method not allowed", re.IGNORECASE)
SKOPEO_MESSAGE = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
SKOPEO = "skopeo"
SKOPEO_TIMEOUT_S = 30 * 60  # a push of a CUDA image moves several GB
QUERIES_AT_ONCE = 4
DEFAULT_CERTS_D = Path("/etc/docker/certs.d")
MAX_NAME_LENGTH = 255  # Docker's limit on a repository name
REDACTED = "<redacted>"

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
    def is_loopback(self) -> bool:
        hostname = self.host.rsplit(":", 1)[0]
        return hostname == "localhost" or hostname.startswith("127.")

    def reference(self, tag_or_digest: str) -> str:
        separator = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"docker://{self.name}{separator}{tag_or_digest}"


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


def image_registry(image: str) -> tuple[Registry, str]:
    """'nvidia/cuda:13.0.2-base-ubuntu24.04' -> (docker.io/nvidia/cuda, '13.0.2-base-ubuntu24.04'), as Docker reads
    an image name: the first part is a registry host only with a dot, a port or 'localhost'."""
    name, _, digest = image.partition("@")
    head, _, tail = name.rpartition(":")
    name, tag = (head, tail) if head and "/" not in tail else (name, "latest")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return Registry(first, rest), digest or tag
    return Registry("docker.io", name if rest else f"library/{name}"), digest or tag


# ------------------------------------------------------------------------------------------------- how to reach it

@dataclass(frozen=True)
class RegistryAccess:
    """How skopeo reaches one registry the way Docker would."""

    auth_file: Path | None  # Docker config (or a credential-helper stand-in for its credsStore); None: anonymous
    cert_dir: Path | None  # CA (and client certificate) folder; None: containers/image's own certs.d look-up
    tls_verify: bool
    secrets: tuple[str, ...] = ()  # what the Docker config holds for this registry: never shown in a message
    # Holds the generated files (CA folder, credential-helper stand-in) as long as the access is in use.
    scratch: tempfile.TemporaryDirectory | None = field(default=None, compare=False, repr=False)

    def flags(self, role: str = "") -> list[str]:
        """skopeo options for one side of a copy (role 'src' or 'dest') or for a one-image command (role '')."""
        prefix = f"--{role}-" if role else "--"
        flags = [f"{prefix}tls-verify={'true' if self.tls_verify else 'false'}"]
        if self.cert_dir:
            flags.append(f"{prefix}cert-dir={self.cert_dir}")
        if self.auth_file:
            flags.append(f"{prefix}authfile={self.auth_file}")
        else:
            flags.append(f"{prefix}no-creds")
        return flags

    def redact(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return re.sub(r"(?i)\b(basic|bearer)\s+[A-Za-z0-9+/=._~-]{8,}", rf"\1 {REDACTED}", text)


def docker_config_dir() -> Path:
    """Where Docker keeps config.json: $DOCKER_CONFIG, else ~/.docker."""
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def registry_access(registry: Registry, config_dir: Path | None = None, certs_d: Path = DEFAULT_CERTS_D,
                    ca_file: Path | None = None, insecure: bool = False) -> RegistryAccess:
    """Credentials from the Docker config, CAs from certs.d/<host>/ and ca_file, TLS as Docker decides it."""
    config_file = (config_dir or docker_config_dir()) / "config.json"
    config = read_json_document(config_file, "fix it, or log in again with `docker login HOST`", default={})
    if not isinstance(config, dict):
        raise InputError([Problem(str(config_file), 1, "not a Docker config (an object with 'auths'): "
                                                       "log in again with `docker login HOST`")])
    needs_files = ca_file is not None or _creds_store_for(config, registry) is not None
    scratch = tempfile.TemporaryDirectory(prefix="torchimages-registry-") if needs_files else None
    auth_file = _auth_file(config, config_file, registry, scratch)
    host_certs = certs_d / registry.host
    cert_dir = _cert_dir(host_certs, ca_file, scratch) if ca_file else (host_certs if host_certs.is_dir() else None)
    # Docker's rule: a loopback registry may be plain HTTP, unless a CA for it says it speaks TLS.
    tls_verify = not insecure and not (registry.is_loopback and cert_dir is None)
    return RegistryAccess(auth_file, cert_dir, tls_verify, _secrets(config, registry), scratch)


def _creds_store_for(config: dict, registry: Registry) -> str | None:
    """The credsStore helper Docker would ask for this registry: when credHelpers names none for it (containers/image
    reads credHelpers itself) and the config holds no inline login for it."""
    helpers = config.get("credHelpers") if isinstance(config.get("credHelpers"), dict) else {}
    if helpers.get(registry.host):
        return None  # containers/image reads credHelpers itself
    inline = (config.get("auths") or {}).get(registry.host) if isinstance(config.get("auths"), dict) else None
    store = config.get("credsStore")
    return store if isinstance(store, str) and store and not (isinstance(inline, dict) and inline.get("auth")) else None


def _auth_file(config: dict, config_file: Path, registry: Registry,
               scratch: tempfile.TemporaryDirectory | None) -> Path | None:
    store = _creds_store_for(config, registry)
    if store:
        stand_in = Path(scratch.name) / "auth.json"
        stand_in.write_text(json.dumps({"credHelpers": {registry.host: store}}))
        return stand_in
    return config_file if config_file.is_file() else None


def _cert_dir(host_certs: Path, ca_file: Path, scratch: tempfile.TemporaryDirectory) -> Path:
    """A certs.d-style folder: the host's own certs.d entries (client certificates too) plus ca_file."""
    if not ca_file.is_file():
        raise InputError([Problem("--registry-ca", 0, f"--registry-ca {ca_file} is not a file: name the PEM file of "
                                                      "the CA that signed the registry's certificate")])
    folder = Path(scratch.name) / "certs"
    if host_certs.is_dir():
        shutil.copytree(host_certs, folder)
    folder.mkdir(exist_ok=True)
    shutil.copyfile(ca_file, folder / "registry-ca.crt")
    return folder


def _secrets(config: dict, registry: Registry) -> tuple[str, ...]:
    auths = config.get("auths") if isinstance(config.get("auths"), dict) else {}
    # Docker Hub's login is filed under its old index address.
    names = [registry.host, *(["https://index.docker.io/v1/"] if registry.host == "docker.io" else [])]
    entry = next((auths[name] for name in names if isinstance(auths.get(name), dict)), None)
    if entry is None:
        return ()
    found = [entry.get(key) for key in ("auth", "password", "identitytoken", "registrytoken")]
    try:
        user_password = base64.b64decode(entry.get("auth") or "").decode()
    except ValueError:
        user_password = ""
    found += [user_password, user_password.partition(":")[2]]
    return tuple(value for value in found if isinstance(value, str) and len(value) >= 4)


@dataclass(frozen=True)
class AccessSettings:
    """How registries are reached, as the command line sets it; the same for every registry a run talks to."""

    certs_d: Path = DEFAULT_CERTS_D
    ca_file: Path | None = None
    insecure: bool = False

    def access(self, registry: Registry) -> RegistryAccess:
        return registry_access(registry, certs_d=self.certs_d, ca_file=self.ca_file, insecure=self.insecure)


# --------------------------------------------------------------------------------------------------------- retries

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


# ------------------------------------------------------------------------------------------------------ operations

@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str

    @classmethod
    def from_body(cls, body: bytes) -> Manifest:
        """The manifest as the registry stored it: its digest is the sha256 of exactly these bytes."""
        return cls(body, json.loads(body).get("mediaType", ""), "sha256:" + hashlib.sha256(body).hexdigest())

    @property
    def config_digest(self) -> str:
        """For a single-platform image: the digest of its config, which is the image id the engine gives it."""
        return (json.loads(self.body).get("config") or {}).get("digest", "")

    def download_size(self) -> int:
        """Compressed bytes a pull transfers (config + layers) for a single-platform manifest; 0 for an index."""
        document = json.loads(self.body)
        return sum(part.get("size", 0) for part in [document.get("config") or {}, *(document.get("layers") or [])])


class RegistryClient:
    """The registry operations publishing needs, each a skopeo run retried when the failure is transient."""

    def __init__(self, registry: Registry, access: RegistryAccess, policy: RetryPolicy, log: Callable[[str], None]):
        self.registry = registry
        self.policy = policy
        self.log = log
        self.access = access

    def ping(self) -> None:
        """Reach the registry and log in: a wrong password or an untrusted certificate fails here."""
        self._retried(self._list_tags)

    def answers(self) -> bool:
        """One quick try, no retries."""
        try:
            self._list_tags()
        except RegistryError:
            return False
        return True

    def tags(self) -> list[str]:
        return self._retried(self._list_tags)

    def manifest(self, reference: str) -> Manifest:
        manifest = self.manifest_or_none(reference)
        if manifest is None:
            raise RegistryError(f"{self.registry.name}: no manifest {reference}", transient=False)
        return manifest

    def manifest_or_none(self, reference: str) -> Manifest | None:
        body = self._skopeo("inspect", "--raw", *self.access.flags(), self.registry.reference(reference), missing_ok=True)
        return None if body is None else Manifest.from_body(body)

    def digest_of(self, reference: str) -> str | None:
        manifest = self.manifest_or_none(reference)
        return manifest.digest if manifest else None

    def tag_manifests(self, tags: list[str]) -> dict[str, Manifest]:
        """tag -> manifest, for those of tags that exist (a few looked up at once)."""
        with ThreadPoolExecutor(max_workers=QUERIES_AT_ONCE) as pool:
            found = dict(zip(tags, pool.map(self.manifest_or_none, tags)))
        return {tag: manifest for tag, manifest in found.items() if manifest}

    def tag_digests(self, tags: list[str]) -> dict[str, str]:
        """tag -> digest, for those of tags that exist."""
        return {tag: manifest.digest for tag, manifest in self.tag_manifests(tags).items()}

    def push(self, image_id: str, tag: str, daemon_host: str | None) -> str:
        """Copy an engine's image (by id) to repository:tag; returns the manifest digest the registry stored."""
        with tempfile.TemporaryDirectory(prefix="torchimages-push-") as folder:
            digest_file = Path(folder) / "digest"
            daemon = ["--src-daemon-host", daemon_host] if daemon_host else []
            self._skopeo("copy", "--quiet", "--digestfile", str(digest_file), *daemon, *self.access.flags("dest"),
                         f"docker-daemon:{image_id}", self.registry.reference(tag))
            return digest_file.read_text().strip()

    def pull(self, digest: str, local_name: str, daemon_host: str | None) -> None:
        """Copy repository@digest into the engine as local_name (no `docker pull`: the engine needs no login)."""
        daemon = ["--dest-daemon-host", daemon_host] if daemon_host else []
        self._retried(lambda: self._skopeo("copy", "--quiet", *daemon, *self.access.flags("src"),
                                           self.registry.reference(digest), f"docker-daemon:{local_name}"))

    def copy_tag(self, digest: str, tag: str) -> None:
        """Point tag at a manifest the repository already holds, byte for byte (the digest does not change)."""
        self._retried(lambda: self._skopeo("copy", "--quiet", "--preserve-digests", *self.access.flags("src"),
                                           *self.access.flags("dest"), self.registry.reference(digest),
                                           self.registry.reference(tag)))

    def delete(self, digest: str) -> None:
        """Delete a manifest; the registry drops every tag naming it."""
        self._retried(lambda: self._skopeo("delete", *self.access.flags(), self.registry.reference(digest)))

    def _list_tags(self) -> list[str]:
        output = self._skopeo("list-tags", *self.access.flags(), f"docker://{self.registry.name}", missing_ok=True)
        return [] if output is None else sorted(json.loads(output).get("Tags") or [])

    def _retried(self, operation: Callable[[], T]) -> T:
        return with_retries(operation, self.policy, lambda message, delay: self.log(f"{message}; retrying in {delay:g} s"))

    def _skopeo(self, *arguments: str, missing_ok: bool = False) -> bytes | None:
        """skopeo's output; None for a missing image or repository when missing_ok; else a RegistryError."""
        try:
            done = subprocess.run([SKOPEO, *arguments], capture_output=True, timeout=SKOPEO_TIMEOUT_S, check=False)
        except FileNotFoundError:
            raise RegistryError("publishing needs skopeo, which is not installed: `apt-get install skopeo` "
                                "(`make engine` installs it)", transient=False) from None
        except subprocess.TimeoutExpired:
            raise RegistryError(f"registry {self.registry.host}: skopeo {arguments[0]} timed out", transient=True) from None
        if done.returncode == 0:
            return done.stdout
        message = self._message(done.stderr.decode(errors="replace"))
        if missing_ok and MISSING_MESSAGE.search(message):
            return None
        where = "does not answer" if UNREACHABLE_MESSAGE.search(message) else "says"
        raise RegistryError(f"registry {self.registry.host} {where}: {message}{self._hint(message)}",
                            transient=is_transient(message) and not AUTH_MESSAGE.search(message))

    def _message(self, stderr: str) -> str:
        """skopeo's own words, without log decoration and with every credential taken out."""
        found = [match.replace('\\"', '"') for match in SKOPEO_MESSAGE.findall(stderr)]
        text = " ".join(" ".join(found or [stderr.strip()]).split())
        return self.access.redact(text)[-600:]

    def _hint(self, message: str) -> str:
        host = self.registry.host
        if AUTH_MESSAGE.search(message):
            return (f" (the login for {host} was refused or is missing: `docker login {host}` writes it to "
                    f"{docker_config_dir() / 'config.json'}; DOCKER_CONFIG names another folder)")
        if TLS_MESSAGE.search(message):
            return (f" (trust the registry's CA: put it in /etc/docker/certs.d/{host}/ca.crt or pass --registry-ca FILE; "
                    f"--insecure-registry only for a registry without TLS)")
        if DELETE_REFUSED.search(message):
            return " (the registry refuses this operation: deleting needs storage.delete.enabled: true in its config)"
        return ""
