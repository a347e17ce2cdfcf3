"""Our SBOM against a scanner's own inventory of the same image: Trivy's CycloneDX (`trivy image --format cyclonedx`,
made without a vulnerability database). Every OS and Python package Trivy finds must be in ours with the same name,
version and PURL (PURLs compared part by part, as a VEX matcher compares them: purls.parse), a Python package at the
same place (its metadata file); whatever else either side lists is a difference, explained (EXPLAINED, each with its
reason) or not. Pure: the documents in, the differences out (docs/security.md, "What Trivy's inventory and ours agree
on"; tests/test_inventory_agreement.py runs the real Trivy on the built rows).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..model import InputError, Problem
from .purls import parse

OS_TYPES = {"debian", "ubuntu", "alpine", "redhat", "centos", "rocky", "alma", "fedora", "oracle", "amazon"}
OS_MANAGERS = {"dpkg", "rpm", "apk"}  # our SBOM's io.torchimages:package-manager values for OS packages
TRIVY_TYPE, TRIVY_PATH = "aquasecurity:trivy:PkgType", "aquasecurity:trivy:FilePath"
OUR_MANAGER = "io.torchimages:package-manager"
# What a difference is
ONLY_OURS, ONLY_THEIRS, OTHER_PURL, OTHER_VERSION, OTHER_NAME, OTHER_PLACE = (
    "only in ours", "only in the scanner's", "another PURL", "another version", "another name", "another place")


@dataclass(frozen=True, order=True)
class Listed:
    """One package one inventory lists: kind is os, python, or the scanner's own type of anything else (gobinary)."""
    kind: str
    name: str
    version: str
    purl: str
    location: str = ""  # a Python package's metadata file, without the leading /; "" for OS packages

    def __str__(self) -> str:
        return f"{self.kind} {self.name} {self.version} ({self.purl}{', ' + self.location if self.location else ''})"


@dataclass(frozen=True)
class Explanation:
    """Why a kind of difference is expected: what (ONLY_OURS ...), the package kind, and a pattern its location (or,
    for OS packages, its name) must match in full."""
    what: str
    kind: str
    pattern: str
    reason: str

    def covers(self, what: str, listed: Listed) -> bool:
        subject = listed.location if listed.kind == "python" else listed.name
        return (what, listed.kind) == (self.what, self.kind) and re.fullmatch(self.pattern, subject, re.ASCII) is not None


@dataclass(frozen=True)
class Difference:
    what: str
    ours: Listed | None
    theirs: Listed | None
    reason: str = ""  # the explanation's; "" when nothing explains it

    def __str__(self) -> str:
        sides = [f"ours: {self.ours}" if self.ours else "", f"trivy: {self.theirs}" if self.theirs else ""]
        text = f"{self.what}: " + "; ".join(side for side in sides if side)
        return text + (f" [explained: {self.reason}]" if self.reason else "")


# The differences that are expected, each with its reason (Explanation). Empty: on the CPU runtime and devel rows and
# the CUDA 13.0 runtime and devel rows, with Trivy 0.76.0, none is left once our PURLs are Trivy's and the inventory
# reads every Python metadata file in the image (docs/security.md). The differences found before were fixed, not
# explained. One found later goes here only with the reason it is right, never to make a test pass.
EXPLAINED: tuple[Explanation, ...] = ()


# ------------------------------------------------------------------------------------------------------- reading

def trivy_inventory(document: object, where: str = "Trivy's CycloneDX") -> list[Listed]:
    """The packages in Trivy's CycloneDX document: its libraries, by Trivy's package type (PkgType)."""
    listed = []
    for component in _components(document, where):
        properties = _properties(component)
        kind = properties.get(TRIVY_TYPE, "")
        if component.get("type") != "library" or not kind:
            continue  # the operating-system component, applications (a lock file, a binary) as containers of packages
        listed.append(Listed("os" if kind in OS_TYPES else "python" if kind == "python-pkg" else kind,
                             str(component.get("name", "")), str(component.get("version", "")),
                             str(component.get("purl", "")), properties.get(TRIVY_PATH, "").lstrip("/")))
    return sorted(listed)


def sbom_inventory(document: object, where: str = "our SBOM") -> list[Listed]:
    """The packages in our SBOM (sbom.cyclonedx): a Python package once per metadata file it was found in."""
    listed = []
    for component in _components(document, where):
        manager = _properties(component).get(OUR_MANAGER, "")
        kind = "os" if manager in OS_MANAGERS else "python" if manager == "pip" else manager
        occurrences = ((component.get("evidence") or {}).get("occurrences") or []) if kind == "python" else []
        for location in [str(item.get("location", "")).lstrip("/") for item in occurrences if isinstance(item, dict)] \
                or [""]:
            listed.append(Listed(kind, str(component.get("name", "")), str(component.get("version", "")),
                                 str(component.get("purl", "")), location))
    return sorted(listed)


def _components(document: object, where: str) -> list[dict]:
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX" \
            or not isinstance(document.get("components"), list):
        raise InputError([Problem(where, 0, "not a CycloneDX document with a components list")])
    return [component for component in document["components"] if isinstance(component, dict)]


def _properties(component: dict) -> dict[str, str]:
    return {str(item.get("name")): str(item.get("value", "")) for item in component.get("properties") or []
            if isinstance(item, dict)}


# ------------------------------------------------------------------------------------------------------- comparing

def compare(ours: Iterable[Listed], theirs: Iterable[Listed],
            explained: tuple[Explanation, ...] = EXPLAINED) -> list[Difference]:
    """Every difference between the two inventories, each with the reason that explains it ("" where none does).
    Packages pair up by PURL (as parsed) and place first (by PURL alone where our SBOM does not say where a Python
    package lies: one written before it did); what is left by PURL (another place), by name and version (another
    PURL), then by name alone (another version); the rest is on one side only."""
    mine, scanned = list(ours), list(theirs)
    differences: list[Difference] = []
    steps = ((_same_package, _same_package, ""), (_unplaced, _same_purl, ""), (_same_purl, _same_purl, OTHER_PLACE),
             (_same_release, _same_release, OTHER_PURL), (_same_name, _same_name, OTHER_VERSION))
    for our_key, their_key, what in steps:
        mine, scanned, paired = _pair(mine, scanned, our_key, their_key)
        for our, their in paired:
            if what:
                differences.append(Difference(what, our, their))
            elif our.name != their.name:
                differences.append(Difference(OTHER_NAME, our, their))
    differences += [Difference(ONLY_OURS, our, None) for our in mine]
    differences += [Difference(ONLY_THEIRS, None, their) for their in scanned]
    return [_explained(difference, explained) for difference in differences]


def unexplained(differences: Iterable[Difference]) -> list[Difference]:
    return [difference for difference in differences if not difference.reason]


def _explained(difference: Difference, explained: tuple[Explanation, ...]) -> Difference:
    listed = difference.ours or difference.theirs
    assert listed is not None
    reason = next((entry.reason for entry in explained if entry.covers(difference.what, listed)), "")
    return Difference(difference.what, difference.ours, difference.theirs, reason)


def _pair(ours: list[Listed], theirs: list[Listed], our_key: Callable[[Listed], object],
          their_key: Callable[[Listed], object]) -> tuple[list[Listed], list[Listed], list[tuple[Listed, Listed]]]:
    """Pair the two sides by their keys (a key of None never pairs); what is left of each, and the pairs."""
    waiting: dict[object, list[Listed]] = {}
    for their in theirs:
        if (value := their_key(their)) is not None:
            waiting.setdefault(value, []).append(their)
    left, paired = [], []
    for our in ours:
        value = our_key(our)
        candidates = waiting.get(value) if value is not None else None
        if candidates:
            paired.append((our, candidates.pop(0)))
        else:
            left.append(our)
    matched = {id(their) for _, their in paired}
    return left, [their for their in theirs if id(their) not in matched], paired


def _same_package(listed: Listed) -> object:
    purl = parse(listed.purl)
    return (listed.kind, purl, listed.location) if purl else None


def _same_purl(listed: Listed) -> object:
    purl = parse(listed.purl)
    return (listed.kind, purl) if purl else None


def _unplaced(listed: Listed) -> object:
    """A Python package our SBOM lists without its metadata file's place."""
    return _same_purl(listed) if listed.kind == "python" and not listed.location else None


def _same_release(listed: Listed) -> object:
    return listed.kind, listed.name.lower(), listed.version, listed.location


def _same_name(listed: Listed) -> object:
    return listed.kind, listed.name.lower(), listed.location
