"""`verify-image`: is it ours, and did it pass? Checked as cosign and an admission policy check it, with no cosign.

REF resolves to the digest the registry serves now (every manifest fetched by digest is checked to be that digest).
A multi-arch tag resolves to its index, whose signature and attestations are checked, then the image the index names
for this machine's platform (`--platform`, or `all`). Each digest needs the key's signature, its three attestations,
and verification reports that meet the report rule (admission.py). The fixable OS packages the reports record are
matched with the VEX statements the keys signed (vex.py): counted as explained or not, and with
`--require no-fixable` an unexplained one refuses the digest.
"""
from __future__ import annotations

import datetime as dt
import json
import platform as host
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..model import InputError, Problem
from ..peers.registry import Manifest, RegistryClient, RegistryError, RetryPolicy
from ..peers.registry_address import image_registry, parse_registry
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..publish import multiarch
from ..reporting import DIGEST
from ..security import vex
from ..trust import admission, attestations
from ..trust.keys import PublicKey
from ..trust.signatures import Evidence, SignatureStore, gather_evidence
from ..trust.signing import load_public_key
from .commands import add_command
from .console import log
from .options import access_settings, add_access_arguments, integer

MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}
NO_FIXABLE = "no-fixable"
PLATFORM = re.compile(r"[a-z0-9]+/[a-z0-9_]+(/v[0-9]+)?", re.ASCII)


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
                "problems": self.evidence.problems, "warnings": self.evidence.warnings, "verified": self.verified}


def host_platform() -> str:
    return MACHINES.get(host.machine().lower(), f"linux/{host.machine().lower()}")


def cmd_verify_image(project: Project, args) -> int:
    keys = [load_public_key(path) for path in args.key]
    registry, reference = image_reference(args.reference)
    if args.platform != "all" and not PLATFORM.fullmatch(args.platform):
        raise InputError([Problem("--platform", 0, f"{args.platform!r} is not OS/ARCH (linux/amd64, linux/arm64) "
                                                   "or all")])
    no_fixable = NO_FIXABLE in args.require  # not a check's status: every fixable finding must be explained
    requirements = ([admission.parse_requirement(text, "check") for text in args.require if text != NO_FIXABLE]
                    + [admission.parse_requirement(text, "host") for text in args.require_host])
    client = RegistryClient(registry, access_settings(args).access(registry), RetryPolicy(retries=args.retries), log)
    try:
        manifest = client.manifest_or_none(reference)
        if manifest is None:
            print(f"error: {registry.name} has no image {reference}", file=sys.stderr)
            return EXIT_FAILED
        subjects = subjects_of(client, manifest, args.platform)
        for subject in subjects:
            check_subject(SignatureStore(client), keys, subject, requirements)
            explain_findings(subject, no_fixable, dt.date.today())
    except RegistryError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    verified = all(subject.verified for subject in subjects)
    if args.format == "json":
        top = subjects[0]
        print(json.dumps({"reference": args.reference, "keys": [key.fingerprint for key in keys],
                          "rule": admission.REPORT_RULE,
                          "requirements": [str(requirement) for requirement in requirements], **top.to_json(),
                          "platforms": {s.label: s.to_json() for s in subjects[1:]}, "verified": verified},
                         indent=2, sort_keys=True))
    else:
        for subject in subjects:
            print_subject(registry.name, ", ".join(key.fingerprint for key in keys), subject)
        print(f"{'verified' if verified else 'NOT VERIFIED'}: {args.reference} ({admission.REPORT_RULE}"
              + (f"; required: {', '.join(map(str, requirements))}" if requirements else "") + ")")
    return EXIT_OK if verified else EXIT_FAILED


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


def check_subject(store: SignatureStore, keys: list[PublicKey], subject: Subject, requirements) -> None:
    """Gather what the keys vouch for about the subject's digest and judge its verification reports."""
    problems = subject.evidence.problems
    subject.evidence = gather_evidence(store, keys, subject.digest, attestations.PREDICATE_TYPES)
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


def image_reference(text: str):
    """'HOST[:PORT]/REPO:TAG' or 'HOST[:PORT]/REPO@sha256:<hex>' -> (registry, tag or digest); exit 2 otherwise."""
    registry, reference = image_registry(text or "")
    parse_registry(registry.name, flag="REF")
    if "@" in text and not DIGEST.fullmatch(reference):
        raise InputError([Problem("REF", 0, f"{text!r}: a digest is sha256: and 64 lower-case hex digits")])
    return registry, reference


def print_subject(repository: str, fingerprint: str, subject: Subject) -> None:
    evidence = subject.evidence
    print(f"{repository}@{subject.digest}" + ("" if subject.label == "image" else f" ({subject.label})"))
    print(f"  signature: {'verified, signs ' + ', '.join(evidence.signed_as) if evidence.signed_as else 'NOT VERIFIED'}"
          f" (key {fingerprint})")
    for kind in attestations.PREDICATE_TYPES:
        found = evidence.statements.get(kind, [])
        if kind == attestations.VERIFICATION_PREDICATE and found:
            for number, verdict in enumerate(subject.reports, start=1):
                print_report(kind, number, len(subject.reports), verdict)
            continue
        print(f"  {kind}: " + (f"verified: {attestations.summary(kind, found[-1])}" if found else "NOT VERIFIED"))
    found = evidence.statements.get(vex.VEX_PREDICATE, [])
    print(f"  {vex.VEX_PREDICATE}: " + (f"verified: {sum(len(d.get('statements') or []) for d in found)} statements"
                                         if found else "none by this key (publish attests one where a finding is accepted or a fix carried)"))
    print(f"  {len(subject.explained)} findings explained, {len(subject.unexplained)} unexplained")
    for warning in evidence.warnings:
        print(f"  warning: {warning}")
    for problem in evidence.problems:
        print(f"  problem: {problem}")


def print_report(kind: str, number: int, count: int, verdict: admission.ReportVerdict) -> None:
    report = verdict.report
    which = f" (report {number} of {count})" if count > 1 else ""
    print(f"  {kind}{which}: verified: {attestations.summary(kind, report)}")
    print(f"    for {report.get('tag')} image {report.get('image_id') or '(an index)'}, verified "
          f"{report.get('verified_at')}: {'admits' if verdict.admits else 'REFUSES: ' + '; '.join(verdict.failures)}")
    for note in verdict.notes:
        print(f"    note: {note}")


def register(commands) -> None:
    checking = add_command(commands, "verify-image")
    checking.add_argument("reference", metavar="REF", help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<hex>")
    checking.add_argument("--key", type=Path, action="append", required=True, metavar="KEY.pub",
                          help="the public key the images are signed with (catalog/keys/<fingerprint>.pub); repeat it "
                               "to trust several (a key rotation): any of them may sign, and every report they "
                               "signed must pass")
    checking.add_argument("--platform", default=host_platform(), metavar="OS/ARCH",
                          help="of a multi-arch tag, also check the image for this platform, or `all` "
                               "(default: this machine's, %(default)s)")
    checking.add_argument("--require", action="append", default=[], metavar="CHECK=STATUS",
                          help="every verification report must give this check this status, e.g. gpu=passed; "
                               f"`{NO_FIXABLE}`: every fixable OS package a report records must be explained by a "
                               "signed VEX statement")
    checking.add_argument("--require-host", action="append", default=[], metavar="FIELD=VALUE",
                          help="every verification report ran on such a host: kind=gpu, gpu_model=NAME, "
                               "driver_major>=580")
    checking.add_argument("--format", choices=("text", "json"), default="text")
    checking.add_argument("--retries", type=integer, default=RetryPolicy.retries,
                          help="tries again after a transient registry error (default: %(default)s)")
    add_access_arguments(checking)
    checking.set_defaults(handler=cmd_verify_image, writes=lambda project, args: [])
