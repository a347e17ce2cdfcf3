#!/usr/bin/env python3
"""Cold builds near their floor (issue 27): today's layout against the new one, side by side in one run, with the
host pip floor (and uv's) in the same run; Markdown for docs/benchmarks-log.md.

For one row (default the CUDA 13.0 runtime row):
1. The floor: the fastest of three `pip install`s of the row's wheels from the wheelhouse into an empty venv on the host; the same with
   `uv pip install` (uv from PyPI into a scratch venv), and the two installed trees compared file by file (path, size,
   sha256, link target): uv may replace pip only where it installs the same files.
2. A cold build (`--no-cache`) of each layout: "today" is the toolkit and the row's Dockerfile at `--baseline`
   (the wheelhouse sent as build context, a packages stage, the venv copied into the final stage), run from an
   exported copy of that commit; "new" is this checkout (the venv written once, in the final stage, from wheels a
   build-input server serves). While each builds, the disk it uses is sampled every second: the engine's data root
   plus the folder the builder writes its context archive to (`du`, so other users of the disk do not count).
3. A torch-only change (one file added to the torch wheel, nothing else): each layout rebuilt from its build cache;
   the layers whose diff id changed, and their share of the image (uncompressed bytes, `docker history`).
4. The two images' /opt/venv compared file by file (path, type, size, mode, owner, time, sha256, link target).

The page cache is dropped before each timed side (root). Needs the project's engine (`make engine`, `source
.engine/env`) and the row's wheelhouse. Leaves nothing behind: its images, venvs and scratch folders are removed.

Run: `python bench/cold_build_bench.py [--row TAG] [--wheelhouse DIR] [--baseline REF]`.
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
import threading
import time
import uuid
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools import localengine  # noqa: E402 (the project root is on sys.path only from here)
from torchimages.build.context import wheel_dir  # noqa: E402
from torchimages.build.wheels import requirements  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402
from torchimages.peers import engine  # noqa: E402

CUDA_RUNTIME = "2.14.1-cuda13.0-cudnn9-runtime"
BASELINE = "f0aa126"  # the last commit with the packages stage
TREE_LISTING = ("cd /opt/venv && find . -printf '%p %y %m %U %G %T@ %l\\n' | sort && "
                "find . -type f -print0 | sort -z | xargs -0 sha256sum")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as error:
        log(f"page cache not dropped ({error})")


def spec_of(tag: str):
    return next(iter(select(load_matrix(ROOT / "matrix.yaml").specs, [tag])))


# ----------------------------------------------------------------------------------------------------- the floor

def installed_tree(venv: Path) -> dict[str, tuple]:
    """site-packages and bin of a venv: relative path -> (size, sha256 or link target)."""
    import hashlib

    tree = {}
    for top in (venv / "bin", *venv.glob("lib/python*/site-packages")):
        for path in sorted(top.rglob("*")):
            name = str(path.relative_to(venv))
            if "__pycache__" in path.parts:
                continue
            if path.is_symlink():
                tree[name] = ("link", os.readlink(path))
            elif path.is_file():
                tree[name] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return tree


# The floor is the fastest of a few installs: one install's time moved from 25.6 to 49.0 s between runs on this VM while
# the builds beside it moved by a tenth of that (docs/benchmarks-log.md), so a single one would make the ratio noise.
FLOOR_RUNS = 3


def floors(tag: str, wheelhouse: Path, scratch: Path, installers: tuple[str, ...] = ("pip", "uv"),
           runs: int = FLOOR_RUNS) -> dict:
    """pip and uv, each `runs` times into an empty venv from the same wheels (page cache dropped before each): the
    fastest is the floor (`<name>_s`), every time is kept (`<name>_runs`); their trees compared."""
    spec = spec_of(tag)
    wheels = wheel_dir(wheelhouse, spec)
    tools = scratch / "uv-tool"
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
    subprocess.run([str(tools / "bin" / "pip"), "install", "--quiet", "uv"], check=True)
    uv_version = subprocess.run([str(tools / "bin" / "uv"), "--version"], capture_output=True, text=True,
                                check=True).stdout.strip()
    results: dict = {"uv_version": uv_version}
    commands = {
        "pip": lambda venv: [str(venv / "bin" / "pip"), "install", "--no-cache-dir", "--disable-pip-version-check",
                             "--quiet", "--no-compile", "--no-index", "--find-links", str(wheels), *requirements(spec)],
        "uv": lambda venv: [str(tools / "bin" / "uv"), "pip", "install", "--quiet", "--no-cache", "--python",
                            str(venv / "bin" / "python"), "--no-index", "--find-links", str(wheels),
                            "--link-mode", "copy", *requirements(spec)],
    }
    trees = {}
    for name, command in ((name, commands[name]) for name in installers):
        times = []
        for _ in range(runs):
            venv = scratch / f"floor-{name}"
            subprocess.run([f"python{spec.python}", "-m", "venv", str(venv)], check=True)
            drop_page_cache()
            started = time.perf_counter()
            subprocess.run(command(venv), check=True)
            times.append(round(time.perf_counter() - started, 1))
            trees[name] = installed_tree(venv)
            shutil.rmtree(venv)
        results[f"{name}_s"], results[f"{name}_runs"] = min(times), times
    shutil.rmtree(tools)
    if len(trees) < 2:
        return results
    differ = sorted(name for name in set(trees["pip"]) | set(trees["uv"]) if trees["pip"].get(name) != trees["uv"].get(name))
    results["uv_differing_files"] = len(differ)
    results["uv_differing_examples"] = differ[:12]
    return results


# ------------------------------------------------------------------------------------------------------- builds

class DiskSampler:
    """The most disk the given folders used at once while it ran, above what they used when it started (`du` once
    a second: the machine's disk is shared, so `df` would count others' writes)."""

    def __init__(self, folders: list[Path]):
        self.folders = [str(folder) for folder in folders]
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used(self) -> int:
        # -x: not into the overlay mounts of running build steps, which show every lower layer again.
        done = subprocess.run(["du", "-x", "-s", "-B1", "-c", *self.folders], capture_output=True, text=True,
                              check=False)
        return int(done.stdout.strip().splitlines()[-1].split()[0])

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, self.used())

    def __enter__(self) -> Self:
        self.start = self.peak = self.used()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.used())


def export_baseline(ref: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def bench_matrix(toolkit: Path, scratch: Path, layout: str) -> Path:
    """The toolkit's matrix under a repository of this run's own, beside its compat.yaml and lock."""
    folder = scratch / f"project-{layout}"
    folder.mkdir()
    for name in ("compat.yaml", "bases.lock.json"):
        if (toolkit / name).exists():
            shutil.copy2(toolkit / name, folder / name)
    text = (toolkit / "matrix.yaml").read_text()
    (folder / "matrix.yaml").write_text(text.replace("localhost:5000/ml/pytorch", f"localhost:5000/bench27/{layout}"))
    return folder / "matrix.yaml"


def build(toolkit: Path, matrix: Path, tag: str, wheelhouse: Path, scratch: Path, *, cold: bool) -> dict:
    """build.py of that toolkit, as CI runs it; seconds and the disk it needed at its peak."""
    contexts = scratch / "tmp"
    contexts.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(contexts), PYTHONPATH=str(toolkit))
    command = [sys.executable, str(toolkit / "build.py"), "--matrix", str(matrix), "--images", str(toolkit / "images"),
               "--reports", str(scratch / f"reports-{uuid.uuid4().hex[:6]}"), "build", tag, "--wheelhouse",
               str(wheelhouse), "--force", *(["--no-cache"] if cold else [])]
    drop_page_cache()
    with DiskSampler([localengine.DATA_ROOT, contexts]) as disk:
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=toolkit, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"build of {tag} by {toolkit} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"seconds": round(seconds, 1), "disk_peak": disk.peak - disk.start}


def layers(client, reference: str) -> list[tuple[str, int]]:
    """(diff id, uncompressed bytes) per layer, bottom first, from the engine's layer store (its size file per chain
    id: the API's history has no field telling which entries made no layer)."""
    import hashlib

    result, chain = [], ""
    for diff_id in client.api.inspect_image(reference)["RootFS"]["Layers"]:
        chain = diff_id if not chain else "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
        size = localengine.DATA_ROOT / "image" / "overlay2" / "layerdb" / "sha256" / chain.split(":", 1)[1] / "size"
        result.append((diff_id, int(size.read_text())))
    return result


def torch_changed(wheelhouse: Path, scratch: Path) -> Path:
    changed = scratch / "wheelhouse-torch-changed"
    shutil.copytree(wheelhouse, changed, copy_function=os.link)
    for wheel in changed.rglob("torch-*.whl"):
        wheel.unlink()
        shutil.copy2(next(wheelhouse.rglob(wheel.name)), wheel)
        with zipfile.ZipFile(wheel, "a") as archive:
            archive.writestr("torch/_cold_build_bench_marker.py", f"BUILD = {uuid.uuid4().hex!r}\n")
    return changed


def venv_listing(client, reference: str) -> list[str]:
    output = client.containers.run(reference, ["bash", "-c", TREE_LISTING], entrypoint=[], user="0", remove=True)
    return output.decode().splitlines()


# ----------------------------------------------------------------------------------------------------------- run

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default=CUDA_RUNTIME)
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--cold-only", action="store_true", help="the floor (pip alone) and the cold builds only")
    parser.add_argument("--layouts", default="today,new", help="which sides to measure (comma-separated)")
    args = parser.parse_args()
    client = engine.client()
    scratch = Path(tempfile.mkdtemp(prefix="cold-build-bench-", dir=ROOT / ".engine"))
    results: dict = {"row": args.row, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"}
    try:
        toolkits = {"today": export_baseline(args.baseline, scratch / "today"), "new": ROOT}
        toolkits = {layout: toolkits[layout] for layout in args.layouts.split(",")}
        log("floors: pip and uv into empty venvs")
        results["floor"] = floors(args.row, args.wheelhouse, scratch, ("pip",) if args.cold_only or "," not in args.layouts else ("pip", "uv"))
        log(f"floor: {results['floor']}")
        changed = None if args.cold_only else torch_changed(args.wheelhouse, scratch)
        for layout, toolkit in toolkits.items():
            reference = f"localhost:5000/bench27/{layout}:{args.row}"
            try:
                results[layout] = (cold_only(layout, toolkit, reference, args, scratch, client) if args.cold_only
                                   else measure(layout, toolkit, reference, args, changed, scratch, client))
            finally:  # the disk is shared: each side's images go before the next side builds
                remove(client, reference)
        if not args.cold_only and len(toolkits) == 2:
            today, new = results["today"]["tree"], results["new"]["tree"]
            results["same_venv"] = today == new
            results["venv_differences"] = sorted(set(today) ^ set(new))[:20]
            for layout in ("today", "new"):
                results[layout]["tree_entries"] = len(results[layout].pop("tree"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if not args.cold_only and len(toolkits) == 2:
        print(markdown(results))


def measure(layout: str, toolkit: Path, reference: str, args, changed: Path, scratch: Path, client) -> dict:
    matrix = bench_matrix(toolkit, scratch, layout)
    log(f"{layout}: cold build")
    side = {"cold": build(toolkit, matrix, args.row, args.wheelhouse, scratch, cold=True)}
    side["size"] = client.api.inspect_image(reference)["Size"]
    side["layers"] = layers(client, reference)
    side["tree"] = venv_listing(client, reference)
    log(f"{layout}: cold {side['cold']}, size {side['size']:,}")
    log(f"{layout}: rebuild after a torch-only change")
    side["rebuild"] = build(toolkit, matrix, args.row, changed, scratch, cold=False)
    before = {diff_id for diff_id, _ in side["layers"]}
    changed_layers = [size for diff_id, size in layers(client, reference) if diff_id not in before]
    side["republish_bytes"] = sum(changed_layers)
    side["republish_share"] = round(sum(changed_layers) / client.api.inspect_image(reference)["Size"], 4)
    log(f"{layout}: rebuild {side['rebuild']}, changed layers {changed_layers}")
    return side


def cold_only(layout: str, toolkit: Path, reference: str, args, scratch: Path, client) -> dict:
    matrix = bench_matrix(toolkit, scratch, layout)
    log(f"{layout}: cold build")
    side = {"cold": build(toolkit, matrix, args.row, args.wheelhouse, scratch, cold=True)}
    side["size"] = client.api.inspect_image(reference)["Size"]
    side["peak_ratio"] = round(side["cold"]["disk_peak"] / side["size"], 3)
    log(f"{layout}: {side}")
    return side


def remove(client, reference: str) -> None:
    try:
        client.images.remove(reference, force=True)
    except Exception as error:  # noqa: BLE001 - not built, or gone already
        log(f"{reference}: not removed ({error})")
    client.images.prune(filters={"dangling": True})


def markdown(results: dict) -> str:
    floor = results["floor"]["pip_s"]
    rows = [f"| `{results['row']}` | today | new |", "|---|---|---|"]
    for label, key in (("cold build (`--no-cache`)", "cold"), ("rebuild after a torch-only change", "rebuild")):
        rows.append(f"| {label} | {results['today'][key]['seconds']} s "
                    f"({results['today'][key]['seconds'] / floor:.1f}x the floor) | {results['new'][key]['seconds']} s "
                    f"({results['new'][key]['seconds'] / floor:.1f}x) |")
    runs = ", ".join(f"{seconds} s" for seconds in results["floor"]["pip_runs"])
    rows.append(f"| floor: host `pip install` of the same wheels, the fastest of {runs} | {floor} s | {floor} s |")
    for key in ("today", "new"):
        results[key]["peak_ratio"] = round(results[key]["cold"]["disk_peak"] / results[key]["size"], 2)
    rows.append(f"| image size | {results['today']['size']:,} B | {results['new']['size']:,} B |")
    rows.append(f"| disk peak of the cold build | {results['today']['cold']['disk_peak'] / 1e9:.2f} GB "
                f"({results['today']['peak_ratio']}x the image) | {results['new']['cold']['disk_peak'] / 1e9:.2f} GB "
                f"({results['new']['peak_ratio']}x) |")
    rows.append(f"| torch-only change: changed layers' share of the image | {results['today']['republish_share']:.1%} | "
                f"{results['new']['republish_share']:.1%} |")
    rows.append(f"| layers | {len(results['today']['layers'])} | {len(results['new']['layers'])} |")
    rows.append(f"| /opt/venv, file by file | {results['today']['tree_entries']} entries | "
                f"{'the same' if results['same_venv'] else 'DIFFERENT: ' + ', '.join(results['venv_differences'][:5])} |")
    rows.append(f"| uv ({results['floor']['uv_version']}) instead of pip, host floor | | {results['floor']['uv_s']} s; "
                f"{results['floor']['uv_differing_files']} files differ from pip's |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
