#!/usr/bin/env python3
"""Where the build-input server runs, and what it costs: one row's cold build (`--no-cache`) with the server on this
host's loopback and with it in a container on the engine (what a remote engine or Docker Desktop's gets: the python
stage built first, the server's folder with the row's wheels uploaded, the steps on a network of the build's own),
side by side in one run, the page cache dropped before each; then the venv layers of the two images compared by diff
id (the same wheels must give the same layers wherever they were served from). Markdown for docs/benchmarks-log.md.

Needs the project's engine (`make engine`, `source .engine/env`) and the row's wheelhouse. Leaves nothing behind: the
two images (a scratch repository name) are removed.

    python bench/inputs_server_bench.py [--row TAG] [--wheelhouse DIR]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from cold_build_bench import ROOT, drop_page_cache, log  # bench/ is on sys.path: this script's folder

SERVERS = ("loopback", "container")
SCRATCH = "localhost:5000/bench/inputs-server"


def cold_build(row: str, wheelhouse: Path, server: str, scratch: Path) -> float:
    """Seconds `build.py build ROW --no-cache --force --inputs-server SERVER` took, into the scratch repository."""
    matrix = scratch / server / "matrix.yaml"
    matrix.parent.mkdir(parents=True)
    matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", f"{SCRATCH}-{server}"))
    (matrix.parent / "compat.yaml").write_text((ROOT / "compat.yaml").read_text())
    drop_page_cache()
    log(f"{row}: cold build, build-input server on {server}")
    started = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "build.py"), "--matrix", str(matrix), "--images", str(ROOT / "images"),
                    "--reports", str(matrix.parent / "reports"), "build", row, "--wheelhouse", str(wheelhouse),
                    "--no-cache", "--force", "--inputs-server", server], check=True, stdout=sys.stderr)
    return time.perf_counter() - started


def venv_layers(image: str) -> list[str]:
    """The diff ids of the layers the venv's install steps wrote, oldest first. Each RUN, COPY and ADD of the history
    made a layer (also an empty one), the other steps (`#(nop)`) none: one layer per such step, in order."""
    def docker(*arguments: str) -> str:
        return subprocess.run(["docker", *arguments], capture_output=True, text=True, check=True).stdout

    layers = json.loads(docker("image", "inspect", image))[0]["RootFS"]["Layers"]
    history = [json.loads(line) for line in docker("history", "--no-trunc", "--format", "{{json .}}", image).splitlines()]
    steps = [entry["CreatedBy"] for entry in reversed(history)
             if "#(nop) " not in entry["CreatedBy"] or "#(nop) COPY" in entry["CreatedBy"] or "#(nop) ADD" in entry["CreatedBy"]]
    if len(steps) != len(layers):
        raise SystemExit(f"{image}: {len(steps)} layer-making steps in its history, {len(layers)} layers")
    return [layer for layer, step in zip(layers, steps, strict=True) if "install_layer.py" in step]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default="2.14.1-cuda13.0-cudnn9-runtime")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    args = parser.parse_args()
    seconds, layers = {}, {}
    with tempfile.TemporaryDirectory(prefix="inputs-server-bench-") as scratch:
        try:
            for server in SERVERS:
                seconds[server] = cold_build(args.row, args.wheelhouse, server, Path(scratch))
                layers[server] = venv_layers(f"{SCRATCH}-{server}:{args.row}")
        finally:
            for server in SERVERS:
                subprocess.run(["docker", "image", "rm", "--force", f"{SCRATCH}-{server}:{args.row}"], check=False,
                               capture_output=True)
    same = layers["loopback"] == layers["container"] and bool(layers["loopback"])
    print(f"Machine: {platform.machine()}, {platform.node()}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"row `{args.row}`\n")
    print("| build-input server | cold build (`--no-cache`) |\n|---|---|")
    for server in SERVERS:
        print(f"| {server} | {seconds[server]:.1f} s |")
    print(f"\nThe venv's {len(layers['loopback'])} install layers: "
          f"{'the same diff ids in both images' if same else 'DIFFERENT: ' + json.dumps(layers)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
