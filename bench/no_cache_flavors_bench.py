#!/usr/bin/env python3
"""A row's two flavors built with `--no-cache` in one run, as a nightly that rebuilds from nothing builds them: the
toolkit at `--baseline` (every build of the run without the cache: devel runs every step again) against this
checkout (devel takes the layers its runtime made moments before, and runs only its own steps and the build stages).

For each side, one `build.py build RUNTIME DEVEL --no-cache --force` run (the page cache dropped first): its seconds,
each flavor's build seconds (the build report), the disk the run needed at its peak (the engine's data root and the
context folder, sampled every second), and the layers devel shares with its runtime (count and uncompressed bytes).
Needs the project's engine (`make engine`, `source .engine/env`) and the row's wheelhouse. Leaves nothing behind.

Run: `python bench/no_cache_flavors_bench.py [--row RUNTIME_TAG] [--wheelhouse DIR] [--baseline REF]`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from cold_build_bench import (
    CUDA_RUNTIME,
    ROOT,
    DiskSampler,
    bench_matrix,
    drop_page_cache,
    export_baseline,
    layers,
    log,
    remove,
)

from devtools import localengine
from torchimages.build.builder import BUILD_REPORT
from torchimages.peers import engine

BASELINE = "c2e35aa"  # the last commit whose --no-cache built every flavor without the cache


def build_flavors(toolkit: Path, matrix: Path, tags: list[str], wheelhouse: Path, scratch: Path) -> dict:
    contexts = scratch / "tmp"
    contexts.mkdir(exist_ok=True)
    reports = scratch / f"reports-{uuid.uuid4().hex[:6]}"
    command = [sys.executable, str(toolkit / "build.py"), "--matrix", str(matrix), "--images", str(toolkit / "images"),
               "--reports", str(reports), "build", *tags, "--wheelhouse", str(wheelhouse), "--force", "--no-cache"]
    drop_page_cache()
    with DiskSampler([localengine.DATA_ROOT, contexts]) as disk:
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=toolkit,
                              env=dict(os.environ, TMPDIR=str(contexts), PYTHONPATH=str(toolkit)))
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the build by {toolkit} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    report = BUILD_REPORT.read(reports)
    return {"seconds": round(seconds, 1), "disk_peak": disk.peak - disk.start,
            "flavor_seconds": {tag: report[tag]["duration"] for tag in tags}}


def shared_layers(client, runtime: str, devel: str) -> dict:
    below, above = layers(client, runtime), layers(client, devel)
    shared = next((index for index, (ours, theirs) in enumerate(zip(below, above, strict=False)) if ours != theirs), len(below))
    return {"shared": shared, "runtime_layers": len(below), "shared_bytes": sum(size for _, size in below[:shared]),
            "runtime_bytes": sum(size for _, size in below)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default=CUDA_RUNTIME, help="the runtime flavor's tag (its devel is built after it)")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args()
    tags = [args.row, args.row.replace("-runtime", "-devel")]
    client = engine.client()
    scratch = Path(tempfile.mkdtemp(prefix="no-cache-flavors-bench-", dir=ROOT / ".engine"))
    results: dict = {"rows": tags, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"}
    try:
        for side, toolkit in (("baseline", export_baseline(args.baseline, scratch / "baseline")), ("this", ROOT)):
            references = [f"localhost:5000/bench27/{side}:{tag}" for tag in tags]
            log(f"{side}: {' '.join(tags)} --no-cache")
            try:
                results[side] = build_flavors(toolkit, bench_matrix(toolkit, scratch, side), tags, args.wheelhouse,
                                              scratch)
                results[side].update(shared_layers(client, *references))
                log(f"{side}: {results[side]}")
            finally:  # the disk is shared: each side's images go before the next side builds
                for reference in references:
                    remove(client, reference)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
