"""The command-line layer over the pipeline (matrix -> render -> build -> verify -> publish): it alone parses flags,
prints and picks exit codes. One module per command group registers its commands; see docs/contributing.md."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from .. import plan, verify
from ..model import InputError, PeerError, Problem, parse_size
from ..project import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, ROOT, Project
from ..registry import parse_registry
from . import images, nightly, publishing
from .display import errors
from .options import parse_date

COMMAND_GROUPS = (images, publishing, nightly)
DESCRIPTION = "Render, build, verify and publish PyTorch images from matrix.yaml. See README.md."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="build.py", description=DESCRIPTION)
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml", help="the version matrix (default: %(default)s)")
    parser.add_argument("--templates", type=Path, default=ROOT / "templates", help=argparse.SUPPRESS)
    parser.add_argument("--images", type=Path, default=ROOT / "images", help="rendered Dockerfiles (default: %(default)s)")
    parser.add_argument("--reports", type=Path, default=ROOT / "reports", help="logs and reports (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def _at_least(minimum: int):
    def check(value: int) -> None:
        if value < minimum:
            raise ValueError(f"must be {'0 or more' if minimum == 0 else f'at least {minimum}'}, got {value}")
    return check


# Flags whose values can be wrong in ways argparse does not see: checked together, before the matrix is read or any
# engine or registry is called, so one run names every problem. name in args -> (flag, check raising on bad values)
FLAG_CHECKS = {
    "gpus": ("--gpus", verify.parse_gpus),
    "shm_size": ("--shm-size", parse_size),
    "timeout": ("--timeout", _at_least(1)),
    "jobs": ("--jobs", _at_least(1)),
    "retries": ("--retries", _at_least(0)),
    "retention": ("--retention", _at_least(1)),
    "shards": ("--shards", _at_least(1)),
    "shard": ("--shard", plan.parse_shard),
    "registry": ("--registry", parse_registry),
    "date": ("--date", parse_date),
}


def flag_problems(args: argparse.Namespace) -> list[Problem]:
    problems = []
    for name, (flag, check) in FLAG_CHECKS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        try:
            check(value)
        except InputError as error:
            problems += error.problems
        except ValueError as error:
            problems.append(Problem(flag, 0, f"{flag} {error}"))
    return problems


def check_flags(project: Project, args: argparse.Namespace) -> None:
    """Bad flags are reported with the matrix's own problems, all in one run."""
    problems = flag_problems(args)
    if not problems:
        return
    try:
        project.load()
    except InputError as error:
        problems += error.problems
    raise InputError(problems)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    project = Project(args.matrix, args.templates, args.images, args.reports)
    try:
        check_flags(project, args)
        return args.handler(project, args)
    except InputError as error:
        for problem in error.problems:
            errors().print(Text.assemble(("error:", "red"), f" {problem}"), highlight=False)
        return EXIT_BAD_INPUT
    except PeerError as error:  # the engine or a registry stalled or sent garbage: one line naming it
        errors().print(Text.assemble(("error:", "red"), f" {error}"), highlight=False)
        return EXIT_FAILED
    except KeyboardInterrupt:
        errors().print("interrupted")
        return EXIT_INTERRUPTED
