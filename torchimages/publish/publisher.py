"""Stage 5: push verified images by digest (pinned <tag>-<YYYYMMDD>, floating <tag>, aliases); prune old dated tags.

The registry is the source of truth for what is published: a row is unchanged when its floating tag, its aliases
and one of its dated tags already name a manifest of this very image (its config digest is the image id). Only the
pinned tag is pushed from the engine; the floating tag and aliases are copies of its manifest by digest, so they can
only ever name a verified digest, and promotion never rebuilds. Every registry operation goes through skopeo
(peers/registry.py), which logs in and trusts CAs the way Docker does.
"""
from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import docker
import docker.errors

from ..build import debs
from ..build.bases_lock import LockedBase
from ..build.builder import INPUT_HASH_LABEL, local_name, read_wheel_record, wheel_record_path
from ..checks.selection import as_flags
from ..files import read_json_document, remove_file
from ..invocation import command
from ..model import LABEL_PREFIX, ImageSpec
from ..peers import engine
from ..peers.registry import DEFAULT_COMPRESSION, Manifest, RegistryClient, RegistryError, RetryPolicy, with_retries
from ..peers.registry_access import RegistryAccess
from ..peers.registry_address import Registry
from ..redaction import redact
from ..reporting import RowReport, utc_timestamp
from ..security import freshness, vex
from ..security import gate as security_gate
from ..security.sbom import (
    Allowlist,
    Inventory,
    SbomError,
    ScanResult,
    collect_inventory,
    cyclonedx,
    sbom_path,
    write_sbom,
)
from ..trust import attestations, bundles
from ..trust.attestations import check_counts, verified_on
from ..trust.keys import SigningKey
from ..trust.referrers import BUNDLE, CLASSIC, ReferrerStore, signing_statuses
from ..trust.signatures import SignatureStore, attestation_tag, signature_tag
from ..verify.reports import VerifyReport, read_verify_report, verify_report_path
from . import catalog_page, lazy, multiarch
from .catalog import (
    Catalog,
    CatalogEntry,
    PinnedIndex,
    PinnedTag,
    catalog_file,
    load_catalog,
    make_entry,
    make_manifest_list,
    require_sbom_folder,
    same_entry,
    save_public_key,
)

SPEC_HASH_LABEL = f"{LABEL_PREFIX}.spec-hash"
ALLOWLIST_NAME = "scanner-allowlist.yaml"


# ---------------------------------------------------------------------------------------------------- pure decisions

def verification_refusal(spec: ImageSpec, image: dict | None, report: VerifyReport | None,
                         report_path: Path) -> str | None:
    """Why this image may not be published, or None when its last verification ran every check and passed for this
    exact image id."""
    if image is None:
        # The local name carries the matrix's registry, which may be a placeholder nobody runs: say it is local.
        return (f"the local image {local_name(spec)} (a name on this engine, not pushed anywhere) is not on the "
                f"engine: build it first ({command(f'build {spec.tag}')})")
    if report is None:
        return f"never verified ({report_path} is missing): run {command(f'test {spec.tag}')}"
    if report.image_id != image["Id"]:
        return (f"the verified image {_short(report.image_id)} is not the one tagged now ({_short(image['Id'])}); "
                f"it was rebuilt since: run {command(f'test {spec.tag}')} again")
    if not report.passed:
        return f"its verification failed ({', '.join(report.with_status('failed')) or 'see the report'}): see {report_path}"
    if report.selection:  # the checks left out were never run on these bytes
        return (f"it was verified with only some checks ({as_flags(report.selection)}): publishing needs every check; "
                f"run the full {command(f'test {spec.tag}')}")
    gpu_check = report.checks.get("gpu")
    if spec.is_gpu and (gpu_check is None or gpu_check.status != "passed"):
        return (f"its GPU checks did not run ({gpu_check.message if gpu_check else 'no gpu check in the report'}): "
                f"a GPU image is published only after {command(f'test {spec.tag} --gpus all')} passes on a GPU host")
    built_from = (image.get("Config", {}).get("Labels") or {}).get(SPEC_HASH_LABEL)
    if built_from != spec.spec_hash():
        return (f"it was built from another version of its matrix row ({SPEC_HASH_LABEL}={built_from}, the matrix "
                f"now gives {spec.spec_hash()}): rebuild and verify it")
    return None


def _short(image_id: str | None) -> str:
    return (image_id or "none").removeprefix("sha256:")[:12]


DATED_TAG = re.compile(r"(.+)-([0-9]{8})(?:\.([0-9]+))?", re.ASCII)


def dated_tags(tag: str, all_tags: list[str]) -> list[str]:
    """The row's dated tags (<tag>-<YYYYMMDD>, or <tag>-<YYYYMMDD>.<n> for a later digest that day), newest first."""
    pattern = re.compile(re.escape(tag) + r"-([0-9]{8})(?:\.([0-9]+))?", re.ASCII)
    found = [(match.group(1), int(match.group(2) or 1), name) for name in all_tags if (match := pattern.fullmatch(name))]
    return [name for _, _, name in sorted(found, reverse=True)]


def new_pinned_tag(tag: str, date: str, existing: list[str]) -> str:
    """A dated tag that no digest holds yet: pinned tags never move."""
    candidates = [f"{tag}-{date}", *(f"{tag}-{date}.{n}" for n in range(2, 1000))]
    return next(name for name in candidates if name not in existing)


def pinned_date(pinned: str) -> str:
    """'2.13.0-cpu-runtime-20261121' -> '2026-11-21'."""
    match = DATED_TAG.fullmatch(pinned)
    return datetime.strptime(match.group(2), "%Y%m%d").strftime("%Y-%m-%d") if match else ""


def published_as(image_id: str, pinned_names: list[str], manifests: dict[str, Manifest],
                 same_image: Callable[[Manifest], bool] = lambda manifest: False) -> str | None:
    """The newest dated tag whose manifest is this image, if any: its config digest is the image id (gzip, Docker's
    manifest), or same_image says so (zstd: an OCI manifest, whose config is the OCI form of the engine's)."""
    return next((name for name in pinned_names if name in manifests
                 and (manifests[name].config_digest == image_id or same_image(manifests[name]))), None)


def same_config(image: dict, config: dict) -> bool:
    """Whether a registry's image config (of an OCI manifest) is the engine's image: the same layers (diff ids) and
    the same creation time, which the OCI form keeps."""
    rootfs = config["rootfs"] if isinstance(config.get("rootfs"), dict) else {}
    return (rootfs.get("diff_ids") == (image.get("RootFS") or {}).get("Layers")
            and bool(config.get("created")) and config.get("created") == image.get("Created"))


# --------------------------------------------------------------------------------------------------------- publish

@dataclass(frozen=True)
class PublishOptions:
    registry: Registry
    access: RegistryAccess
    reports_dir: Path
    catalog_dir: Path
    images_dir: Path
    date: str  # YYYYMMDD of new pinned tags
    daemon_host: str | None = None  # the engine skopeo pushes from ($DOCKER_HOST; None: the default socket)
    compression: str = DEFAULT_COMPRESSION  # of the layers pushed: gzip (every client) or zstd (registry.COMPRESSIONS)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    allowlist: Allowlist = field(default_factory=Allowlist)
    signing_key: SigningKey | None = None  # None: publish unsigned (the CLI refuses that where signing is required)
    # The OS's security index (compat.yaml's os.<name>.security); None: not consulted, and the verdict says so.
    security: freshness.Checker | None = None
    # Where the pushes' blob-info caches are kept between runs (registry.publish_cache_folder); None: this run's own.
    push_cache: Path | None = None
    # bases.lock.json's pins, by base image: the provenance names a base by its registry manifest digest.
    base_pins: dict[str, LockedBase] = field(default_factory=dict)
    # Which signature formats each signed digest gets: classic (.sig/.att tags), bundle (Sigstore bundles in OCI
    # referrers), or both (trust/referrers.SIGNATURE_FORMATS).
    signature_format: str = "both"
    lazy: str | None = None  # also a lazily pullable variant of each image (lazy.LAZY_FORMATS), beside it
    # The vulnerability database the installed scanner (trivy, else grype) reads offline at the gate; None: the
    # scanner is not run, and the verdict says so (it never downloads one).
    scanner_db: Path | None = None


@dataclass
class PublishResult:
    tag: str
    status: str  # published | unchanged | refused | failed
    digest: str = ""
    pinned: str = ""
    created: list[str] = field(default_factory=list)  # registry tags this run created
    moved: list[str] = field(default_factory=list)  # floating tags and aliases this run pointed elsewhere
    message: str = ""
    signing: dict = field(default_factory=dict)  # key fingerprint, signature and attestations: added or present
    blocking: list[str] = field(default_factory=list)  # what the security gate refused, every CVE named
    lazy: str = ""  # the lazily pullable variant's digest (publish --lazy)


class Publisher:
    """Publishes rows one at a time; a row enters the catalog only once all its tags name its digest."""

    def __init__(self, docker_client: docker.DockerClient, options: PublishOptions, log: Callable[[str], None]):
        self.client = docker_client
        self.options = options
        self.log = log
        self.registry = RegistryClient(options.registry, options.access, options.retry, log)
        self.wheel_records: dict[str, dict] = {}  # tag -> the build's wheel record, read before the first push
        # tag -> the SBOM, verification report and VEX attested to its digest (its multi-arch index's are made from
        # them) and the fixes it carries that the row's previous digest lacked
        self.attested: dict[str, dict] = {}
        self.scanned: dict[str, list] = {}  # tag -> the gate's scanner findings (sbom.Finding)
        self.predicates: dict[str, dict] = {}  # tag -> every predicate attested to its digest (its lazy variant's too)
        self.recorded: dict[str, CatalogEntry] = {}  # each row's catalog entry before this run

    def publish_all(self, specs: list[ImageSpec]) -> list[PublishResult]:
        # Every input is read before the first push: a damaged file stops the run with nothing changed.
        catalog = load_catalog(catalog_file(self.options.catalog_dir))
        self.recorded = dict(catalog.images)
        require_sbom_folder(self.options.catalog_dir)
        if self.options.signing_key is not None:  # a catalog key file that holds another key stops the run here
            save_public_key(self.options.catalog_dir, self.options.signing_key.public)
        reports = {spec.tag: read_verify_report(verify_report_path(self.options.reports_dir, spec.tag)) for spec in specs}
        self.wheel_records = {spec.tag: read_wheel_record(wheel_record_path(self.options.reports_dir, spec.tag))
                              for spec in specs}
        try:
            self.registry.ping()
            all_tags = self.registry.tags()
        except RegistryError as error:
            return [PublishResult(spec.tag, "failed", message=f"nothing published: {error}") for spec in specs]
        results: list[PublishResult] = []
        grouped = multiarch.groups(specs)
        with self.registry.pushes_share_a_cache(self.options.push_cache):
            for spec in specs:
                if results and results[-1].status == "failed" and not self.registry.answers():
                    results.append(PublishResult(spec.tag, "failed",
                                                 message="not attempted: the registry stopped answering"))
                    continue
                targets = multiarch.image_tags(spec, (spec.index_tag or spec.tag) in grouped)
                result = self._publish_guarded(spec, catalog, all_tags, reports[spec.tag], targets)
                results.append(result)
                all_tags = sorted(set(all_tags) | set(result.created))
        by_tag = {result.tag: result for result in results}
        for tag, members in grouped.items():
            results.append(self._publish_index_guarded(tag, members, [by_tag[spec.tag] for spec in members], catalog,
                                                       all_tags))
        return results

    def _publish_index_guarded(self, tag: str, members: list[ImageSpec], published: list[PublishResult],
                               catalog: Catalog, all_tags: list[str]) -> PublishResult:
        """The row's tag as an image index over its per-arch images, once every one of them is published."""
        name = f"{tag} (manifest list)"
        missing = [result.tag for result in published if result.status not in ("published", "unchanged")]
        if missing:
            return PublishResult(name, "refused", message=f"not written: {', '.join(missing)} not published, and the "
                                                          f"tag names every architecture or none")
        try:
            return self._publish_index(name, tag, members, published, catalog, all_tags)
        except RegistryError as error:
            return PublishResult(name, "failed", message=f"{redact(str(error))} (nothing recorded for {tag})")

    def _publish_index(self, name: str, tag: str, members: list[ImageSpec], published: list[PublishResult],
                       catalog: Catalog, all_tags: list[str]) -> PublishResult:
        """Write the index under a dated tag of the row's tag (unless one names it already), then under the row's tag
        and aliases; as an image's pinned tag, the dated one never moves, so a pin of it outlives the next publish."""
        manifests = {spec.tag: self.registry.manifest(result.digest) for spec, result in zip(members, published, strict=True)}
        entries = [multiarch.Member(spec.platform, multiarch.arch_tag(spec), manifest.digest, manifest.media_type,
                                    len(manifest.body)) for spec, manifest in ((s, manifests[s.tag]) for s in members)]
        body = multiarch.index_body(entries)
        targets, digest = multiarch.index_tags(members), "sha256:" + hashlib.sha256(body).hexdigest()
        pinned_names = dated_tags(tag, all_tags)
        current = self.registry.tag_digests(targets + pinned_names)
        # A dated tag naming this very index already: an identical republish writes nothing.
        pinned = next((dated for dated in pinned_names if current.get(dated) == digest), None)
        result = PublishResult(name, "unchanged", digest, pinned or new_pinned_tag(tag, self.options.date, all_tags),
                               message="already published")
        # Signed and attested before any tag names it, as an image is: a cluster resolves the row's tag to this digest.
        subject = {"mediaType": multiarch.INDEX_MEDIA_TYPE, "digest": digest, "size": len(body)}
        result.signing = self._attach_index(tag, subject, {
            entry.platform: {"digest": entry.digest, "tag": entry.tag, **self.attested.get(spec.tag, {})}
            for spec, entry in zip(members, entries, strict=True)})
        for target in [result.pinned, *targets]:  # the dated tag first: a floating tag names only a pinned digest
            if current.get(target) != result.digest:
                self.registry.write_index(body, target)
                (result.moved if target in current else result.created).append(target)
                self.log(f"{self.options.registry.name}:{target} -> {result.digest} (manifest list: "
                         f"{', '.join(entry.platform for entry in entries)})")
        if result.created or result.moved:
            result.status, result.message = "published", f"manifest list over {', '.join(e.platform for e in entries)}"
        previous = catalog.manifest_lists.get(tag)
        index = make_manifest_list(
            tag, self.options.registry.name, result.digest, targets,
            {entry.platform: {**entry.to_json(), "image": spec.tag} for spec, entry in zip(members, entries, strict=True)},
            PinnedIndex(result.pinned, result.digest, pinned_date(result.pinned)), previous, result.signing)
        if previous is None or not same_entry(previous, index):
            catalog.manifest_lists[tag] = index
            catalog_page.save(catalog, self.options.catalog_dir, self.options.images_dir)
        return result

    def _attach_index(self, tag: str, subject: dict, members: dict[str, dict]) -> dict:
        """Sign an index digest and attest it as an image's is (attestations.index_*: made from its members' own);
        {} when publishing unsigned. subject: the index's descriptor (no tag names it yet)."""
        key = self.options.signing_key
        if key is None:
            return {}
        digest = subject["digest"]
        repository = self.options.registry.name
        predicates = {
            attestations.SBOM_PREDICATE: attestations.index_sbom(tag, repository, digest, members),
            attestations.PROVENANCE_PREDICATE: attestations.index_provenance_predicate(tag, members),
            attestations.VERIFICATION_PREDICATE: attestations.index_verification_predicate(tag, members),
            **vex.index_predicate(repository, digest, members),
        }
        signed = self._sign_and_attest(key, digest, predicates, subject)
        self.log(f"{tag} (manifest list): {signing_statuses(signed)} ({key.public.fingerprint})")
        return signed

    def _sign_and_attest(self, key: SigningKey, digest: str, predicates: dict[str, dict],
                         subject: dict | None = None) -> dict:
        """key's signature and attestations of digest on the registry, in the formats asked (classic tags, bundle
        referrers, or both: cosign 2.x and podman read the one, cosign v3, Kyverno's ImageValidatingPolicy and Trivy
        the other); what is there by this key stays, its older verification report and VEX give way to new ones. The
        signing record publish returns and the catalog keeps. subject: digest's descriptor (default: read from the
        registry, where the image is by now; an index is signed before it is written, and says its own)."""
        formats = self.options.signature_format
        replace = frozenset({attestations.VERIFICATION_PREDICATE, vex.VEX_PREDICATE})
        record = {"key": key.public.fingerprint, "predicate_types": sorted(predicates), "signature_format": formats}
        jobs = {}
        with ThreadPoolExecutor(max_workers=3) as pool:  # tags and referrers of their own: written side by side
            if formats in (CLASSIC, "both"):
                store = SignatureStore(self.registry)
                record.update(signature=signature_tag(digest), attestation=attestation_tag(digest))
                jobs["signature_status"] = pool.submit(store.sign, key, digest)
                jobs["attestation_status"] = pool.submit(store.attest, key, digest, predicates, replace)
            if formats in (BUNDLE, "both"):
                if subject is None:
                    manifest = self.registry.manifest(digest)
                    subject = {"mediaType": manifest.media_type, "digest": digest, "size": len(manifest.body)}
                record["referrers"] = bundles.referrers_tag(digest)
                jobs["bundle_status"] = pool.submit(ReferrerStore(self.registry).attest, key, digest, subject,
                                                    {bundles.SIGN_PREDICATE: {}, **predicates}, replace)
            record.update({name: job.result() for name, job in jobs.items()})
        return record

    def _publish_guarded(self, spec: ImageSpec, catalog: Catalog, all_tags: list[str],
                         report: VerifyReport | None, targets: list[str]) -> PublishResult:
        try:
            return self._publish_one(spec, catalog, all_tags, report, targets)
        except (RegistryError, docker.errors.APIError, SbomError) as error:
            return PublishResult(spec.tag, "failed", message=f"{redact(str(error))} (nothing recorded for {spec.tag})")

    def _publish_one(self, spec: ImageSpec, catalog: Catalog, all_tags: list[str],
                     report: VerifyReport | None, targets: list[str]) -> PublishResult:
        """Push one image under a new pinned tag (unless the registry has it), sign it, and move targets (its floating
        tags) to it."""
        image = engine.inspect_image(self.client, local_name(spec))
        refusal = verification_refusal(spec, image, report, verify_report_path(self.options.reports_dir, spec.tag))
        if refusal:
            return PublishResult(spec.tag, "refused", message=refusal)
        assert image is not None and report is not None  # verification_refusal refuses a missing image or report

        own = targets[0]  # multiarch.image_tags puts the image's own tag first: its pinned tags are dated from it
        pinned_names = dated_tags(own, all_tags)
        manifests = self.registry.tag_manifests(targets + pinned_names)
        current = {name: manifest.digest for name, manifest in manifests.items()}
        pinned = published_as(image["Id"], pinned_names, manifests, lambda manifest: self._same_image(image, manifest))
        digest = current[pinned] if pinned else ""
        on_record = verified_on(report)
        if pinned and all(current.get(name) == digest for name in targets):
            unchanged = PublishResult(spec.tag, "unchanged", digest, pinned, message="already published")
            unchanged.signing = self._attach(spec, image, report, unchanged)
            self._record(spec, catalog, image, report, on_record, manifests[pinned], None, unchanged, targets)
            return unchanged

        # Read before anything moves on the registry, so that what can fail has failed by then.
        inventory = collect_inventory(self.client, image["Id"])
        scan = self._scan(spec, inventory)
        if scan.status == "failed":  # one line; every finding, each with all its CVEs, in the publish report
            return PublishResult(spec.tag, "refused", blocking=[str(finding) for finding in scan.blocking],
                                 message=f"{scan.message}; every CVE: {self.options.reports_dir / PUBLISH_REPORT.name}")
        result = PublishResult(spec.tag, "published", message=scan.message)
        if pinned is None:
            pinned = new_pinned_tag(own, self.options.date, all_tags)
            digest = self._push(image["Id"], spec.tag, pinned)
            result.created.append(pinned)
        result.digest, result.pinned = digest, pinned
        # Signed before any floating tag moves to it; a digest this run pushed goes again if it cannot be signed.
        try:
            result.signing = self._attach(spec, image, report, result, inventory)
        except (RegistryError, SbomError, vex.VexError) as error:
            if pinned in result.created and digest not in current.values():
                self._withdraw(digest, pinned)
                remove_file(sbom_path(self.options.catalog_dir, pinned), self.options.catalog_dir)
            raise RegistryError(f"{error}; not signed, so no tag names it", transient=False) from None
        if self.options.lazy:
            result.lazy = self._lazy_variant(spec, image, result)
        manifest = self.registry.manifest(digest)
        for name in targets:
            if current.get(name) != digest:
                self._promote(name, manifest)
                (result.moved if name in current else result.created).append(name)
        security = vex.scan_record(scan.summary(), self.options.security, spec.tag,
                                         self.attested.get(spec.tag, {}).get("fixed", []), datetime.now().date())
        self._record(spec, catalog, image, report, on_record, manifest, security, result, targets, inventory)
        return result

    def _scan(self, spec: ImageSpec, inventory: Inventory) -> ScanResult:
        """One verdict from the OS's security index (fixable OS updates) and trivy or grype where installed and given
        a database (offline)."""
        allowlist, today = self.options.allowlist, datetime.now().date()
        fixes = security_gate.gate(self.options.security, spec.tag, spec.os, inventory.debs, allowlist, today,
                               inventory.apt_suites)
        scanned = security_gate.scan_image(local_name(spec), allowlist, self.options.scanner_db)
        self.scanned[spec.tag] = scanned.findings  # the packages the VEX statements name
        return security_gate.merge([fixes, scanned])

    def _attach(self, spec: ImageSpec, image: dict, report: VerifyReport, result: PublishResult,
                inventory: Inventory | None = None) -> dict:
        """Sign result.digest and attest its SBOM, build provenance and verification report at the registry (what
        is there already by this key stays, nothing is added twice, and a report of a new verification replaces the
        key's older one); {} when publishing unsigned."""
        key = self.options.signing_key
        if key is None:
            return {}
        sbom, today = self._sbom(result, image, inventory), datetime.now().date()
        row = vex.security_row(self.options.security, spec.tag, spec.os, sbom)
        previous = self.recorded.get(spec.tag)
        fixed = vex.fixed_since(previous.digest if previous else None, previous.scan if previous else {},
                                      result.digest, sbom)
        predicates = {
            attestations.SBOM_PREDICATE: sbom,
            attestations.PROVENANCE_PREDICATE: attestations.provenance_predicate(
                spec, image, self._wheels(spec, image), self.options.base_pins.get(spec.base_image),
                debs.image_pins(self.client.api, image["Id"]), engine.daemon_info(self.client).get("ServerVersion", "")),
            attestations.VERIFICATION_PREDICATE: attestations.verification_predicate(
                spec, image["Id"], report, freshness.fix_record(row, today)),
            **vex.image_predicate(self.options.allowlist, row, fixed, self.options.registry.name, result.digest,
                                  sbom, report.finished_at or utc_timestamp(), today, self.scanned.get(spec.tag, [])),
        }
        self.attested[spec.tag] = {"sbom": sbom, "report": predicates[attestations.VERIFICATION_PREDICATE],
                                   "vex": predicates.get(vex.VEX_PREDICATE), "fixed": fixed}
        self.predicates[spec.tag] = predicates
        signed = self._sign_and_attest(key, result.digest, predicates)
        self.log(f"{spec.tag}: {signing_statuses(signed)}; signed with key {key.public.fingerprint}")
        return signed

    def _lazy_variant(self, spec: ImageSpec, image: dict, result: PublishResult) -> str:
        """The image's eStargz variant under its pinned tag + LAZY_SUFFIX (written once: a pinned tag's image never
        changes), signed and attested as the image is; its digest."""
        tag = lazy.lazy_tag(result.pinned)
        there = self.registry.digest_of(tag)
        if there:
            return there
        self.log(f"{spec.tag}: making its eStargz variant (every layer converted; minutes for a CUDA row)")
        folder = Path(tempfile.mkdtemp(prefix="torchimages-lazy-"))
        try:
            prefetch = lazy.prefetch_by_layer(self.options.reports_dir, spec.tag, image["Id"])
            cuts = lazy.cuts_by_layer(self.options.reports_dir, spec.tag, image["Id"])
            variant = lazy.write_variant(self.client.api, image["Id"], prefetch, folder, cuts)
            self.registry.write_artifact(folder, tag)
        finally:
            lazy.remove_work(folder)
        result.created.append(tag)
        key = self.options.signing_key
        if key is not None:
            predicates = lazy.variant_predicates(self.predicates[spec.tag], result.digest)
            self._sign_and_attest(key, variant.digest, predicates)
        self.log(f"{spec.tag}: {tag}: {variant.summary()}"
                 + ("" if prefetch else f"; no start-up set measured (`torchimages startup-set {spec.tag}`)"))
        return variant.digest

    def _sbom(self, result: PublishResult, image: dict, inventory: Inventory | None) -> dict:
        """The CycloneDX SBOM of result.pinned, as the catalog holds it."""
        path = self._ensure_sbom(result, image, inventory)
        document = read_json_document(path, "delete it: publish writes it again", default=None)
        if not isinstance(document, dict):
            raise SbomError(f"{path} is not a CycloneDX document: delete it, publish writes it again")
        return document

    def _ensure_sbom(self, result: PublishResult, image: dict, inventory: Inventory | None) -> Path:
        """catalog/sbom/<pinned>.cdx.json, made from the image's inventory where it is not there yet."""
        path = sbom_path(self.options.catalog_dir, result.pinned)
        if not path.is_file():
            inventory = inventory or collect_inventory(self.client, image["Id"])
            write_sbom(path, cyclonedx(inventory, self.options.registry.name, result.digest,
                                                             image["Id"], utc_timestamp()))
        return path

    def _wheels(self, spec: ImageSpec, image: dict) -> list[dict]:
        """The wheels the build recorded for this image's inputs (reports/<tag>/wheels.json), else none."""
        record = self.wheel_records.get(spec.tag) or {}
        labels = (image.get("Config") or {}).get("Labels") or {}
        return record["wheels"] if record and record["input_hash"] == labels.get(INPUT_HASH_LABEL) else []

    def _withdraw(self, digest: str, pinned: str) -> None:
        """Delete a digest this run pushed and could not sign: no tag may name an unsigned digest, and no signature or
        bundle of one the other format did write outlives it."""
        try:
            for store in (SignatureStore(self.registry), ReferrerStore(self.registry)):
                try:
                    store.remove(digest)
                except RegistryError:  # what refused the one format may refuse its removal too: the digest still goes
                    pass
            self.registry.delete(digest)
            self.log(f"{self.options.registry.name}:{pinned}: deleted again, it could not be signed")
        except RegistryError as error:
            self.log(f"{self.options.registry.name}:{pinned} could not be signed nor deleted ({error}): delete it")

    def _same_image(self, image: dict, manifest: Manifest) -> bool:
        """An OCI manifest with zstd layers is this image when its config is (read only for such manifests)."""
        if manifest.config_digest == image["Id"] or manifest.compression() != "zstd":
            return False
        return same_config(image, self.registry.image_config(manifest.digest))

    def _push(self, image_id: str, tag: str, pinned: str) -> str:
        """Push image_id as repository:pinned; return the manifest digest, as the registry confirms it, after checking
        that every layer it holds is compressed as asked."""
        repository = self.options.registry.name
        compression = self.options.compression
        self.log(f"{tag}: pushing {repository}:{pinned} ({compression} layers)")
        pushed = with_retries(lambda: self.registry.push(image_id, pinned, self.options.daemon_host, compression),
                              self.options.retry,
                              lambda message, delay: self.log(f"{tag}: {message}; retrying in {delay:g} s"))
        stored = self.registry.manifest_or_none(pinned)
        if stored is None or stored.digest != pushed:
            raise RegistryError(f"{repository}:{pinned}: the push reported {pushed} but the registry has "
                                f"{stored.digest if stored else None}", transient=False)
        if stored.compression() != compression:
            found = ", ".join(sorted(set(stored.layer_media_types)))
            raise RegistryError(f"{repository}:{pinned}: asked for {compression} layers, the registry holds {found}; "
                                f"no floating tag was moved to it (delete the tag, then publish again)", transient=False)
        return pushed

    def _promote(self, name: str, manifest: Manifest) -> None:
        self.registry.copy_tag(manifest.digest, name)
        stored = self.registry.digest_of(name)
        if stored != manifest.digest:
            raise RegistryError(f"{name}: the registry has {stored}, not the verified {manifest.digest}", transient=False)
        self.log(f"{self.options.registry.name}:{name} -> {manifest.digest}")

    def _record(self, spec: ImageSpec, catalog: Catalog, image: dict, report: VerifyReport, on_record: dict,
                manifest: Manifest, scan: dict | None, result: PublishResult, floating: list[str],
                inventory: Inventory | None = None) -> None:
        """Put the row (with its SBOM) in the catalog; write catalog.json and images/README.md if anything changed."""
        folder = self.options.catalog_dir
        sbom_file = self._ensure_sbom(result, image, inventory)
        pinned = PinnedTag(result.pinned, result.digest, pinned_date(result.pinned),
                                         sbom_file.relative_to(folder).as_posix())
        previous = catalog.images.get(spec.tag)
        if self.options.signing_key is not None:
            save_public_key(folder, self.options.signing_key.public)
        entry = make_entry(spec, self.options.registry.name, result.digest, image,
                                         manifest.download_size, check_counts(report), pinned, previous, scan,
                                         on_record, result.signing, floating)
        if previous is not None and same_entry(previous, entry):
            return
        catalog.images[spec.tag] = entry
        catalog_page.save(catalog, folder, self.options.images_dir)


# ----------------------------------------------------------------------------------------------------------- prune

# ---------------------------------------------------------------------------------------------------- the report

PUBLISH_REPORT = RowReport("publish-report.json", PublishResult, "publish report",
                           "delete it: it only records past publish runs, the registry and catalog hold the truth")


def write_publish_report(reports_dir: Path, results: list[PublishResult]) -> Path:
    """Merge this run into reports/publish-report.json, keeping entries of rows not published this time."""
    entries = PUBLISH_REPORT.read(reports_dir)
    entries.update({result.tag: asdict(result) for result in results})
    return PUBLISH_REPORT.write(reports_dir, entries)
