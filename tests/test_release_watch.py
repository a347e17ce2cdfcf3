"""The nightly's release watch, engine-free, against a PEP 691 index on 127.0.0.1 holding torch 2.16.0: a newer
release is read, proposed as rows shaped like the newest ones, and rendered; the other rows' folders do not change."""
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from packaging.version import Version

from torchimages.build.render import render_files, stale_paths
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError
from torchimages.project import DEFAULT_TEMPLATES

from .conftest import ROOT, run_cli_in_process
from .index_fixtures import LocalIndex, make_release
from .workflow_fixtures import workflow_step


@pytest.fixture
def project(fixture_project):
    """The tests' frozen project (matrix, compat data, rendered images): its newest release is 2.15.0 for ever."""
    return fixture_project


def watch(project, index_url: str, check_exit: int = 0):
    result = run_cli_in_process("--matrix", str(project / "matrix.yaml"), "--images", str(project / "images"),
                                "--reports", str(project / "reports"), "watch", "--index-url", index_url)
    assert result.returncode == check_exit, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def dockerfiles(images):
    return {path.parent.name: path.read_bytes() for path in images.glob("*/Dockerfile")}


def test_a_newer_release_is_proposed_as_rows_like_the_newest_and_rendered(project, tmp_path):
    before = dockerfiles(project / "images")
    with LocalIndex(make_release(tmp_path / "index", cuda_library_size=1024)) as index:
        result = watch(project, index.url)
        report = json.loads((project / "reports" / "release-watch.json").read_text())
        assert report["release"] == "2.16.0" and report["newest_in_matrix"] == "2.15.0"
        proposed = ["2.16.0-cuda13.2-cudnn9-runtime", "2.16.0-cuda13.2-cudnn9-devel",
                    "2.16.0-cuda13.2-cudnn9-runtime-ubuntu24.04", "2.16.0-cuda13.2-cudnn9-devel-ubuntu24.04",
                    "2.16.0-cpu-runtime", "2.16.0-cpu-devel"]
        assert report["tags"] == proposed and "- `2.16.0-cuda13.2-cudnn9-runtime`" in result.stdout
        matrix_text = (project / "matrix.yaml").read_text()
        assert "# Proposed by the release watch (torch 2.16.0 on http://127.0.0.1" in matrix_text
        assert "# CPU-only images" in matrix_text, "the matrix's comments stay"
        specs = {spec.tag: spec for spec in load_matrix(project / "matrix.yaml", project / "compat.yaml").specs}
        assert specs["2.16.0-cuda13.2-cudnn9-runtime"].torchvision == "0.31.0"
        assert specs["2.16.0-cuda13.2-cudnn9-runtime"].aliases == ("latest",), "latest moves to the new release"
        assert specs["2.15.0-cuda13.2-cudnn9-runtime"].aliases == ()
        assert specs["2.16.0-cuda13.2-cudnn9-runtime-ubuntu24.04"].python == "3.12"
        assert yaml.safe_load((project / "compat.yaml").read_text())["torch"]["2.16.0"]["cuda"]["13.2"]["source"]
        after = dockerfiles(project / "images")
        assert set(after) - set(before) == set(proposed)
        assert {tag: after[tag] for tag in before} == before, "no other row's folder changes"
        assert "torch==2.16.0 torchvision==0.31.0 numpy==2.4.1" in after["2.16.0-cuda13.2-cudnn9-runtime"].decode()
        assert "torch==2.16.0+cpu " in after["2.16.0-cpu-runtime"].decode(), "the CPU rows follow: the index has +cpu"
        assert "2.13.0-cpu-runtime" in specs, "the rows copied stay"
        rendered = render_files(list(specs.values()), DEFAULT_TEMPLATES, "matrix.yaml", "localhost:5000/ml/pytorch")
        assert stale_paths(project / "images", rendered) == [], "images/ is what render makes of the proposal"
        # The next night: the matrix has the newest release; nothing changes.
        matrix_text = (project / "matrix.yaml").read_text()
        result = watch(project, index.url)
        assert "No torch release newer than the matrix's 2.16.0" in result.stdout
        assert (project / "matrix.yaml").read_text() == matrix_text


def test_nothing_is_proposed_when_the_matrix_has_the_newest(project, tmp_path):
    index_folder = tmp_path / "index"
    make_release(index_folder, cuda_library_size=1024)
    for wheel in index_folder.glob("torch-2.16.0*"):
        wheel.rename(wheel.with_name(wheel.name.replace("2.16.0", "2.15.0")))
    matrix = (project / "matrix.yaml").read_text()
    with LocalIndex(index_folder) as index:
        result = watch(project, index.url)
    assert "No torch release newer" in result.stdout and (project / "matrix.yaml").read_text() == matrix
    assert json.loads((project / "reports" / "release-watch.json").read_text())["tags"] == []


def test_an_unreachable_index_is_exit_2_and_changes_nothing(project):
    matrix, compat = (project / "matrix.yaml").read_text(), (project / "compat.yaml").read_text()
    result = watch(project, "http://127.0.0.1:9/simple", check_exit=2)
    assert "http://127.0.0.1:9/simple" in result.stderr and "--index-url" in result.stderr
    assert (project / "matrix.yaml").read_text() == matrix and (project / "compat.yaml").read_text() == compat


def test_cpu_rows_the_index_cannot_move_are_named_in_the_proposal(project, tmp_path):
    """PyPI has no +cpu build: the proposal moves the CUDA rows and says the CPU rows stay behind, and why."""
    index_folder = make_release(tmp_path / "index", cuda_library_size=1024)
    for wheel in index_folder.glob("torch-*+cpu-*"):
        wheel.unlink()
    with LocalIndex(index_folder) as index:
        result = watch(project, index.url)
    report = json.loads((project / "reports" / "release-watch.json").read_text())
    assert report["tags"] and not [tag for tag in report["tags"] if "-cpu-" in tag]
    note = f"the CPU rows stay at torch 2.13.0: {index.url} has no +cpu build of torch 2.16.0"
    assert any(item.startswith(note) for item in report["notes"]), report["notes"]
    assert "download.pytorch.org/whl/cpu" in (project / "reports" / "release-watch.md").read_text()
    assert "note: the CPU rows stay at torch 2.13.0" in result.stdout


@pytest.mark.parametrize("newer", [True, False])
def test_the_workflows_watch_step_hands_the_release_and_tags_to_the_pull_request_steps(project, tmp_path, newer):
    """The release-watch job's "Watch" step, run as the runner runs it (bash -eo pipefail, in the checkout), with
    build.py being the real watch against the local index: $GITHUB_OUTPUT gets the release and the proposed tags
    (space separated, as the build step splits them), empty when there is nothing newer; the pull request opens
    for any newer release, with a token that lets the project's CI run on it."""
    index_folder = make_release(tmp_path / "index", cuda_library_size=1024)
    if not newer:
        for wheel in index_folder.glob("torch-2.16.0*"):
            wheel.rename(wheel.with_name(wheel.name.replace("2.16.0", "2.15.0")))
    checkout = tmp_path / "checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (checkout / ".venv" / "bin" / "python").chmod(0o755)
    step = workflow_step("release-watch", "Watch the index for a newer torch")
    output = tmp_path / "github-output"
    output.write_text("")
    with LocalIndex(index_folder) as index:
        (checkout / "build.py").write_text(
            f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom torchimages.cli import main\n"
            f"assert sys.argv[1:] == ['watch']\n"
            f"sys.exit(main(['--matrix', {str(project / 'matrix.yaml')!r}, '--images', {str(project / 'images')!r}, "
            f"'--reports', 'reports', 'watch', '--index-url', {index.url!r}]))\n")
        result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=checkout,
                                env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(output)}, capture_output=True,
                                text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    if newer:
        assert outputs["release"] == "2.16.0"
        assert outputs["tags"].split(" ") == json.loads((checkout / "reports" / "release-watch.json").read_text())[
            "tags"] and "2.16.0-cuda13.2-cudnn9-runtime" in outputs["tags"].split(" ")
    else:
        assert outputs == {"release": "", "tags": ""}
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    opens = next(step for step in workflow["jobs"]["release-watch"]["steps"]
                 if str(step.get("uses", "")).startswith("peter-evans/create-pull-request"))
    assert opens["if"] == "steps.watch.outputs.release != ''", "a newer release opens a pull request, rows or none"
    assert "secrets.RELEASE_WATCH_TOKEN" in opens["with"]["token"], "GITHUB_TOKEN's pull requests start no CI"


def test_a_yanked_release_is_not_proposed(project, tmp_path):
    """A release pulled from the index (PEP 592 yanked) is no release to build: the watch proposes nothing, and
    reads the index's torch page once."""
    with LocalIndex(make_release(tmp_path / "index", cuda_library_size=1024)) as index:
        index.yanked = {wheel.name for wheel in index.folder.glob("torch-2.16.0*")}
        result = watch(project, index.url)
        assert "No torch release newer than the matrix's 2.15.0" in result.stdout
        index.yanked = set()
        index.pages.clear()
        watch(project, index.url)
        assert index.pages["torch"] == 1, "one read of the torch page per run"


def test_a_release_on_a_cuda_compat_yaml_does_not_know_is_proposed_as_facts_and_a_note(project, tmp_path):
    """PyPI's build of the new release is on a CUDA the compat data has no driver facts for (they are NVIDIA's, not
    the wheel's): the watch still ends well, with the release's facts read and a note saying what a person adds, so
    the pull request opens instead of the job failing."""
    from .index_fixtures import ARCH_FLAGS, PINS, version_py
    from .wheels_fixtures import make_wheel

    folder = tmp_path / "index"
    make_wheel(folder, "torch", "2.16.0", PINS, ">=3.11", files={
        "torch/version.py": version_py("2.16.0+cu134", "13.4"),
        "torch/lib/libtorch_python.so": b"\x7fELF" + ARCH_FLAGS})
    make_wheel(folder, "torchvision", "0.31.0", ("torch==2.16.0",), tag="cp311-cp311-manylinux_2_28_x86_64")
    matrix = (project / "matrix.yaml").read_text()
    with LocalIndex(folder) as index:
        result = watch(project, index.url)
    report = json.loads((project / "reports" / "release-watch.json").read_text())
    assert report["release"] == "2.16.0" and report["tags"] == []
    assert any("unknown CUDA 13.4" in note and "not proposed" in note for note in report["notes"]), report["notes"]
    assert yaml.safe_load((project / "compat.yaml").read_text())["torch"]["2.16.0"]["cuda"]["13.4"]["source"]
    assert (project / "matrix.yaml").read_text() == matrix and "no rows could be proposed" in result.stdout


def test_a_release_before_its_torchvision_is_proposed_without_it(project, tmp_path):
    """Release day, torchvision not out yet: compat.yaml takes the release with no torchvision paired (and stays a
    compat.yaml every command reads), and the rows are proposed without torchvision, saying so."""
    folder = make_release(tmp_path / "index", cuda_library_size=1024)
    for wheel in folder.glob("torchvision-0.31.0*"):
        wheel.unlink()
    with LocalIndex(folder) as index:
        result = watch(project, index.url)
    report = json.loads((project / "reports" / "release-watch.json").read_text())
    assert "2.16.0-cuda13.2-cudnn9-runtime" in report["tags"], result.stdout
    assert "no torchvision on the index takes torch 2.16.0: proposed without it" in report["notes"]
    specs = {spec.tag: spec for spec in load_matrix(project / "matrix.yaml", project / "compat.yaml").specs}
    assert specs["2.16.0-cuda13.2-cudnn9-runtime"].torchvision is None
    assert "torchvision" not in yaml.safe_load((project / "compat.yaml").read_text())["torch"]["2.16.0"]
    row = "  - {torch: 2.16.0, torchvision: 0.31.0, cuda: \"13.2\", cudnn: 9, flavors: [runtime]}\n"
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text().replace("variants:\n",
                                                                                      "variants:\n" + row, 1))
    with pytest.raises(InputError, match="no torchvision is paired with torch 2.16.0"):
        load_matrix(project / "matrix.yaml", project / "compat.yaml")


def test_the_proposal_passes_the_projects_checks_unedited(tmp_path):
    """What the pull request would hold: the watch run on a scratch copy of this repository against the tests'
    index, then the repository's own engine-free checks of its data run on the result with no edit. The toolkit's
    tests read only tests/project/, so these are the checks a new release can break."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    scratch = tmp_path / "repository"
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, scratch / name)
    newest = max(Version(spec.torch) for spec in load_matrix(ROOT / "matrix.yaml").specs)
    release = f"{newest.major}.{newest.minor + 1}.0"  # the next release, whatever the live matrix has by then
    with LocalIndex(make_release(tmp_path / "index", cuda_library_size=1024, torch=release)) as index:
        watched = subprocess.run([sys.executable, "build.py", "watch", "--index-url", index.url], cwd=scratch,
                                 capture_output=True, text=True, timeout=300, check=False)
    assert watched.returncode == 0 and f"- `{release}-cuda13.2-cudnn9-runtime`" in watched.stdout, watched.stderr
    assert re.search(r"numpy==[0-9]", (scratch / "images" / f"{release}-cpu-runtime" / "Dockerfile").read_text())
    checks = subprocess.run([sys.executable, "-m", "pytest", "-m", "not engine", "-q", "-p", "no:cacheprovider",
                             "tests/test_project_data.py"], cwd=scratch, capture_output=True, text=True, timeout=300, check=False)
    assert checks.returncode == 0, checks.stdout[-4000:] + checks.stderr[-2000:]
