#!/usr/bin/env python3
"""Command start-up: how long `torchimages --help` and `torchimages list` take before they do anything, and which
heavy libraries they import on the way (the command table imports only the chosen command's group, so `--help` needs
neither the Docker SDK nor cryptography); Markdown for docs/benchmarks.md.

    python bench/startup_bench.py                     # this checkout, 7 runs of each
    python bench/startup_bench.py --baseline 404767e  # and the same commands at another commit, side by side

Each run is a fresh interpreter (`python -m torchimages`, the installed command's own path), on the frozen test
project (tests/project). The baseline is checked out into a temporary git worktree and removed afterwards.
Needs no engine.
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("docker", "cryptography", "jsonschema", "pkcs11", "jinja2", "rich")
COMMANDS = {"--help": ["--help"], "list": ["--project", "tests/project", "list"]}


def timed(tree: Path, arguments: list[str], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torchimages", *arguments], cwd=tree, capture_output=True, check=True,
                       timeout=120)
        seconds.append(time.perf_counter() - started)
    return seconds


def heavy_imports(tree: Path, arguments: list[str]) -> list[str]:
    """The heavy libraries the command imports (python -X importtime's top-level names)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchimages", *arguments], cwd=tree,
                          capture_output=True, text=True, check=True, timeout=120)
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in imported]


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), revision], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def rows(label: str, tree: Path, runs: int) -> list[str]:
    lines = []
    for name, arguments in COMMANDS.items():
        seconds = timed(tree, arguments, runs)
        lines.append(f"| {label} | `torchimages {name}` | {min(seconds):.2f} | {statistics.median(seconds):.2f} | "
                     f"{', '.join(heavy_imports(tree, arguments)) or 'none'} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", metavar="REV", help="also time the commands at this commit")
    args = parser.parse_args()
    print(f"Command start-up, {date.today().isoformat()}, {platform.node()} ({platform.machine()}, "
          f"Python {platform.python_version()}), {args.runs} runs each\n")
    print("| tree | command | min s | median s | heavy libraries imported |\n|---|---|---|---|---|")
    if args.baseline:
        with checkout(args.baseline) as tree:
            print("\n".join(rows(args.baseline, tree, args.runs)))
    print("\n".join(rows("this checkout", ROOT, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
