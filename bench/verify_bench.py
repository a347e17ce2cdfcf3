#!/usr/bin/env python3
"""Verification benchmark (issue 4), printed as Markdown for docs/benchmarks-log.md.

Times `build.py test <tag> --gpus none` as a user runs it (whole CLI, Python start-up included) several
times, with the stages each run recorded in its verify.json and the probe's own timings from facts.json.
Target: verifying one CPU runtime image takes at most 15 s.

Needs a running engine (`make engine`, `source .engine/env`) and the image built (`build.py build`).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from datetime import date
from pathlib import Path

from timing import timed_verification  # noqa: E402 (bench/ is the script's folder, so on sys.path)

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 15.0


def one_run(tag: str, reports: Path) -> dict:
    wall, report, facts = timed_verification(tag, reports)
    main = facts["main"]
    return {
        "wall": wall, "stages": report["stage_seconds"], "passed": report["passed"],
        "probe": main["probe_seconds"], "torch_import": main["torch"]["import_seconds"],
        "dataloader": main["shm"]["dataloader"]["seconds"], "amp_cpu": main["amp_cpu"]["seconds"],
        "side_probes": max(facts["files"]["probe_seconds"], facts["import"]["probe_seconds"]),
    }


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def stage_median(runs: list[dict], stage: str) -> float:
    return statistics.median(run["stages"].get(stage, 0.0) for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tag", default="2.13.0-cpu-runtime")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verify-bench-") as folder:
        one_run(args.tag, Path(folder))  # warm the page cache: torch's libraries are read once per boot
        runs = [one_run(args.tag, Path(folder)) for _ in range(args.runs)]
    walls = sorted(run["wall"] for run in runs)
    load = os.getloadavg()[0]
    print(f"Machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), {date.today()}, "
          f"load average {load:.1f} at the end; image {args.tag}; {args.runs} runs after one warm-up\n")
    print("| `build.py test` one CPU runtime image | seconds |\n|---|---|")
    print(f"| whole CLI run, median (min .. max) | **{statistics.median(walls):.1f}** ({walls[0]:.1f} .. {walls[-1]:.1f}) |")
    for stage in ("starting container", "probing", "checking", "removing container"):
        print(f"| stage: {stage} | {stage_median(runs, stage):.2f} |")
    print(f"| probe (main part) in the container | {median(runs, 'probe'):.2f} |")
    print(f"| of which `import torch` | {median(runs, 'torch_import'):.2f} |")
    print(f"| of which DataLoader, 4 workers, 192 MiB through /dev/shm | {median(runs, 'dataloader'):.2f} |")
    print(f"| of which CPU bf16 autocast training steps | {median(runs, 'amp_cpu'):.2f} |")
    print(f"| side probes (root file scan, arbitrary-uid import), in parallel | {median(runs, 'side_probes'):.2f} |")
    verdict = "meets" if statistics.median(walls) <= TARGET_S else "MISSES"
    print(f"\nTarget ≤ {TARGET_S:.0f} s per CPU runtime image: the median {verdict} it.")


if __name__ == "__main__":
    main()
