"""What a published digest's three attestations say: its CycloneDX SBOM (sbom.py writes it), SLSA v1 build provenance,
and the result of its verification, a predicate type of this project's own. Pure functions of what publish has read.

A consumer's policy reads these fields (docs/kyverno-policy.yaml): keep them stable, and move
VERIFICATION_PREDICATE to a /v2 when one changes its meaning.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .builder import INPUT_HASH_LABEL
from .model import ImageSpec

SBOM_PREDICATE = "https://cyclonedx.org/bom"  # cosign's `--type cyclonedx`
PROVENANCE_PREDICATE = "https://slsa.dev/provenance/v1"  # cosign's `--type slsaprovenance1`
VERIFICATION_PREDICATE = "https://torchimages.io/verification-report/v1"
PREDICATE_TYPES = (SBOM_PREDICATE, PROVENANCE_PREDICATE, VERIFICATION_PREDICATE)
# cosign's names for --type, where it has one (`cosign verify-attestation --type NAME`).
COSIGN_TYPE_NAMES = {SBOM_PREDICATE: "cyclonedx", PROVENANCE_PREDICATE: "slsaprovenance1",
                     VERIFICATION_PREDICATE: VERIFICATION_PREDICATE}
BUILDER_ID = "https://torchimages.io/builder/v1"
BUILD_TYPE = "https://torchimages.io/build/v1"
NO_GPU = "no GPU: GPU checks skipped"


def tool_version() -> str:
    try:
        return version("torchimages")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def matrix_row(spec: ImageSpec) -> dict:
    """The resolved matrix row the image was built from (not where it sits in matrix.yaml)."""
    return {key: value for key, value in spec.to_json().items() if key != "matrix_line"}


def verification_predicate(spec: ImageSpec, image_id: str, report, facts: dict) -> dict:
    """Each check's status and reason, the host they ran on, the tool: what a policy can require, e.g. that `gpu`
    passed on an H100 with driver >= 580 (host.gpu_models, host.driver_major)."""
    return {
        "tool": {"name": "torchimages", "version": tool_version()},
        "tag": spec.tag,
        "image_id": image_id,
        "result": "passed" if report.passed else "failed",
        "verified_at": report.finished_at,
        "host": verification_host(report, facts),
        "checks": {name: {"status": verdict.status, "reason": verdict.message, "warnings": list(verdict.warnings)}
                   for name, verdict in sorted(report.checks.items())},
    }


def _mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def verification_host(report, facts: dict) -> dict:
    """The host's GPUs as the probe saw them where the gpu check passed; else that it had none."""
    main = _mapping(facts.get("main"))
    gpu = _mapping(main.get("gpu"))
    gpu_check = report.checks.get("gpu")
    if gpu_check is None or gpu_check.status != "passed":
        return {"kind": "cpu-only", "gpu_models": [], "gpus": [], "driver": "", "driver_major": 0,
                "cuda_driver": "", "note": NO_GPU}
    devices = [device for device in gpu.get("devices") or [] if isinstance(device, dict)]
    driver = str(gpu.get("driver_version") or "")
    return {
        "kind": "gpu",
        "gpu_models": sorted({str(device.get("name")) for device in devices}),
        "gpus": [{"name": str(device.get("name")), "capability": ".".join(map(str, device.get("capability") or []))}
                 for device in devices],
        "driver": driver,
        "driver_major": int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0,
        "cuda_driver": str(gpu.get("libcuda_driver_version") or ""),
        "note": "",
    }


def provenance_predicate(spec: ImageSpec, image: dict, wheels: list[dict]) -> dict:
    """SLSA v1 build provenance: the builder and its version, the matrix row, the input hash, the git commit, the
    base image, every wheel (name and sha256) the image was built from."""
    labels = (image.get("Config") or {}).get("Labels") or {}
    commit = labels.get("org.opencontainers.image.revision", "")
    dependencies = [{"uri": f"docker-image://{spec.base_image}",
                     "digest": {"sha256": labels.get("org.opencontainers.image.base.digest", "").removeprefix("sha256:")}}]
    if commit and commit != "unknown":
        dependencies.insert(0, {"uri": "git+torchimages", "digest": {"gitCommit": commit}})
    dependencies += [{"uri": f"pkg:pypi/{wheel['name']}", "name": wheel["name"], "digest": {"sha256": wheel["sha256"]}}
                     for wheel in wheels]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"tag": spec.tag, "matrix_row": matrix_row(spec)},
            "internalParameters": {"input_hash": labels.get(INPUT_HASH_LABEL, ""),
                                   "spec_hash": spec.spec_hash()},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"torchimages": tool_version()}},
            "metadata": {"invocationId": image.get("Id", ""), "startedOn": labels.get("org.opencontainers.image.created", "")},
        },
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
        wheels = sum(1 for item in dependencies if isinstance(item, dict) and str(item.get("uri", "")).startswith("pkg:"))
        builder = run.get("builder") or {}
        return (f"built by {builder.get('id')} {(builder.get('version') or {}).get('torchimages', '')}, commit {commit}, "
                f"input hash {(definition.get('internalParameters') or {}).get('input_hash', '')}, {wheels} wheels")
    host = predicate.get("host") or {}
    where = ", ".join(host.get("gpu_models") or []) + f" driver {host.get('driver')}" if host.get("kind") == "gpu" \
        else host.get("note", "")
    checks = ", ".join(f"{name} {check.get('status')}" for name, check in (predicate.get("checks") or {}).items()
                       if isinstance(check, dict))
    return f"{predicate.get('result')} on {host.get('kind')} ({where}): {checks}"
