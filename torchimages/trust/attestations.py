"""What a published digest's three attestations say: its CycloneDX SBOM (security/sbom.py writes it), SLSA v1 build provenance,
and the result of its verification, a predicate type of this project's own. Pure functions of what publish has read.

A consumer's policy reads these fields (docs/policies/): keep them stable, and move
VERIFICATION_PREDICATE to a /v2 when one changes its meaning.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from ..build.bases_lock import LockedBase
from ..build.builder import INPUT_HASH_LABEL
from ..build.debs import PinnedDeb
from ..model import ImageSpec
from ..reporting import as_object

SBOM_PREDICATE = "https://cyclonedx.org/bom"  # cosign's `--type cyclonedx`
PROVENANCE_PREDICATE = "https://slsa.dev/provenance/v1"  # cosign's `--type slsaprovenance1`
VERIFICATION_PREDICATE = "https://torchimages.io/verification-report/v1"
PREDICATE_TYPES = (SBOM_PREDICATE, PROVENANCE_PREDICATE, VERIFICATION_PREDICATE)  # what every signed digest carries
# The fourth, where there is a finding to explain or a fix carried (security/vex.py): cosign's `--type openvex` (cosign 2.5,
# cmd/cosign/cli/options/predicate.go).
VEX_PREDICATE = "https://openvex.dev/ns"
# cosign's names for --type, where it has one (`cosign verify-attestation --type NAME`).
COSIGN_TYPE_NAMES = {SBOM_PREDICATE: "cyclonedx", PROVENANCE_PREDICATE: "slsaprovenance1",
                     VERIFICATION_PREDICATE: VERIFICATION_PREDICATE, VEX_PREDICATE: "openvex"}
BUILDER_ID = "https://torchimages.io/builder/v1"
BUILD_TYPE = "https://torchimages.io/build/v1"
INDEX_BUILD_TYPE = "https://torchimages.io/index/v1"


def tool_version() -> str:
    try:
        return version("torchimages")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def matrix_row(spec: ImageSpec) -> dict:
    """The resolved matrix row the image was built from (not where it sits in matrix.yaml)."""
    return {key: value for key, value in spec.to_json().items() if key != "matrix_line"}


def verification_predicate(spec: ImageSpec, image_id: str, report, security: dict | None = None) -> dict:
    """Each check's status and reason, the host they ran on, the tool: what a policy can require, e.g. that `gpu`
    passed on an H100 with driver >= 580 (host.gpu_models, host.driver_major). With the security index's verdict
    at publish (security.fix_record): the fixable OS packages the image carries and the age of the oldest fix it
    lacks, which `verify-image` matches with the VEX statements. The host is the one the verify stage judged
    (VerifyReport.host): publish signs what verify decided and never reads the probe's raw facts."""
    return {
        "tool": {"name": "torchimages", "version": tool_version()},
        "tag": spec.tag,
        "image_id": image_id,
        "result": "passed" if report.passed else "failed",
        "verified_at": report.finished_at,
        "host": report.host,
        "checks": {name: {"status": verdict.status, "reason": verdict.message, "warnings": list(verdict.warnings),
                          "blame": verdict.blame}
                   for name, verdict in sorted(report.checks.items())},
        **({"security": security} if security else {}),
    }


def check_counts(report) -> dict:
    """Verification as the catalog shows it: counts by status, skipped checks with their reasons, when."""
    return {
        **{status: len(report.with_status(status)) for status in ("passed", "failed", "skipped")},
        "skipped_checks": {name: report.checks[name].message for name in report.with_status("skipped")},
        "verified_at": report.finished_at,
    }


def verified_on(report) -> dict:
    """What kind of host the checks ran on (a CPU-only CI host, or a GPU runner with its GPU models and driver),
    which checks ran there and which were skipped; on a GPU host whether it was healthy (None: not read) and the
    speed figures (bf16 TFLOPS, pinned copies and all-reduce bus bandwidth in GB/s; None: not measured), as the
    verify stage judged them (VerifyReport.host)."""
    host = report.host
    on_gpu = host.get("kind") == "gpu"
    speed = host.get("performance") or {}
    return {
        "host": "gpu" if on_gpu else "cpu-only",
        "gpu_models": list(host.get("gpu_models") or []) if on_gpu else [],
        "driver": str(host.get("driver") or "") if on_gpu else "",
        "ran": report.with_status("passed"),
        "skipped": report.with_status("skipped"),
        "healthy": (host.get("health") or {}).get("healthy") if on_gpu else None,
        "performance": {"bf16_tflops": speed["bf16_matmul"]["tflops"], "h2d_gbps": speed["pinned_copies"]["h2d_gbps"],
                        "d2h_gbps": speed["pinned_copies"]["d2h_gbps"],
                        "all_reduce_busbw_gbps": speed["all_reduce"]["busbw_gbps"]} if on_gpu else {},
    }


def provenance_predicate(spec: ImageSpec, image: dict, wheels: list[dict], base: LockedBase | None = None,
                         debs: Sequence[PinnedDeb] = (), engine: str = "") -> dict:
    """SLSA v1 build provenance: the builder and its version, the matrix row, the input hash, the git commit, the
    base image (by the lock's pin: the registry manifest digest a consumer matches, with the engine's image id beside
    it), every wheel (name and sha256) and every OS package file (.deb: its purl, apt's file name, sha256 and the
    step that installed it, as the image records them) the image was built from, and the Docker engine's version
    (engines before and after Docker 23 write other layer bytes from the same files: docs/reproducible.md)."""
    labels = (image.get("Config") or {}).get("Labels") or {}
    commit = labels.get("org.opencontainers.image.revision", "")
    dependencies = [base_dependency(spec.base_image, labels.get("org.opencontainers.image.base.digest", ""), base)]
    if commit and commit != "unknown":
        dependencies.insert(0, {"uri": "git+torchimages", "digest": {"gitCommit": commit}})
    dependencies += [{"uri": f"pkg:pypi/{wheel['name']}", "name": wheel["name"], "digest": {"sha256": wheel["sha256"]}}
                     for wheel in wheels]
    distro = re.sub(r"[^a-z].*", "", spec.os)  # debian12 -> debian: the purl's namespace
    dependencies += [{"uri": pin.purl(distro), "name": pin.filename, "digest": {"sha256": pin.sha256},
                      "annotations": {"step": pin.step}} for pin in debs]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"tag": spec.tag, "matrix_row": matrix_row(spec)},
            "internalParameters": {"input_hash": labels.get(INPUT_HASH_LABEL, ""),
                                   "spec_hash": spec.spec_hash()},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID,
                        "version": {"torchimages": tool_version(), **({"docker": engine} if engine else {})}},
            "metadata": {"invocationID": image.get("Id", ""), "startedOn": labels.get("org.opencontainers.image.created", "")},
        },
    }


def base_dependency(base_image: str, engine_image_id: str, base: LockedBase | None) -> dict:
    """The base image as SLSA's resolvedDependencies names it: by its registry manifest digest where the lock pins
    one (what `docker pull IMAGE@sha256:...` and a scanner match), else by the engine's image id, which is all a
    local-only base has; the annotations say which."""
    pinned = base is not None and base.digest is not None
    digest = base.digest if base is not None and base.digest else engine_image_id
    annotations = {"pin": "registry-manifest" if pinned else "engine-image-id", "imageId": engine_image_id}
    if base is not None:
        annotations["lockSource"] = base.source
    return {"uri": f"docker-image://{base_image}", "digest": {"sha256": digest.removeprefix("sha256:")},
            "annotations": annotations}


# ------------------------------------------------------------------------------------------------ multi-arch indexes
# A multi-arch tag resolves to its index digest, and cosign, Kyverno and policy-controller look for the attestations
# there (kyverno#12630, cosign#3552): the index gets the three predicates too, made from its members' own.

WORST_FIRST = ("failed", "skipped", "passed")


def worst_status(statuses: list[str]) -> str:
    """A check's status over several images: failed if any failed, else skipped if any skipped, else passed."""
    return next((status for status in WORST_FIRST if status in statuses), statuses[0] if statuses else "skipped")


def index_verification_predicate(tag: str, members: dict[str, dict]) -> dict:
    """The verification report of an index over members ({platform: {"digest", "tag", "report"}}), with an image
    report's top-level fields so that one policy judges both: passed only if every member passed, each check's worst
    status, the least-verified member's host (cpu-only if any was), and every member's whole report."""
    reports = {platform: member["report"] for platform, member in sorted(members.items())}
    names = sorted({name for report in reports.values() for name in report.get("checks") or {}})
    checks = {}
    for name in names:
        per_platform = {platform: (report.get("checks") or {}).get(name) or {"status": "skipped", "reason": "not run"}
                        for platform, report in reports.items()}
        status = worst_status([check["status"] for check in per_platform.values()])
        checks[name] = {"status": status, "warnings": [],
                        "reason": "; ".join(f"{platform}: {check['status']}" for platform, check in per_platform.items())}
    hosts = [report.get("host") or {} for report in reports.values()]
    return {
        "tool": {"name": "torchimages", "version": tool_version()},
        "tag": tag,
        "image_id": "",
        "result": "passed" if all(report.get("result") == "passed" for report in reports.values()) else "failed",
        "verified_at": max((str(report.get("verified_at", "")) for report in reports.values()), default=""),
        "host": next((host for host in hosts if host.get("kind") != "gpu"), hosts[0] if hosts else {}),
        "checks": checks,
        "platforms": {platform: {"digest": member["digest"], "tag": member["tag"], "result": member["report"].get("result"),
                                 "report": member["report"]} for platform, member in sorted(members.items())},
    }


def index_provenance_predicate(tag: str, members: dict[str, dict]) -> dict:
    """SLSA v1 provenance of an index: nothing is built, the index is assembled from its members' digests."""
    return {
        "buildDefinition": {
            "buildType": INDEX_BUILD_TYPE,
            "externalParameters": {"tag": tag, "platforms": sorted(members)},
            "internalParameters": {},
            "resolvedDependencies": [{"uri": f"oci-image://{member['tag']}",
                                      "digest": {"sha256": member["digest"].removeprefix("sha256:")},
                                      "annotations": {"platform": platform}}
                                     for platform, member in sorted(members.items())],
        },
        "runDetails": {"builder": {"id": BUILDER_ID, "version": {"torchimages": tool_version()}},
                       "metadata": {"invocationID": tag}},
    }


def index_sbom(tag: str, repository: str, digest: str, members: dict[str, dict]) -> dict:
    """A CycloneDX BOM of an index: one container component per platform, each holding its image's components."""
    return {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        "metadata": {"component": {"type": "container", "name": repository, "version": digest,
                                   "bom-ref": f"{repository}@{digest}", "description": f"manifest list {tag}"}},
        "components": [{"type": "container", "name": repository, "version": member["digest"],
                        "bom-ref": f"{repository}@{member['digest']}",
                        "properties": [{"name": "torchimages:platform", "value": platform},
                                       {"name": "torchimages:tag", "value": member["tag"]}],
                        "components": member["sbom"].get("components") or []}
                       for platform, member in sorted(members.items())],
    }


def summary(predicate_type: str, predicate: dict) -> str:
    """One line of what an attestation says, for `verify-image`."""
    if predicate_type == SBOM_PREDICATE:
        return f"CycloneDX SBOM, {len(predicate.get('components') or [])} components"
    if predicate_type == PROVENANCE_PREDICATE:
        definition, run = predicate.get("buildDefinition") or {}, predicate.get("runDetails") or {}
        dependencies = definition.get("resolvedDependencies") or []
        commit = next((item["digest"]["gitCommit"] for item in dependencies
                       if isinstance(item, dict) and "gitCommit" in (item.get("digest") or {})), "unknown")
        uris = [str(item.get("uri", "")) for item in dependencies if isinstance(item, dict)]
        wheels, debs = (sum(1 for uri in uris if uri.startswith(kind)) for kind in ("pkg:pypi/", "pkg:deb/"))
        builder = run.get("builder") or {}
        return (f"built by {builder.get('id')} {(builder.get('version') or {}).get('torchimages', '')}, commit {commit}, "
                f"input hash {(definition.get('internalParameters') or {}).get('input_hash', '')}, {wheels} wheels"
                + (f", {debs} .debs" if debs else ""))
    host = predicate.get("host") or {}
    where = ", ".join(host.get("gpu_models") or []) + f" driver {host.get('driver')}" if host.get("kind") == "gpu" \
        else host.get("note", "")
    checks = ", ".join(f"{name} {check.get('status')}" for name, check in (predicate.get("checks") or {}).items()
                       if isinstance(check, dict))
    platforms = predicate.get("platforms") if isinstance(predicate.get("platforms"), dict) else {}
    over = "; index over " + ", ".join(f"{name} {as_object(member).get('result')}" for name, member in platforms.items()) \
        if platforms else ""
    return f"{predicate.get('result')} on {host.get('kind')} ({where}): {checks}{over}"
