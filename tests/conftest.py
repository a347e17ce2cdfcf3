import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, check_exit: int | None = None, env=None, timeout=1800) -> subprocess.CompletedProcess:
    """Run build.py as a user would; returns the finished process (stdout/stderr as text)."""
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True,
                            env=env, timeout=timeout)
    if check_exit is not None:
        assert result.returncode == check_exit, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


@pytest.fixture
def cli():
    return run_cli
