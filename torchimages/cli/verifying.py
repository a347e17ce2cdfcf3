"""`verify-image`: is it ours, and did it pass? Checked as cosign and an admission policy check it, with no cosign
(publish/verify_image.py decides; this module turns flags into its call and prints what it found)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..model import InputError, Problem
from ..peers.registry import RetryPolicy
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..publish.verify_image import NO_FIXABLE, Subject, host_platform, image_reference, verify_image
from ..security import vex
from ..trust import admission, attestations
from ..trust.referrers import SIGNATURE
from ..trust.signatures import Evidence
from ..trust.signing import load_public_key
from .commands import add_command
from .options import add_access_arguments, ask_registry, integer

PLATFORM = re.compile(r"[a-z0-9]+/[a-z0-9_]+(/v[0-9]+)?", re.ASCII)


def cmd_verify_image(project: Project, args) -> int:
    keys = [load_public_key(path) for path in args.key]
    registry, reference = image_reference(args.reference)
    if args.platform != "all" and not PLATFORM.fullmatch(args.platform):
        raise InputError([Problem("--platform", 0, f"{args.platform!r} is not OS/ARCH (linux/amd64, linux/arm64) "
                                                   "or all")])
    no_fixable = NO_FIXABLE in args.require  # not a check's status: every fixable finding must be explained
    requirements = ([admission.parse_requirement(text, "check") for text in args.require if text != NO_FIXABLE]
                    + [admission.parse_requirement(text, "host") for text in args.require_host])
    subjects = ask_registry(args, registry, reference, lambda client: verify_image(
        client, keys, reference, requirements, args.platform, no_fixable))
    if subjects is None:
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


def print_subject(repository: str, fingerprint: str, subject: Subject) -> None:
    evidence = subject.evidence
    print(f"{repository}@{subject.digest}" + ("" if subject.label == "image" else f" ({subject.label})"))
    print(f"  signature: {'verified, signs ' + ', '.join(evidence.signed_as) if evidence.signed_as else 'NOT VERIFIED'}"
          f" (key {fingerprint}){formats_of(evidence, SIGNATURE)}")
    for kind in attestations.PREDICATE_TYPES:
        found = evidence.statements.get(kind, [])
        if kind == attestations.VERIFICATION_PREDICATE and found:
            print(f"  {kind}: {len(subject.reports)} signed report(s){formats_of(evidence, kind)}")
            for number, verdict in enumerate(subject.reports, start=1):
                print_report(kind, number, len(subject.reports), verdict)
            continue
        print(f"  {kind}: " + (f"verified: {attestations.summary(kind, found[-1])}{formats_of(evidence, kind)}"
                               if found else "NOT VERIFIED"))
    found = evidence.statements.get(vex.VEX_PREDICATE, [])
    print(f"  {vex.VEX_PREDICATE}: " + (f"verified: {sum(len(d.get('statements') or []) for d in found)} statements"
                                         if found else "none by this key (publish attests one where a finding is accepted or a fix carried)"))
    print(f"  {len(subject.explained)} findings explained, {len(subject.unexplained)} unexplained")
    for warning in evidence.warnings:
        print(f"  warning: {warning}")
    for problem in evidence.problems:
        print(f"  problem: {problem}")


def formats_of(evidence: Evidence, kind: str) -> str:
    """' [classic, bundle]': the formats a statement was verified in (cosign's .sig/.att tags, Sigstore bundles)."""
    found = evidence.formats.get(kind)
    return f" [{', '.join(found)}]" if found else ""


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
