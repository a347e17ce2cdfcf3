"""The thin command line over the pipeline: matrix -> render -> build -> verify -> publish."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import matrix as matrix_stage
from . import render as render_stage
from .model import ImageSpec, InputError

ROOT = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class Project:
    """Where a run reads and writes; every path can be moved with a global option."""

    matrix: Path
    templates: Path
    images: Path
    reports: Path

    def load(self) -> matrix_stage.Matrix:
        return matrix_stage.load_matrix(self.matrix)

    def rendered(self, matrix: matrix_stage.Matrix) -> dict[str, bytes]:
        return render_stage.render_files(matrix.specs, self.templates, self.matrix.name, matrix.repository)


def console() -> Console:
    """Results go to stdout; when it is not a terminal (CI logs), keep tables wide enough to read."""
    return Console(width=None if sys.stdout.isatty() else 220, soft_wrap=not sys.stdout.isatty())


def errors() -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() else 220)


def cmd_list(project: Project, args) -> int:
    specs = matrix_stage.select(project.load().specs, args.selectors, str(project.matrix))
    rows = [_list_row(spec) for spec in specs]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    table = Table(title=f"{len(rows)} images from {project.matrix}")
    for column in rows[0]:
        table.add_column(column, no_wrap=column in ("tag", "base_image"))
    for row in rows:
        table.add_row(*(str(value) for value in row.values()))
    console().print(table)
    return EXIT_OK


def _list_row(spec: ImageSpec) -> dict:
    return {
        "tag": spec.tag, "torch": spec.torch, "cuda": spec.cuda or "cpu", "cudnn": spec.cudnn or "-",
        "python": spec.python, "os": spec.os, "flavor": spec.flavor, "base_image": spec.base_image,
        "min_driver": spec.min_driver or "-", "arch_list": ";".join(spec.arch_list) or "-",
    }


def cmd_render(project: Project, args) -> int:
    rendered = project.rendered(project.load())
    if args.check:
        stale = render_stage.stale_paths(project.images, rendered)
        if stale:
            print(f"{project.images} is stale; run `python build.py render` and commit the result:", file=sys.stderr)
            for rel in stale:
                print(f"  {project.images / rel}", file=sys.stderr)
            return EXIT_FAILED
        print(f"{project.images} is up to date ({len(rendered)} files)")
        return EXIT_OK
    changed = render_stage.write_rendered(project.images, rendered)
    print(f"rendered {len(rendered)} files into {project.images}: {len(changed)} changed")
    for rel in changed:
        print(f"  {rel}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__)
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml", help="the version matrix (default: %(default)s)")
    parser.add_argument("--templates", type=Path, default=ROOT / "templates", help=argparse.SUPPRESS)
    parser.add_argument("--images", type=Path, default=ROOT / "images", help="rendered Dockerfiles (default: %(default)s)")
    parser.add_argument("--reports", type=Path, default=ROOT / "reports", help="logs and reports (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="print every tag with its versions")
    listing.add_argument("selectors", nargs="*", metavar="SELECTOR", help="tags or globs")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    listing.set_defaults(handler=cmd_list)

    rendering = commands.add_parser("render", help="write images/<tag>/Dockerfile from the matrix")
    rendering.add_argument("--check", action="store_true", help="exit 1 listing stale files, write nothing")
    rendering.set_defaults(handler=cmd_render)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    project = Project(args.matrix, args.templates, args.images, args.reports)
    try:
        return args.handler(project, args)
    except InputError as error:
        for problem in error.problems:
            errors().print(f"[red]error:[/red] {problem}", markup=True, highlight=False)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        errors().print("interrupted")
        return EXIT_INTERRUPTED
