"""Sigstore bundles on the registry as OCI referrers of the digest they sign (bundles.py makes and opens them), and
the consumer's verdict over both formats.

Writing: each bundle is an OCI manifest pushed by its digest, its `subject` the signed digest. A registry with the
referrers API lists it from then on; on one without (Debian's docker-registry 2.8, Docker Hub's v2 API), it is listed
in the referrers tag schema's index `<repo>:sha256-<hex>`, which publish reads, extends and writes back. A registry
has no compare-and-swap on tags, so as with the classic tags (signatures.py) the index is read back at once and again
after SETTLE_S, and a referrer a concurrent writer dropped is listed again: two shards publishing one digest keep each
other's referrers. A key's older statement of a kind that is replaced (a verification report, VEX) leaves the list
and its manifest is deleted.

Reading: the referrers the API lists, else those of the fallback index; a referrer that is not a bundle, or does not
open with one of the keys, is skipped with a warning, as cosign skips it. `gather_both` reads the classic set and the
bundles and gives one verdict: cosign v3 reads the bundles first and cosign 2.x the classic tags, so where both are
present they must say the same (the signature, and each predicate type's statements), and a report that fails in
either refuses the digest.
"""
from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..files import brief
from ..peers.registry import RegistryClient, RegistryError, with_retries
from ..reporting import DIGEST
from . import bundles, keys
from .signatures import (
    APPEND_TRIES,
    MAX_ARTIFACT_BYTES,
    MAX_LAYERS,
    SETTLE_S,
    Evidence,
    SignatureStore,
    UnreadableArtifact,
    as_json,
    copied_artifact,
    gather_evidence,
)

CLASSIC, BUNDLE = "classic", "bundle"
SIGNATURE_FORMATS = (CLASSIC, BUNDLE, "both")
SIGNATURE = "signature"
PUSHES_AT_ONCE = 4  # referrers pushed side by side: each is a skopeo run of a few KB  # the key under which Evidence.formats records where the signature was verified


def signing_statuses(signing: dict) -> str:
    """'signature present, attestations added, bundles added': what publish did in each format (replaced: a new
    verification report took the key's older one's place)."""
    statuses = {"signature": signing.get("signature_status"), "attestations": signing.get("attestation_status"),
                "bundles": signing.get("bundle_status")}
    return ", ".join(f"{name} {status}" for name, status in statuses.items() if status)


@dataclass(frozen=True)
class Referrer:
    digest: str  # of the referrer manifest
    bundle: bytes


class ReferrerStore:
    """The bundle referrers of digests in one repository."""

    def __init__(self, registry: RegistryClient, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        self.registry = registry
        self.now = now

    # ------------------------------------------------------------------------------------------------- listing

    def entries(self, digest: str) -> tuple[list[dict], bool]:
        """The referrers of digest (descriptors) and whether the registry's referrers API listed them (else the
        fallback index did, or nothing: ([], False))."""
        listed = self.registry.referrers(digest)
        if listed is not None:
            return self._entries_of(listed, f"{self.registry.registry.name} referrers of {digest}"), True
        manifest = self.registry.manifest_or_none(bundles.referrers_tag(digest))
        if manifest is None:
            return [], False
        return self._entries_of(manifest.body, self._where(digest)), False

    def _entries_of(self, body: bytes, where: str) -> list[dict]:
        try:
            return bundles.index_entries(body)
        except ValueError as why:
            raise UnreadableArtifact(where, f"{why}, not a referrers list") from None

    def _where(self, digest: str) -> str:
        return f"{self.registry.registry.name}:{bundles.referrers_tag(digest)}"

    def read(self, digest: str) -> tuple[list[Referrer], list[str]]:
        """The bundles referring to digest and why any referrer was left out (not a bundle, too large, damaged). All
        of them together are held to MAX_ARTIFACT_BYTES, as a .att tag's attestations are: a referrer past it is
        skipped before it is copied."""
        entries, _ = self.entries(digest)
        found: list[Referrer] = []
        skipped = []
        for entry in entries[:MAX_LAYERS]:
            artifact = entry.get("artifactType", "")
            # cosign 2.5 lists its bundles as artifactType application/vnd.oci.empty.v1+json (go-containerregistry
            # takes the config's media type): those are opened to see.
            if artifact not in (bundles.BUNDLE_MEDIA_TYPE, bundles.EMPTY_MEDIA_TYPE):
                continue  # another tool's referrer (an SBOM pushed by oras, a notation signature): not ours to read
            try:
                budget = MAX_ARTIFACT_BYTES - sum(len(referrer.bundle) for referrer in found)
                found.append(Referrer(entry["digest"], self._bundle_of(entry, budget)))
            except ValueError as why:
                skipped.append(f"{self._where(digest)}: referrer {brief(entry['digest'])} was skipped: {why}")
        if len(entries) > MAX_LAYERS:
            skipped.append(f"{self._where(digest)}: {len(entries) - MAX_LAYERS} referrers past the first {MAX_LAYERS} "
                           "not read")
        return found, skipped

    def _bundle_of(self, entry: dict, budget: int) -> bytes:
        """The bundle layer of one referrer manifest, read through the one artifact reader (copied_artifact) within
        budget bytes; a ValueError saying why it is none."""
        size = entry.get("size")
        if type(size) is not int or not 0 <= size <= MAX_ARTIFACT_BYTES:  # type(): a JSON true is no size
            raise ValueError(f"a manifest whose size is {brief(size)}, not that of a bundle referrer")
        if not DIGEST.fullmatch(entry["digest"]):  # anything else would be looked up as a tag
            raise ValueError("a digest that is not sha256: and 64 lower-case hex digits")
        with copied_artifact(self.registry, entry["digest"], budget) as folder:
            if folder is None:
                raise ValueError("the registry has no such manifest")
            layers = json.loads((folder / "manifest.json").read_bytes()).get("layers") or []
            if len(layers) != 1 or not isinstance(layers[0], dict) or \
                    layers[0].get("mediaType") not in bundles.BUNDLE_MEDIA_TYPES:
                raise ValueError("not a manifest of one Sigstore bundle")
            try:
                data = (folder / str(layers[0].get("digest", "")).removeprefix("sha256:")).read_bytes()
            except OSError:
                raise ValueError("its bundle layer was not copied") from None
        if "sha256:" + hashlib.sha256(data).hexdigest() != layers[0].get("digest"):
            raise ValueError("a bundle whose bytes are not its digest")
        return data

    # ------------------------------------------------------------------------------------------------- writing

    def attest(self, key: keys.SigningKey, digest: str, subject: dict, predicates: dict[str, dict],
               replace: frozenset[str] = frozenset()) -> str:
        """Make sure a bundle of key's for each predicate type (the signature's included) refers to digest:
        'present', 'added' or 'replaced' (key's older statement of a kind in replace gave way), as
        SignatureStore.attest does for the classic tags. subject is digest's descriptor."""
        repository, public = self.registry.registry.name, key.public
        wanted = {kind: as_json(predicate) for kind, predicate in predicates.items()}
        found, superseded = set(), []
        for referrer in self.read(digest)[0]:
            try:
                statement = bundles.open_bundle(public, referrer.bundle, digest)
            except keys.SignatureError:
                continue
            kind = statement["predicateType"]
            if kind in replace and statement.get("predicate") != wanted.get(kind):
                superseded.append(referrer.digest)
            else:
                found.add(kind)
        made = []  # (referrer manifest, bundle) of each kind missing
        for kind, predicate in wanted.items():
            if kind not in found:
                bundle = bundles.make_bundle(key, repository, digest, kind, predicate)
                made.append((bundles.referrer_manifest(subject, kind, bundle, self.now()), bundle))
        with ThreadPoolExecutor(max_workers=PUSHES_AT_ONCE) as pool:  # one small manifest and blob each
            list(pool.map(lambda pair: self._push_referrer(*pair), made))
        added = [bundles.referrer_descriptor(manifest) for manifest, _ in made]
        if not added and not superseded:
            return "present"
        _, by_api = self.entries(digest)
        if not by_api:
            self._revise_index(digest, added, set(superseded))
        for stale in superseded:
            self.registry.delete(stale)
        return "replaced" if superseded else "added"

    def _push_referrer(self, manifest: bytes, bundle: bytes) -> None:
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        with tempfile.TemporaryDirectory(prefix="torchimages-referrer-") as scratch:
            folder = Path(scratch) / "referrer"
            folder.mkdir()
            files = {"version": b"Directory Transport Version: 1.1\n", "manifest.json": manifest,
                     bundles.EMPTY_DIGEST.removeprefix("sha256:"): bundles.EMPTY_CONFIG,
                     hashlib.sha256(bundle).hexdigest(): bundle}
            for name, content in files.items():
                (folder / name).write_bytes(content)
            self.registry.write_artifact(folder, digest)

    def _revise_index(self, digest: str, added: list[dict], dropped: set[str]) -> None:
        """List added and unlist dropped in digest's fallback index, keeping what other writers listed meanwhile."""
        tag, where = bundles.referrers_tag(digest), self._where(digest)

        def revised() -> list[dict] | None:
            # Retried: a registry may answer 500 while another writer replaces the tag (docker-registry 2.8 does).
            manifest = with_retries(lambda: self.registry.manifest_or_none(tag), self.registry.policy,
                                    lambda message, delay: self.registry.log(f"{message}; retrying in {delay:g} s"))
            entries = self._entries_of(manifest.body, where) if manifest else []
            listed = {entry["digest"] for entry in entries}
            kept = [entry for entry in entries if entry["digest"] not in dropped]
            missing = [entry for entry in added if entry["digest"] not in listed]
            return None if not missing and len(kept) == len(entries) else [*kept, *missing]

        revision = revised()
        for _ in range(APPEND_TRIES):
            if revision is None:
                return
            with_retries(functools.partial(self.registry.write_referrers_index, bundles.referrers_index(revision), tag),
                         self.registry.policy,
                         lambda message, delay: self.registry.log(f"{message}; retrying in {delay:g} s"))
            revision = revised()
            if revision is None:
                time.sleep(SETTLE_S)  # a writer that read the index before this write has written by now
                revision = revised()
        if revision is not None:
            raise RegistryError(f"{where}: another writer replaced it {APPEND_TRIES} times while this one listed its "
                                "referrers; publish again", transient=False)

    def remove(self, digest: str) -> list[str]:
        """Delete digest's bundle referrers and its fallback index (prune); what was deleted."""
        entries, _ = self.entries(digest)
        removed = []
        for entry in entries:
            if entry.get("artifactType") in (bundles.BUNDLE_MEDIA_TYPE, bundles.EMPTY_MEDIA_TYPE):
                if self.registry.digest_of(entry["digest"]):
                    self.registry.delete(entry["digest"])
                    removed.append(f"referrer {entry['digest']}")
        index = self.registry.digest_of(bundles.referrers_tag(digest))
        if index:
            self.registry.delete(index)
            removed.append(bundles.referrers_tag(digest))
        return removed


# ------------------------------------------------------------------------------------------------ the consumer side

def gather_bundle_evidence(store: ReferrerStore, public_keys: list[keys.PublicKey], digest: str,
                           predicate_types) -> Evidence:
    """What the keys vouch for about digest in its bundle referrers: the signature (a cosign/sign/v1 statement)
    and each attestation, as cosign v3 reads them."""
    evidence = Evidence(digest)
    try:
        referrers, evidence.warnings = store.read(digest)
    except UnreadableArtifact as unreadable:
        evidence.problems.append(unreadable.consumer_message)
        return evidence
    signed = set()
    for referrer in referrers:
        statement = _opened(public_keys, referrer.bundle, digest)
        if statement is None:
            evidence.warnings.append(f"referrer {brief(referrer.digest)} is no bundle these keys signed about {digest}")
            continue
        if statement["predicateType"] == bundles.SIGN_PREDICATE:
            names = [subject.get("name") for subject in statement.get("subject", []) if isinstance(subject, dict)]
            # cosign v3's signature names the digest only: it is accepted wherever the digest is, as cosign does.
            signed |= {name for name in names if isinstance(name, str) and name} or {store.registry.registry.name}
            continue
        predicate = statement.get("predicate")
        evidence.statements.setdefault(statement["predicateType"], []).append(predicate if isinstance(predicate, dict)
                                                                              else {})
    evidence.signed_as = sorted(signed)
    if not signed:
        evidence.problems.append(f"no {bundles.SIGN_PREDICATE} bundle by {_these(public_keys)} for {digest}")
    for kind in predicate_types:
        if kind not in evidence.statements:
            evidence.problems.append(f"no {kind} bundle by {_these(public_keys)} for {digest}")
    return evidence


def _opened(public_keys: list[keys.PublicKey], bundle: bytes, digest: str) -> dict | None:
    hint = bundles.bundle_hint(bundle)  # the hinted key first; the hint itself is never trusted
    for key in sorted(public_keys, key=lambda key: bundles.key_hint(key) != hint):
        try:
            return bundles.open_bundle(key, bundle, digest)
        except keys.SignatureError:
            continue
    return None


def _these(public_keys: list) -> str:
    return "this key" if len(public_keys) == 1 else "these keys"


def gather_both(client: RegistryClient, public_keys: list[keys.PublicKey], digest: str, predicate_types) -> Evidence:
    """One verdict over digest's classic signature tags and its bundle referrers (see the module's note)."""
    classic = gather_evidence(SignatureStore(client), public_keys, digest, predicate_types)
    bundled = gather_bundle_evidence(ReferrerStore(client), public_keys, digest, predicate_types)
    return reconcile(classic, bundled)


def _vouches(evidence: Evidence) -> bool:
    return bool(evidence.signed_as or evidence.statements)


def reconcile(classic: Evidence, bundled: Evidence) -> Evidence:
    """The evidence of whichever format the keys vouch in (both: they must agree), each statement's formats named."""
    present = [(name, evidence) for name, evidence in ((CLASSIC, classic), (BUNDLE, bundled)) if _vouches(evidence)]
    if not present:  # nothing by these keys in either: the classic reader's words, which name the tags looked at
        classic.problems += [problem for problem in bundled.problems if "bundle" not in problem]
        classic.warnings += bundled.warnings
        return classic
    merged = Evidence(classic.digest)
    for name, evidence in present:
        merged.problems += evidence.problems
        merged.signed_as = sorted({*merged.signed_as, *evidence.signed_as})
        if evidence.signed_as:
            merged.formats.setdefault(SIGNATURE, []).append(name)
        for kind, predicates in evidence.statements.items():
            merged.formats.setdefault(kind, []).append(name)
            known = merged.statements.setdefault(kind, [])
            known += [predicate for predicate in predicates if predicate not in known]
    for name, evidence in ((CLASSIC, classic), (BUNDLE, bundled)):
        merged.warnings += evidence.warnings
        if not _vouches(evidence):
            merged.warnings += [f"{name} format: {problem}" for problem in evidence.problems]
    if len(present) == 2:
        merged.problems += disagreements(classic, bundled)
    return merged


def disagreements(classic: Evidence, bundled: Evidence) -> list[str]:
    """Where the classic set and the bundles say different things about one digest: a client reading one format
    would admit what a client reading the other refuses."""
    found = []
    if bool(classic.signed_as) != bool(bundled.signed_as):
        found.append(f"the {CLASSIC if classic.signed_as else BUNDLE} format holds a signature the "
                     f"{BUNDLE if classic.signed_as else CLASSIC} format lacks")
    elif classic.signed_as != bundled.signed_as:  # podman reads the one, Kyverno's IVP the other
        found.append(f"the formats' signatures name different repositories: classic {', '.join(classic.signed_as)}, "
                     f"bundle {', '.join(bundled.signed_as)}")
    for kind in sorted(set(classic.statements) | set(bundled.statements)):
        ours, theirs = _canonical(classic.statements.get(kind, [])), _canonical(bundled.statements.get(kind, []))
        if ours != theirs:
            found.append(f"the classic and bundle formats disagree on {kind}: {len(ours - theirs)} statement(s) only "
                         f"in the classic set, {len(theirs - ours)} only in the bundles")
    return found


def _canonical(predicates: list[dict]) -> set[str]:
    return {json.dumps(predicate, sort_keys=True) for predicate in predicates}
