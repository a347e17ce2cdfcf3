"""A published image checked the way a consumer checks it (`verify-image`), as a library call: REF resolved to the
digest the registry serves now (every manifest fetched by digest is checked to be that digest); a multi-arch tag's
index checked, then the image it names for a platform (or all). Each digest needs the key's signature, its three
attestations (in cosign's classic tags, in Sigstore bundle referrers, or in both saying the same: trust/referrers.py), and verification reports that meet the report rule (trust/admission.py). The fixable OS packages the
reports record are matched with the VEX statements the keys signed (security/vex.py): counted as explained or not,
and with `no_fixable` an unexplained one refuses the digest. Nothing here prints: cli/verifying.py does."""
from __future__ import annotations

import datetime as dt
import platform as host
from dataclasses import dataclass, field

from ..model import InputError, Problem
from ..peers.registry import Manifest, RegistryClient, RegistryError
from ..peers.registry_address import Registry, image_registry, parse_registry
from ..reporting import DIGEST
from ..security import vex
from ..trust import admission, attestations
from ..trust.keys import PublicKey
from ..trust.referrers import gather_both
from ..trust.signatures import Evidence
from . import multiarch

MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}
NO_FIXABLE = "no-fixable"


@dataclass
class Subject:
    """One digest checked: the one REF names, or a platform's image in the index REF names."""

    label: str  # "image", "index", or the member's platform
    digest: str
    manifest: Manifest
    evidence: Evidence = field(default_factory=lambda: Evidence(""))
    reports: list[admission.ReportVerdict] = field(default_factory=list)
    explained: list[vex.Finding] = field(default_factory=list)  # findings the reports record that signed VEX explains
    unexplained: list[vex.Finding] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.evidence.holds(attestations.PREDICATE_TYPES)

    def to_json(self) -> dict:
        return {"digest": self.digest, "signed_as": self.evidence.signed_as,
                "predicates": {kind: self.evidence.latest(kind) for kind in self.evidence.statements},
                "reports": [{"tag": v.report.get("tag"), "image_id": v.report.get("image_id"),
                             "verified_at": v.report.get("verified_at"), "result": v.report.get("result"),
                             "host": v.report.get("host"), "admits": v.admits, "failures": v.failures,
                             "notes": v.notes} for v in self.reports],
                "findings": {"explained": list(map(str, self.explained)), "unexplained": list(map(str, self.unexplained))},
                "formats": self.evidence.formats, "problems": self.evidence.problems, "warnings": self.evidence.warnings, "verified": self.verified}


def host_platform() -> str:
    return MACHINES.get(host.machine().lower(), f"linux/{host.machine().lower()}")


def verify_image(client: RegistryClient, keys: list[PublicKey], reference: str,
                 requirements: list[admission.Requirement], platform: str, no_fixable: bool = False,
                 today: dt.date | None = None) -> list[Subject] | None:
    """The subjects reference names on the client's registry (the digest, and for an index the platform's images),
    each judged: `all(subject.verified ...)` is the verdict. None when the registry has no such image; a
    RegistryError when it cannot be asked."""
    manifest = client.manifest_or_none(reference)
    if manifest is None:
        return None
    subjects = subjects_of(client, manifest, platform)
    for subject in subjects:
        check_subject(client, keys, subject, requirements)
        explain_findings(subject, no_fixable, today or dt.date.today())
    return subjects


def subjects_of(client: RegistryClient, manifest: Manifest, wanted: str) -> list[Subject]:
    """The digest REF names and, for an index, the member images of the platforms wanted (`all`, or one)."""
    try:
        members = multiarch.platforms_of(manifest.body) if manifest.media_type in multiarch.INDEX_TYPES else {}
    except ValueError as why:
        raise RegistryError(f"{client.registry.name}@{manifest.digest} holds {why}: nothing in it was checked",
                            transient=False) from None
    if not members:
        return [Subject("image", manifest.digest, manifest)]
    index = Subject("index", manifest.digest, manifest)
    chosen = sorted(members) if wanted == "all" else [wanted]
    missing = [name for name in chosen if name not in members]
    if missing:
        index.evidence.problems.append(f"the index has no {', '.join(missing)} image (it has {', '.join(sorted(members))})")
    return [index, *(Subject(name, members[name], client.manifest(members[name])) for name in chosen
                     if name in members)]


def check_subject(client: RegistryClient, keys: list[PublicKey], subject: Subject, requirements) -> None:
    """Gather what the keys vouch for about the subject's digest, in both formats, and judge its verification reports
    (every one either format holds: a failed one in either refuses)."""
    problems = subject.evidence.problems
    subject.evidence = gather_both(client, keys, subject.digest, attestations.PREDICATE_TYPES)
    subject.evidence.problems[:0] = problems
    keep_readable_statements(subject.evidence, requirements, subject.manifest)
    reports = subject.evidence.statements.get(attestations.VERIFICATION_PREDICATE, [])
    subject.reports, failures = admission.judge_reports(reports, requirements, subject.manifest.media_type,
                                                        subject.manifest.config_digest)
    subject.evidence.problems += failures


# What goes wrong when code that reads a predicate of ours meets one of another shape (a list where an object belongs,
# a number where a string does, an integer too large for a float).
OTHER_SHAPE = (TypeError, AttributeError, KeyError, ValueError, OverflowError)


def keep_readable_statements(evidence: Evidence, requirements: list[admission.Requirement], manifest: Manifest) -> None:
    """The one place verify-image reads what a key signed: each statement is read as it will be (summarized, and a
    report judged), and one of another shape than publish writes is taken out, a problem named, so that it refuses
    the digest in one line rather than failing the run where it is shown."""
    for kind, predicates in list(evidence.statements.items()):
        readable = []
        for predicate in predicates:
            try:
                if kind != vex.VEX_PREDICATE:  # VEX is read by its schema (explain_findings)
                    attestations.summary(kind, predicate)
                if kind == attestations.VERIFICATION_PREDICATE:
                    admission.judge_report(predicate, requirements, manifest.media_type, manifest.config_digest)
            except OTHER_SHAPE as error:
                evidence.problems.append(f"a signed {kind} statement of another shape than publish writes "
                                         f"({type(error).__name__}): it vouches for nothing")
                continue
            readable.append(predicate)
        if readable:
            evidence.statements[kind] = readable
        else:  # none read: the type is as absent as unsigned (Evidence.holds asks for the key)
            del evidence.statements[kind]


def explain_findings(subject: Subject, no_fixable: bool, today: dt.date) -> None:
    """Match the fixable findings the subject's reports record with the VEX statements the keys signed (those that
    name this digest); with --require no-fixable an unexplained one keeps the subject from being verified. A document
    the OpenVEX schema refuses explains nothing, and is not kept to be shown either."""
    signed = subject.evidence.statements.pop(vex.VEX_PREDICATE, [])
    documents = [document for document in signed if not vex.schema_problems(document)]
    if len(documents) < len(signed):
        subject.evidence.warnings.append("a signed VEX document fails the OpenVEX schema: it explains nothing")
    if documents:
        subject.evidence.statements[vex.VEX_PREDICATE] = documents
    about_this_image = [vex.about_image(document, subject.digest) for document in documents]
    subject.explained, subject.unexplained = vex.explain([v.report for v in subject.reports], about_this_image, today)
    if no_fixable and subject.unexplained:
        subject.evidence.problems.append(f"{len(subject.unexplained)} fixable finding(s) no signed VEX statement "
                                         f"explains ({'; '.join(map(str, subject.unexplained))}): --require "
                                         f"{NO_FIXABLE}")


def image_reference(text: str) -> tuple[Registry, str]:
    """'HOST[:PORT]/REPO:TAG' or 'HOST[:PORT]/REPO@sha256:<hex>' -> (registry, tag or digest); exit 2 otherwise.
    A login in text is refused first, with text shown without it, so no later message can quote it."""
    from ..files import brief
    from ..peers.registry_address import TAG_PATTERN, refuse_login
    form = "HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<hex> alone"
    refuse_login(text, "REF", form)
    if "://" in (text or ""):
        raise InputError([Problem("REF", 0, f"REF {brief(text)} is a URL: give {form}, without a scheme")])
    registry, reference = image_registry(text or "")
    parse_registry(registry.name, flag="REF")
    if "@" in text and not DIGEST.fullmatch(reference):
        # Only the digest is quoted: were what precedes the '@' a login after all, it stays unshown.
        raise InputError([Problem("REF", 0, f"REF digest {brief(reference)}: a digest is sha256: and 64 lower-case hex "
                                            "digits")])
    if "@" not in text and not TAG_PATTERN.fullmatch(reference):
        raise InputError([Problem("REF", 0, f"REF {brief(text)}: a tag is up to 128 letters, digits, '_', '.' or '-' "
                                            f"({form})")])
    return registry, reference
