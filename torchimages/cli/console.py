"""Where the command line writes: results on stdout, progress, logs and errors on stderr (rich consoles that read no
markup from data). Light on purpose: every command, `--help` included, starts with it."""
from __future__ import annotations

import sys

from rich.console import Console


def console() -> Console:
    """Results go to stdout; when it is not a terminal (CI logs), keep tables wide enough to read. Text is never read
    as markup: values from files (a `[/]` in a message) print as they are."""
    return Console(width=None if sys.stdout.isatty() else 220, soft_wrap=not sys.stdout.isatty(), markup=False)


def errors() -> Console:
    """Progress, logs and errors: stderr, so that stdout stays the result (a table, JSON, a summary)."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 220, markup=False)


def log(message: str) -> None:
    """The log line stages report through (pushes, pulls, retries)."""
    print(message, file=sys.stderr, flush=True)
