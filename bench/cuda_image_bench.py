#!/usr/bin/env python3
"""CUDA image benchmarks (issue 8), printed as Markdown for docs/benchmarks-log.md.

For the CUDA rows CI builds (runtime and devel from one wheel set):
1. Size: each image's uncompressed size next to the bytes its installed wheels take in /opt/venv (the floor no
   image with these wheels can go below) and the published sizes of official images.
2. Build time: cold (`--no-cache`, the devel build reusing the runtime's layers as `build.py build` arranges)
   and warm (inputs unchanged: the skip decision).
3. Disk: the engine's data root at its peak during the cold build, and after it (build stages pruned).

Needs a running engine (`make engine`, `source .engine/env`) and the wheelhouse (`build.py wheels SELECTOR`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.build.builder import local_name  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402
from torchimages.peers import engine  # noqa: E402
from torchimages.reporting import human_size  # noqa: E402


class DiskPeak:
    """Samples the used bytes of the file system holding the engine's data root."""

    def __init__(self, path: Path):
        self.path, self.peak, self.stop = path, 0, threading.Event()
        self.start_used = shutil.disk_usage(path).used

    def __enter__(self):
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(1):
            self.peak = max(self.peak, shutil.disk_usage(self.path).used)

    def __exit__(self, *exc):
        self.stop.set()


def build(selectors: list[str], wheelhouse: Path, *extra: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "build.py"), "build", *selectors, "--wheelhouse", str(wheelhouse), *extra],
                   check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def venv_bytes(image: str) -> int:
    output = subprocess.run(["docker", "run", "--rm", "--entrypoint", "du", image, "-sb", "/opt/venv"],
                            check=True, capture_output=True, text=True).stdout
    return int(output.split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--selector", nargs="+", default=["2.14.1-cuda13.0-cudnn9-runtime", "2.14.1-cuda13.0-cudnn9-devel"],
                        help="rows to build (default the CUDA 13.0 x86_64 rows CI builds)")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--data-root", type=Path, default=ROOT / ".engine" / "docker")
    parser.add_argument("--skip-cold", action="store_true", help="only sizes and the warm figure")
    args = parser.parse_args()
    specs = select(load_matrix(ROOT / "matrix.yaml").specs, args.selector)
    client = engine.client()
    cold = None
    if not args.skip_cold:
        with DiskPeak(args.data_root) as disk:
            cold = build(args.selector, args.wheelhouse, "--no-cache")
        after = shutil.disk_usage(args.data_root).used
    warm = build(args.selector, args.wheelhouse)
    report = json.loads((ROOT / "reports" / "build-report.json").read_text())
    durations = {entry["tag"]: entry["last_build_duration"] for entry in report["images"]}
    print(f"Date {date.today()}, {client.info().get('NCPU')} cores, selector {' '.join(args.selector)}\n")
    print("| image | size | installed wheels (/opt/venv) | above the floor | cold build |")
    print("|---|---|---|---|---|")
    for spec in specs:
        name = local_name(spec)
        size, floor = client.api.inspect_image(name)["Size"], venv_bytes(name)
        print(f"| `{spec.tag}` | {human_size(size)} | {human_size(floor)} | {human_size(size - floor)} "
              f"| {durations.get(spec.tag, 0):.0f} s |")
    if cold is not None:
        print(f"\ncold, both rows: {cold:.0f} s; warm (inputs unchanged): {warm:.1f} s")
        print(f"disk: peak +{human_size(disk.peak - disk.start_used)} during the cold build, "
              f"+{human_size(after - disk.start_used)} after it")
    else:
        print(f"\nwarm (inputs unchanged): {warm:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
