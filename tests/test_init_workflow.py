"""The CI workflow `init` writes installs the very toolkit init ran with (newcomer trial 2, finding 4): its wheel in
.torchimages/ checked by its sha256, or a git URL at its commit, and its dependencies at the versions init ran with;
never a bare name from a package index, where `torchimages` was unclaimed and whoever registered it would have run code
in every such workflow."""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from torchimages.cli.init import CONSTRAINTS, Toolkit, git_requirement, toolkit_wheel

from .conftest import run_cli_in_process

WORKFLOW = Path(".github/workflows/images.yml")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA256 = re.compile(r"[0-9a-f]{64}")


def install_steps(workflow: Path | str) -> list[str]:
    """The `run:` text of every job's step that installs torchimages."""
    document = yaml.safe_load(Path(workflow).read_text() if isinstance(workflow, Path) else workflow)
    return [step["run"] for job in document["jobs"].values() for step in job["steps"]
            if "pip install" in str(step.get("run", ""))]


def unpinned(run: str) -> list[str]:
    """What a step's pip install lines would take from an index unpinned: every requirement must be a wheel file the
    step checks by its sha256 first, `name==version` with a --hash, or `name @ git+URL@<40-hex commit>`."""
    checked = {match.group(2) for match in re.finditer(r'"([0-9a-f]{64})  ([^"]+)" \| sha256sum --check', run)}
    loose = []
    for line in run.splitlines():
        words = shlex.split(line)
        if words[:2] != ["pip", "install"]:
            continue
        hashed = any(word.startswith("--hash=sha256:") for word in words)
        arguments = iter(words[2:])
        for word in arguments:
            if word in ("--constraint", "-c"):
                next(arguments)  # a constraints file only narrows what the requirements take
            elif word.startswith("-"):
                continue
            elif word.endswith(".whl"):
                if word.removeprefix("./") not in checked:
                    loose.append(word)
            elif " @ git+" in word:
                if not re.search(r"@[0-9a-f]{40}(#subdirectory=[^ ]+)?$", word):
                    loose.append(word)
            elif not (re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", word) and hashed):
                loose.append(word)
    return loose


def test_the_workflow_pins_the_toolkit_by_its_wheels_sha256_and_names_no_unpinned_package(tmp_path):
    run_cli_in_process("init", str(tmp_path), check_exit=0)
    steps = install_steps(tmp_path / WORKFLOW)
    assert len(steps) == 2 and steps[0] == steps[1], "every job installs the same toolkit"
    assert unpinned(steps[0]) == []
    [wheel] = (tmp_path / ".torchimages").glob("torchimages-*-py3-none-any.whl")
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() in steps[0], "the sha256 checked is the wheel's"
    constraints = (tmp_path / CONSTRAINTS).read_text().splitlines()
    pins = [line for line in constraints if not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9-]+==\S+", pin) for pin in pins), pins
    assert {"jinja2", "pyyaml", "pytest", "urllib3"} <= {pin.split("==")[0] for pin in pins}
    assert not any(pin.startswith("torchimages==") for pin in pins), "the toolkit itself is the wheel"
    text = (tmp_path / WORKFLOW).read_text()
    assert "@" + "INSTALL@" not in text and f'python-version: "{sys.version_info[0]}.{sys.version_info[1]}"' in text
    assert "init --force" in text, "the workflow says how to move to a newer toolkit"


def test_the_checker_finds_the_unpinned_installs_it_is_for():
    assert unpinned('pip install "$TORCHIMAGES"') == ["$TORCHIMAGES"]
    assert unpinned("pip install torchimages") == ["torchimages"]
    assert unpinned("pip install torchimages==0.1.0") == ["torchimages==0.1.0"], "a version without its hash"
    assert unpinned("pip install torchimages==0.1.0 --hash=sha256:" + "a" * 64) == []
    assert unpinned("pip install ./.torchimages/t-0.1.0-py3-none-any.whl") == ["./.torchimages/t-0.1.0-py3-none-any.whl"]
    assert unpinned('pip install "torchimages @ git+https://example.org/t@main"') == [
        "torchimages @ git+https://example.org/t@main"]


def test_a_toolkit_installed_from_git_is_pinned_at_its_commit(tmp_path):
    recorded = {"url": "https://github.com/example/torchimages.git",
                "vcs_info": {"vcs": "git", "commit_id": COMMIT, "requested_revision": "main"}}
    requirement = git_requirement("torchimages", recorded)
    assert requirement == f"torchimages @ git+https://github.com/example/torchimages.git@{COMMIT}"
    workflow = Toolkit([f'pip install --constraint {CONSTRAINTS} "{requirement}"'], {}, "git").workflow()
    assert [unpinned(step) for step in install_steps(workflow)] == [[], []]
    (tmp_path / "images.yml").write_text(workflow)
    linted = subprocess.run([str(Path(sys.executable).parent / "actionlint"), str(tmp_path / "images.yml")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    secret = {**recorded, "url": "https://someone:token@github.com/example/torchimages.git", "subdirectory": "py"}
    assert git_requirement("torchimages", secret) == \
        f"torchimages @ git+https://github.com/example/torchimages.git@{COMMIT}#subdirectory=py", "no credentials"
    assert git_requirement("torchimages", {**recorded, "url": "ssh://git@github.com/example/t.git"}) == \
        f"torchimages @ git+ssh://git@github.com/example/t.git@{COMMIT}", "ssh's user git is no credential"
    # Not from git, or no full commit: the wheel instead.
    assert git_requirement("torchimages", {**recorded, "vcs_info": {"vcs": "git", "commit_id": "0123abc"}}) is None
    assert git_requirement("torchimages", {"url": "file:///src/torchimages", "dir_info": {"editable": True}}) is None
    assert git_requirement("torchimages", {"url": "file:///w/t.whl", "archive_info": {}}) is None
    assert git_requirement("torchimages", {}) is None


def test_the_wheel_is_the_same_bytes_every_time_and_force_writes_back_only_what_is_missing(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run_cli_in_process("init", str(first), check_exit=0)
    run_cli_in_process("init", str(second), check_exit=0)
    [wheel] = (first / ".torchimages").glob("*.whl")
    assert wheel.read_bytes() == (second / ".torchimages" / wheel.name).read_bytes(), "reproducible"
    workflow = (first / WORKFLOW).read_text()
    # The documented move to another toolkit: delete .torchimages/ and the workflow, then init --force.
    for path in (first / ".torchimages").iterdir():
        path.unlink()
    (first / WORKFLOW).unlink()
    (first / "matrix.yaml").write_text((first / "matrix.yaml").read_text() + "# mine\n")
    run_cli_in_process("init", str(first), "--force", check_exit=0)
    assert (first / WORKFLOW).read_text() == workflow and wheel.is_file()
    assert (first / "matrix.yaml").read_text().endswith("# mine\n"), "--force keeps what is there"


def test_the_workflows_install_step_makes_a_working_toolkit_in_a_fresh_venv(tmp_path):
    """The install step's own lines, run as a user's CI runs them: in the project's folder, with a fresh venv's pip.
    Needs the network, as CI does: pip fetches the pinned dependencies from PyPI (or the index pip's configuration
    names). About 30-60 s, most of it pip."""
    project = tmp_path / "demo"
    run_cli_in_process("init", str(project), check_exit=0)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    # A user's shell: this venv first on PATH, nothing of the tests' own environment's Python.
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", HOME=str(tmp_path), PIP_NO_COMPILE="1", COLUMNS="200")
    [step, _] = install_steps(project / WORKFLOW)
    installed = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step], cwd=project, env=env,
                               capture_output=True, text=True, timeout=600, check=False)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert ": OK" in installed.stdout, "the wheel's sha256 was checked"
    listed = subprocess.run(["torchimages", "list"], cwd=project, env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert listed.returncode == 0 and "2 images" in listed.stdout, listed.stdout + listed.stderr
    where = subprocess.run(["python", "-c", "import torchimages; print(torchimages.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60, check=True)
    assert where.stdout.startswith(str(venv)), "the toolkit runs from the venv's install of the wheel"
    # A tampered wheel stops the step before pip runs.
    [wheel] = (project / ".torchimages").glob("*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    refused = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step], cwd=project, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode != 0 and "FAILED" in refused.stdout + refused.stderr


def test_init_refuses_a_toolkit_folder_linked_from_elsewhere_before_writing(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / ".torchimages").symlink_to(elsewhere, target_is_directory=True)
    refused = run_cli_in_process("init", str(project), check_exit=2)
    assert refused.stderr.count("\n") == 1 and ".torchimages" in refused.stderr, refused.stderr
    assert [path.name for path in project.iterdir()] == [".torchimages"] and not any(elsewhere.iterdir())


def test_a_checkouts_egg_info_gives_the_wheel_its_metadata_and_entry_points(tmp_path):
    """An editable install leaves torchimages.egg-info in the checkout, and Python finds it first from there: its
    metadata is PKG-INFO, with no RECORD. The wheel init writes still has METADATA (pip read the version as None
    without it) and the console script."""
    egg_info = tmp_path / "torchimages.egg-info"
    egg_info.mkdir()
    (egg_info / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: torchimages\nVersion: 0.1.0\n")
    (egg_info / "entry_points.txt").write_text("[console_scripts]\ntorchimages = torchimages.cli:main\n")
    name, wheel = toolkit_wheel(importlib.metadata.PathDistribution(egg_info))
    path = tmp_path / name
    path.write_bytes(wheel)
    with zipfile.ZipFile(path) as packed:
        assert "Version: 0.1.0" in packed.read("torchimages-0.1.0.dist-info/METADATA").decode()
        assert "torchimages = torchimages.cli:main" in packed.read(
            "torchimages-0.1.0.dist-info/entry_points.txt").decode()
