"""OpenVEX for a published digest: why each finding the allowlist accepts does not block it, and which fixes it
carries that the row's previous digest lacked. Pure functions of what publish has read; signed as a fourth
attestation beside the SBOM, provenance and verification report (docs/security.md).

Trivy, Grype and Docker Scout read an OpenVEX document and stop raising the findings it explains. Each statement
names the image by its OCI purl and the OS package by the purl the SBOM gives it, so that a scanner matches both.
An allowlist entry becomes `not_affected` when it gives a `justification:` (OpenVEX's five), else `affected` with
its reason as the action; both say "accepted until <expires>" in status_notes, and `verify-image` takes a statement
past that date as explaining nothing, as the publish gate does.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import quote, unquote

import jsonschema
from debian.debian_support import version_compare

from ..model import InputError, Problem
from ..reporting import as_object
from ..trust.attestations import VEX_PREDICATE
from .freshness import Checker, Fixable, Installed, RowSecurity, fix_record, sbom_packages
from .sbom import AllowedVulnerability, Allowlist
from .sbom import Finding as ScannerFinding

CONTEXT = "https://openvex.dev/ns/v0.2.0"
AUTHOR = "torchimages publish"
SCHEMA = Path(__file__).parent.parent / "schemas" / "openvex_json_schema.json"  # vendored: schemas/README.md
ACCEPTED_UNTIL = re.compile(r"accepted until ([0-9]{4}-[0-9]{2}-[0-9]{2})", re.ASCII)
EXPLAINING = ("not_affected", "affected")  # `fixed` says the image no longer has it: no finding of it is explained


class VexError(InputError):
    """A VEX document the OpenVEX schema refuses: nothing is signed or published with it (exit 2)."""


@dataclass(frozen=True)
class Finding:
    """A fixable OS package an image carries, as its verification report records it."""

    package: str
    cves: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.package} ({', '.join(self.cves) or 'no CVE named'})"


# ------------------------------------------------------------------------------------------------------ products

def image_purl(repository: str, digest: str) -> str:
    """The image as scanners name it: pkg:oci/NAME@sha256%3A...?repository_url=HOST/PATH."""
    name = repository.rsplit("/", 1)[-1]
    return f"pkg:oci/{name}@{quote(digest, safe='')}?repository_url={quote(repository, safe='/:')}"


def package_purls(sbom: dict) -> dict[str, str]:
    """OS package name -> the purl the SBOM gives it (what a scanner's finding names)."""
    purls: dict[str, str] = {}
    for component in sbom.get("components") or []:
        if isinstance(component, dict) and str(component.get("purl", "")).startswith(("pkg:deb/", "pkg:rpm/", "pkg:apk/")):
            purls.setdefault(str(component.get("name")), str(component["purl"]))
    return purls


def _product(image: str, packages: list[str], purls: dict[str, str]) -> dict:
    subcomponents = sorted({purls[name] for name in packages if name in purls})
    return {"@id": image, **({"subcomponents": [{"@id": purl} for purl in subcomponents]} if subcomponents else {})}


# ---------------------------------------------------------------------------------------------------- statements

def is_vulnerability(entry: AllowedVulnerability) -> bool:
    """A `cve:` entry (a CVE or GHSA id); else a `package:` one (Debian names are lower case)."""
    return entry.id.startswith(("CVE-", "GHSA-"))


def accepted(entry: AllowedVulnerability, cve: str, product: dict, allowlist_path: str) -> dict:
    """One allowlist entry's statement about one vulnerability."""
    notes = f"{allowlist_path} entry {entry.id}, accepted until {entry.expires.isoformat()}"
    statement = {"vulnerability": {"name": cve}, "products": [product], "status_notes": notes}
    if entry.justification:
        return {**statement, "status": "not_affected", "justification": entry.justification,
                "impact_statement": entry.reason}
    return {**statement, "status": "affected",
            "action_statement": f"{entry.reason} (accepted until {entry.expires.isoformat()}; then it blocks "
                                "publishing again unless renewed or fixed)"}


def accepted_statements(allowlist: Allowlist, fixable: list[Fixable], image: str, purls: dict[str, str],
                        today: dt.date, scanned: Sequence[ScannerFinding] = ()) -> list[dict]:
    """A statement for each finding the allowlist accepts: every active `cve:` entry (a scanner may raise it whether
    or not the security index does), and each CVE of a fixable package a `package:` entry accepts. Its products name
    the packages the security index and the gate's scanner (scanned) found the CVE in, by their SBOM PURLs: Trivy
    suppresses a finding only when the statement names its package among the image's subcomponents."""
    active = [entry for entry in allowlist.entries if entry.expires >= today]
    path = Path(allowlist.path).name or "scanner-allowlist.yaml"
    carriers: dict[str, list[str]] = {}  # CVE -> the packages it was found in
    for item in fixable:
        for cve in item.cves:
            carriers.setdefault(cve, []).append(item.package)
    for finding in scanned:
        carriers.setdefault(finding.id, []).append(finding.package)
    statements = [accepted(entry, entry.id, _product(image, carriers.get(entry.id, []), purls), path)
                  for entry in active if is_vulnerability(entry)]
    by_package = {entry.id: entry for entry in active if not is_vulnerability(entry)}
    covered = {entry.id for entry in active if is_vulnerability(entry)}
    statements += [accepted(by_package[item.package], cve, _product(image, [item.package], purls), path)
                   for item in fixable if item.package in by_package for cve in item.cves if cve not in covered]
    return statements


def fixed_statements(fixed: list[dict], image: str, purls: dict[str, str]) -> list[dict]:
    """`fixed` for each CVE a fix this digest carries closes ({"package", "fixed", "cves"} records)."""
    return [{"vulnerability": {"name": cve}, "products": [_product(image, [item["package"]], purls)], "status": "fixed",
             "status_notes": f"{item['package']} {item['fixed']} is in this image; the row's previous digest lacked it"}
            for item in fixed for cve in item.get("cves") or []]


def fixes_carried(previous_fixable: list[dict], installed: dict[str, str]) -> list[dict]:
    """The fixes a previous digest lacked (its recorded fixable list) that this image's packages now hold."""
    return [{"package": item["package"], "fixed": item["fixed"], "cves": list(item.get("cves") or [])}
            for item in previous_fixable
            if item.get("package") in installed and version_compare(installed[item["package"]], item["fixed"]) >= 0]


def document(image: str, statements: list[dict], timestamp: str) -> dict:
    """The OpenVEX document (its @id names the image, so that the same statements give the same document)."""
    return {"@context": CONTEXT, "@id": f"https://torchimages.io/vex/{quote(image, safe='')}", "author": AUTHOR,
            "role": "publisher", "timestamp": timestamp, "version": 1, "tooling": "torchimages publish",
            "statements": statements}


# ------------------------------------------------------------------------------------------------ what publish signs

def security_row(checker: Checker | None, tag: str, os_name: str, sbom: dict) -> RowSecurity | None:
    """The security index's verdict on the image: the publish gate's, or (an unchanged republish, which runs no gate)
    one made now from its SBOM; None without an index."""
    if checker is None:
        return None
    if tag not in checker.judged:
        installed = _installed(sbom)
        if not installed:  # an SBOM without OS packages: the gate already said so, nothing to record
            return None
        checker.check(tag, os_name, installed)
    return checker.judged[tag]


def fixed_since(previous_digest: str | None, previous_scan: dict, digest: str, sbom: dict) -> list[dict]:
    """The fixes this digest carries that the row's previous digest lacked, as its catalog record lists them (the
    previous digest and its record's scan; None when the row was never published); the same digest republished keeps
    the list it was first published with."""
    if previous_digest is None:
        return []
    if previous_digest == digest:
        return list(previous_scan.get("fixed") or [])
    installed = {package.name: package.version for package in _installed(sbom)}
    return fixes_carried(list(previous_scan.get("fixable") or []), installed)


def _installed(sbom: dict) -> list[Installed]:
    try:
        return sbom_packages(sbom, "SBOM")
    except InputError:
        return []


def image_predicate(allowlist: Allowlist, row: RowSecurity | None, fixed: list[dict], repository: str, digest: str,
                    sbom: dict, timestamp: str, today: dt.date,
                    scanned: Sequence[ScannerFinding] = ()) -> dict[str, dict]:
    """{VEX_PREDICATE: the image's document}, validated; {} when it has nothing to say (OpenVEX needs a statement).
    scanned: what the gate's scanner found in the image (its packages join the statements' products)."""
    image, purls = image_purl(repository, digest), package_purls(sbom)
    statements = (accepted_statements(allowlist, row.fixable if row else [], image, purls, today, scanned)
                  + fixed_statements(fixed, image, purls))
    if not statements:
        return {}
    return {VEX_PREDICATE: validated(document(image, statements, timestamp), allowlist.path or "scanner-allowlist.yaml")}


def preflight(allowlist: Allowlist, today: dt.date) -> None:
    """Every kind of statement the allowlist can give, checked against the schema before anything is pushed: a
    document the schema refuses stops `publish` with exit 2 and nothing published."""
    stand_in = "CVE-0000-0000"  # a package entry's statements name the CVEs of the fixes it accepts
    fixable = [Fixable(entry.id, "all", "0", "1", (stand_in,)) for entry in allowlist.entries
               if not is_vulnerability(entry)]
    image_predicate(allowlist, RowSecurity("preflight", "", fixable=fixable), [], "preflight.invalid/image",
                    "sha256:" + "0" * 64, {}, dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), today)


def index_predicate(repository: str, digest: str, members: dict[str, dict]) -> dict[str, dict]:
    """An index's VEX: each member's statements, naming the index as a product beside the member image (a multi-arch
    tag resolves to the index, and a scanner matches what it resolved)."""
    index = {"@id": image_purl(repository, digest)}
    documents = [member["vex"] for _, member in sorted(members.items()) if member.get("vex")]
    statements = [{**statement, "products": [index, *statement["products"]]}
                  for vex in documents for statement in vex["statements"]]
    if not statements:
        return {}
    timestamp = max(vex["timestamp"] for vex in documents)
    return {VEX_PREDICATE: validated(document(index["@id"], statements, timestamp), "the index's VEX document")}


def scan_record(summary: dict, checker: Checker | None, tag: str, fixed: list[dict], today: dt.date) -> dict:
    """The catalog's record of a digest's scan: the gate's verdict, the fixable packages it carries with the oldest
    missing fix's age, and the fixes it carries that the row's previous digest lacked."""
    row = checker.judged.get(tag) if checker else None
    return {**summary, **fix_record(row, today), **({"fixed": fixed} if fixed else {})}


# ---------------------------------------------------------------------------------------------------- validation

@cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER)


def schema_problems(vex: object) -> list[str]:
    """Why the OpenVEX schema refuses vex, one line each ([] when it holds)."""
    return [f"{'/'.join(map(str, error.absolute_path)) or 'the document'}: {_described(error)}"
            for error in sorted(_validator().iter_errors(vex), key=lambda error: list(map(str, error.path)))]


def _described(error: jsonschema.ValidationError) -> str:
    """What the schema asks for, in one bounded line: an anyOf's message would quote the whole statement."""
    if error.validator in ("anyOf", "oneOf"):
        text = f"needs one of {json.dumps(error.validator_value, separators=(',', ':'))}"
    else:
        text = error.message
    return " ".join(text.split())[:200]


def validated(vex: dict, where: str) -> dict:
    """vex, once the schema holds; a VexError (exit 2, nothing signed) naming the first thing it refuses."""
    problems = schema_problems(vex)
    if problems:
        raise VexError([Problem(where, 0, f"the VEX document fails the OpenVEX schema ({problems[0]}): fix the "
                                          "allowlist entry it comes from")])
    return vex


# ------------------------------------------------------------------------------------------------ verify-image

def findings_of(reports: list[dict]) -> list[Finding]:
    """The fixable OS packages the verification reports record (publish's security index check), each once."""
    found = {Finding(str(item.get("package")), tuple(sorted(map(str, _list(item.get("cves"))))))
             for report in _with_members(reports) for item in _list(as_object(report.get("security")).get("fixable"))
             if isinstance(item, dict)}
    return sorted(found, key=lambda finding: finding.package)


def _with_members(reports: list[dict]) -> list[dict]:
    """The reports and, of an index's, each platform's whole report (where its findings are)."""
    members = [as_object(member).get("report") for report in reports
               for member in as_object(report.get("platforms")).values()]
    return [report for report in [*reports, *members] if isinstance(report, dict)]


def _list(value: object) -> list:
    """A signed report's list, as it reads: anything else (a report written by another tool) holds nothing."""
    return value if isinstance(value, list) else []


def about_image(vex: dict, digest: str) -> dict:
    """vex with only the statements that name the image of digest among their products: a signed statement about
    another image (another row's, an older digest's) explains nothing here, whatever CVE it names."""
    statements = [statement for statement in _list(vex.get("statements")) if isinstance(statement, dict)
                  and any(names_image(product, digest) for product in _list(statement.get("products")))]
    return {**vex, "statements": statements}


def names_image(product: object, digest: str) -> bool:
    """Whether an OpenVEX product is the image of digest: its @id, or its identifiers' purl, is an OCI purl
    (`pkg:oci/NAME@sha256%3A...`, as image_purl writes it and scanners read it) of that digest."""
    product = as_object(product)
    purls = (product.get("@id"), as_object(product.get("identifiers")).get("purl"))
    return any(isinstance(purl, str) and _oci_digest(purl) == digest for purl in purls)


def _oci_digest(purl: str) -> str | None:
    """The digest an OCI purl's version names; None for a purl of another type."""
    if not purl.startswith("pkg:oci/"):
        return None
    path = purl.split("?", 1)[0].split("#", 1)[0]  # the qualifiers (repository_url) may hold '@' of their own
    return unquote(path.partition("@")[2]) or None


def explained(finding: Finding, documents: list[dict], today: dt.date) -> bool:
    """Whether a signed VEX statement explains the finding: every CVE it fixes is `not_affected` or `affected` and
    not past its "accepted until" date. A fix that names no CVE cannot be matched, and is not explained."""
    names = {statement["vulnerability"].get("name") for vex in documents for statement in _list(vex.get("statements"))
             if isinstance(statement, dict) and isinstance(statement.get("vulnerability"), dict)
             and statement.get("status") in EXPLAINING and _still_accepted(statement, today)}
    return bool(finding.cves) and all(cve in names for cve in finding.cves)


def _still_accepted(statement: dict, today: dt.date) -> bool:
    until = ACCEPTED_UNTIL.search(str(statement.get("status_notes", "")))
    try:
        return until is None or dt.date.fromisoformat(until.group(1)) >= today
    except ValueError:  # not a date: it says nothing a finding can rest on
        return False


def explain(reports: list[dict], documents: list[dict], today: dt.date) -> tuple[list[Finding], list[Finding]]:
    """(explained, unexplained) findings of the reports against the VEX documents."""
    findings = findings_of(reports)
    return ([f for f in findings if explained(f, documents, today)],
            [f for f in findings if not explained(f, documents, today)])


def in_force(documents: list[dict], digest: str, today: dt.date) -> dict | None:
    """What a scanner may apply to digest, as one OpenVEX document: the statements of the signed documents that name
    its image and are not past their "accepted until" date, under the newest document's header; None when none is
    left (a scanner then suppresses nothing)."""
    statements = [statement for document in documents for statement in about_image(document, digest)["statements"]
                  if _still_accepted(statement, today)]
    return {**documents[-1], "statements": statements} if statements else None
