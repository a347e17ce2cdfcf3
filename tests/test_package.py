"""What users install (issue 46): the wheel holds every module and data file, installs (not editable) into a fresh
venv as a working `torchimages` command, and `torchimages init` makes a project that renders at once. A hand-written
package list once missed torchimages.build_inputs, so the installed package did not import: only editable installs,
which CI used, worked."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from torchimages.invocation import source_version
from torchimages.project import DEFAULT_TEMPLATES

from .conftest import FIXTURE_PROJECT, ROOT, run_cli_in_process

# What the commands read from the package besides its modules: the check suite's pytest.ini, the default templates and
# the starter project init writes.
DATA_FILES = {"torchimages/checks/suite/pytest.ini", "torchimages/templates/Dockerfile.j2",
              "torchimages/templates/macros.j2", "torchimages/templates/os/apt.j2",
              "torchimages/templates/context/entrypoint.sh", "torchimages/starter/matrix.yaml",
              "torchimages/starter/compat.yaml", "torchimages/starter/images.yml", "torchimages/starter/gitignore"}
INIT_FILES = ("matrix.yaml", "compat.yaml", ".gitignore", ".github/workflows/images.yml", "README.md")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist, built from a copy of the checkout (setuptools writes build/ beside what it builds)."""
    folder = tmp_path_factory.mktemp("dist")
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "torchimages", source / "torchimages", ignore=shutil.ignore_patterns("__pycache__"))
    for hook in ("build_wheel", "build_sdist"):  # one process each: the second builds nothing after the first
        subprocess.run([sys.executable, "-c", f"import sys; from setuptools import build_meta; "
                        f"build_meta.{hook}(sys.argv[1])", str(folder)], cwd=source, check=True, capture_output=True,
                       timeout=300)
    return folder


def test_the_wheel_holds_every_module_and_data_file_and_an_index_takes_its_metadata(dist):
    [wheel] = dist.glob("torchimages-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "torchimages").rglob("*.py")
               if "__pycache__" not in path.parts}
    assert sources - packed == set(), "modules the wheel leaves out"
    assert DATA_FILES - packed == set(), "data files the wheel leaves out"
    assert "console_scripts" in zipfile.ZipFile(wheel).read("torchimages-0.1.0.dist-info/entry_points.txt").decode()
    [sdist] = dist.glob("torchimages-*.tar.gz")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wheel_init_writes_for_ci_holds_what_setuptools_builds(dist, tmp_path):
    """init's own wheel of the running toolkit (the CI workflow it writes installs that file) holds the modules and
    data files of the wheel setuptools builds from pyproject.toml, and the same command."""
    run_cli_in_process("init", str(tmp_path), check_exit=0)
    [ours] = (tmp_path / ".torchimages").glob("torchimages-*.whl")
    [built] = dist.glob("torchimages-*.whl")
    assert ours.name == built.name

    def package_files(wheel: Path) -> set[str]:
        return {name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name}

    assert package_files(ours) == package_files(built)
    entry_points = "torchimages-0.1.0.dist-info/entry_points.txt"
    assert zipfile.ZipFile(ours).read(entry_points) == zipfile.ZipFile(built).read(entry_points)


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed as a user's pip installs it. Its dependencies come from this venv's
    site-packages on PYTHONPATH (tests reach no index); that folder holds the checkout only as an editable-install
    .pth, which Python reads in site folders alone, so the package comes from the fresh venv."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    [wheel] = dist.glob("torchimages-*.whl")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=120)
    return venv


# What a user's shell passes on to the command in the engine lane: the engine, and the session's own user cache.
# TORCHIMAGES_LOCK_WAIT: make test's engine lane waits for a folder the other process holds (the shared wheelhouse).
PASSED_ON = ("DOCKER_HOST", "XDG_CACHE_HOME", "TORCHIMAGES_LOCK_WAIT")


def user_run(venv: Path, *args: str, cwd: Path, timeout: int = 120, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(cwd), "PYTHONPATH": sysconfig.get_paths()["purelib"],
           "COLUMNS": "200", **{name: os.environ[name] for name in PASSED_ON if name in os.environ}, **(env or {})}
    return subprocess.run(["torchimages", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_the_installed_command_makes_a_project_that_renders_and_lists_at_once(installed, tmp_path):
    shown = user_run(installed, "--help", cwd=tmp_path)
    assert shown.returncode == 0 and "init" in shown.stdout, shown.stderr
    where = subprocess.run([str(installed / "bin" / "python"), "-m", "torchimages", "--help"], capture_output=True,
                           text=True, timeout=60, check=False, env={"PYTHONPATH": sysconfig.get_paths()["purelib"]})
    assert where.returncode == 0 and "usage: torchimages" in where.stdout, where.stderr
    assert user_run(installed, "init", "demo", cwd=tmp_path).returncode == 0
    demo = tmp_path / "demo"
    assert all((demo / name).is_file() for name in INIT_FILES)
    assert {path.name for path in (demo / "images").iterdir() if path.is_dir()} == {
        "2.15.0-cuda13.2-cudnn9-runtime", "2.13.0-cpu-runtime"}, "rendered by init: `images` can build at once"
    listed = user_run(installed, "list", cwd=demo)
    assert listed.returncode == 0 and "2 images" in listed.stdout, listed.stderr
    # The installed command names itself in its messages (not a clone's build.py) and knows its version.
    typo = user_run(installed, "list", "2.13.0-cpu-runtme", cwd=demo)
    assert typo.returncode == 2 and "did you mean '2.13.0-cpu-runtime'? (`torchimages list`" in typo.stderr, typo.stderr
    assert "build.py" not in typo.stderr
    version = user_run(installed, "--version", cwd=demo)
    assert version.stdout == f"torchimages {source_version()}\n", version.stderr  # the wheel's, from this checkout
    checked = user_run(installed, "render", "--check", cwd=demo / ".github")  # found from a folder below the project
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (demo / "images" / "2.13.0-cpu-runtime" / "Dockerfile").unlink()
    assert user_run(installed, "render", cwd=demo).returncode == 0
    assert (demo / "images" / "2.13.0-cpu-runtime" / "Dockerfile").is_file()
    # every command group imports from the wheel (the command table imports only the chosen one's)
    for command in ("images", "publish", "verify-image", "rebuild", "nightly", "compat", "security", "test"):
        helped = user_run(installed, command, "--help", cwd=demo)
        assert helped.returncode == 0 and f"usage: torchimages {command}" in helped.stdout, helped.stderr


def test_the_installed_command_renders_the_tests_project_as_a_checkout_does(installed, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(FIXTURE_PROJECT, project)
    listed = user_run(installed, "list", cwd=project)
    assert listed.returncode == 0 and "2.13.0-cpu-runtime" in listed.stdout, listed.stderr
    assert user_run(installed, "render", cwd=project).returncode == 0
    checkout = run_cli_in_process("--project", str(project), "render", "--check", check_exit=0)
    assert "up to date" in checkout.stdout, "the installed templates render what the checkout's do"


def test_init_overwrites_nothing_and_force_writes_only_what_is_missing(tmp_path):
    run_cli_in_process("init", str(tmp_path), check_exit=0)
    (tmp_path / "matrix.yaml").write_text("registry: mine\n")
    (tmp_path / ".gitignore").unlink()
    refused = run_cli_in_process("init", str(tmp_path), check_exit=2)
    assert refused.stderr.count("\n") == 1 and "matrix.yaml" in refused.stderr and "--force" in refused.stderr
    run_cli_in_process("init", str(tmp_path), "--force", check_exit=0)
    assert (tmp_path / "matrix.yaml").read_text() == "registry: mine\n" and (tmp_path / ".gitignore").is_file()
    assert (tmp_path / "README.md").read_text().count("## Images") == 1, "the README section is added once"


def test_a_project_is_found_from_the_current_folder_upwards_or_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = run_cli_in_process("list", check_exit=2)
    assert missing.stderr.count("\n") == 1 and str(tmp_path) in missing.stderr and "init" in missing.stderr
    named = run_cli_in_process("--project", str(tmp_path / "nowhere"), "list", check_exit=2)
    assert "nowhere" in named.stderr and named.stderr.count("\n") == 1
    run_cli_in_process("init", "demo", check_exit=0)
    assert "2 images" in run_cli_in_process("--project", "demo", "list", check_exit=0).stdout
    (tmp_path / "demo" / "deeper").mkdir()
    monkeypatch.chdir(tmp_path / "demo" / "deeper")
    assert str(tmp_path / "demo" / "images") in run_cli_in_process("render", "--check", check_exit=0).stdout


def test_a_projects_own_templates_win_over_the_packages(tmp_path):
    run_cli_in_process("init", str(tmp_path), "--templates", check_exit=0)
    templates = tmp_path / "templates"
    assert (templates / "Dockerfile.j2").read_bytes() == (DEFAULT_TEMPLATES / "Dockerfile.j2").read_bytes()
    with (templates / "Dockerfile.j2").open("a") as template:
        template.write("LABEL org.example.team=ours\n")
    run_cli_in_process("--project", str(tmp_path), "render", check_exit=0)
    assert "org.example.team=ours" in (tmp_path / "images" / "2.13.0-cpu-runtime" / "Dockerfile").read_text()


def test_the_installed_command_takes_an_init_project_to_a_signed_image_verify_image_accepts(
        installed, tmp_path, cpu_images, wheelhouse, cosign, own_registry):
    """The done-when of issues 46 and 57, on the engine, through the installed command alone (its check suite, probe
    and pytest.ini read from the installed package): `init`, `doctor`, `images`, a key from `cosign
    generate-key-pair`, `publish`, `verify-image`, with no workaround. cpu_images built the row first (the same
    Dockerfile), so `images` finds it unchanged and verifies it."""
    assert user_run(installed, "init", "demo", cwd=tmp_path).returncode == 0
    demo = tmp_path / "demo"
    doctor = user_run(installed, "doctor", "2.13.0-cpu-runtime", "--wheelhouse", str(wheelhouse), cwd=demo)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    result = user_run(installed, "images", "2.13.0-cpu-runtime", "--wheelhouse", str(wheelhouse), cwd=demo,
                      timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((demo / "reports" / "2.13.0-cpu-runtime" / "verify.json").read_text())
    assert report["passed"] is True and report["checks"]["smoke"]["status"] == "passed"
    password = {"COSIGN_PASSWORD": "first-day"}
    subprocess.run([str(cosign), "generate-key-pair"], cwd=demo, env={**os.environ, **password}, check=True,
                   capture_output=True, timeout=60)
    _, host = own_registry
    published = user_run(installed, "publish", "2.13.0-cpu-runtime", "--registry", f"{host}/first-day/pytorch",
                         "--signing-key", "cosign.key", cwd=demo, env=password, timeout=600)
    assert published.returncode == 0, published.stdout + published.stderr
    verified = user_run(installed, "verify-image", f"{host}/first-day/pytorch:2.13.0-cpu-runtime", "--key",
                        "cosign.pub", cwd=demo)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "build.py" not in "".join(run.stdout + run.stderr for run in (doctor, result, published, verified))


def test_the_workflow_init_writes_passes_actionlint(tmp_path):
    run_cli_in_process("init", str(tmp_path), check_exit=0)
    workflow = tmp_path / ".github" / "workflows" / "images.yml"
    linted = subprocess.run([str(Path(sys.executable).parent / "actionlint"), str(workflow)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    steps = workflow.read_text()
    assert all(command in steps for command in ("torchimages render --check", "torchimages images", "torchimages test"))
