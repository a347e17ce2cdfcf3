"""A registry's address as Docker reads one: HOST[:PORT]/REPO (`--registry`), and the registry an image name
points to. Both the registry client (registry.py) and the way skopeo reaches a registry (registry_access.py) name it."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..files import brief
from ..model import InputError, Problem
from ..redaction import REDACTED

HOST_PATTERN = re.compile(r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::[0-9]{1,5})?", re.ASCII)
REPOSITORY_PATTERN = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*",
                                re.ASCII)
MAX_NAME_LENGTH = 255  # Docker's limit on a repository name


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
    login, at, address = (text or "").rpartition("@")
    if at:  # neither a host nor a repository holds '@': what comes before it is a login, never quoted, even cut short
        raise InputError([Problem(flag, 0, f"{flag} {brief(f'{REDACTED}@{address}')} holds a login before the host: "
                                           "give the login to `docker login HOST` (the Docker config) and "
                                           f"{flag} HOST[:PORT]/REPO alone ({example})")])
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
