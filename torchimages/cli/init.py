"""init: a new project (matrix.yaml, compat.yaml, .gitignore, a CI workflow, a README section, its images rendered)
that `render`, `list`, `doctor` and `images` work in at once. Its templates are the package's until the project has a templates/ folder."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..build.render import MARKER, write_rendered
from ..files import atomic_write, check_destinations, read_text
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
README = "README.md"


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
    # A link counts as there: init overwrites nothing, a link's target included.
    present = [name for name in writes if os.path.lexists(folder / name)]
    if present and not args.force:
        raise InputError([Problem(str(folder), 0, f"holds {', '.join(present)} already: init writes a new project "
                                                  "and overwrites nothing (--force writes only the missing files)")])
    renders = MATRIX_NAME not in present  # --force beside a matrix of the project's own: its images are render's
    # Every destination checked, and the README read, before the first write: a refusal leaves the folder as it was.
    destinations = [folder / name for name in writes if name not in present] + [folder / README]
    if renders:
        destinations.append(Project.at(folder).images / MARKER)
    check_folder(folder)
    check_destinations(destinations, folder)
    readme = readme_with_section(folder / README)
    for name, source in writes.items():
        if name not in present:
            atomic_write(folder / name, source.read_bytes(), root=folder)
    if readme is not None:
        atomic_write(folder / README, readme, root=folder)
    if not renders:
        print(f"{folder}: the missing files written; next: torchimages render")
        return EXIT_OK
    print(f"{folder}: a new project, its images rendered into {render_images(folder)}; next: cd {folder} && "
          "torchimages list && torchimages images")
    return EXIT_OK


def check_folder(folder: Path) -> None:
    """The project's folder itself may be a link (the user named it), or missing; a file there is refused."""
    if os.path.lexists(folder) and not folder.is_dir():
        raise InputError([Problem(str(folder), 0, "a file where the project's folder belongs: name a folder, or move "
                                                  "the file away")])


def render_images(folder: Path) -> Path:
    """The new project's images/, rendered now: `images` builds at once, and the workflow's render check passes on
    the first commit."""
    project = Project.at(folder)
    write_rendered(project.images, project.rendered(project.load()))
    return project.images


def template_files() -> dict[str, Path]:
    return {f"templates/{path.relative_to(DEFAULT_TEMPLATES).as_posix()}": path
            for path in sorted(DEFAULT_TEMPLATES.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


def readme_with_section(readme: Path) -> str | None:
    """The project's README saying how its images are made: a new README, or the section added to the one there
    (None when it has it). Only a plain UTF-8 file of the project is read: a link would copy a file from elsewhere
    into the project, a FIFO would never end."""
    section = README_SECTION.read_text()
    fix = ("init adds its section only to a plain UTF-8 README.md of the project: replace it with such a file, or "
           "move it away")
    current = read_text(readme, fix, follow_links=False) if os.path.lexists(readme) else \
        f"# {readme.resolve().parent.name}\n"
    return None if section.strip() in current else current.rstrip("\n") + "\n" + section
