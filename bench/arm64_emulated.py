#!/usr/bin/env python3
"""arm64 (Grace) rows under emulation on an x86_64 host (issue 28), printed as Markdown rows for docs/benchmarks-log.md.

For each row given (default: the 2.14.1 cu13.0 arm64 runtime row, the one CI is meant to build), as a user runs it:
`build.py wheels` (the aarch64 wheel set from PyPI), `build.py build --no-cache` from that wheelhouse (every RUN step
under qemu), and `build.py test --gpus none` (the checks under qemu; GPU checks skipped with their reason), each timed, with the
image's size. Needs `make engine` (which registers qemu and makes arm64v8/debian:bookworm) and `source .engine/env`.
One arm64 CUDA build at a time: it needs about 4 GB of wheels and 10 GB of engine disk. Not one of `make bench`'s
`*_bench.py` scripts (a row takes about 40 minutes under qemu on 2 cores), and the row must be switched on first:
`arch: [x86_64, aarch64]` on its variant in matrix.yaml, then `python build.py render`.

    python bench/arm64_emulated.py ['2.14.1-cuda13.0-cudnn9-runtime-arm64' ...] [--wheelhouse wheelhouse]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.build.builder import local_name  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402

DEFAULT_ROWS = ["2.14.1-cuda13.0-cudnn9-runtime-arm64"]


def timed(*arguments: str) -> tuple[float, int]:
    """Seconds `build.py ARGUMENTS` took, and its exit code (its output goes to this terminal)."""
    started = time.perf_counter()
    returncode = subprocess.run([sys.executable, str(ROOT / "build.py"), *arguments], cwd=ROOT, check=False).returncode
    return time.perf_counter() - started, returncode


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def image_bytes(tag: str) -> int:
    [spec] = select(load_matrix(ROOT / "matrix.yaml").specs, [tag])
    return int(subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", local_name(spec)], check=True,
                              capture_output=True, text=True).stdout)


def checks(tag: str) -> str:
    report = json.loads((ROOT / "reports" / tag / "verify.json").read_text())
    counts: dict[str, int] = {}
    for verdict in report["checks"].values():
        counts[verdict["status"]] = counts.get(verdict["status"], 0) + 1
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="*", default=DEFAULT_ROWS)
    parser.add_argument("--wheelhouse", default="wheelhouse")
    options = parser.parse_args()
    if "DOCKER_HOST" not in os.environ:
        parser.error("no engine: run `make engine` and `source .engine/env` first")
    print(f"<!-- {date.today()} on {platform.node()}: {os.cpu_count()} cores, {platform.machine()} -->")
    print("| row | wheels (fetch, size) | build --no-cache (under qemu) | image size | test (under qemu) | checks |")
    print("|---|---|---|---|---|---|")
    for tag in options.rows:
        fetch, fetched = timed("wheels", tag, "--dest", options.wheelhouse)
        build, built = timed("build", tag, "--wheelhouse", options.wheelhouse, "--no-cache", "--force")
        test, tested = timed("test", tag, "--gpus", "none")  # no NVIDIA runtime here: the GPU checks skip, saying so
        wheels = folder_bytes(ROOT / options.wheelhouse / "cu130-py3.11-aarch64") if fetched == 0 else 0
        size = f"{image_bytes(tag) / 1e9:.2f} GB" if built == 0 else f"build failed ({built})"
        print(f"| {tag} | {fetch:.0f} s, {wheels / 1e9:.2f} GB | {build / 60:.1f} min | {size} | {test / 60:.1f} min "
              f"(exit {tested}) | {checks(tag) if tested in (0, 1) else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
