"""What the hostile-input tests share (test_hostile_input, test_hostile_index, test_hostile_peers, and the security
archive's and build-input server's): build.py run bounded (no engine reachable, a memory cap and a hang guard when
isolated), the contract every run keeps, a scratch project with sentinels beside it, and an alarm for a block that
could hang."""
import os
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from .conftest import FIXTURE_COMPAT, FIXTURE_MATRIX, ROOT, run_cli_in_process

MATRIX_TEXT = FIXTURE_MATRIX.read_text()
CPU_RUNTIME = "2.13.0-cpu-runtime"
HANG_GUARD_S = 60  # a command that is still running after this has hung: the test fails saying so
MEMORY_CAP = 2 * 2**30  # address space of one build.py run: a memory bomb fails fast instead of swapping the host
NO_ENGINE = "unix:///nonexistent/torchimages-test/docker.sock"


def run_bounded(*args: str, env: dict | None = None, timeout: float = HANG_GUARD_S,
                isolated: bool = False) -> subprocess.CompletedProcess:
    """build.py as a user runs it. DOCKER_HOST points at nothing unless the caller says otherwise, so no command can
    reach a real engine by accident. isolated: in its own process with a memory cap and a hang guard, for inputs
    built to exhaust memory or hang; else in this process (fast)."""
    if not isolated:
        return run_cli_in_process(*args, env={"DOCKER_HOST": NO_ENGINE, **(env or {})})

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    environment = {**os.environ, "DOCKER_HOST": NO_ENGINE, **(env or {})}
    try:
        return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, encoding="utf-8",
                              errors="replace", env=environment, timeout=timeout, preexec_fn=cap_memory,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else error.stderr
        raise AssertionError(f"build.py {' '.join(args)!r} still ran after {timeout} s (it hangs); stderr so far:\n"
                             f"{stderr}") from None


def assert_contract(result: subprocess.CompletedProcess, *expected_codes: int) -> None:
    """Exit 0, 1 or 2 (or one of expected_codes), no traceback, and an exit 2 says what was wrong."""
    shown = f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode in (expected_codes or (0, 1, 2)), shown
    assert "Traceback" not in result.stderr, shown
    if result.returncode == 2:
        assert "error" in result.stderr.lower(), shown


def in_scratch(scratch: Path, *command: str, matrix: Path | None = None) -> tuple[str, ...]:
    """Global options that keep a command's reads and writes inside scratch (the catalog goes beside images)."""
    return ("--matrix", str(matrix or scratch / "matrix.yaml"), "--images", str(scratch / "images"),
            "--reports", str(scratch / "reports"), *command)


def make_scratch(top: Path, matrix_text: str | bytes = MATRIX_TEXT) -> Path:
    """top/scratch/matrix.yaml for the command, and sentinels beside scratch that no command may touch."""
    scratch = top / "scratch"
    scratch.mkdir()
    (top / "sentinel.txt").write_text("a file next to the scratch folder\n")
    (top / "neighbour").mkdir()
    (top / "neighbour" / "keep.txt").write_text("another folder next to it\n")
    data = matrix_text.encode("utf-8") if isinstance(matrix_text, str) else matrix_text
    (scratch / "matrix.yaml").write_bytes(data)
    shutil.copy(FIXTURE_COMPAT, scratch / "compat.yaml")
    return scratch


@contextmanager
def within(seconds: int):
    """Fails the test, instead of hanging it, when the block runs past seconds (a spin or a blocking open)."""
    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s: a hang")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
