#!/usr/bin/env python3
"""The settling step's read of a built image's config (issue 58, item 6), the three ways side by side in one run:

- save: `docker save` of the whole image, read through for its config (what every build did before). Docker 20.10
  writes the save into a folder on its own disk first: the image's size again, for a moment.
- engine: the engine's inspect and history, and a save of the base alone (build/reproducible.py's engine_config).
- store: the config file in the engine's image store, checked against the image id (stored_config; what settling
  reads first, and the only way short of a save for a BuildKit build).

For each: seconds (median of --runs), and the engine disk's peak use above its level before (free space sampled every
50 ms on the filesystem of the engine's root folder, which `docker info` names: it must be on this host). Both must
give the same settled config (the run stops if not). Markdown for docs/benchmarks.md.

    python bench/settle_bench.py                                     # the CPU runtime row's image
    python bench/settle_bench.py --image localhost:5000/ml/pytorch:2.14.1-cuda13.0-cudnn9-runtime

Needs the project's engine (`make engine`, `source .engine/env`) holding the image and its base.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from torchimages.build import reproducible  # noqa: E402


def peak_disk_use(folder: str, work) -> tuple[float, int, object]:
    """(seconds, the most bytes the engine's disk held above its level before, work's result)."""
    before = shutil.disk_usage(folder).free
    lowest = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            lowest[0] = min(lowest[0], shutil.disk_usage(folder).free)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        result = work()
    finally:
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
    return seconds, max(0, before - lowest[0]), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost:5000/ml/pytorch:2.13.0-cpu-runtime")
    parser.add_argument("--base", default="debian:bookworm")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    api = docker.from_env(timeout=1800).api
    root = api.info()["DockerRootDir"]
    if not os.path.isdir(root):
        raise SystemExit(f"the engine's root folder {root} is not on this host: no disk figure")
    size = api.inspect_image(args.image)["Size"]
    from_base = reproducible.base_entries(api, args.base)
    ways = {"save": lambda: reproducible.saved_config(api.get_image(args.image)),
            "engine": lambda: reproducible.engine_config(api, args.image, args.base),
            "store": lambda: reproducible.stored_config(api, api.inspect_image(args.image)["Id"])}
    figures: dict[str, list[tuple[float, int]]] = {way: [] for way in ways}
    configs = {}
    for _ in range(args.runs):
        for way, work in ways.items():
            reproducible._BASE_CONFIGS.clear()  # each run reads the base again, as a fresh build process does
            seconds, disk, config = peak_disk_use(root, work)
            figures[way].append((seconds, disk))
            configs[way] = reproducible.config_bytes(reproducible.settled_config(config, "2000-01-01T00:00:00Z",
                                                                                 from_base))
    if not configs["save"] == configs["engine"] == configs["store"]:
        raise SystemExit("the ways gave different settled configs")
    print(f"\n### Settling's config read, {args.image} ({size / 1e9:.2f} GB), "
          f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores\n")
    print(f"| way | seconds (median of {args.runs}) | engine disk peak |")
    print("|---|---|---|")
    for way, runs in figures.items():
        print(f"| {way} | {statistics.median(s for s, _ in runs):.2f} | "
              f"{max(d for _, d in runs) / 1e9:.2f} GB |")
    print("\nThe same settled config every way.")


if __name__ == "__main__":
    main()
