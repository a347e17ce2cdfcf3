"""A registry's address as Docker reads one: HOST[:PORT]/REPO (`--registry`), and the registry an image name
points to. Both the registry client (registry.py) and the way skopeo reaches a registry (registry_access.py) name it."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..files import brief
from ..model import InputError, Problem
from ..redaction import DIGEST_SHAPE, REDACTED, reference_login

HOST_PATTERN = re.compile(r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::[0-9]{1,5})?", re.ASCII)
REPOSITORY_PATTERN = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*",
                                re.ASCII)
TAG_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)  # Docker's grammar for a tag
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
    refuse_login(text, flag, f"HOST[:PORT]/REPO alone ({example})")
    if "@" in (text or ""):  # a digest: no registry address holds one (and the '@' ends no login: it was refused)
        raise InputError([Problem(flag, 0, f"{flag} {brief(text)} names an image, not a registry: give "
                                           f"HOST[:PORT]/REPO alone ({example})")])
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


def refuse_login(text: str, flag: str, form: str) -> None:
    """An InputError when text holds a login before its host (user:password@host/repo, perhaps after https://): the
    refusal shows text with the login replaced, and says to give it to `docker login HOST` and flag in form instead.
    Called before anything else reads text, so that no message about it (a bad port, an upper-case repository) can
    quote the login, even cut short."""
    scheme, login, address = reference_login(text or "")
    if not login:
        return
    host = address.partition("/")[0]
    host = host if HOST_PATTERN.fullmatch(host) else "HOST"  # a hostile host is never made part of a command to copy
    raise InputError([Problem(flag, 0, f"{flag} {brief(f'{scheme}{REDACTED}@{address}')} holds a login before "
                                       f"the host: give it to `docker login {host}` (the Docker config keeps it) and "
                                       f"{flag} {form}")])


def parse_image_name(text: str, flag: str = "--image") -> str:
    """An image as Docker names one: [HOST[:PORT]/]REPO[:TAG][@DIGEST], a Docker Hub image without a host (an
    engine's image id reads as one too); an InputError saying what a valid name looks like otherwise."""
    example = "e.g. pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime or registry.example.com/ml/pytorch:2.13"
    refuse_login(text, flag, f"[HOST[:PORT]/]REPO[:TAG] alone ({example})")
    if reference_login(text or "")[0]:
        raise InputError([Problem(flag, 0, f"{flag} {brief(text)} is a URL: give the image name without its scheme "
                                           f"({example})")])
    registry, tag_or_digest = image_registry(text or "")
    _, at, digest = (text or "").partition("@")
    try:
        parse_registry(registry.name, flag)
    except InputError:  # its message quotes the name as completed (docker.io/library/...): this one quotes text
        raise InputError([Problem(flag, 0, f"{flag} {brief(text)} is not an image name: [HOST[:PORT]/]REPO[:TAG] or "
                                           f"REPO@sha256:<hex>, the repository in lower case ({example})")]) from None
    if (at and not DIGEST_SHAPE.fullmatch(digest)) or (not at and not TAG_PATTERN.fullmatch(tag_or_digest)):
        raise InputError([Problem(flag, 0, f"{flag} {brief(text)}: a tag is up to 128 letters, digits, '_', '.' or "
                                           f"'-', a digest ALGORITHM:HEX such as sha256:<64 hex digits> ({example})")])
    return text


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
