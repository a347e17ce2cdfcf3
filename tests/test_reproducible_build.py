"""Issue 47 on a real engine: two --no-cache builds of the CPU rows from the same wheels give the same image ids, and
pushed with the pinned compression the same manifest digests (docs/reproducible.md)."""
import json
import os

import pytest

from torchimages.registry import RegistryClient, RetryPolicy, image_registry, registry_access

from .conftest import CPU_SELECTOR, ROOT, SHARED_STEPS, one_process_at_a_time, run_cli, with_live_compat

pytestmark = pytest.mark.engine
REPOSITORY = "localhost:5000/test/reproducible"


def built_ids(matrix, reports, wheelhouse) -> dict[str, str]:
    run_cli("--matrix", str(matrix), "--reports", str(reports), "build", CPU_SELECTOR, "--wheelhouse", str(wheelhouse),
            "--no-cache", "--force", check_exit=0)
    report = json.loads((reports / "build-report.json").read_text())
    assert {entry["status"] for entry in report["images"]} == {"built"}
    return {entry["tag"]: entry["image_id"] for entry in report["images"]}


def test_two_no_cache_builds_give_one_image_and_one_manifest_digest(cpu_images, wheelhouse, tmp_path, docker_client,
                                                                    tmp_path_factory, own_registry):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", REPOSITORY))
    with_live_compat(matrix)
    _, host = own_registry
    address, _ = image_registry(f"{host}/test/reproducible:any")
    registry = RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)
    try:
        with one_process_at_a_time(tmp_path_factory, SHARED_STEPS):  # no cache: it makes every shared step again
            first = built_ids(matrix, tmp_path / "first", wheelhouse)
            digests = {tag: registry.push(image_id, f"{tag}-first", os.environ["DOCKER_HOST"], "gzip")
                       for tag, image_id in first.items()}
            second = built_ids(matrix, tmp_path / "second", wheelhouse)
        log = (tmp_path / "second" / "2.13.0-cpu-runtime" / "build.log").read_text()
        assert "apt-get install" in log and " ---> Running in " in log, "the second build ran its steps again"
        assert second == first, "the same inputs built twice gave other images"
        for tag, image_id in second.items():
            assert registry.push(image_id, f"{tag}-second", os.environ["DOCKER_HOST"], "gzip") == digests[tag]
        image = docker_client.api.inspect_image(first["2.13.0-cpu-runtime"])
        assert image["Created"] == image["Config"]["Labels"]["org.opencontainers.image.created"].replace("Z", "") + "Z"
    finally:
        for tag in first if "first" in locals() else ():
            docker_client.images.remove(f"{REPOSITORY}:{tag}", force=True)
