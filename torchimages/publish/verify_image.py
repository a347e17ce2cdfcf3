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
from ..peers.registry import Manifest, RegistryClient
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
    members = multiarch.platforms_of(manifest.body) if manifest.media_type in multiarch.INDEX_TYPES else {}
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
    reports = subject.evidence.statements.get(attestations.VERIFICATION_PREDICATE, [])
    subject.reports, failures = admission.judge_reports(reports, requirements, subject.manifest.media_type,
                                                        subject.manifest.config_digest)
    subject.evidence.problems += failures


def explain_findings(subject: Subject, no_fixable: bool, today: dt.date) -> None:
    """Match the fixable findings the subject's reports record with the VEX statements the keys signed; with
    --require no-fixable an unexplained one keeps the subject from being verified."""
    documents = [d for d in subject.evidence.statements.get(vex.VEX_PREDICATE, []) if not vex.schema_problems(d)]
    if len(documents) < len(subject.evidence.statements.get(vex.VEX_PREDICATE, [])):
        subject.evidence.warnings.append("a signed VEX document fails the OpenVEX schema: it explains nothing")
    subject.explained, subject.unexplained = vex.explain([v.report for v in subject.reports], documents, today)
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
