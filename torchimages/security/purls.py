"""Package URLs as Trivy writes them, so that a scanner matches what our SBOM and our VEX statements name.

A VEX statement about a package matches a scanner's finding only when its PURL has the scanner's type, namespace,
name and version, and each of its qualifiers has the scanner's value (openvex/go-vex pkg/vex/vex.go `PurlMatches`, at
ba5be8f42460; Trivy's own pkg/purl/purl.go `Match` the same). What Trivy 0.76 writes (aquasecurity/trivy
pkg/purl/purl.go at dc3c56eed58a: `New`, `parseQualifier`, `parseDeb`, `parseRPM`, `parseApk`, `parsePyPI`):

- deb: `pkg:deb/debian/zlib1g@1.2.13.dfsg-1?arch=amd64&distro=debian-12.15&epoch=1`. The epoch is a qualifier, never
  part of the version; `distro` is the OS family and the release Trivy's OS analyzer reads: /etc/debian_version's
  first line on Debian (12.15, where os-release's VERSION_ID says 12: pkg/fanal/analyzer/os/debian/debian.go), and
  /etc/lsb-release's DISTRIB_RELEASE on Ubuntu (pkg/fanal/analyzer/os/ubuntu/ubuntu.go).
- rpm: the same qualifiers (purl-spec's rpm type has the epoch qualifier too), os-release's VERSION_ID as the release.
- apk: `distro=<release>`, /etc/alpine-release's, without the family.
- pypi: the name lower-cased with `_` as `-`, its dots kept (purl-spec's pypi type: `jaraco.context`, not PEP 503's
  `jaraco-context`).

purl-spec's deb type writes a Debian epoch inside the version instead (`pkg:deb/debian/attr@1:2.4.47-2`,
package-url/purl-spec types/deb-definition.json at 16f3d0e39343), as Syft does; we follow the scanner that reads our
VEX by PURL, and say so in docs/security.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

PURL_TYPES = {"dpkg": "deb", "rpm": "rpm", "apk": "apk"}  # package database -> package-url type
EPOCH = re.compile(r"([0-9]+):(.+)", re.ASCII)
# The file each family's release is read from, in the inventory (sbom.INVENTORY_SCRIPT), where Trivy reads it
RELEASE_FILES = {"debian": "debian_version", "ubuntu": "lsb-release", "alpine": "alpine-release"}


@dataclass(frozen=True)
class Purl:
    """A PURL's parts, unescaped: two PURLs are the same package when these are equal, however each was escaped."""
    type: str
    namespace: str
    name: str
    version: str
    qualifiers: tuple[tuple[str, str], ...] = field(default=())
    subpath: str = ""

    def __str__(self) -> str:
        namespace = f"{'/'.join(quote(part, safe='') for part in self.namespace.split('/'))}/" if self.namespace else ""
        text = f"pkg:{self.type}/{namespace}{quote(self.name, safe='')}"
        text += f"@{quote(self.version, safe='')}" if self.version else ""
        text += "?" + "&".join(f"{key}={quote(value, safe='')}" for key, value in self.qualifiers) if self.qualifiers \
            else ""
        return text + (f"#{quote(self.subpath, safe='/')}" if self.subpath else "")


def parse(text: str) -> Purl | None:
    """A PURL's parts as purl-spec's parsing rules give them; None for what is not a PURL."""
    if not isinstance(text, str) or not text.startswith("pkg:"):
        return None
    rest, _, subpath = text[len("pkg:"):].partition("#")
    rest, _, query = rest.partition("?")
    path, at, version = rest.rpartition("@")
    if not at:
        path, version = rest, ""
    parts = [part for part in path.strip("/").split("/") if part]
    if len(parts) < 2:
        return None
    qualifiers = sorted((key.lower(), unquote(value)) for key, _, value in
                        (pair.partition("=") for pair in query.split("&") if pair) if value)
    return Purl(parts[0].lower(), "/".join(unquote(part) for part in parts[1:-1]), unquote(parts[-1]), unquote(version),
                tuple(qualifiers), unquote(subpath).strip("/"))


def same_package(first: str, second: str) -> bool:
    """Whether two PURL strings name the same package (a different escaping of the same parts is the same)."""
    parsed = parse(first)
    return parsed is not None and parsed == parse(second)


def matches(general: str, specific: str) -> bool:
    """Whether a VEX statement's PURL (general) names a scanner's package (specific), as go-vex `PurlMatches` decides:
    the same type, namespace and name, the same version unless general gives none, and each of general's qualifiers
    with the same value in specific (which may have more)."""
    first, second = parse(general), parse(specific)
    if first is None or second is None or (first.type, first.namespace, first.name) != \
            (second.type, second.namespace, second.name):
        return False
    if first.version and first.version != second.version:
        return False
    return set(first.qualifiers) <= set(second.qualifiers)


def release(os_release: dict[str, str], release_files: dict[str, str]) -> str:
    """The OS release as Trivy names it (the module's docstring): the family's release file where the inventory read
    it, else os-release's VERSION_ID."""
    family = os_release.get("ID", "")
    text = release_files.get(RELEASE_FILES.get(family, ""), "")
    if family == "ubuntu":
        text = next((line.partition("=")[2].strip().strip('"') for line in text.splitlines()
                     if line.startswith("DISTRIB_RELEASE=")), "")
    else:
        text = text.splitlines()[0].strip() if text.strip() else ""
    return text or os_release.get("VERSION_ID", "")


def os_purl(manager: str, name: str, version: str, arch: str, family: str, os_release: str) -> str:
    """An OS package's PURL as Trivy writes it: manager is the package database (dpkg, rpm, apk), version the whole
    installed version (a `1:` epoch included), family the OS's os-release ID and os_release what release() gives."""
    epoch = EPOCH.fullmatch(version) if manager in ("dpkg", "rpm") else None
    qualifiers = [("arch", arch)] if arch else []
    if os_release:
        qualifiers.append(("distro", os_release if manager == "apk" else f"{family}-{os_release}"))
    if epoch:
        version = epoch.group(2)
        if int(epoch.group(1)):
            qualifiers.append(("epoch", str(int(epoch.group(1)))))
    name = name.lower() if manager == "apk" else name
    return str(Purl(PURL_TYPES[manager], family, name, version, tuple(sorted(qualifiers))))


def pypi_name(name: str) -> str:
    """A Python distribution's name in its PURL: lower-cased, `_` as `-`, dots kept (purl-spec; Trivy parsePyPI)."""
    return name.lower().replace("_", "-")


def pypi_purl(name: str, version: str) -> str:
    return str(Purl("pypi", "", pypi_name(name), version))
