"""Where a run reads and writes, and the exit codes every command shares."""
from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from .build import render
from .build.bases_lock import LOCK_NAME, read_lock
from .invocation import command
from .matrix.load import Matrix, compat_beside, load_matrix
from .matrix.load import select as select_rows
from .model import InputError, Problem

PACKAGE = Path(__file__).resolve().parent
# The folder above the package: this repository when the package runs from a clone (its tests read its data here).
ROOT = PACKAGE.parent
# The Dockerfile templates every project renders with until it has a templates/ folder of its own.
DEFAULT_TEMPLATES = PACKAGE / "templates"
MATRIX_NAME = "matrix.yaml"
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def find_project(start: Path) -> Path | None:
    """The project a command run in `start` works on: the nearest folder, from start upwards, holding a matrix.yaml
    (as git finds its repository). A found folder that someone else could have put there is refused, not adopted
    (as git's safe.directory): its templates and matrix decide what runs as this user."""
    start = start.resolve()
    found = next((folder for folder in (start, *start.parents) if (folder / MATRIX_NAME).is_file()), None)
    if found is not None:
        refuse_untrusted(found)
    return found


def trusted_owners() -> set[int]:
    """Whose folders a found project may be in: this user's, and under sudo the user who ran sudo (as git)."""
    owners = {os.geteuid()}
    sudo_uid = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo_uid.isdigit():
        owners.add(int(sudo_uid))
    return owners


def private_group(gid: int, uid: int) -> bool:
    """The owner's own group (same name, no other member), as umask 002 systems give every user: its write bit lets
    no one else write."""
    try:
        group, owner = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:  # a number the system does not name: nobody can say who is in it
        return False
    return group.gr_name == owner.pw_name and set(group.gr_mem) <= {owner.pw_name}


def refuse_untrusted(folder: Path) -> None:
    """A found project folder another user owns, or that a shared group or everyone may write (a shared /tmp, mode
    1777), is one line and exit 2: a matrix.yaml and templates/ anyone could have planted are never adopted. A
    project named with --project is the user's own choice and is not checked."""
    info = folder.stat()
    if info.st_uid not in trusted_owners():
        why = f"owned by another user (uid {info.st_uid})"
    elif info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and not private_group(info.st_gid, info.st_uid)):
        why = f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    else:
        return
    raise InputError([Problem(str(folder / MATRIX_NAME), 0, f"the project found here is in a folder {why}, so "
                                                             "someone else could have put it there: run the command in "
                                                             "a project of your own, or name this one with --project "
                                                             f"{folder} if you trust it")])


def locate(named: Path | None, start: Path, file: Path | None = None) -> Path:
    """The project folder a run's defaults come from: --project's, else the one found from start upwards. A file
    named by --matrix (or, without one, --compat) needs no matrix.yaml there: outside any project, its own folder is
    the project."""
    if file is not None and (named is not None or find_project(start) is None):
        return named or file.parent
    return project_folder(named, start)


def project_folder(named: Path | None, start: Path) -> Path:
    """--project's folder, else the one found from start upwards; one line naming where it looked when there is
    none."""
    if named is not None:
        if not (named / MATRIX_NAME).is_file():
            raise InputError([Problem(str(named), 0, f"--project {named} holds no {MATRIX_NAME}: name a project folder, "
                                                     f"or make one with {command('init')}")])
        return named
    found = find_project(start)
    if found is None:
        raise InputError([Problem(str(start), 0, f"no {MATRIX_NAME} here or in any folder above: run the command in "
                                                  "a project, name one with --project DIR, or make one with "
                                                  f"{command('init')}")])
    return found


def templates_of(folder: Path) -> Path:
    """The one rule for templates: a project's own templates/ folder wins; without one, the package's defaults."""
    own = folder / "templates"
    return own if own.is_dir() else DEFAULT_TEMPLATES


@dataclass
class Project:
    """Paths of one run; every one can be moved with a global option of build.py."""

    matrix: Path
    compat: Path  # the compatibility facts the matrix is checked against (by default beside it)
    templates: Path
    images: Path
    reports: Path

    @classmethod
    def at(cls, folder: Path, matrix: Path | None = None, compat: Path | None = None, templates: Path | None = None,
           images: Path | None = None, reports: Path | None = None) -> Project:
        """The project in folder, each path given replacing its default there."""
        matrix = matrix or folder / MATRIX_NAME
        return cls(matrix, compat or compat_beside(matrix), templates or templates_of(folder),
                   images or folder / "images", reports or folder / "reports")

    def load(self) -> Matrix:
        return load_matrix(self.matrix, self.compat)

    def select(self, selectors: list[str]):
        return select_rows(self.load().specs, selectors, str(self.matrix))

    @property
    def lock_file(self) -> Path:
        return self.matrix.parent / LOCK_NAME

    def rendered(self, matrix: Matrix) -> dict[str, bytes]:
        """Dockerfiles as the matrix and the base pins (bases.lock.json, when present) say."""
        pinned = {image: base.reference for image, base in read_lock(self.lock_file).items()}
        return render.render_files(matrix.specs, self.templates, self.matrix.name, matrix.repository, pinned)
