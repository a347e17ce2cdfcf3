"""init: a new project (matrix.yaml, compat.yaml, .gitignore, a CI workflow, a README section) that `render`, `list`,
`doctor` and `images` work in at once. Its templates are the package's until the project has a templates/ folder."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..files import atomic_write
from ..model import InputError, Problem
from ..project import DEFAULT_TEMPLATES, EXIT_OK, MATRIX_NAME, PACKAGE

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
    parser = commands.add_parser(
        "init", help="make a new project: matrix.yaml (a CPU and a CUDA row), compat.yaml, .gitignore, a CI workflow",
        description="Write a new project into DIR. Its Dockerfile templates are the package's own until DIR has a "
                    "templates/ folder (--templates copies them there to edit): a project's templates/ wins.")
    parser.add_argument("folder", nargs="?", type=Path, default=Path("."), metavar="DIR",
                        help="the project's folder, made if missing (default: the current folder)")
    parser.add_argument("--templates", dest="copy_templates", action="store_true",
                        help="also copy the package's templates into DIR/templates, to edit them")
    parser.add_argument("--force", action="store_true", help="write the files that are missing, keep those there")
    parser.set_defaults(handler=cmd_init, makes_project=True)


def cmd_init(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    writes = dict(WRITES)
    if args.copy_templates:
        writes.update(template_files())
    present = [name for name in writes if (folder / name).exists()]
    if present and not args.force:
        raise InputError([Problem(str(folder), 0, f"holds {', '.join(present)} already: init writes a new project "
                                                  "and overwrites nothing (--force writes only the missing files)")])
    for name, source in writes.items():
        if name not in present:
            atomic_write(folder / name, source.read_bytes(), root=folder)
    add_readme_section(folder / "README.md")
    print(f"{folder}: a new project; next: cd {folder} && torchimages list && torchimages render")
    return EXIT_OK


def template_files() -> dict[str, Path]:
    return {f"templates/{path.relative_to(DEFAULT_TEMPLATES).as_posix()}": path
            for path in sorted(DEFAULT_TEMPLATES.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


def add_readme_section(readme: Path) -> None:
    """The project's README says how its images are made: a new README, or the section added to the one there (once)."""
    section = README_SECTION.read_text()
    current = readme.read_text() if readme.exists() else f"# {readme.resolve().parent.name}\n"
    if section.strip() not in current:
        atomic_write(readme, current.rstrip("\n") + "\n" + section, root=readme.parent)
