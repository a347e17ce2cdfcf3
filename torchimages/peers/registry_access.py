"""How skopeo reaches one container registry the way Docker would: its login, the CAs it trusts, and whether TLS is
verified.

Credentials are found as Docker finds them: `$DOCKER_CONFIG/config.json` (default ~/.docker/config.json), as
`docker login` writes it: `auths`, `credHelpers`, and a `credsStore` (which containers/image does not read, so it is
passed on as a credential helper for the one registry). A private CA is trusted from `<certs.d>/<host:port>/ca.crt`
(default /etc/docker/certs.d) or `--registry-ca FILE`. Plain HTTP (and unverified TLS) only for a loopback registry
with no CA configured, as Docker does, or with `--insecure-registry`. No credential ever reaches a message: whatever
skopeo says is stripped of the secrets the Docker config holds for the registry (redaction.py).

Every file handed to skopeo is a copy, in a private folder, of a bounded regular file read and checked here (a
certs.d `ca.crt` linked to /dev/zero is refused, not streamed).
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..files import brief, read_bytes, read_json_document
from ..model import InputError, Problem
from ..redaction import Secrets
from .registry_address import Registry

DEFAULT_CERTS_D = Path("/etc/docker/certs.d")
CERT_SUFFIXES = (".crt", ".cert", ".key")  # what containers/image reads from a certs.d folder


@dataclass(frozen=True)
class RegistryAccess:
    """How skopeo reaches one registry the way Docker would."""

    auth_file: Path | None  # a copy of the Docker config (or a credential-helper stand-in); None: anonymous
    cert_dir: Path | None  # a copy of the CA (and client certificate) folder; None: no CA for this registry
    tls_verify: bool
    secrets: Secrets = Secrets()  # what the Docker config holds for this registry: never shown in a message
    # Holds the copied files (Docker config, CA folder) as long as the access is in use.
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
        return self.secrets.redact(text)


def docker_config_dir() -> Path:
    """Where Docker keeps config.json: $DOCKER_CONFIG, else ~/.docker."""
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def registry_access(registry: Registry, config_dir: Path | None = None, certs_d: Path = DEFAULT_CERTS_D,
                    ca_file: Path | None = None, insecure: bool = False) -> RegistryAccess:
    """Credentials from the Docker config, CAs from certs.d/<host>/ and ca_file, TLS as Docker decides it."""
    config_file = (config_dir or docker_config_dir()) / "config.json"
    config = docker_config(config_file)
    host_certs = certs_d / registry.host
    certificates = _certificates(host_certs, ca_file)
    scratch = tempfile.TemporaryDirectory(prefix="torchimages-registry-") if config or certificates else None
    auth_file = _auth_file(config, registry, scratch)
    cert_dir = _cert_dir(certificates, scratch) if certificates and scratch else None
    # Docker's rule: a loopback registry may be plain HTTP, unless a CA for it says it speaks TLS.
    tls_verify = not insecure and not (registry.is_loopback and cert_dir is None and not host_certs.is_dir())
    return RegistryAccess(auth_file, cert_dir, tls_verify, _secrets(config, registry), scratch)


LOGIN_AGAIN = "log in again with `docker login HOST` (or fix the file by hand)"
# The fields of config.json this module reads, and what each must be.
CONFIG_STRINGS = ("auth", "username", "password", "identitytoken", "registrytoken")


def docker_config(config_file: Path) -> dict | None:
    """The Docker config (None when there is none), checked for the shape `docker login` writes: anything else is an
    InputError naming the file and the key, since it would otherwise be a traceback or a login silently dropped."""
    config = read_json_document(config_file, LOGIN_AGAIN, default=None)
    if config is None:
        return None
    problems = []

    def require(ok: bool, key: str, what: str) -> bool:
        if not ok:
            problems.append(Problem(str(config_file), 1, f"{key} must be {what}: {LOGIN_AGAIN}"))
        return ok

    if require(isinstance(config, dict), "the document", "an object with 'auths'"):
        if require(isinstance(config.get("auths", {}), dict), "'auths'", "an object of registry -> login"):
            for host, entry in (config.get("auths") or {}).items():
                if require(isinstance(entry, dict), f"auths[{brief(host)}]", "an object"):
                    for key in CONFIG_STRINGS:
                        require(isinstance(entry.get(key, ""), str), f"auths[{brief(host)}].{key}", "a string")
        helpers = config.get("credHelpers", {})
        if require(isinstance(helpers, dict), "'credHelpers'", "an object of registry -> helper name"):
            for host, helper in helpers.items():
                require(isinstance(helper, str), f"credHelpers[{brief(host)}]", "a helper name (a string)")
        require(isinstance(config.get("credsStore", ""), str), "'credsStore'", "a helper name (a string)")
    if problems:
        raise InputError(problems)
    return config


def _creds_store_for(config: dict, registry: Registry) -> str | None:
    """The credsStore helper Docker would ask for this registry: when credHelpers names none for it (containers/image
    reads credHelpers itself) and the config holds no inline login for it."""
    if (config.get("credHelpers") or {}).get(registry.host):
        return None  # containers/image reads credHelpers itself
    inline = (config.get("auths") or {}).get(registry.host) or {}
    store = config.get("credsStore")
    return store if store and not inline.get("auth") else None


def _auth_file(config: dict | None, registry: Registry, scratch: tempfile.TemporaryDirectory | None) -> Path | None:
    """What skopeo reads as its auth file: the config as checked here (a copy, so that skopeo reads what was checked),
    or a stand-in naming the credsStore helper for this registry."""
    if config is None:
        return None
    assert scratch is not None  # made whenever there is a config
    store = _creds_store_for(config, registry)
    copy = Path(scratch.name) / "auth.json"
    copy.write_text(json.dumps({"credHelpers": {registry.host: store}} if store else config))
    copy.chmod(0o600)
    return copy


def _certificates(host_certs: Path, ca_file: Path | None) -> dict[str, bytes]:
    """The host's certs.d files (CAs, client certificates and keys) and ca_file, each a bounded regular file read
    here; a FIFO, a device or a link to one is an InputError naming it."""
    fix = "put PEM files there (regular files, not links to devices or FIFOs)"
    found = {}
    if host_certs.is_dir():
        for path in sorted(host_certs.iterdir()):
            if path.name.endswith(CERT_SUFFIXES):
                found[path.name] = read_bytes(path, fix)
    if ca_file is not None:
        found["registry-ca.crt"] = read_bytes(ca_file, "--registry-ca names the PEM file of the CA that signed the "
                                                       "registry's certificate")
    return found


def _cert_dir(certificates: dict[str, bytes], scratch: tempfile.TemporaryDirectory) -> Path:
    """A certs.d-style folder of copies: skopeo reads only what was checked."""
    folder = Path(scratch.name) / "certs"
    folder.mkdir()
    for name, content in certificates.items():
        (folder / name).write_bytes(content)
    return folder


def _secrets(config: dict | None, registry: Registry) -> Secrets:
    auths = (config or {}).get("auths") or {}
    # Docker Hub's login is filed under its old index address.
    names = [registry.host, *(["https://index.docker.io/v1/"] if registry.host == "docker.io" else [])]
    entry = next((auths[name] for name in names if name in auths), None)
    if entry is None:
        return Secrets()
    found = [entry.get(key) for key in ("auth", "password", "identitytoken", "registrytoken")]
    try:
        user_password = base64.b64decode(entry.get("auth") or "").decode()
    except (binascii.Error, ValueError):  # not base64, or not text: skopeo will say the login is bad
        user_password = ""
    return Secrets.of(*found, user_password, user_password.partition(":")[2])


@dataclass(frozen=True)
class AccessSettings:
    """How registries are reached, as the command line sets it; the same for every registry a run talks to."""

    certs_d: Path = DEFAULT_CERTS_D
    ca_file: Path | None = None
    insecure: bool = False

    def access(self, registry: Registry) -> RegistryAccess:
        return registry_access(registry, certs_d=self.certs_d, ca_file=self.ca_file, insecure=self.insecure)
