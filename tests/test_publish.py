"""Publishing on a real engine and a real registry: pinned/floating/alias tags by digest, refusals, registry
failures, pruning, base locking, and the nightly run.

Publish mechanics use small stand-in images built FROM debian:bookworm with the labels a real build gives (fast);
the nightly test builds, verifies and publishes the real CPU rows.
"""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker.errors
import pytest

from torchimages.build.bases_lock import LOCAL_ONLY_NOTE
from torchimages.build.builder import local_name
from torchimages.matrix.load import load_matrix
from torchimages.publish.prune import prune_plan
from torchimages.publish.publisher import SPEC_HASH_LABEL, dated_tags, new_pinned_tag, verification_refusal
from torchimages.security.sbom import collect_inventory
from torchimages.trust.attestations import PROVENANCE_PREDICATE, VERIFICATION_PREDICATE
from torchimages.verify.reports import CheckVerdict, VerifyReport

from .conftest import CPU_SELECTOR, FIXTURE_MATRIX, ROOT, free_port
from .policy_eval import shipped_policies_admit
from .publish_fixtures import DEVEL, RUNTIME, Workspace, clean_up, nightly
from .security_fixtures import Package, make_key, write_archive
from .signing_fixtures import (
    FIRST,
    KEYS,
    TEST_PASSWORD,
    accepted_everything,
    key,
)

pytestmark = pytest.mark.engine


@pytest.fixture
def workspace(tmp_path, engine_env, docker_client):
    space = Workspace(tmp_path, engine_env.registry)
    yield space
    clean_up(docker_client, space)


@pytest.fixture
def real_rows(tmp_path, engine_env, docker_client, wheelhouse):
    """The project's CPU rows under a registry name of this test's own, rendered and built (mostly from cache)."""
    space = Workspace(tmp_path, engine_env.registry, real_rows=True)
    space.cli("render", check_exit=0)
    yield space
    clean_up(docker_client, space)


# ------------------------------------------------------------------------------------------------------- publish

def test_publish_pins_floats_and_aliases_one_verified_digest_and_pulls_back(workspace, docker_client):
    ids = {tag: workspace.build_verified(docker_client, tag) for tag in (RUNTIME, DEVEL)}
    result = workspace.publish(CPU_SELECTOR, date="20260101")
    assert result.stdout.count("published") >= 2

    catalog = workspace.catalog_json()["images"]
    assert set(catalog) == {RUNTIME, DEVEL}
    for tag, entry in catalog.items():
        pinned = f"{tag}-20260101"
        assert [p["tag"] for p in entry["pinned"]] == [pinned]
        assert entry["image_id"] == ids[tag]
        names = [pinned, tag] + (["latest"] if tag == RUNTIME else [])
        assert {name: workspace.digest_of(name) for name in names} == {name: entry["digest"] for name in names}
        sbom = json.loads((workspace.catalog / entry["sbom"]).read_text())
        assert sbom["bomFormat"] == "CycloneDX" and sbom["metadata"]["component"]["version"] == entry["digest"]
        assert any(c["name"] == "dpkg" and c["purl"].startswith("pkg:deb/debian/dpkg@") for c in sbom["components"])
        assert entry["checks"]["passed"] == 2 and entry["checks"]["skipped"] == 1
        assert entry["scan"]["status"] == "passed" and entry["scan"]["scanner"] == "bookworm-security index"
        assert "vulnerability scan skipped: " in entry["scan"]["message"]  # no scanner, or no database for it
    assert catalog[RUNTIME]["floating"] == [RUNTIME, "latest"]

    # Pulled back onto an engine without them, by pinned tag and by digest, the bits are the verified image's.
    for tag, entry in catalog.items():
        for reference in (f"{workspace.repository}:{tag}-20260101", f"{workspace.repository}@{entry['digest']}"):
            docker_client.api.remove_image(ids[tag], force=True)
            pulled = docker_client.images.pull(reference)
            assert pulled.id == ids[tag]
            assert f"{workspace.repository}@{entry['digest']}" in pulled.attrs["RepoDigests"]
    for tag in catalog:  # as publish left them, so the second run below finds them published
        docker_client.api.tag(ids[tag], workspace.repository, tag)
        docker_client.api.tag(ids[tag], *local_name(workspace.specs[tag]).rsplit(":", 1))
    readme = (workspace.images / "README.md").read_text()
    assert f"`docker pull {workspace.repository}:{RUNTIME}-20260101`" in readme
    assert f"`docker pull {workspace.repository}@{catalog[RUNTIME]['digest']}`" in readme
    assert f"| `{workspace.repository}:latest` | `{catalog[RUNTIME]['digest']}` |" in readme

    # Nothing new: nothing is pushed, no tag moves, the catalog stays byte for byte.
    before = (workspace.catalog / "catalog.json").read_bytes()
    started = time.monotonic()
    again = workspace.publish(CPU_SELECTOR, date="20260102")
    assert time.monotonic() - started < 30
    assert "2 unchanged" in again.stdout
    assert (workspace.catalog / "catalog.json").read_bytes() == before
    assert not any(tag.endswith("20260102") for tag in workspace.tags())


def test_the_gate_blocks_a_fixable_os_package_unless_allowlisted_and_an_expired_entry_blocks_again(
        workspace, docker_client, tmp_path):
    """The image's own dpkg database against a signed security index listing a newer build of one of its packages."""
    image_id = workspace.build_verified(docker_client, RUNTIME)
    installed = {name: (version, arch) for name, version, arch in collect_inventory(docker_client, image_id).debs}
    version, arch = installed["base-files"]
    fixed = f"{version}+sec1"
    key = make_key(tmp_path, "archive")
    shutil.copy(key.keyring, workspace.security_keyring)
    changelog = (f"base-files ({fixed}) bookworm-security; urgency=high\n\n  * Fix CVE-2026-90001.\n\n"
                 f" -- Security Team <team@security.debian.org>  Tue, 24 Nov 2026 10:00:00 +0000\n")
    write_archive(workspace.security_archive, key, [Package("base-files", fixed, arch, changelog)])
    allowlist = workspace.root / "allowlist.yaml"

    refused = workspace.publish(RUNTIME, check_exit=1)
    # One line: the count, the first packages, the remedy; every CVE in the publish report (newcomer trial 2, #3).
    assert f"1 OS package lacks security fixes (1 CVE): base-files {version} -> {fixed}" in refused.stdout
    assert "CVE-2026-90001" in (workspace.reports / "publish-report.json").read_text()
    assert "bookworm-security index" in refused.stdout and not workspace.tags()
    # An expired entry is bad input (issue 48): publish would sign a VEX statement nobody stands behind.
    allowlist.write_text("allow:\n  - {package: base-files, reason: rebuilt soon, expires: 2026-01-01}\n")
    expired = workspace.publish(RUNTIME, check_exit=2, extra=("--allowlist", str(allowlist)))
    assert f"{allowlist}:2: base-files: expired 2026-01-01" in expired.stderr and not workspace.tags()

    allowlist.write_text("allow:\n  - {cve: CVE-2026-90001, reason: not reachable, expires: 2099-01-01}\n")
    workspace.publish(RUNTIME, check_exit=0, extra=("--allowlist", str(allowlist)))
    scan = workspace.catalog_json()["images"][RUNTIME]["scan"]
    assert scan["status"] == "passed" and scan["scanner"] == "bookworm-security index"
    assert scan["allowed"] == [f"base-files {fixed} (CVE-2026-90001): not reachable (until 2099-01-01)"]

    # The published row, as people ask about it: its SBOM in the catalog against the same index.
    shown = workspace.cli("security", RUNTIME, "--catalog", str(workspace.catalog), "--format", "json", check_exit=1)
    row = json.loads(shown.stdout)["rows"][0]
    assert row["fixable"] == [{"package": "base-files", "arch": arch, "installed": version, "fixed": fixed,
                               "cves": ["CVE-2026-90001"], "since": "2026-11-24"}]
    assert row["signature"].startswith("signature verified")


GZIP_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"


def test_publish_is_gzip_whatever_skopeos_cache_holds_docker_pulls_and_runs_it_zstd_on_request(
        workspace, docker_client, tmp_path):
    image_id = workspace.build_verified(docker_client, RUNTIME, blob_mb=4)
    # The trap of issue 20: a zstd copy of the same layers into the same repository, through the blob-info cache
    # that the publish's environment names. skopeo 1.9 offers those zstd blobs to a later gzip push of the layers
    # (--dest-compress-format or not), and Docker 20.10 cannot pull what it then publishes.
    environment = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "_CONTAINERS_ROOTLESS_UID": "65534"}
    subprocess.run(["skopeo", "copy", "--quiet", "--src-daemon-host", os.environ["DOCKER_HOST"],
                    "--dest-tls-verify=false", "--dest-compress-format", "zstd", f"docker-daemon:{image_id}",
                    f"docker://{workspace.repository}:zstd-copy"], env=environment, check=True, capture_output=True)
    assert {layer["mediaType"] for layer in workspace.manifest("zstd-copy")["layers"]} == {ZSTD_LAYER}
    assert (tmp_path / "data" / "containers" / "cache").is_dir()  # the cache the poisoned copy used

    workspace.publish(RUNTIME, date="20260101", env=environment)
    pinned = f"{RUNTIME}-20260101"
    manifest = workspace.manifest(pinned)
    assert {layer["mediaType"] for layer in manifest["layers"]} == {GZIP_LAYER}
    assert manifest["config"]["digest"] == image_id

    # `docker pull` on the engine, without the image: the engine's own client, as developers pull; then it runs.
    try:
        docker_client.api.remove_image(image_id, force=True)
        pulled = docker_client.images.pull(f"{workspace.repository}:{pinned}")
        assert pulled.id == image_id
        nonce = docker_client.containers.run(pulled.id, ["cat", "/nonce"], remove=True).decode().strip()
        assert len(nonce) == 32

        # zstd on request: an OCI manifest with zstd layers; the same image published again is unchanged.
        zstd_id = workspace.build_verified(docker_client, RUNTIME, blob_mb=4)
        said = workspace.publish(RUNTIME, date="20260102", extra=("--compression", "zstd"))
        assert "zstd layers" in said.stdout + said.stderr
        zstd_manifest = workspace.manifest(f"{RUNTIME}-20260102")
        assert zstd_manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert {layer["mediaType"] for layer in zstd_manifest["layers"]} == {ZSTD_LAYER}
        assert workspace.catalog_json()["images"][RUNTIME]["image_id"] == zstd_id
        again = workspace.publish(RUNTIME, date="20260103", extra=("--compression", "zstd"))
        assert "1 unchanged" in again.stdout
        assert not any(tag.endswith("20260103") for tag in workspace.tags())
    finally:
        for name in (image_id, f"{workspace.repository}:{pinned}"):
            try:
                docker_client.api.remove_image(name, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_unverified_failed_or_rebuilt_images_are_refused_and_floating_tags_stay(workspace, docker_client):
    workspace.build(docker_client, RUNTIME)
    never = workspace.publish(RUNTIME, check_exit=1)
    assert "refused" in never.stdout and "never verified" in never.stdout and "build.py test" in never.stdout
    assert workspace.tags() == [] and not (workspace.catalog / "catalog.json").exists()

    failed_id = workspace.build(docker_client, RUNTIME)
    workspace.verified(RUNTIME, failed_id, passed=False)
    failed = workspace.publish(RUNTIME, check_exit=1)
    assert "verification failed (hygiene)" in failed.stdout

    workspace.build_verified(docker_client, RUNTIME)
    workspace.publish(RUNTIME, date="20260101")
    published = workspace.digest_of(RUNTIME)

    verified_report = (workspace.reports / RUNTIME / "verify.json").read_text()
    workspace.build(docker_client, RUNTIME)  # rebuilt after its verification
    (workspace.reports / RUNTIME / "verify.json").write_text(verified_report)
    rebuilt = workspace.publish(RUNTIME, date="20260102", check_exit=1)
    assert "is not the one tagged now" in rebuilt.stdout and "rebuilt since" in rebuilt.stdout
    assert workspace.digest_of(RUNTIME) == published == workspace.digest_of("latest")
    assert workspace.catalog_json()["images"][RUNTIME]["digest"] == published


def test_a_refused_row_fails_the_run_while_the_others_publish(workspace, docker_client):
    workspace.build_verified(docker_client, RUNTIME)
    workspace.build(docker_client, DEVEL)
    result = workspace.publish(CPU_SELECTOR, check_exit=1)
    assert f"published {RUNTIME}" in result.stdout and f"refused   {DEVEL}: never verified" in result.stdout
    assert list(workspace.catalog_json()["images"]) == [RUNTIME]
    assert workspace.digest_of(DEVEL) is None


def test_registry_down_exits_1_and_records_nothing(workspace, docker_client):
    workspace.build_verified(docker_client, RUNTIME)
    workspace.repository = f"127.0.0.1:{free_port()}/{workspace.namespace}/pytorch"
    result = workspace.publish(RUNTIME, check_exit=1, extra=("--retries", "1"))
    assert "nothing published" in result.stdout and "does not answer" in result.stdout
    assert "retrying in 1 s" in result.stderr
    assert not (workspace.catalog / "catalog.json").exists()
    assert json.loads((workspace.reports / "publish-report.json").read_text())["images"][0]["status"] == "failed"


def test_registry_stopped_mid_publish_leaves_the_catalog_intact(tmp_path, engine_env, docker_client, own_registry):
    process, host = own_registry
    (tmp_path / "work").mkdir()
    workspace = Workspace(tmp_path / "work", host)
    try:
        workspace.build_verified(docker_client, RUNTIME)
        workspace.publish(RUNTIME)
        catalog_before = (workspace.catalog / "catalog.json").read_bytes()
        readme_before = (workspace.images / "README.md").read_bytes()
        workspace.build_verified(docker_client, DEVEL, blob_mb=400)  # big enough to be caught mid-push

        publishing = subprocess.Popen(
            [sys.executable, str(ROOT / "build.py"), "--matrix", str(workspace.matrix), "--images", str(workspace.images),
             "--reports", str(workspace.reports), "publish", CPU_SELECTOR, "--registry", workspace.repository,
             "--catalog", str(workspace.catalog), "--date", "20260102", "--retries", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in publishing.stderr:
            if f"{DEVEL}: pushing" in line:
                break
        time.sleep(1)
        os.kill(process.pid, signal.SIGKILL)
        stdout, stderr = publishing.communicate(timeout=600)
    finally:
        for spec in workspace.specs.values():
            docker_client.api.remove_image(local_name(spec), force=True)

    assert publishing.returncode == 1, stdout + stderr
    assert f"failed    {DEVEL}" in stdout and "nothing recorded" in stdout
    assert f"unchanged {RUNTIME}" in stdout
    assert (workspace.catalog / "catalog.json").read_bytes() == catalog_before
    assert (workspace.images / "README.md").read_bytes() == readme_before


def test_prune_keeps_exactly_the_retention_count_newest_first(workspace, docker_client):
    digests = {}
    for date in ("20260101", "20260102", "20260103", "20260103"):  # two digests on the 3rd: -20260103 and -20260103.2
        workspace.build_verified(docker_client, RUNTIME)
        workspace.publish(RUNTIME, date=date)
        digests[workspace.catalog_json()["images"][RUNTIME]["pinned"][0]["tag"]] = workspace.digest_of(RUNTIME)
    assert list(digests) == [f"{RUNTIME}-20260101", f"{RUNTIME}-20260102", f"{RUNTIME}-20260103", f"{RUNTIME}-20260103.2"]
    assert workspace.digest_of(f"{RUNTIME}-20260103") == digests[f"{RUNTIME}-20260103"]  # pinned tags never move
    sboms = {p["tag"]: workspace.catalog / p["sbom"] for p in workspace.catalog_json()["images"][RUNTIME]["pinned"]}
    assert all(path.is_file() for path in sboms.values())

    workspace.cli("prune", RUNTIME, "--registry", workspace.repository, "--retention", "2", "--catalog",
                  str(workspace.catalog), check_exit=0)

    kept = [f"{RUNTIME}-20260103.2", f"{RUNTIME}-20260103"]
    assert dated_tags(RUNTIME, workspace.tags()) == kept
    assert workspace.digest_of(RUNTIME) == workspace.digest_of("latest") == digests[kept[0]]
    assert [p["tag"] for p in workspace.catalog_json()["images"][RUNTIME]["pinned"]] == kept
    assert sorted(tag for tag, path in sboms.items() if path.is_file()) == sorted(kept)
    assert workspace.digest_of(digests[f"{RUNTIME}-20260101"]) is None
    bad = workspace.cli("prune", RUNTIME, "--registry", workspace.repository, "--retention", "0", check_exit=2)
    assert "--retention must be at least 1" in bad.stderr


@pytest.mark.parametrize("arguments, message", [
    (["--registry", "pytorch"], "--registry 'pytorch' must be HOST[:PORT]/REPO"),
    (["--registry", "127.0.0.1:5000/ML/PyTorch"], "may hold lower case letters"),
    (["--registry", "127.0.0.1:5000/ml/pytorch", "--date", "2026-01-01"], "--date '2026-01-01' must be a date written YYYYMMDD"),
    (["--registry", "127.0.0.1:5000/ml/pytorch", "--retries", "-1"], "--retries must be 0 or more"),
])
def test_bad_publish_input_exits_2_naming_the_flag(workspace, arguments, message):
    result = workspace.cli("publish", RUNTIME, *arguments, check_exit=2)
    assert message in result.stderr


def test_bad_allowlist_exits_2_naming_file_and_line(workspace):
    allowlist = workspace.root / "scanner-allowlist.yaml"
    allowlist.write_text("allow:\n  - cve: CVE-2024-1234\n    reason: ''\n    expires: 2026-12-31\n  - cve: nope\n")
    result = workspace.cli("publish", RUNTIME, "--registry", workspace.repository, check_exit=2)
    assert f"{allowlist}:3: CVE-2024-1234: 'reason' must say why" in result.stderr
    assert f"{allowlist}:5: each allowlist entry needs exactly: cve (or package), reason, expires" in result.stderr


# ------------------------------------------------------------------------------------------------- pure decisions

def test_dated_tags_sort_newest_first_and_ignore_other_rows():
    tags = [f"{RUNTIME}-20260101", f"{RUNTIME}-20260103", f"{RUNTIME}-20260103.2", f"{RUNTIME}-20260103.10",
            RUNTIME, "latest", f"{DEVEL}-20260105", f"{RUNTIME}-2026010"]
    assert dated_tags(RUNTIME, tags) == [f"{RUNTIME}-20260103.10", f"{RUNTIME}-20260103.2", f"{RUNTIME}-20260103",
                                         f"{RUNTIME}-20260101"]
    assert new_pinned_tag(RUNTIME, "20260103", tags) == f"{RUNTIME}-20260103.3"
    assert new_pinned_tag(RUNTIME, "20260104", tags) == f"{RUNTIME}-20260104"


def test_prune_plan_keeps_digests_other_kept_tags_name():
    tags = {f"{RUNTIME}-2026010{day}": f"sha256:{day}" for day in range(1, 5)}
    tags |= {RUNTIME: "sha256:4", "latest": "sha256:4", f"{DEVEL}-20260101": "sha256:1"}
    plan = prune_plan([RUNTIME], tags, retention=1, members={})
    assert plan.delete == {"sha256:2": [f"{RUNTIME}-20260102"], "sha256:3": [f"{RUNTIME}-20260103"]}
    assert plan.kept_shared == {f"{RUNTIME}-20260101": f"{DEVEL}-20260101"} and plan.kept_in_index == {}


def test_refusal_names_the_reason():
    spec = load_matrix(FIXTURE_MATRIX).specs[-1]  # the fixture project's last row, a CPU one
    image = {"Id": "sha256:aaa", "Config": {"Labels": {SPEC_HASH_LABEL: spec.spec_hash()}}}
    path = Path("reports/x/verify.json")
    assert "build it first" in verification_refusal(spec, None, None, path)
    assert "never verified" in verification_refusal(spec, image, None, path)
    assert "rebuilt since" in verification_refusal(spec, image, VerifyReport("sha256:bbb", True, {}), path)
    assert verification_refusal(spec, image, VerifyReport("sha256:aaa", True, {}), path) is None
    failed = VerifyReport("sha256:aaa", False, {"hygiene": CheckVerdict("failed"), "gpu": CheckVerdict("skipped")})
    assert "its verification failed (hygiene)" in verification_refusal(spec, image, failed, path)
    gpu_spec = dataclasses.replace(spec, cuda="13.0", cudnn=9)
    skipped_gpu = VerifyReport("sha256:aaa", True, {"gpu": CheckVerdict("skipped", "--gpus none")})
    assert "GPU checks did not run (--gpus none)" in verification_refusal(gpu_spec, image, skipped_gpu, path)
    stale = {"Id": "sha256:aaa", "Config": {"Labels": {SPEC_HASH_LABEL: "0" * 16}}}
    assert "another version of its matrix row" in verification_refusal(spec, stale, VerifyReport("sha256:aaa", True, {}), path)


# ------------------------------------------------------------------------------------------------------------ lock

def test_lock_pins_a_local_only_base_by_image_id_and_notices_it_moving(workspace, docker_client):
    result = workspace.cli("lock", check_exit=0)
    lock = json.loads((workspace.root / "bases.lock.json").read_text())["bases"]["debian:bookworm"]
    assert lock["source"] == "local-only" and lock["digest"] is None and lock["note"] == LOCAL_ONLY_NOTE
    assert lock["image_id"] == docker_client.images.get("debian:bookworm").id
    assert "local-only  debian:bookworm" in result.stdout
    workspace.cli("lock", "--check", check_exit=0)

    lock_file = workspace.root / "bases.lock.json"
    moved = json.loads(lock_file.read_text())
    moved["bases"]["debian:bookworm"]["image_id"] = "sha256:" + "0" * 64
    lock_file.write_text(json.dumps(moved))
    check = workspace.cli("lock", "--check", check_exit=1)
    assert "moved: debian:bookworm" in check.stdout and f"{RUNTIME}, {DEVEL}" in check.stdout
    lock_file.write_text("{")
    assert "not valid JSON" in workspace.cli("lock", check_exit=2).stderr


# --------------------------------------------------------------------------------------------------------- nightly


def test_nightly_publishes_what_passed_prunes_and_a_second_run_does_nothing(real_rows, docker_client, wheelhouse):
    real_rows.cli("build", CPU_SELECTOR, "--wheelhouse", str(wheelhouse), check_exit=0)
    ids = {tag: docker_client.images.get(local_name(real_rows.specs[tag])).id for tag in (RUNTIME, DEVEL)}
    for tag, image_id in ids.items():
        real_rows.verified(tag, image_id)  # what a passing `build.py test` leaves

    first, summary = nightly(real_rows, wheelhouse, "--retention", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(summary["skipped"]) == sorted(summary["already_verified"]) == sorted(ids)  # nothing rebuilt or re-verified
    assert sorted(p["tag"] for p in summary["published"]) == sorted(ids) and summary["failed"] == []
    assert sorted(change["tag"] for change in summary["size_changes"]) == sorted(ids)
    assert all(change["before"] is None for change in summary["size_changes"])
    assert sorted(summary["new_tags"]) == sorted([*ids, *(p["pinned"] for p in summary["published"])])
    assert "## Published" in first.stdout and "## Size changes against the last catalog" in first.stdout
    kept = Path(os.environ["XDG_CACHE_HOME"]) / "torchimages" / "push-blob-info" / "gzip"
    assert list(kept.rglob("blob-info-cache-*")), "the pushes' blob-info cache was not kept for the next run"
    catalog = real_rows.catalog_json()["images"]
    for tag, entry in catalog.items():
        assert real_rows.digest_of(tag) == real_rows.digest_of(entry["pinned"][0]["tag"]) == entry["digest"]
        assert entry["image_id"] == ids[tag]
        sbom = json.loads((real_rows.catalog / entry["sbom"]).read_text())
        assert "pkg:pypi/torch@2.13.0%2Bcpu" in [component["purl"] for component in sbom["components"]]

    started = time.monotonic()
    second, again = nightly(real_rows, wheelhouse, "--retention", "1")
    assert second.returncode == 0, second.stdout + second.stderr
    assert time.monotonic() - started < 60
    assert "nothing to do: 2 rows unchanged, verified and published already" in second.stdout
    assert again["nothing_to_do"] and sorted(again["unchanged"]) == sorted(ids) and again["new_tags"] == []
    assert real_rows.catalog_json()["images"] == catalog
    real_rows.cli("catalog", "--check-registry", "--catalog", str(real_rows.catalog), check_exit=0)
    why = ("why", CPU_SELECTOR, "--registry", real_rows.repository, "--catalog", str(real_rows.catalog),
           "--wheelhouse", str(wheelhouse))
    assert f"{RUNTIME}: nothing\n  published with today's inputs; its tags on the registry name the catalog's digest" \
        in real_rows.cli(*why, check_exit=0).stdout
    signed_why = real_rows.cli(*why, "--signing-key", str(FIRST), "--format", "json", check_exit=0,
                               env={**os.environ, "COSIGN_PASSWORD": TEST_PASSWORD})
    decisions = {row["tag"]: row for row in json.loads(signed_why.stdout)}
    assert decisions[DEVEL]["decision"] == "verify, publish" and decisions[DEVEL]["build_reasons"] == []
    assert decisions[DEVEL]["publish_reasons"] == [f"not signed yet by this run's key {key().public.fingerprint}"]

    # A signing key now: rows published unsigned are not taken as done; publish signs their unchanged digests. The
    # runner is wiped first: the night builds both rows again (from the published images' layers) and, the same
    # inputs giving the same image (issue 47), gets the published digests and pushes nothing.
    for tag in ids:
        docker_client.images.remove(local_name(real_rows.specs[tag]), force=True)
    third, signed = nightly(real_rows, wheelhouse, "--retention", "1", "--signing-key", str(FIRST),
                            env={**os.environ, "COSIGN_PASSWORD": TEST_PASSWORD})
    assert third.returncode == 0, third.stdout + third.stderr
    assert (third.stdout + third.stderr).count("signature added, attestations added") == 2
    after = real_rows.catalog_json()["images"]
    assert {tag: entry["digest"] for tag, entry in after.items()} == {tag: entry["digest"] for tag, entry in catalog.items()}
    assert all(entry["signing"]["keys"] == [key().public.fingerprint] for entry in after.values())
    assert sorted(signed["built"]) == sorted(ids) and signed["published"] == []
    assert all(f"{tag}: rebuilt, same digest {catalog[tag]['digest']}: nothing published" in signed["notes"]
               for tag in ids), signed["notes"]


def test_the_nightly_rebuilds_only_the_os_security_layer_of_a_row_behind_its_security_pocket(
        real_rows, docker_client, wheelhouse, tmp_path):
    """The runtime row published, then its SBOM says libssl3 is older than the security pocket's (as when a fix lands
    after publishing): the nightly rebuilds its OS security layer alone, verifies, republishes under 10% of the image
    and lists the fix; the next night has nothing to fix and skips it."""
    real_rows.cli("build", RUNTIME, "--wheelhouse", str(wheelhouse), check_exit=0)
    real_rows.verified(RUNTIME, docker_client.images.get(local_name(real_rows.specs[RUNTIME])).id)
    command = ("nightly", RUNTIME, "--registry", real_rows.repository, "--catalog", str(real_rows.catalog),
               "--wheelhouse", str(wheelhouse))
    real_rows.cli(*command, check_exit=0)
    before = real_rows.catalog_json()["images"][RUNTIME]
    sbom_file = real_rows.catalog / before["sbom"]
    sbom = json.loads(sbom_file.read_text())
    libssl = next(c for c in sbom["components"] if c["name"] == "libssl3")
    current, older = libssl["version"], "3.0.0-1"
    libssl["version"] = older  # the published digest as the security pocket's index now sees it: one fix behind
    sbom_file.write_text(json.dumps(sbom))
    key = make_key(tmp_path, "archive")
    shutil.copy(key.keyring, real_rows.security_keyring)
    changelog = (f"openssl ({current}) bookworm-security; urgency=high\n\n  * Fix CVE-2026-90002.\n\n"
                 f" -- Security Team <team@security.debian.org>  Tue, 24 Nov 2026 10:00:00 +0000\n")
    write_archive(real_rows.security_archive, key, [Package("libssl3", current, "amd64", changelog)])
    why = real_rows.cli("why", *command[1:], check_exit=0).stdout
    assert f"{RUNTIME}: rebuild the OS security layer, verify, publish" in why and "CVE-2026-90002" in why

    rebuilt = real_rows.cli(*command)
    summary = json.loads((real_rows.reports / "nightly-summary.json").read_text())
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert summary["built"] == [RUNTIME] and summary["verified"] == [RUNTIME] and summary["skipped"] == []
    fixed = f"libssl3 {older} -> {current} (CVE-2026-90002)"
    assert any(fixed in note and "rebuilt for OS security fixes" in note for note in summary["notes"]), summary["notes"]
    assert "rebuilt for OS security fixes" in rebuilt.stdout and "CVE-2026-90002" in rebuilt.stdout
    after = real_rows.catalog_json()["images"][RUNTIME]
    assert after["digest"] != before["digest"] and after["scan"]["scanner"] == "bookworm-security index"
    old_layers = {layer["digest"] for layer in real_rows.manifest(before["pinned"][0]["tag"])["layers"]}
    new_layers = real_rows.manifest(after["pinned"][0]["tag"])["layers"]
    fresh = [layer for layer in new_layers if layer["digest"] not in old_layers]
    uploaded, total = sum(layer["size"] for layer in fresh), sum(layer["size"] for layer in new_layers)
    # The mirror here has no newer libssl3 than the image: the OS security layer ran again (built above) and gave
    # the layer it gave before, so the republish uploads no layer. Before issue 47 its apt logs and file times made it
    # one new layer each time (this test asserted exactly one, under 10% of the image).
    assert fresh == [] and uploaded < total / 10, f"{len(fresh)} new layers, {uploaded} of {total} bytes"

    started = time.monotonic()
    quiet = real_rows.cli(*command, check_exit=0)
    assert time.monotonic() - started < 60
    assert json.loads((real_rows.reports / "nightly-summary.json").read_text())["unchanged"] == [RUNTIME], quiet.stdout


def test_nightly_end_to_end_builds_verifies_and_publishes_the_cpu_rows_signed(real_rows, wheelhouse, cosign):
    """The acceptance run: real builds, real verification, real pushes signed with a key, each digest's signature and
    three attestations accepted by the real cosign; then a quick no-op run."""
    first, summary = nightly(real_rows, wheelhouse, "--signing-key", str(FIRST),
                             env={**os.environ, "COSIGN_PASSWORD": TEST_PASSWORD})
    assert first.returncode == 0, first.stdout
    assert sorted(p["tag"] for p in summary["published"]) == sorted([RUNTIME, DEVEL])
    for tag, entry in real_rows.catalog_json()["images"].items():
        # cosign and verify-image on the digest and on the tag (which resolves to it), as a cluster admin checks.
        for reference in (f"{real_rows.repository}@{entry['digest']}", f"{real_rows.repository}:{tag}"):
            assert accepted_everything(cosign, reference, KEYS / "first.pub"), reference
            checked = real_rows.cli("verify-image", reference, "--key", str(KEYS / "first.pub"), "--format", "json",
                                    check_exit=0)
        predicates = json.loads(checked.stdout)["predicates"]
        wheels = [item["name"] for item in predicates[PROVENANCE_PREDICATE]["buildDefinition"]["resolvedDependencies"]
                  if item["uri"].startswith("pkg:pypi/")]
        assert any(name.startswith("torch-2.13.0+cpu") for name in wheels), wheels
        report = predicates[VERIFICATION_PREDICATE]
        assert report["result"] == "passed" and report["checks"]["identity"]["status"] == "passed"
        # The shipped policies admit the real rows' real attestations.
        verdicts = shipped_policies_admit(tag, {kind: [predicate] for kind, predicate in predicates.items()})
        assert all(admitted for admitted, _ in verdicts.values()), verdicts
    second, again = nightly(real_rows, wheelhouse)
    assert second.returncode == 0 and again["nothing_to_do"], second.stdout
    real_rows.cli("catalog", "--check-registry", "--catalog", str(real_rows.catalog), check_exit=0)
