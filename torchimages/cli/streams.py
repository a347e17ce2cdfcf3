"""What main() puts around every command: stdout and stderr that name themselves when a write fails, SIGTERM
handled as Ctrl-C is, and one line (never a traceback) for a file or stream the system refused."""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..build.failure import strip_ansi
from ..model import TorchImagesError
from ..redaction import Secrets, workflow_commands_broken
from .console import log

EXIT_TERMINATED = 128 + signal.SIGTERM  # as a shell reports a command SIGTERM ended
# Errors that say the path named is wrong (fix the path: exit 2); the others say the run failed (exit 1).
BAD_PATH = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENOENT,
            errno.EEXIST, errno.ENAMETOOLONG, errno.ENXIO}
STANDARD = ((0, "stdin"), (1, "stdout"), (2, "stderr"))


class Terminated(KeyboardInterrupt):
    """SIGTERM (CI cancelling a job) unwinds as Ctrl-C does: builds cancelled, containers and temporaries removed."""


def _terminate(signum, frame) -> None:
    raise Terminated()


@contextmanager
def handling_sigterm() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StreamError(TorchImagesError, OSError):
    """A write to stdout or stderr the system refused. Not a BrokenPipeError even for EPIPE: rich turns that into a
    silent exit 1, and the user would not learn which stream failed."""


class NamedStream:
    """sys.stdout or sys.stderr for a run: a write the system refuses (a closed pipe, a full disk) is an OSError
    naming the stream, after which the stream is dropped (the interpreter's last flush must not fail again);
    characters the stream's encoding lacks (an ASCII-only locale) are escaped, not an error. Every text passes the
    run's redaction first: this is the one boundary every message, table and error line crosses (an engine's error
    escaping a stage, argparse repeating a flag, a message quoting --registry), so no credential is printed, and no
    line is a workflow command the Actions runner would execute (each write may begin a line: it is checked so)."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name
        self.secrets = Secrets()
        # Where this is not a terminal (a CI log, a file), terminal escapes are noise: pip's `ESC[91m` in a build's
        # error, a colour rich was forced to write. FORCE_COLOR asks for them anyway (a CI that renders colours).
        self._plain = not _is_terminal(stream) and not os.environ.get("FORCE_COLOR")

    def write(self, text: str) -> int:
        shown = workflow_commands_broken(self.secrets.redact(strip_ansi(text) if self._plain else text))
        try:
            self._stream.write(shown)
        except UnicodeEncodeError:
            encoding = self._stream.encoding or "ascii"
            self._guarded(self._stream.write, shown.encode(encoding, "backslashreplace").decode(encoding))
        except OSError as error:
            raise self._failed(error) from None
        return len(text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except OSError as error:
            raise self._failed(error) from None

    def _failed(self, error: OSError) -> StreamError:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (a test's capture) stays
            pass
        return StreamError(error.errno, error.strerror, self._name)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):  # closed, or a stream without a descriptor
        return False


@contextmanager
def standard_streams() -> Iterator[str]:
    """The run's stdout and stderr (NamedStream); yields "stdout" when stdout was closed when the run began (its
    descriptor is then taken by /dev/null, as are stdin's and stderr's: a file opened later must never get them)."""
    closed = []
    for descriptor, name in STANDARD:
        try:
            os.fstat(descriptor)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # takes the lowest free descriptor: this one
            closed.append(name)
    saved = sys.stdout, sys.stderr
    if sys.stderr is None or "stderr" in closed:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - dropped with the run
    sys.stderr = NamedStream(sys.stderr, "<stderr>")
    sys.stdout = NamedStream(sys.stdout, "<stdout>") if sys.stdout is not None and "stdout" not in closed else None
    try:
        yield "stdout" if "stdout" in closed or saved[0] is None else ""
    finally:
        sys.stdout, sys.stderr = saved


def keep_out(secrets: Secrets) -> None:
    """From now on, the run's output streams take secrets out as well as anything shaped like a credential."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, NamedStream):
            stream.secrets = secrets


def os_error_line(error: OSError) -> str:
    """One line: the path or stream, what the system said, and its errno name."""
    names = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    code = errno.errorcode.get(error.errno or 0, "")
    reason = error.strerror or " ".join(str(error).split())[:300] or type(error).__name__
    return f"{names or type(error).__name__}: {reason}" + (f" ({code})" if code else "")


def report(line: str, code: int) -> int:
    """Say line on stderr (when stderr can still be written) and give the exit code."""
    try:
        log(line)
    except OSError:
        pass
    return code
