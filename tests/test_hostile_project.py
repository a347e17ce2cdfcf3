"""Hostile ground under a project (issue 56): a project found in a folder someone else owns or can write, templates
that reach for Python's internals, kept .debs written through a link, and init reading or writing through what the
target folder already holds. No Docker engine: the one command that needs it (`debs`) is driven with a fake client.

Each test is named after the code it attacks; every refusal is exit 2, one line naming the file, and no write."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from torchimages.build import debs
from torchimages.project import MATRIX_NAME

from .conftest import copy_fixture_project
from .hostile_fixtures import assert_contract, run_bounded

ROW = "2.13.0-cpu-runtime"
# A uid and gid no test process runs as: "another user" (a test chowns to it as root, which only root may do).
OTHER_ID = 4242 if os.environ.get("SUDO_UID") != "4242" else 4243
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user takes root")
# A template that, outside a sandbox, runs a shell command as the user through a function's module globals.
ESCAPING_TEMPLATES = {
    "globals": "{{ cycler.__init__.__globals__.os.system('touch {marker}') }}\n",
    "class": "{{ ''.__class__.__mro__[1].__subclasses__() }}\n",
    "spec-class": "{{ spec.__class__.__init__.__globals__ }}\n",
}


def refused_in_one_line(result, *named: str) -> None:
    assert_contract(result, 2)
    assert result.stderr.count("\n") == 1, result.stderr
    for name in named:
        assert name in result.stderr, result.stderr


def contents(folder: Path) -> dict[str, str]:
    """Every path below folder with what it is, a link by its target: to show that a refusal wrote nothing."""
    return {str(path.relative_to(folder)): (f"link to {os.readlink(path)}" if path.is_symlink()
                                            else "folder" if path.is_dir() else path.read_bytes().hex()[:64])
            for path in sorted(folder.rglob("*"))}


def planted_project(folder: Path, marker: Path) -> Path:
    """A project with templates of its own that would touch marker when rendered outside a sandbox."""
    copy_fixture_project(folder)
    (folder / "templates").mkdir()
    (folder / "templates" / "Dockerfile.j2").write_text(ESCAPING_TEMPLATES["globals"].replace("{marker}", str(marker)))
    (folder / "below").mkdir()
    return folder / "below"


# ------------------------------------------------------------------------------------------ 1. whose project it is

@needs_root
def test_find_project_refuses_a_project_in_a_folder_another_user_owns(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    start = planted_project(tmp_path / "theirs", marker)
    os.chown(tmp_path / "theirs", OTHER_ID, OTHER_ID)
    monkeypatch.chdir(start)
    for command in (("render",), ("list",), ("--matrix", str(tmp_path / "theirs" / MATRIX_NAME), "render")):
        refused = run_bounded(*command)
        refused_in_one_line(refused, str(tmp_path / "theirs" / MATRIX_NAME), "another user", "--project")
    assert not marker.exists() and not (tmp_path / "theirs" / "images").exists()


@pytest.mark.parametrize("mode", [0o1777, 0o757, 0o775], ids=lambda mode: f"{mode:o}")
def test_find_project_refuses_a_project_in_a_folder_others_can_write(tmp_path, monkeypatch, mode):
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"
    start = planted_project(shared, marker)
    if mode & 0o020 and os.geteuid() == 0:
        os.chown(shared, 0, OTHER_ID)  # a group no user's own: others in it can write
    elif mode & 0o020:
        pytest.skip("a shared group for the folder takes root")
    shared.chmod(mode)
    monkeypatch.chdir(start)
    refused = run_bounded("render")
    refused_in_one_line(refused, str(shared / MATRIX_NAME), f"mode {mode:o}", "--project")
    assert not marker.exists() and not (shared / "images").exists()


def test_find_project_adopts_the_users_own_project_and_a_named_one(tmp_path, monkeypatch):
    """The refusal has a way out (name the project) and spares the user's own folders, group-writable ones in a
    group of their own included."""
    shared = tmp_path / "shared"
    copy_fixture_project(shared)
    (shared / "below").mkdir()
    monkeypatch.chdir(shared / "below")
    assert_contract(run_bounded("list"), 0)
    shared.chmod(0o777)
    assert_contract(run_bounded("--project", str(shared), "list"), 0)


# ------------------------------------------------------------------------------------- 1. templates in a sandbox

@pytest.mark.parametrize("name", sorted(ESCAPING_TEMPLATES))
def test_render_files_keeps_templates_away_from_python_internals(tmp_path, name):
    marker = tmp_path / "ran"
    project = tmp_path / "project"
    copy_fixture_project(project)
    (project / "templates").mkdir()
    template = ESCAPING_TEMPLATES[name].replace("{marker}", str(marker))
    (project / "templates" / "Dockerfile.j2").write_text(template)
    refused = run_bounded("--project", str(project), "render")
    refused_in_one_line(refused, str(project / "templates"), "unsafe")
    assert not marker.exists() and not (project / "images").exists()


def test_render_files_refuses_a_template_value_too_large_for_a_dockerfile(tmp_path):
    project = tmp_path / "project"
    copy_fixture_project(project)
    (project / "templates").mkdir()
    (project / "templates" / "Dockerfile.j2").write_text("{{ 'x' * 4000000000 }}\n")
    refused = run_bounded("--project", str(project), "render", isolated=True)
    refused_in_one_line(refused, str(project / "templates"), "sandbox")


def test_context_files_are_read_as_files_of_the_templates_folder(tmp_path):
    project = tmp_path / "project"
    copy_fixture_project(project)
    (project / "templates" / "context").mkdir(parents=True)
    (project / "templates" / "Dockerfile.j2").write_text("FROM scratch\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for an image\n")
    (project / "templates" / "context" / "entrypoint.sh").symlink_to(secret)
    refused = run_bounded("--project", str(project), "render")
    refused_in_one_line(refused, "entrypoint.sh", "a link")
    assert not (project / "images").exists()


# ------------------------------------------------------------------------------------------- 2. kept .debs by link

class FakeContainer:
    """What debs._download asks of a container: apt ran, and /tmp/debs holds one .deb."""

    def __init__(self, name: str, body: bytes):
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            member = tarfile.TarInfo(f"debs/{name}")
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
        self.archive = archive.getvalue()

    def start(self):
        pass

    def wait(self, timeout):
        return {"StatusCode": 0}

    def get_archive(self, path):
        return iter([self.archive]), {}

    def remove(self, force):
        pass


class FakeClient:
    def __init__(self, container: FakeContainer):
        self.containers = self
        self.container = container

    def create(self, *args, **kwargs):
        return self.container


@pytest.mark.parametrize("target_hash", ["other", "pinned"])
def test_debs_keep_replaces_a_link_under_a_debs_name_instead_of_writing_through_it(tmp_path, target_hash):
    """A link whose target has other bytes was written through; one whose target has the pinned bytes was kept as a
    link, a pointer that can change after the check. Either way dest ends with a file of its own."""
    name, body = "curl_8.5.0-2_amd64.deb", b"the .deb apt downloaded\n"
    pin = debs.PinnedDeb("system", name, hashlib.sha256(body).hexdigest())
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"someone's file\n" if target_hash == "other" else body)
    before = outside.read_bytes()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / name).symlink_to(outside)
    debs.keep(FakeClient(FakeContainer(name, body)), "image", ROW, [pin], dest)
    assert outside.read_bytes() == before, "the download went through the link"
    assert not (dest / name).is_symlink() and (dest / name).read_bytes() == body
    assert sorted(path.name for path in dest.iterdir()) == sorted([name, f"{ROW}.debs.json"]), "a temporary was left"


# ------------------------------------------------------------------------------------------- 8. init's README

def test_readme_with_section_leaves_a_readme_linked_from_elsewhere_alone(tmp_path):
    elsewhere = tmp_path / "private-notes.md"
    elsewhere.write_text("# my private notes\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").symlink_to(elsewhere)
    refused = run_bounded("init", str(project))
    refused_in_one_line(refused, str(project / "README.md"), "plain UTF-8 README.md")
    assert elsewhere.read_text() == "# my private notes\n"
    assert contents(project) == {"README.md": f"link to {elsewhere}"}, "init wrote before it refused"


def test_readme_with_section_refuses_a_fifo_without_waiting(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    os.mkfifo(project / "README.md")
    refused = run_bounded("init", str(project), isolated=True, timeout=30)
    refused_in_one_line(refused, str(project / "README.md"), "not a regular file")
    assert [path.name for path in project.iterdir()] == ["README.md"]


def test_readme_with_section_refuses_a_readme_that_is_not_utf8(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_bytes(b"# caf\xe9\n")
    refused = run_bounded("init", str(project))
    refused_in_one_line(refused, str(project / "README.md"), "not UTF-8")
    assert contents(project) == {"README.md": b"# caf\xe9\n".hex()}


# --------------------------------------------------------------------------------- 17. init checks before it writes

@pytest.mark.parametrize("linked", [".github", "images", "templates"])
def test_cmd_init_checks_every_destination_before_writing_the_first(tmp_path, linked):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / linked).symlink_to(elsewhere, target_is_directory=True)
    refused = run_bounded("init", str(project), "--templates")
    refused_in_one_line(refused, str(project / linked), "a link")
    assert contents(project) == {linked: f"link to {elsewhere}"}, "init wrote before it refused"
    assert not any(elsewhere.iterdir())
