"""init: a new project (matrix.yaml, compat.yaml, .gitignore, a CI workflow, a README section, its images rendered)
that `render`, `list`, `doctor` and `images` work in at once. Its templates are the package's until the project has a templates/ folder."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..build.render import write_rendered
from ..files import atomic_write
from ..model import InputError, Problem
from ..project import DEFAULT_TEMPLATES, EXIT_OK, MATRIX_NAME, PACKAGE, Project
from .commands import add_command

STARTER = PACKAGE / "starter"
README_SECTION = STARTER / "README-section.md"
# Where each starter file goes in the new project. Package data holds no dot-files (`gitignore`), and the workflow
# sits flat there.
WRITES = {
    MATRIX_NAME: STARTER / MATRIX_NAME,
    "compat.yaml": STARTER / "compat.yaml",
    ".gitignore": STARTER / "gitignore",
    ".github/workflows/images.yml": STARTER / "images.yml",
}


def register(commands) -> None:
    parser = add_command(commands, "init", description="Write a new project into DIR. Its Dockerfile templates are the package's own until DIR has a "
                    "templates/ folder (--templates copies them there to edit): a project's templates/ wins.")
    parser.add_argument("folder", nargs="?", type=Path, default=Path("."), metavar="DIR",
                        help="the project's folder, made if missing (default: the current folder)")
    parser.add_argument("--templates", dest="copy_templates", action="store_true",
                        help="also copy the package's templates into DIR/templates, to edit them")
    parser.add_argument("--force", action="store_true", help="write the files that are missing, keep those there")
    parser.set_defaults(handler=cmd_init, makes_project=True)


def cmd_init(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    writes = {**WRITES, **(template_files() if args.copy_templates else {})}
    present = [name for name in writes if (folder / name).exists()]
    if present and not args.force:
        raise InputError([Problem(str(folder), 0, f"holds {', '.join(present)} already: init writes a new project "
                                                  "and overwrites nothing (--force writes only the missing files)")])
    for name, source in writes.items():
        if name not in present:
            atomic_write(folder / name, source.read_bytes(), root=folder)
    add_readme_section(folder / "README.md")
    if MATRIX_NAME in present:  # --force beside a matrix of the project's own: its images are for `render` to write
        print(f"{folder}: the missing files written; next: torchimages render")
        return EXIT_OK
    print(f"{folder}: a new project, its images rendered into {render_images(folder)}; next: cd {folder} && "
          "torchimages list && torchimages images")
    return EXIT_OK


def render_images(folder: Path) -> Path:
    """The new project's images/, rendered now: `images` builds at once, and the workflow's render check passes on
    the first commit."""
    project = Project.at(folder)
    write_rendered(project.images, project.rendered(project.load()))
    return project.images


def template_files() -> dict[str, Path]:
    return {f"templates/{path.relative_to(DEFAULT_TEMPLATES).as_posix()}": path
            for path in sorted(DEFAULT_TEMPLATES.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


def add_readme_section(readme: Path) -> None:
    """The project's README says how its images are made: a new README, or the section added to the one there (once)."""
    section = README_SECTION.read_text()
    current = readme.read_text() if readme.exists() else f"# {readme.resolve().parent.name}\n"
    if section.strip() not in current:
        atomic_write(readme, current.rstrip("\n") + "\n" + section, root=readme.parent)
