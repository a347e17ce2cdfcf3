"""What the command line shows: results on stdout, progress and errors on stderr, a live view on a terminal and
plain lines in CI logs. Stages report through the Progress classes they define; these are their console forms."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .. import verify
from ..build.builder import BuildResult, Progress, status_words
from ..reporting import human_size

STATUS_STYLE = {"built": "green", "skipped": "cyan", "up to date": "cyan", "failed": "red", "cancelled": "yellow", "building": "white"}
CHECK_STYLE = {"passed": "green", "failed": "red", "skipped": "yellow"}
DOCTOR_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


class ConsoleDisplay:
    """Build and verification progress on one console, as the stages that run both (images, nightly) take it."""

    def __init__(self, console_: Console):
        self.console = console_

    @contextmanager
    def building(self, tags: list[str]) -> Iterator[Progress]:
        if self.console.is_terminal:
            with LiveProgress(self.console, tags) as progress:
                yield progress
        else:
            yield PlainProgress(self.console)

    def verifying(self) -> ConsoleProgress:
        return ConsoleProgress(self.console)


class PlainProgress(Progress):
    """One line per event, for logs that are not terminals."""

    def __init__(self, console: Console):
        self.console = console
        self.started_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def started(self, tag: str) -> None:
        self.started_at[tag] = time.monotonic()
        self._print(f"{tag}: building")

    def step(self, tag: str, step: int, total: int) -> None:
        self._print(f"{tag}: step {step}/{total} ({self._elapsed(tag)})")

    def finished(self, result: BuildResult) -> None:
        # Only the status: why a row failed is said once, after the summary (failure_lines).
        self._print(f"{result.tag}: {status_words(result)}" if result.status == "skipped"
                    else f"{result.tag}: {result.status} ({result.duration:.1f}s)")

    def _elapsed(self, tag: str) -> str:
        return f"{time.monotonic() - self.started_at.get(tag, time.monotonic()):.0f}s"

    def _print(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False, highlight=False)


class LiveProgress(PlainProgress):
    """A rich live table: one line per image with its step n/m and elapsed time."""

    def __init__(self, console: Console, tags: list[str]):
        super().__init__(console)
        self.rows = {tag: ["waiting", "", ""] for tag in tags}
        self.live = Live(self._table(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.update(self._table())
        return self.live.__exit__(*exc)

    def started(self, tag: str) -> None:
        self.started_at[tag] = time.monotonic()
        self.rows[tag] = ["building", "", "0s"]
        self.live.update(self._table())

    def step(self, tag: str, step: int, total: int) -> None:
        self.rows[tag] = ["building", f"{step}/{total}", self._elapsed(tag)]
        self.live.update(self._table())

    def finished(self, result: BuildResult) -> None:
        self.rows[result.tag] = [status_words(result), self.rows.get(result.tag, ["", "", ""])[1],
                                 f"{result.duration:.1f}s"]
        self.live.update(self._table())

    def _table(self) -> Table:
        table = Table(box=None, show_header=True)
        for column in ("image", "status", "step", "elapsed"):
            table.add_column(column)
        for tag, (status, step, elapsed) in self.rows.items():
            table.add_row(tag, Text(status, STATUS_STYLE.get(status.split(" (")[0], "white")), step, elapsed)
        return table


def build_summary(results: list[BuildResult]) -> Table:
    table = Table(title="build summary")
    for column in ("image", "status", "size", "duration", "log"):
        table.add_column(column, no_wrap=column != "log")
    for result in results:
        size = human_size(result.size) if result.size else "-"
        table.add_row(result.tag, Text(status_words(result), STATUS_STYLE[result.status]), size,
                      "-" if result.status == "skipped" else f"{result.duration:.1f}s", result.log or "-")
    return table


def failure_lines(results: list[BuildResult], terminal: bool) -> list[str]:
    """One line per failed row: its cause and remedy (builder.py reads them from the build log), then the log's path:
    on that line in a CI log, on a line of its own on a terminal, where it must not be cut or wrapped to fit the
    table. No path where no build started (nothing was logged)."""
    lines = []
    for result in results:
        if result.status != "failed":
            continue
        cause = " ".join(result.error.split()) or "failed"
        if not result.log:
            lines.append(f"{result.tag} failed: {cause}")
        elif terminal:
            lines += [f"{result.tag} failed: {cause}", f"  full log: {result.log}"]
        else:
            lines.append(f"{result.tag} failed: {cause}; full log: {result.log}")
    return lines


class ConsoleProgress(verify.Progress):
    """Verification progress: a rich status line on a terminal, plain lines in CI logs."""

    def __init__(self, console_):
        self.console = console_
        self.status = console_.status("") if console_.is_terminal else None

    def __enter__(self):
        if self.status:
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status:
            self.status.__exit__(*exc)

    def stage(self, tag: str, text: str) -> None:
        if self.status:
            self.status.update(f"{tag}: {text}")
        else:
            self.console.print(f"{tag}: {text}", markup=False, highlight=False)

    def finished(self, result: verify.VerifyResult) -> None:
        verdict = "passed" if result.passed else "FAILED"
        self.console.print(f"{result.tag}: {verdict} ({result.duration:.1f}s)", markup=False, highlight=False)


def checks_table(result: verify.VerifyResult) -> Table:
    verdict = Text("passed", "green") if result.passed else Text("FAILED", "red")
    title = Text.assemble(f"{result.tag}: ", verdict, f" ({result.duration:.1f}s, {result.image_id[:19]})")
    table = Table(title=title, title_justify="left", caption=result.cpu_standin or None, caption_justify="left")
    for column in ("check", "status", "message"):
        table.add_column(column, no_wrap=column != "message")
    for name, check in result.checks.items():
        table.add_row(name, Text(check["status"], CHECK_STYLE[check["status"]]), Text(check["message"]))
    return table
