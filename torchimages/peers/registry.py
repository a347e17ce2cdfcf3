"""Talking to a container registry: its address, how to reach it the way Docker would (credentials, trusted CAs, TLS),
and the operations publishing needs, each retried with backoff when the failure is transient.

The operations run skopeo (Debian's `skopeo` package, containers/image underneath) rather than an HTTP client of our
own. skopeo already does what every real registry (Harbor, Artifactory, ECR, GHCR) wants: Basic and Bearer-token
logins, Docker's config.json with its credential helpers, CAs in Docker's certs.d layout, and it copies images between
the engine and a registry, and from one tag to another by digest, without pulling them. The Docker SDK only pushes
through the engine (whose TLS trust is the daemon's own /etc/docker/certs.d) and cannot list tags or delete; oras-py
and requests + tenacity would mean writing the token flows and credential-helper calls by hand again.
How skopeo reaches a registry the way Docker would (credentials, trusted CAs, TLS) is registry_access.py.

The registry is a peer that may stall or lie. Every file handed to skopeo is a copy, in a private folder, of a
bounded regular file registry_access.py read and checked (a certs.d `ca.crt` linked to /dev/zero is refused, not
streamed); every skopeo run has a bound (seconds for a question, half an hour for a transfer) and retries stop after
a total bound; every answer (a manifest, a tag list) is checked for its shape before it is used, and a wrong one
names the registry and what it sent.

Digests are checked, everywhere. `skopeo inspect --raw` of REPO@sha256:... prints whatever the registry answers,
unchecked (skopeo 1.9.3's cmd/skopeo/inspect.go writes out ImageSource.GetManifest's bytes), so every manifest and
index fetched by digest here (manifest, manifest_or_none, digest_of: verify-image's digests, an index's members
before publish builds and signs the index) is hashed and compared with the digest asked for before anything reads
it; a mismatch is a RegistryError naming both. What skopeo reads through containers/image's UnparsedImage is
checked there (v5.22.1, which skopeo 1.9.3 vendors): the manifest of REPO@digest against the digest
(internal/image/unparsed.go, "Manifest does not match provided manifest digest") for `inspect --config`
(image_config) and every `copy` from a digest (pull, copy_tag); the config blob against the manifest's config digest
(ConfigBlob in internal/image/docker_schema2.go and oci.go); every blob a copy reads against its descriptor
(copy/digesting_reader.go: read_artifact's layers, pull's). A tag cannot be checked: the digest found for it is the
sha256 of the exact bytes answered (Manifest.from_body), the digest the catalog records and a signature names.
`delete` sends a digest and reads nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, overload

import tenacity

from ..files import brief
from ..invocation import install_skopeo
from ..model import PeerError
from . import referrers_api
from .registry_access import RegistryAccess, docker_config_dir
from .registry_address import Registry

# What a registry or the engine says when the same request may work a little later.
TRANSIENT_MESSAGE = re.compile(
    r"connection refused|connection reset|broken pipe|timed? ?out|\beof\b|temporar(?:y failure|ily)|too many requests|"
    r"service unavailable|bad gateway|gateway time|internal server error|no such host|tls handshake|"
    r"deadline exceeded",
    re.IGNORECASE | re.ASCII,
)
UNREACHABLE_MESSAGE = re.compile(r"dial tcp|connection refused|connection reset|no such host|i/o timeout",
                                 re.IGNORECASE | re.ASCII)
STALLED_MESSAGE = re.compile(r"deadline exceeded|timeout awaiting|i/o timeout", re.IGNORECASE | re.ASCII)
MISSING_MESSAGE = re.compile(r"manifest unknown|name unknown|404 \(Not Found\)|repository name not known",
                             re.IGNORECASE | re.ASCII)
AUTH_MESSAGE = re.compile(r"unauthorized|authentication required|invalid username/password|denied|\b403\b",
                          re.IGNORECASE | re.ASCII)
TLS_MESSAGE = re.compile(r"x509|certificate|server gave HTTP response to HTTPS client", re.IGNORECASE | re.ASCII)
NO_SPACE_MESSAGE = re.compile(r"no space left on device", re.IGNORECASE | re.ASCII)
DELETE_REFUSED = re.compile(r"unsupported|405|method not allowed", re.IGNORECASE | re.ASCII)
SKOPEO_MESSAGE = re.compile(r'msg="((?:[^"\\]|\\.)*)"', re.ASCII)
SKOPEO = "skopeo"
# skopeo copies an image it reads from an engine (docker-daemon:) into a temporary file as large as the image first,
# in containers/image's folder for big files: /var/tmp, whatever TMPDIR says (skopeo 1.9.3, seen here).
SKOPEO_BIG_FILES_FOLDER = "/var/tmp"
# Bounds on one skopeo run, read when it starts (tests shorten them): a question (a manifest, the tag list, a
# delete) is answered in seconds by any registry that works; a push of a CUDA image moves several GB.
QUESTION_TIMEOUT_S = 30
TRANSFER_TIMEOUT_S = 30 * 60
KILL_GRACE_S = 5  # skopeo stops itself at its --command-timeout; this long after it, it is killed
QUERIES_AT_ONCE = 4

# How published layers are compressed, and the layer media types a manifest of each may hold. gzip is the default:
# every client reads it, Docker 20.10 (which fails on zstd layers with "archive/tar: invalid tar header") included.
# zstd is for fleets whose clients all read it: containerd 1.5+ (Kubernetes nodes, `ctr`, nerdctl) and Docker 23+;
# it needs an OCI manifest, so its image config is the OCI form of the engine's (another digest than the image id).
COMPRESSIONS = ("gzip", "zstd")
DEFAULT_COMPRESSION = "gzip"
LAYER_MEDIA_TYPES = {
    "gzip": ("application/vnd.docker.image.rootfs.diff.tar.gzip", "application/vnd.oci.image.layer.v1.tar+gzip"),
    "zstd": ("application/vnd.oci.image.layer.v1.tar+zstd",),
}

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------------- retries

class RegistryError(PeerError):
    """A registry operation failed; transient failures (network, 5xx, 429, no answer in time) are worth another try."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff (1 s, 2 s, 4 s...) for `retries` more tries, all of them within `total_s`."""

    retries: int = 3
    first_delay_s: float = 1.0
    total_s: float = 10 * 60


def with_retries(operation: Callable[[], T], policy: RetryPolicy, on_retry: Callable[[str, float], None]) -> T:
    """Run operation, trying again after each transient RegistryError while the policy allows."""
    def announce(state: tenacity.RetryCallState) -> None:
        if state.outcome and state.next_action:
            on_retry(str(state.outcome.exception()), state.next_action.sleep)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.retries + 1) | tenacity.stop_after_delay(policy.total_s),
        wait=tenacity.wait_exponential(multiplier=policy.first_delay_s, exp_base=2),
        retry=tenacity.retry_if_exception(lambda error: isinstance(error, RegistryError) and error.transient),
        before_sleep=announce,
        reraise=True,
    )
    return retrying(operation)


def is_transient(message: str) -> bool:
    return bool(TRANSIENT_MESSAGE.search(message)) and not NO_SPACE_MESSAGE.search(message)


def big_files_folder(environ: Mapping[str, str]) -> str:
    """Where skopeo writes an image's temporary copy: TMPDIR, as for every other program, else its own default."""
    return environ.get("TMPDIR") or SKOPEO_BIG_FILES_FOLDER


def publish_cache_folder(environ: Mapping[str, str]) -> Path:
    """Where publishing keeps its pushes' blob-info caches between runs: the user's cache folder (XDG_CACHE_HOME, else
    ~/.cache), as pip keeps its own. On a CI runner that keeps this folder between jobs, a republish compresses only
    the layers that changed."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torchimages" / "push-blob-info"


def _made_folder(folder: Path | None, log: Callable[[str], None]) -> Path | None:
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log(f"pushes' blob-info cache: {brief(str(folder))}: {error.strerror or error}; this run keeps its own")
        return None
    return folder


def big_files_flags(environ: Mapping[str, str]) -> list[str]:
    """skopeo's --tmpdir when TMPDIR names a folder: skopeo itself would still write to /var/tmp."""
    return ["--tmpdir", environ["TMPDIR"]] if environ.get("TMPDIR") else []


# ------------------------------------------------------------------------------------------------------ operations

@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str
    config_digest: str  # single-platform image: the digest of its config, the image id the engine gives it; else ""
    download_size: int  # compressed bytes a pull transfers (config + layers) for one platform; 0 for an index
    layer_media_types: tuple[str, ...] = ()  # one per layer, in order (their compression)

    @classmethod
    def from_body(cls, body: bytes) -> Manifest:
        """The manifest as the registry stored it (its digest is the sha256 of exactly these bytes); a ValueError
        saying what is wrong when it is not a manifest's shape."""
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            raise ValueError("not JSON") from None
        if not isinstance(document, dict):
            raise ValueError(f"a JSON {type(document).__name__}, not an object")
        config, layers = document.get("config") or {}, document.get("layers") or []
        parts = [config, *layers] if isinstance(layers, list) else [None]
        if not isinstance(document.get("mediaType", ""), str) or not all(
                isinstance(part, dict) and isinstance(part.get("size", 0), int) for part in parts):
            raise ValueError("an object without a manifest's mediaType, config and layers")
        config_digest = config.get("digest", "")
        if not isinstance(config_digest, str):
            raise ValueError("a manifest whose config digest is not a string")
        media_types = tuple(layer.get("mediaType", "") for layer in layers)
        if not all(isinstance(media_type, str) for media_type in media_types):
            raise ValueError("a manifest whose layer media types are not strings")
        return cls(body, document.get("mediaType", ""), "sha256:" + hashlib.sha256(body).hexdigest(), config_digest,
                   sum(part.get("size", 0) for part in parts if isinstance(part, dict)), media_types)

    def compression(self) -> str | None:
        """'gzip' or 'zstd' when every layer is compressed that way (an image without layers counts as gzip); None
        for a mix or anything else."""
        for name in COMPRESSIONS:
            if all(media_type in LAYER_MEDIA_TYPES[name] for media_type in self.layer_media_types):
                return name
        return None


def private_cache_environment(folder: Path) -> dict[str, str]:
    """The environment for one skopeo run whose blob-info cache is folder/containers/cache, not the machine's.

    containers/image (skopeo 1.9.3's, and later) keeps its blob-info cache in /var/lib/containers/cache when the
    caller is root, else in $XDG_DATA_HOME/containers/cache; whom it takes for root it reads from
    _CONTAINERS_ROOTLESS_UID when set (what podman sets in its user namespace), and skopeo has no flag for the folder.
    So the run is told it is not root and where its data folder is. What publishing reads (auth file, CA folder)
    is named by flags; the one other difference is that containers' own config files (registries.conf, policy.json)
    are looked for in ~/.config/containers before /etc/containers, as for any user.
    """
    environment = dict(os.environ)
    environment["XDG_DATA_HOME"] = str(folder)
    environment["_CONTAINERS_ROOTLESS_UID"] = str(os.geteuid() or 65534)
    return environment


class RegistryClient:
    """The registry operations publishing needs, each a skopeo run retried when the failure is transient."""

    def __init__(self, registry: Registry, access: RegistryAccess, policy: RetryPolicy, log: Callable[[str], None]):
        self.registry = registry
        self.policy = policy
        self.log = log
        self.access = access
        self._push_cache: Path | None = None  # see pushes_share_a_cache
        self._requests: referrers_api.RegistryHTTP | None = None  # what skopeo cannot ask (referrers_api.py)

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
        """The manifest (or index) reference names, None when there is none; one asked for by digest is checked to
        be that digest before anything reads it (`skopeo inspect --raw` prints whatever the registry answers)."""
        body = self._skopeo("inspect", "--raw", *self.access.flags(), self.registry.reference(reference), missing_ok=True)
        if body is None:
            return None
        self._require_digest(reference, body)
        try:
            return Manifest.from_body(body)
        except ValueError as error:
            raise self._garbage(f"the manifest of {reference}", str(error), body) from None

    def digest_of(self, reference: str) -> str | None:
        manifest = self.manifest_or_none(reference)
        return manifest.digest if manifest else None

    def tag_manifests(self, tags: list[str]) -> dict[str, Manifest]:
        """tag -> manifest, for those of tags that exist (a few looked up at once)."""
        with ThreadPoolExecutor(max_workers=QUERIES_AT_ONCE) as pool:
            found = dict(zip(tags, pool.map(self.manifest_or_none, tags), strict=False))
        return {tag: manifest for tag, manifest in found.items() if manifest}

    def tag_digests(self, tags: list[str]) -> dict[str, str]:
        """tag -> digest, for those of tags that exist."""
        return {tag: manifest.digest for tag, manifest in self.tag_manifests(tags).items()}

    @contextmanager
    def pushes_share_a_cache(self, kept: Path | None = None) -> Iterator[None]:
        """The pushes inside share a blob-info cache, one per compression (see push): a layer an image shares with one
        pushed before (a devel image's runtime layers, or last night's image's unchanged layers) is found in the
        registry by what the cache recorded, or mounted there from another repository of it, and is not compressed
        again (a CPU runtime image pushed to a second repository: 9.2 s instead of 20.1 s here). The caches are in
        kept, kept between runs (`publish_cache_folder`); else in a folder of this run's own, removed afterwards, as
        they are when kept cannot be made."""
        with tempfile.TemporaryDirectory(prefix="torchimages-push-cache-") as folder:
            self._push_cache = _made_folder(kept, self.log) or Path(folder)
            try:
                yield
            finally:
                self._push_cache = None

    def push(self, image_id: str, tag: str, daemon_host: str | None, compression: str = DEFAULT_COMPRESSION) -> str:
        """Copy an engine's image (by id) to repository:tag, its layers compressed as asked; returns the manifest
        digest the registry stored.

        The compression is pinned: --dest-compress-format names it, and skopeo runs with a blob-info cache that only
        pushes of that compression write (see pushes_share_a_cache; else one of its own), since a cache shared more
        widely offers blobs another copy compressed otherwise (a zstd blob for a gzip push) and skopeo 1.9 takes them
        whatever the format asked. --dest-precompute-digests compresses each layer before it uploads it and skips a
        layer the registry already holds (same content, same bytes: the compressors are deterministic), so a
        republish uploads only the layers that changed, with no cache at all.
        """
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is none of {COMPRESSIONS}")
        with tempfile.TemporaryDirectory(prefix="torchimages-push-") as folder:
            digest_file = Path(folder) / "digest"
            daemon = ["--src-daemon-host", daemon_host] if daemon_host else []
            # zstd layers exist only in OCI manifests; gzip keeps Docker's v2 manifest, whose config digest is the
            # engine's image id.
            manifest_format = ["--format", "oci"] if compression == "zstd" else []
            cache = self._push_cache / compression if self._push_cache else None
            if cache:
                cache.mkdir(exist_ok=True)
            self._skopeo("copy", "--quiet", "--digestfile", str(digest_file), *daemon, *self.access.flags("dest"),
                         "--dest-compress-format", compression, "--dest-precompute-digests", *manifest_format,
                         f"docker-daemon:{image_id}", self.registry.reference(tag), transfer=True,
                         cache=cache)
            return digest_file.read_text().strip()

    def image_config(self, digest: str) -> dict:
        """The image config (its JSON document) of repository@digest."""
        body = self._skopeo("inspect", "--config", "--raw", *self.access.flags(), self.registry.reference(digest))
        try:
            config = json.loads(body)
        except (ValueError, RecursionError):
            config = None
        if not isinstance(config, dict):
            raise self._garbage(f"the image config of {digest}", "not a JSON object", body)
        return config

    def pull(self, digest: str, local_name: str, daemon_host: str | None) -> None:
        """Copy repository@digest into the engine as local_name (no `docker pull`: the engine needs no login)."""
        daemon = ["--dest-daemon-host", daemon_host] if daemon_host else []
        self._retried(lambda: self._skopeo("copy", "--quiet", *daemon, *self.access.flags("src"),
                                           self.registry.reference(digest), f"docker-daemon:{local_name}",
                                           transfer=True))

    def copy_tag(self, digest: str, tag: str) -> None:
        """Point tag at a manifest the repository already holds, byte for byte (the digest does not change)."""
        self._retried(lambda: self._skopeo("copy", "--quiet", "--preserve-digests", *self.access.flags("src"),
                                           *self.access.flags("dest"), self.registry.reference(digest),
                                           self.registry.reference(tag), transfer=True))

    def read_artifact(self, reference: str, folder: Path) -> bool:
        """Copy repository@reference (a small artifact: a signature, attestations, a bundle) into folder in skopeo's
        `dir:` layout (manifest.json and one file per blob, named by its hex digest); False when the registry has no
        such manifest, or lacks one of its blobs (skopeo says 404 for both). skopeo copies each blob whole, whatever
        size the manifest declares: trust/signatures.py's copied_artifact, the one caller, asks by the digest of a
        manifest it checked and bounds what arrived before it reads any of it."""
        return self._retried(lambda: self._skopeo("copy", "--quiet", *self.access.flags("src"),
                                                  self.registry.reference(reference), f"dir:{folder}",
                                                  missing_ok=True)) is not None

    def write_artifact(self, folder: Path, tag: str) -> None:
        """Push a `dir:` layout as repository:tag byte for byte (its manifest digest is the one written)."""
        self._retried(lambda: self._skopeo("copy", "--quiet", "--preserve-digests", *self.access.flags("dest"),
                                           f"dir:{folder}", self.registry.reference(tag), transfer=True))

    def write_index(self, body: bytes, tag: str) -> str:
        """Put an image index (manifest list) under tag, byte for byte; the images it names are in the repository
        already, so only the index is written (skopeo's --multi-arch index-only). Its digest, as the registry has it."""
        with tempfile.TemporaryDirectory(prefix="torchimages-index-") as folder:
            Path(folder, "manifest.json").write_bytes(body)
            Path(folder, "version").write_text("Directory Transport Version: 1.1\n")
            self._retried(lambda: self._skopeo("copy", "--quiet", "--multi-arch", "index-only", "--preserve-digests",
                                               *self.access.flags("dest"), f"dir:{folder}",
                                               self.registry.reference(tag), transfer=True))
        stored = self.manifest_or_none(tag)
        expected = "sha256:" + hashlib.sha256(body).hexdigest()
        if stored is None or stored.digest != expected:
            raise RegistryError(f"{self.registry.name}:{tag}: the index written is {expected}, the registry has "
                                f"{stored.digest if stored else 'nothing'}", transient=False)
        return expected

    def referrers(self, digest: str) -> bytes | None:
        """The index the registry's referrers API lists for digest; None when it has no such API (referrers_api.py)."""
        return self._http().referrers(digest)

    def write_referrers_index(self, body: bytes, tag: str) -> None:
        """Put the referrers tag schema's index under tag byte for byte (by HTTP: skopeo 1.9 rewrites its
        artifactType away). Not read back here: a concurrent writer's index may already stand in its place, and the
        caller reads the tag again to see whose referrers it lists (trust/referrers.py)."""
        refused = self._http().put_index(body, tag)
        if refused is not None:
            raise RegistryError(f"registry {self.registry.host} did not take the referrers index {tag}: "
                                f"{self.access.redact(brief(refused))}", transient=refused.startswith("HTTP 5"))

    def _http(self) -> referrers_api.RegistryHTTP:
        if self._requests is None:
            self._requests = referrers_api.RegistryHTTP(self.registry, self.access)
        return self._requests

    def delete(self, digest: str) -> None:
        """Delete a manifest; the registry drops every tag naming it."""
        self._retried(lambda: self._skopeo("delete", *self.access.flags(), self.registry.reference(digest)))

    def _list_tags(self) -> list[str]:
        output = self._skopeo("list-tags", *self.access.flags(), f"docker://{self.registry.name}", missing_ok=True)
        if output is None:
            return []
        try:
            tags = json.loads(output).get("Tags") or []
        except (ValueError, RecursionError, AttributeError):  # not JSON, or not an object
            raise self._garbage("its tag list", "not a JSON object", output) from None
        if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
            raise self._garbage("its tag list", "Tags is not a list of names", output)
        return sorted(tags)

    def _require_digest(self, reference: str, body: bytes) -> None:
        """A RegistryError unless body is the manifest reference names, when reference is a digest (a tag names
        whatever the registry holds: the digest found for it is the sha256 of these very bytes)."""
        if not reference.startswith("sha256:"):
            return
        found = "sha256:" + hashlib.sha256(body).hexdigest()
        if found != reference:
            raise RegistryError(f"registry {self.registry.host} answered {self.registry.repository}@{reference} with a "
                                f"manifest whose digest is {found}: it is not the image asked for; nothing it sent "
                                "was used (the registry, or a proxy or cache in front of it, serves the wrong content: "
                                "tell its operators)", transient=False)

    def _garbage(self, what: str, why: str, sent: bytes) -> RegistryError:
        return RegistryError(f"registry {self.registry.host} sent {what} as {why}: "
                             f"{self.access.redact(brief(sent))}", transient=False)

    def _retried(self, operation: Callable[[], T]) -> T:
        return with_retries(operation, self.policy, lambda message, delay: self.log(f"{message}; retrying in {delay:g} s"))

    @overload
    def _skopeo(self, *arguments: str, missing_ok: Literal[False] = False, transfer: bool = False,
                cache: Path | None = None) -> bytes: ...
    @overload
    def _skopeo(self, *arguments: str, missing_ok: Literal[True], transfer: bool = False,
                cache: Path | None = None) -> bytes | None: ...

    def _skopeo(self, *arguments: str, missing_ok: bool = False, transfer: bool = False,
                cache: Path | None = None) -> bytes | None:
        """skopeo's output; None for a missing image or repository when missing_ok; else a RegistryError. Within its
        bound: a question's or a transfer's, after which the registry is said not to answer. Its blob-info cache is
        in cache, else in a folder of its own."""
        bound = TRANSFER_TIMEOUT_S if transfer else QUESTION_TIMEOUT_S
        command = [SKOPEO, f"--command-timeout={bound}s", *big_files_flags(os.environ), *arguments]
        try:
            with nullcontext(str(cache)) if cache else tempfile.TemporaryDirectory(prefix="torchimages-skopeo-") as private:
                done = subprocess.run(command, capture_output=True, timeout=bound + KILL_GRACE_S, check=False,
                                      env=private_cache_environment(Path(private)))
        except FileNotFoundError:
            raise RegistryError(f"publishing needs skopeo, which is not installed: {install_skopeo()}",
                                transient=False) from None
        except subprocess.TimeoutExpired:
            raise self._stalled(arguments[0], bound) from None
        if done.returncode == 0:
            return done.stdout
        message = self._message(done.stderr.decode(errors="replace"))
        if missing_ok and MISSING_MESSAGE.search(message):
            return None
        if STALLED_MESSAGE.search(message):
            raise self._stalled(arguments[0], bound)
        where = "does not answer" if UNREACHABLE_MESSAGE.search(message) else "says"
        raise RegistryError(f"registry {self.registry.host} {where}: {message}{self._hint(message)}",
                            transient=is_transient(message) and not AUTH_MESSAGE.search(message))

    def _stalled(self, operation: str, bound: int) -> RegistryError:
        return RegistryError(f"registry {self.registry.host} did not answer within {bound} s (skopeo {operation}): "
                             "it accepts connections but does not respond; check that it is up and not overloaded",
                             transient=True)

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
        if NO_SPACE_MESSAGE.search(message):
            return (f" (skopeo copies each image out of the engine into a temporary file as large as the image, in "
                    f"{big_files_folder(os.environ)}: free space there, or set TMPDIR to a folder on a larger disk)")
        if DELETE_REFUSED.search(message):
            return " (the registry refuses this operation: deleting needs storage.delete.enabled: true in its config)"
        return ""
