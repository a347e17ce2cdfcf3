"""What the verification benchmarks share: one `build.py test TAG` run as a user runs it, timed, with its reports."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_verification(tag: str, reports: Path) -> tuple[float, dict, dict]:
    """(wall seconds, verify.json, facts.json) of `build.py test TAG --gpus none`, Python start-up included."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "build.py"), "--reports", str(reports), "test", tag,
                           "--gpus", "none"], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"build.py test failed to run (exit {done.returncode}):\n{done.stderr}")
    report = json.loads((reports / tag / "verify.json").read_text())
    facts = json.loads((reports / tag / "facts.json").read_text())
    return wall, report, facts
