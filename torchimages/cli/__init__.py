"""The command-line layer over the pipeline (matrix -> render -> build -> verify -> publish): it alone parses flags,
prints and picks exit codes. One module per command group registers its commands; see docs/contributing.md."""
from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import importlib.metadata
import os
import re
import sys
from pathlib import Path

from rich.text import Text

from .. import invocation
from ..files import LOCK_WAIT_ENV, brief, hold_folders
from ..model import PROXY_ARGS, InputError, PeerError, Problem, TorchImagesError, parse_size
from ..peers.registry_address import parse_image_name, parse_registry
from ..project import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, Project, locate
from ..redaction import Secrets
from . import commands as command_table
from .console import errors
from .streams import (
    BAD_PATH,
    EXIT_TERMINATED,
    Terminated,
    handling_sigterm,
    keep_out,
    os_error_line,
    report,
    standard_streams,
)

DEFAULT_LOCK_WAIT_S, MAX_LOCK_WAIT_S = 30.0, 86400
DESCRIPTION = "Render, build, verify and publish PyTorch images from matrix.yaml."
EPILOG = f"Documentation: {invocation.DOCS}"  # not README.md: an installed package has none beside it
# The global flags that take a value: what chosen_command() steps over to find the command.
VALUE_FLAGS = ("--project", "--matrix", "--compat", "--templates", "--images", "--reports")


def chosen_command(argv: list[str]) -> str | None:
    """The command named in argv (its first word that is neither a global flag nor a flag's value), so that only its
    group is imported; None when there is none (`--help`), and an unknown word is argparse's to refuse."""
    words = iter(argv)
    for word in words:
        if word in VALUE_FLAGS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None, everything: bool = False) -> argparse.ArgumentParser:
    """The parser for command: its group in full, every other command as its help line only (None: `--help`);
    every command in full with everything."""
    parser = argparse.ArgumentParser(prog=invocation.program(), description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"torchimages {version()}")
    parser.add_argument("--project", type=Path, metavar="DIR", help=command_table.PROJECT_HELP)
    parser.add_argument("--matrix", type=Path, metavar="PATH", help="the version matrix (default: the project's matrix.yaml)")
    parser.add_argument("--compat", type=Path, metavar="PATH",
                        help="its compatibility facts (default: compat.yaml beside the matrix)")
    parser.add_argument("--templates", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--images", type=Path, metavar="DIR", help="rendered Dockerfiles (default: the project's images/)")
    parser.add_argument("--reports", type=Path, metavar="DIR", help="logs and reports (default: the project's reports/)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command_table.register(commands, command, everything)
    return parser


def version() -> str:
    """The running code's version: a source checkout's pyproject.toml where the package runs from one (the environment
    may have another torchimages installed), else the installed distribution's."""
    source = invocation.source_version()
    if source:
        return source
    try:
        return importlib.metadata.version("torchimages")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed, and no pyproject.toml beside the package)"


def unknown_command(argv: list[str]) -> InputError | None:
    """A misspelt command, as one line with the nearest command (argparse lists all 23 and suggests none)."""
    word = chosen_command(argv)
    if word is None or word in command_table.COMMANDS:
        return None
    guess = difflib.get_close_matches(word, command_table.COMMANDS, n=1)
    fix = f"did you mean '{guess[0]}'?" if guess else f"{invocation.command('--help')} lists the commands"
    return InputError([Problem("", 0, f"unknown command {brief(word)}: {fix}")])


def _at_least(minimum: int):
    def check(value: int) -> None:
        if value < minimum:
            raise ValueError(f"must be {'0 or more' if minimum == 0 else f'at least {minimum}'}, got {value}")
    return check


# Flags whose values can be wrong in ways argparse does not see: checked together, before the matrix is read or any
# engine or registry is called, so one run names every problem. name in args -> (flag, check raising on bad values);
# a check named "module:function" lives in a stage, imported only when its flag was given (its command's group has
# imported that stage already).
FLAG_CHECKS = {
    "gpus": ("--gpus", "torchimages.verify.plan:parse_gpus"),
    "shm_size": ("--shm-size", parse_size),
    "timeout": ("--timeout", _at_least(1)),
    "jobs": ("--jobs", _at_least(1)),
    "retries": ("--retries", _at_least(0)),
    "retention": ("--retention", _at_least(1)),
    "shards": ("--shards", _at_least(1)),
    "shard": ("--shard", "torchimages.nightly.plan:parse_shard"),
    "registry": ("--registry", parse_registry),
    "reference": ("REF", "torchimages.publish.verify_image:image_reference"),  # verify-image, rebuild
    "image": ("--image", parse_image_name),  # test, gpu-record, security: a login is refused before any engine call
    "date": ("--date", "torchimages.cli.options:parse_date"),
}


def flag_problems(args: argparse.Namespace) -> list[Problem]:
    problems = []
    for name, (flag, check) in FLAG_CHECKS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if isinstance(check, str):
            module, _, function = check.partition(":")
            check = getattr(importlib.import_module(module), function)
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


def lock_wait() -> float:
    """Seconds a run waits for another one writing the same folders (TORCHIMAGES_LOCK_WAIT, default 30)."""
    text = os.environ.get(LOCK_WAIT_ENV, "")
    if not text:
        return DEFAULT_LOCK_WAIT_S
    # ASCII digits only: float() also takes other scripts' digits, '_', 'inf' and 'nan'
    seconds = float(text) if re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9})?", text, re.ASCII) else -1.0
    if not 0 <= seconds <= MAX_LOCK_WAIT_S:
        raise InputError([Problem(LOCK_WAIT_ENV, 0, f"{LOCK_WAIT_ENV}={brief(text)} must be seconds from 0 to "
                                                    f"{MAX_LOCK_WAIT_S}: fix it or unset it")])
    return seconds


def main(argv: list[str] | None = None, start: Path | None = None, program: str | None = None) -> int:
    """Every command's one boundary: bad input exits 2, a failed file or stream 1 or 2, Ctrl-C 130 and SIGTERM 143,
    each with one line on stderr and no traceback; files are written whole or not at all. program: the command as the
    user ran it, which messages name (build.py gives `python build.py`; None: guessed from sys.argv[0])."""
    with invocation.running_as(program), standard_streams() as closed, handling_sigterm():
        if closed:
            return report(f"{closed}: closed ({errno.errorcode[errno.EBADF]}): run the command with {closed} open "
                          "(>/dev/null to drop it)", EXIT_BAD_INPUT)
        try:
            code = run(argv, start or Path.cwd())
            sys.stdout.flush()  # a full disk or closed pipe behind stdout shows here, not after main returns
            return code
        except InputError as error:
            for problem in error.problems:  # one line each, however long
                errors().print(Text.assemble(("error:", "red"), f" {problem}"), highlight=False, soft_wrap=True)
            return EXIT_BAD_INPUT
        except PeerError as error:
            return report(f"error: {error}", EXIT_FAILED)
        except Terminated:
            return report("terminated", EXIT_TERMINATED)
        except KeyboardInterrupt:
            return report("interrupted", EXIT_INTERRUPTED)
        except OSError as error:
            return report(f"error: {os_error_line(error)}", EXIT_BAD_INPUT if error.errno in BAD_PATH else EXIT_FAILED)
        except TorchImagesError as error:  # any other kind a stage raises: one line, never a traceback
            return report(f"error: {error}", EXIT_FAILED)


# Where a run's logins come from: index URLs and proxies hold user:password@, --registry may hold it before its host.
URL_FLAGS = ("pip_index_url", "extra_index_url", "index_url", "mirror", "security_mirror")
PROXY_ENV = (*PROXY_ARGS, "ALL_PROXY", "all_proxy")


def run_secrets(args: argparse.Namespace) -> Secrets:
    """What this run must never print: every login its flags and environment name. A registry's host and repository
    hold no '@', so whatever comes before its last one is a login."""
    login = (getattr(args, "registry", None) or "").rpartition("@")[0]
    return (Secrets.in_urls(*(getattr(args, name, None) for name in URL_FLAGS), *map(os.environ.get, PROXY_ENV))
            | Secrets.of(login, login.partition(":")[2]))


def run(argv: list[str] | None, start: Path) -> int:
    """start: the folder the project is looked for from (the current one; build.py's own in a clone)."""
    arguments = sys.argv[1:] if argv is None else argv
    keep_out(Secrets.in_arguments(arguments))  # before parsing: argparse's own errors quote what they refuse
    unknown = unknown_command(arguments)
    if unknown:
        raise unknown
    args = build_parser(chosen_command(arguments)).parse_args(argv)
    keep_out(run_secrets(args) | Secrets.in_arguments(arguments))
    if getattr(args, "makes_project", False):  # init: there is no project yet
        return args.handler(args)
    folder = locate(args.project, start, args.matrix or args.compat)
    project = Project.at(folder, args.matrix, args.compat, args.templates, args.images, args.reports)
    check_flags(project, args)
    writes = getattr(args, "writes", None)
    with hold_folders(writes(project, args) if writes else [], lock_wait()):
        return args.handler(project, args)
