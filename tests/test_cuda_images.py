"""The CUDA rows built from the real cu130 wheel set and verified on a host without GPUs: every check that
needs no GPU passes, the GPU checks are skipped with the reason, and an image broken in one way fails its check."""
import json
import os
import shutil
from dataclasses import dataclass

import pytest

from torchimages.verify import GPU_CHECKS

from .conftest import (
    CUDA_DEVEL,
    CUDA_ROWS,
    CUDA_RUNTIME,
    ROOT,
    SHARED_STEPS,
    local_names,
    one_process_at_a_time,
    run_cli,
    run_cli_side_by_side,
)
from .inventory_fixtures import trivy_rootfs, unexplained_differences
from .verify_fixtures import assert_only_check_failed, containers_left, image_report_of, report_of, selection_for

pytestmark = pytest.mark.engine

BROKEN = ROOT / "tests" / "data" / "broken-cuda"
# The CUDA images take about 6.5 GB of the engine's disk, and the engine tests after this module grow it by about
# 4 GB more (publishing spools each image to a temporary file as large as itself): a runner with less free disk
# than this after the module gets them removed (one CI runner's disk filled; docs/benchmarks-log.md).
KEEP_CUDA_IMAGES_WITH_FREE_BYTES = 20 * 2**30


@pytest.fixture(scope="module")
def cuda_images(engine_env, cuda_wheelhouse, docker_client, tmp_path_factory):
    """The CUDA rows, really built from the real wheels: {tag: local image name}."""
    with one_process_at_a_time(tmp_path_factory, SHARED_STEPS):  # the devel row takes the runtime's layers
        result = run_cli("--reports", str(tmp_path_factory.mktemp("cuda-images")), "build", *CUDA_ROWS,
                         "--wheelhouse", str(cuda_wheelhouse), "--jobs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    names = local_names(*CUDA_ROWS)
    yield names
    if shutil.disk_usage(docker_client.info()["DockerRootDir"]).free < KEEP_CUDA_IMAGES_WITH_FREE_BYTES:
        for name in names.values():
            docker_client.images.remove(name, force=True)


@pytest.fixture(scope="module")
def cuda_baseline(cuda_images, tmp_path_factory) -> dict[str, dict]:
    reports = tmp_path_factory.mktemp("cuda-baseline")
    process = run_cli("--reports", str(reports), "test", *CUDA_ROWS, "--gpus", "none")
    by_tag = {tag: report_of(reports, tag) for tag in cuda_images}
    return {"process": process, "reports": reports, "by_tag": by_tag}


def test_cuda_rows_pass_every_check_that_needs_no_gpu(cuda_baseline, cuda_images, docker_client):
    for tag, report in cuda_baseline["by_tag"].items():
        failed = {name: check["message"] for name, check in report["checks"].items() if check["status"] == "failed"}
        assert not failed, f"{tag}: {failed}"
        for name in GPU_CHECKS:
            assert report["checks"][name]["status"] == "skipped" and "verify on a GPU host" in report["checks"][name]["message"]
        assert report["image_id"] == docker_client.api.inspect_image(cuda_images[tag])["Id"]
    assert cuda_baseline["process"].returncode == 0, cuda_baseline["process"].stderr
    assert not containers_left(docker_client, cuda_baseline["reports"])


def test_devel_compiles_a_cuda_extension_with_its_own_nvcc(cuda_baseline):
    facts = json.loads((cuda_baseline["reports"] / CUDA_DEVEL / "facts.json").read_text())["main"]
    nvcc = facts["tools"]["nvcc"]
    assert nvcc["release"] == facts["torch"]["cuda"] == "13.0"
    assert nvcc["path"] == "/usr/local/cuda/bin/nvcc", "nvcc comes from the toolkit wheels, through /usr/local/cuda"
    assert facts["extension"]["ok"] and facts["extension"]["language"] == "CUDA", facts["extension"]


def test_the_devel_image_reuses_the_runtime_images_layers(docker_client, cuda_images):
    """One venv on disk for both flavors: the devel image is the runtime image's layers plus the toolkit."""
    runtime = docker_client.api.inspect_image(cuda_images[CUDA_RUNTIME])["RootFS"]["Layers"]
    devel = docker_client.api.inspect_image(cuda_images[CUDA_DEVEL])["RootFS"]["Layers"]
    shared = len(os.path.commonprefix([runtime, devel]))
    assert shared >= len(runtime) - 2, "only the runtime's last layers (its OS security layer, WORKDIR) may differ"


def test_trivys_own_inventory_of_the_runtime_row_is_ours(cuda_images, docker_client):
    """Issue 59 on the CUDA 13.0 runtime row: Trivy's inventory (`trivy rootfs` in a container of the image, 3 s
    where `trivy image` waits 70 s for the engine's export of its 6 GB; the CPU rows' test checks each run that the
    two modes list the same) against our SBOM of it: no unexplained difference (tests/inventory_fixtures.py)."""
    image = cuda_images[CUDA_RUNTIME]
    assert unexplained_differences(docker_client, image, trivy_rootfs(docker_client, image)) == []


@dataclass(frozen=True)
class BrokenCuda:
    name: str
    row: str
    check: str
    says: tuple[str, ...]

    @property
    def image(self) -> str:
        return f"torchimages-test/broken-cuda:{self.name}"


BROKEN_CUDA = (
    BrokenCuda("second-libcudnn", CUDA_RUNTIME, "hygiene", ("libcudnn", "/usr/lib/x86_64-linux-gnu/libcudnn.so.9")),
    BrokenCuda("devel-without-nvcc", CUDA_DEVEL, "devel", ("nvcc",)),
    BrokenCuda("another-torch", CUDA_RUNTIME, "identity", ("torch is 2.13.0+cpu", "expects 2.14.1+cu130")),
)


@pytest.fixture(scope="module")
def broken_cuda_images(cuda_images, wheelhouse, docker_client, tmp_path_factory):
    built = []
    try:
        for case in BROKEN_CUDA:
            context = tmp_path_factory.mktemp(case.name)
            shutil.copytree(BROKEN / case.name, context, dirs_exist_ok=True)
            if case.name == "another-torch":
                shutil.copy(next(wheelhouse.glob("cpu-py3.11/torch-2.13.0*.whl")), context)
            docker_client.images.build(path=str(context), buildargs={"BASE": cuda_images[case.row]}, tag=case.image,
                                       rm=True, forcerm=True)
            built.append(case.image)
        yield
    finally:
        for image in built:
            docker_client.images.remove(image, force=True)


@pytest.fixture(scope="module")
def broken_cuda_verdicts(broken_cuda_images, tmp_path_factory) -> dict[str, tuple]:
    """Each broken image verified once by `build.py test --image`, two runs at a time (without the smoke check where
    it is not the one under test: selection_for)."""
    reports = {case.name: tmp_path_factory.mktemp(case.name) for case in BROKEN_CUDA}
    processes = run_cli_side_by_side({case.name: ("--reports", str(reports[case.name]), "test", case.row, "--image",
                                                  case.image, "--gpus", "none", *selection_for(case.check))
                                      for case in BROKEN_CUDA})
    return {name: (process, reports[name]) for name, process in processes.items()}


@pytest.mark.parametrize("case", BROKEN_CUDA, ids=lambda case: case.name)
def test_a_broken_cuda_image_fails_exactly_its_check(case, broken_cuda_verdicts, cuda_baseline, docker_client):
    result, reports = broken_cuda_verdicts[case.name]
    assert result.returncode == 1, result.stdout + result.stderr
    assert_only_check_failed(image_report_of(reports, case.row, case.image), cuda_baseline["by_tag"][case.row], case.check, case.says)
    assert not containers_left(docker_client, reports)
