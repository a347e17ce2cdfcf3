"""The command as the user ran it, for every message that tells them what to run next: `torchimages` (the installed
console script, `python -m torchimages`) or `python build.py` (a clone's build.py); and the tool's own source checkout
when the package runs from one whose Makefile has the `engine` target, so `make engine` is offered only where it
exists. Nothing here imports the rest of the package: every wing may import it.

The one place the package spells `build.py` or `make` as a command (tests/test_command_names.py holds it so)."""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

INSTALLED = "torchimages"
CLONE = "python build.py"
PROGRAM_ENV = "TORCHIMAGES_PROGRAM"  # how a child process (the check suite's pytest) learns the name
# Where the package's source would be in a clone (or an editable install); in site-packages there is no Makefile.
CHECKOUT = Path(__file__).resolve().parent.parent
ENGINE_TARGET = re.compile(rb"^engine:", re.MULTILINE | re.ASCII)
MAX_MAKEFILE = 2**20  # bytes read of it: the target sits near its top, and a huge file is not this tool's
# [project]'s name and version lines, as this repository's pyproject.toml writes them.
PROJECT_VERSION = re.compile(rb'^name = "torchimages"\nversion = "([0-9A-Za-z.+!-]{1,64})"$', re.MULTILINE | re.ASCII)
DOCS = "https://github.com/torchimages/torchimages/tree/main/docs"  # a pipx user has no docs/ folder
EXPORT_DOCKER_HOST = "export DOCKER_HOST=unix:///path/to/docker.sock"

# Set by main() for the run (running_as); None: guessed from sys.argv[0]. A module global, not a ContextVar: the
# builder's and verifier's worker threads word messages too, and a ContextVar's value does not reach them.
_program: str | None = None


def guess(argv0: str) -> str:
    """A process started as `python build.py` has build.py as argv[0]; the console script and -m have another."""
    return CLONE if Path(argv0).name == "build.py" else INSTALLED


def program() -> str:
    """The command's name as the user ran it: `torchimages` or `python build.py`; in the check suite's own pytest
    process, the name its parent handed on."""
    handed = os.environ.get(PROGRAM_ENV)
    return _program or (handed if handed in (INSTALLED, CLONE) else guess(sys.argv[0] if sys.argv else ""))


def handed_on(environment: Mapping[str, str]) -> dict[str, str]:
    """environment for a child process of this tool whose messages name the command (the check suite's pytest)."""
    return {**environment, PROGRAM_ENV: program()}


def command(words: str) -> str:
    """A command for a message, quoted as messages quote commands: command("build TAG") is "`torchimages build TAG`"
    for the installed command and "`python build.py build TAG`" in a clone."""
    return f"`{program()} {words}`"


@contextmanager
def running_as(name: str | None) -> Iterator[None]:
    """Messages name the command as name (None: guessed) while the block runs; the previous name afterwards (a test
    runs main() in-process both ways)."""
    global _program
    before, _program = _program, name
    try:
        yield
    finally:
        _program = before


def source_version() -> str | None:
    """The version in the source checkout's pyproject.toml when the package runs from one (tomllib is 3.11's; the
    package runs on 3.10); None for an installed package."""
    try:
        with (CHECKOUT / "pyproject.toml").open("rb") as pyproject:
            text = pyproject.read(MAX_MAKEFILE)
    except OSError:
        return None
    found = PROJECT_VERSION.search(text)
    return found.group(1).decode() if found else None


def engine_checkout() -> Path | None:
    """The tool's source checkout when its Makefile has the `engine` target (`make engine` exists there); None for an
    installed package."""
    try:
        with (CHECKOUT / "Makefile").open("rb") as makefile:
            text = makefile.read(MAX_MAKEFILE)
    except OSError:
        return None
    return CHECKOUT if ENGINE_TARGET.search(text) else None


def make_engine() -> str | None:
    """`make engine` (then `source .engine/env`) as it is run from here: with -C when here is not the checkout; None
    where there is no such Makefile."""
    checkout = engine_checkout()
    if checkout is None:
        return None
    try:
        here = Path.cwd().resolve() == checkout
    except OSError:  # the current folder was deleted
        here = False
    if here:
        return "`make engine` (then `source .engine/env`)"
    return f"`make -C {checkout} engine` (then `source {checkout}/.engine/env`)"


def start_engine() -> str:
    """The remedy for no engine answering: the checkout's engine where there is one, else the user's own."""
    made = make_engine()
    if made:
        return f"start one with {made}, or {EXPORT_DOCKER_HOST}"
    return f"start a Docker engine, or {EXPORT_DOCKER_HOST} to name one that runs"


def offline_base() -> str:
    """How a base image gets onto an engine that cannot pull it: the checkout's engine seeds the CPU bases; anyone
    else makes one as the docs say."""
    made = make_engine()
    if made:
        return f"run {made}: it seeds the CPU bases"
    return f'make an offline Debian base with {command("base NAME")} (docs/building.md, "Offline bases")'


def install_skopeo() -> str:
    made = make_engine()
    return "`apt-get install skopeo`" + (f" ({made} installs it)" if made else "")
