#!/usr/bin/env python3
"""An installed user's first day, timed (issue 57's done-when): the toolkit's wheel installed into a fresh venv, then
`torchimages init`, `doctor`, `images` on the CPU row (built without the cache, as on a fresh engine, then verified),
a key from `cosign generate-key-pair`, `publish` into a fresh repository of the engine's registry and `verify-image`,
each a process of its own as a user runs it; Markdown for docs/benchmarks-log.md.

The wheels come from the project's wheelhouse (`--wheelhouse`, as the user behind a proxy runs it after `torchimages
wheels`), so the index's speed is not in the figure. The venv takes its dependencies from this checkout's venv
(PYTHONPATH), so pip's download time is not either. Needs the project's engine (`make engine`, `source .engine/env`),
its registry and cosign (`make cosign`). Leaves the scratch folder and the fresh repository's manifests removed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker.errors  # noqa: E402

from devtools.cosign import cosign_path  # noqa: E402
from torchimages.peers import engine  # noqa: E402
from torchimages.peers.registry import RegistryClient, RetryPolicy  # noqa: E402
from torchimages.peers.registry_access import registry_access  # noqa: E402
from torchimages.peers.registry_address import Registry  # noqa: E402

PASSWORD = {"COSIGN_PASSWORD": "first-day-bench"}
LOCAL_REPOSITORY = "localhost:5000/first-day-bench/pytorch"


def installed_venv(scratch: Path) -> Path:
    """The wheel built from this checkout, installed (not editable) into a fresh venv."""
    source = scratch / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "torchimages", source / "torchimages", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_wheel(sys.argv[1])", str(scratch)], cwd=source, check=True, capture_output=True)
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    [wheel] = scratch.glob("torchimages-*.whl")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True)
    return venv


def step(venv: Path, name: str, *args: str, cwd: Path, times: dict[str, float], env: dict | None = None) -> None:
    environment = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
                   "PYTHONPATH": sysconfig.get_paths()["purelib"], **(env or {})}
    started = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=environment, capture_output=True, text=True, check=False)
    times[name] = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default="2.13.0-cpu-runtime")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    args = parser.parse_args()
    host = os.environ.get("TORCHIMAGES_REGISTRY", "127.0.0.1:5000")
    repository = f"first-day-{uuid.uuid4().hex[:8]}/pytorch"
    cosign = cosign_path()
    if not cosign:
        raise SystemExit("needs cosign: `make cosign`")
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="first-day-bench-") as folder:
        scratch = Path(folder)
        venv = installed_venv(scratch)
        step(venv, "init", "torchimages", "init", "demo", cwd=scratch, times=times)
        demo = scratch / "demo"
        # The starter names its local images as this checkout's matrix does: another name, so that the bench's build
        # (from uncommitted files: another creation time) never stands in for the project's own image of the row.
        matrix = demo / "matrix.yaml"
        matrix.write_text(matrix.read_text().replace("localhost:5000/ml/pytorch", LOCAL_REPOSITORY))
        step(venv, "doctor", "torchimages", "doctor", args.row, "--wheelhouse", str(args.wheelhouse), cwd=demo,
             times=times)
        step(venv, "images (cold build + verification)", "torchimages", "images", args.row, "--wheelhouse",
             str(args.wheelhouse), "--no-cache", "--force", cwd=demo, times=times)
        step(venv, "cosign generate-key-pair", str(cosign), "generate-key-pair", cwd=demo, times=times, env=PASSWORD)
        step(venv, "publish (signed, both formats)", "torchimages", "publish", args.row, "--registry",
             f"{host}/{repository}", "--signing-key", "cosign.key", cwd=demo, times=times, env=PASSWORD)
        step(venv, "verify-image", "torchimages", "verify-image", f"{host}/{repository}:{args.row}", "--key",
             "cosign.pub", cwd=demo, times=times)
    with contextlib.suppress(docker.errors.ImageNotFound):
        engine.client().images.remove(f"{LOCAL_REPOSITORY}:{args.row}", force=True)
    registry = Registry(host, repository)
    client = RegistryClient(registry, registry_access(registry), RetryPolicy(retries=1), lambda _: None)
    for tag in client.tags():
        digest = client.digest_of(tag)
        if digest:
            client.delete(digest)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"### An installed user's first day ({args.row}, {when}, {platform.node()}, {os.cpu_count()} cores)\n")
    print("| step | wall |")
    print("|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.1f} s |")
    first_image = sum(seconds for name, seconds in times.items() if name in ("init", "doctor") or name.startswith("images"))
    signed = sum(seconds for name, seconds in times.items() if name not in ("init", "doctor")
                 and not name.startswith("images"))
    print(f"\nFirst verified image (init, doctor, images): {first_image:.1f} s; then the signed image verify-image "
          f"accepts: {signed:.1f} s more.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
