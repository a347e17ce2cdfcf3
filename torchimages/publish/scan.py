"""`scan`: a published digest through the scanner a security team runs (Trivy, offline, on the team's own database),
with exactly the VEX its publisher's key signed about that digest.

Trivy's own `trivy image --vex oci` applies whatever OpenVEX the registry holds for the digest, signed or not: anyone
who can push to the repository can attach a VEX that silences findings (Trivy's docs/docs/supply-chain/vex/oci.md
says so; it verifies nothing). Here the digest's signature and its OpenVEX attestations are verified with the key
first, in both formats (cosign's `.att` tag and Sigstore bundles among the referrers, as `verify-image` reads them);
of the verified documents, the statements that name this digest's image and are not past their "accepted until"
date are written to one file and handed to the scanner with `--vex FILE`. A VEX the registry holds that the key did
not sign about this digest (unsigned, signed by another key, about another digest) suppresses nothing and is named.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..files import atomic_write
from ..peers.registry import RegistryClient
from ..security import vex
from ..security.sbom import Finding
from ..security.trivy import TrivyReport, run_trivy
from ..trust import bundles, signing
from ..trust.keys import PublicKey, SignatureError
from ..trust.referrers import ReferrerStore
from ..trust.signatures import SignatureStore, UnreadableArtifact, attestation_tag, attested_by
from .verify_image import Subject, verify_image

DEFAULT_FAIL_ON = ("CRITICAL", "HIGH")


@dataclass
class ScanOutcome:
    """One digest scanned: what the key vouches for, the VEX handed to the scanner, what the scanner reported."""

    scanned: str  # HOST/REPO@sha256:..., the reference the scanner read
    subject: Subject
    fail_on: tuple[str, ...]
    vex_document: dict | None = None  # the verified statements in force, as handed to the scanner
    ignored_vex: list[str] = field(default_factory=list)  # VEX the registry holds that the key did not sign
    report: TrivyReport | None = None

    @property
    def signed(self) -> bool:
        return bool(self.subject.evidence.signed_as)

    @property
    def blocking(self) -> list[Finding]:
        """Findings the scanner still reports that a fix exists for, at a fail_on severity: unexplained ones."""
        left = self.report.findings if self.report else []
        return [finding for finding in left if finding.fixed and finding.severity in self.fail_on]

    @property
    def passed(self) -> bool:
        return self.signed and not self.blocking


def scan_published(client: RegistryClient, keys: list[PublicKey], reference: str, platform: str, db: Path,
                   fail_on: tuple[str, ...] = DEFAULT_FAIL_ON, vex_out: Path | None = None,
                   today: dt.date | None = None, scanner: Callable[..., TrivyReport] = run_trivy) -> ScanOutcome | None:
    """Verify reference's digest (for an index, its platform's image) with keys, then scan it with only the VEX the
    keys signed about it. None when the registry has no such image; RegistryError when it cannot be asked;
    InputError/ScannerError from the scanner (a bad database folder, Trivy's own failure)."""
    today = today or dt.date.today()
    subjects = verify_image(client, keys, reference, [], platform, today=today)
    if subjects is None:
        return None
    subject = subjects[-1]  # the image itself, or the platform's member of an index
    outcome = ScanOutcome(f"{client.registry.name}@{subject.digest}", subject, fail_on)
    documents = subject.evidence.statements.get(vex.VEX_PREDICATE, []) if outcome.signed else []
    outcome.vex_document = vex.in_force(documents, subject.digest, today)
    outcome.ignored_vex = unverified_vex(client, keys, subject.digest)
    with tempfile.TemporaryDirectory(prefix="torchimages-scan-") as work:
        path = None
        if outcome.vex_document is not None:
            path = vex_out or Path(work, "vex.json")
            atomic_write(path, json.dumps(outcome.vex_document, indent=2, sort_keys=True) + "\n")
        outcome.report = scanner(outcome.scanned, db, vex=path, source="remote", insecure=client.registry.is_loopback)
    return outcome


# ------------------------------------------------------------------------------------- what the key did not sign

def unverified_vex(client: RegistryClient, keys: list[PublicKey], digest: str) -> list[str]:
    """Each OpenVEX attestation the registry holds for digest (its .att tag, its bundle referrers) that none of keys
    signed about digest: one line each, saying it is ignored."""
    these = "this key" if len(keys) == 1 else "these keys"
    found = []
    try:
        layers, _ = SignatureStore(client).read(attestation_tag(digest), signing.ATTESTATION_MEDIA_TYPE)
    except UnreadableArtifact:
        layers = []  # verify_image has named it a problem already
    for layer in layers:
        if claims_vex(layer.data) and not any(attested_by(key, layer, digest) for key in keys):
            found.append(f"an OpenVEX attestation at {attestation_tag(digest)} that {these} did not sign about "
                         f"{digest}: ignored, it suppresses nothing")
    try:
        referrers, _ = ReferrerStore(client).read(digest)
    except UnreadableArtifact:
        referrers = []
    for referrer in referrers:
        envelope = _bundle_envelope(referrer.bundle)
        if envelope is not None and claims_vex(envelope) and not _bundle_signed(keys, referrer.bundle, digest):
            found.append(f"an OpenVEX bundle (referrer {referrer.digest}) that {these} did not sign about {digest}: "
                         "ignored, it suppresses nothing")
    return found


def claims_vex(envelope: bytes) -> bool:
    """Whether a DSSE envelope's (unverified) in-toto statement says it carries OpenVEX: only to name what is
    ignored, never to trust it."""
    try:
        statement = json.loads(base64.b64decode(json.loads(envelope)["payload"], validate=True))
        return isinstance(statement, dict) and statement.get("predicateType") == vex.VEX_PREDICATE
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError):
        return False


def _bundle_envelope(bundle: bytes) -> bytes | None:
    try:
        envelope = json.loads(bundle).get("dsseEnvelope")
    except (ValueError, AttributeError, RecursionError):
        return None
    return json.dumps(envelope).encode() if isinstance(envelope, dict) else None


def _bundle_signed(keys: list[PublicKey], bundle: bytes, digest: str) -> bool:
    for key in keys:
        try:
            bundles.open_bundle(key, bundle, digest)
        except SignatureError:
            continue
        return True
    return False
