#!/usr/bin/env python3
"""Build benchmarks (issue 3), printed as Markdown rows for docs/benchmarks-log.md.

1. Skip decision: `build.py build` over already-built rows (no-op) versus `docker build` of each tag
   with a warm layer cache (what a Makefile would do).
2. CPU runtime image: our multi-stage image versus a naive single-stage Dockerfile that COPYs the
   wheels and pip-installs them: uncompressed size and cold (--no-cache) build time.

Needs a running engine (`make engine`, `source .engine/env`) and a wheelhouse (`build.py wheels`).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.build import builder  # noqa: E402
from torchimages.build import context as build_context  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402
from torchimages.peers import engine  # noqa: E402

NAIVE_DOCKERFILE = """FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends python{python} python{python}-venv \\
 && rm -rf /var/lib/apt/lists/*
COPY wheelhouse/ /wheels/
RUN python{python} -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels torch=={torch}
ENV PATH=/opt/venv/bin:$PATH
"""


def timed(command: list[str], **kwargs) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, **kwargs)
    return time.perf_counter() - started


def build_cli(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "build.py"), *args]


def noop_versus_docker_build(specs, wheelhouse: Path) -> list[str]:
    tags = [spec.tag for spec in specs]
    subprocess.run(build_cli("build", *tags, "--wheelhouse", str(wheelhouse)), check=True, capture_output=True)
    ours = min(timed(build_cli("build", *tags, "--wheelhouse", str(wheelhouse))) for _ in range(3))
    docker_total = 0.0
    for spec in specs:
        with tempfile.TemporaryDirectory() as folder:
            context = Path(folder)
            shutil.copytree(ROOT / "images" / spec.tag, context, dirs_exist_ok=True)
            shutil.copytree(build_context.wheel_dir(wheelhouse, spec), context / "build-inputs" / "wheelhouse")
            command = ["docker", "build", "-q", "-t", f"bench/{spec.tag}", str(context)]
            environment = {**os.environ, "DOCKER_BUILDKIT": "0"}
            subprocess.run(command, check=True, capture_output=True, env=environment)  # warm the cache
            docker_total += timed(command, env=environment)
    per_image_ours = ours / len(specs)
    per_image_docker = docker_total / len(specs)
    return [
        f"| no-op `build.py build` ({len(specs)} built rows, whole CLI run incl. Python start) | {ours * 1000:.0f} ms | "
        f"{per_image_ours * 1000:.0f} ms/image |",
        f"| `docker build` with a warm cache, each tag | {docker_total * 1000:.0f} ms | {per_image_docker * 1000:.0f} ms/image "
        f"(ours is {per_image_docker / per_image_ours:.0f}x faster) |",
    ]


def skip_decision_only(specs, wheelhouse: Path) -> str:
    client = engine.client()
    options = builder.BuildOptions(images_dir=ROOT / "images", reports_dir=ROOT / "reports", wheelhouse=wheelhouse)
    plan = builder.Builder(client, options).plan
    started = time.perf_counter()
    decisions = [plan(spec)[1] for spec in specs]
    elapsed = time.perf_counter() - started
    assert all(d and d.status == "skipped" for d in decisions), "rows must be built before this benchmark"
    return f"| skip decision alone (`Builder.plan`, in-process) | {elapsed * 1000:.1f} ms | {elapsed / len(specs) * 1000:.1f} ms/image |"


def size_versus_naive(spec, wheelhouse: Path) -> list[str]:
    client = engine.client()
    with tempfile.TemporaryDirectory() as folder:
        context = Path(folder)
        shutil.copytree(build_context.wheel_dir(wheelhouse, spec), context / "wheelhouse")
        (context / "Dockerfile").write_text(NAIVE_DOCKERFILE.format(base=spec.base_image, python=spec.python, torch=spec.torch))
        environment = {**os.environ, "DOCKER_BUILDKIT": "0"}
        naive_time = timed(["docker", "build", "--no-cache", "-q", "-t", "bench/naive", str(context)], env=environment)
    ours_time = timed(build_cli("build", spec.tag, "--no-cache", "--wheelhouse", str(wheelhouse)))
    ours_size = client.images.get(builder.local_name(spec)).attrs["Size"]
    naive_size = client.images.get("bench/naive").attrs["Size"]
    return [
        f"| {spec.tag} (multi-stage) | {ours_size / 1e6:.0f} MB | {ours_time:.0f} s |",
        f"| naive single-stage (COPY wheels + pip install) | {naive_size / 1e6:.0f} MB | {naive_time:.0f} s |",
        f"| ratio ours / naive | {ours_size / naive_size:.2f}x | {ours_time / naive_time:.2f}x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--selector", default="2.13.0-cpu-*")
    args = parser.parse_args()
    specs = select(load_matrix(ROOT / "matrix.yaml").specs, [args.selector])
    print(f"Machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), {date.today()}\n")
    print("| skip-unchanged | total | per image |\n|---|---|---|")
    for line in noop_versus_docker_build(specs, args.wheelhouse):
        print(line)
    print(skip_decision_only(specs, args.wheelhouse))
    runtime = next(spec for spec in specs if spec.flavor == "runtime")
    print("\n| CPU runtime image | size (uncompressed) | cold build |\n|---|---|---|")
    for line in size_versus_naive(runtime, args.wheelhouse):
        print(line)


if __name__ == "__main__":
    main()
