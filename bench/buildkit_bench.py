#!/usr/bin/env python3
"""What BuildKit gives the cold build (issue 27): the same rendered Dockerfile and build inputs, built cold by the
engine's classic builder (`build.py build --no-cache`) and by its BuildKit (`--builder buildkit`: the same builder,
driving BuildKit through the Docker API), side by side in one run with the host pip floor; then the two images'
/opt/venv compared file by file, and the disk each build took at its peak.

The classic builder writes each step's files twice (the step's container, then its commit into a new layer); BuildKit
keeps a step's snapshot as the layer. This measures what that is worth here.

Needs the project's engine (`make engine`, `source .engine/env`) and the row's wheelhouse. Leaves nothing behind: its
two images and BuildKit's build cache are removed.

    python bench/buildkit_bench.py [--row TAG] [--wheelhouse DIR]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from cold_build_bench import (  # bench/ is on sys.path: this script's folder
    ROOT,
    DiskSampler,
    drop_page_cache,
    floors,
    layers,
    log,
    spec_of,
    venv_listing,
)

from devtools import localengine
from torchimages.build.builder import Builder, BuildOptions, local_name
from torchimages.peers import engine

BUILDERS = ("classic", "buildkit")


def cold_build(client, kind: str, row: str, wheelhouse: Path, scratch: Path) -> dict:
    """A cold build of row by kind into a repository of its own: seconds, the engine's disk at its peak above where
    it started, the image's size, layers and /opt/venv listing."""
    spec = replace(spec_of(row), repository=f"localhost:5000/bench-builders/{kind}")
    options = BuildOptions(images_dir=ROOT / "images", reports_dir=scratch / kind, wheelhouse=wheelhouse,
                           no_cache=True, force=True, prune_build_stages=True, builder=kind)
    builder = Builder(client, options)
    drop_page_cache()
    log(f"{row}: cold build, {kind} builder")
    with DiskSampler([localengine.DATA_ROOT]) as disk:
        started = time.perf_counter()
        [result] = builder.build_all([spec])
        seconds = time.perf_counter() - started
    if result.status != "built":
        raise SystemExit(f"{kind}: {result.status}: {result.error}")
    image = local_name(spec)
    return {"seconds": round(seconds, 1), "disk_peak": disk.peak - disk.start, "image": image,
            "size": client.api.inspect_image(image)["Size"], "layers": layers(client, image),
            "tree": venv_listing(client, image), "steps": step_seconds(Path(result.log).read_text())}


def step_seconds(build_log: str) -> dict[str, float]:
    """BuildKit's plain progress: each step's name (`#7 [venv 2/3] RUN ...`, `#20 exporting to image`) and time (`#7
    DONE 4.2s`); the classic builder's log has no times (empty)."""
    names = dict(re.findall(r"^#(\d+) (\[.*|exporting .*)$", build_log, re.MULTILINE))
    return {names[number][:100]: float(seconds) for number, seconds in re.findall(r"^#(\d+) DONE ([0-9.]+)s$",
                                                                                   build_log, re.MULTILINE)
            if number in names}


def remove(client, image: str) -> None:
    """The image, the untagged ones it leaves, and BuildKit's build cache."""
    client.images.remove(image, force=True)
    client.images.prune(filters={"dangling": True})
    client.api.prune_builds(all=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default="2.14.1-cuda13.0-cudnn9-runtime")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    args = parser.parse_args()
    client = engine.client()
    sides = {}
    with tempfile.TemporaryDirectory(prefix="buildkit-bench-", dir=ROOT / ".engine") as scratch:
        measured = floors(args.row, args.wheelhouse, Path(scratch), ("pip",))
        floor, floor_runs = measured["pip_s"], measured["pip_runs"]
        for kind in BUILDERS:
            try:
                sides[kind] = cold_build(client, kind, args.row, args.wheelhouse, Path(scratch))
            finally:  # the disk is shared: each side's image goes before the next side builds
                remove(client, f"localhost:5000/bench-builders/{kind}:{args.row}")
            log(f"{kind}: {sides[kind]['seconds']} s, disk peak {sides[kind]['disk_peak']:,} B")
    classic, buildkit = sides["classic"], sides["buildkit"]
    same_tree = classic["tree"] == buildkit["tree"]
    classic_ids = {diff_id for diff_id, _ in classic["layers"]}
    shared = [(index, size) for index, (diff_id, size) in enumerate(buildkit["layers"]) if diff_id in classic_ids]
    shared_bytes = sum(size for _, size in shared)
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.node()}; "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; row `{args.row}`; load {os.getloadavg()[0]:.1f}\n")
    print("| | classic builder | BuildKit (`--builder buildkit`) |\n|---|---|---|")
    runs = ", ".join(f"{seconds} s" for seconds in floor_runs)
    print(f"| floor: host `pip install` of the same wheels, the fastest of {runs} | {floor} s | {floor} s |")
    print("| cold build (`--no-cache`) | " + " | ".join(
        f"{side['seconds']} s ({side['seconds'] / floor:.1f}x the floor)" for side in (classic, buildkit)) + " |")
    print("| disk peak of the cold build | " + " | ".join(
        f"{side['disk_peak'] / 1e9:.2f} GB ({side['disk_peak'] / side['size']:.2f}x the image)"
        for side in (classic, buildkit)) + " |")
    print(f"| image size | {classic['size']:,} B | {buildkit['size']:,} B |")
    print(f"| layers | {len(classic['layers'])} | {len(buildkit['layers'])}; {len(shared)} of them (numbers "
          f"{', '.join(str(index) for index, _ in shared)}, {shared_bytes:,} B, {shared_bytes / buildkit['size']:.0%} "
          "of the image) with a diff id of the classic build's: a switch of builder uploads only the others |")
    print(f"| /opt/venv, file by file | {len(classic['tree'])} entries | "
          f"{'the same' if same_tree else 'DIFFERENT'} |")
    print("\nBuildKit's steps over a second (stages run side by side where they do not depend on each other):\n")
    for name, seconds in buildkit["steps"].items():
        if seconds >= 1:
            print(f"- {seconds:.1f} s `{name}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
