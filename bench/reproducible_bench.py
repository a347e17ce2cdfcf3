#!/usr/bin/env python3
"""What reproducible builds (issue 47) cost: a row built with `--no-cache` from templates whose OS steps are not
normalised (os_step_begin/os_step_end emptied) against today's templates, and the config's settling alone.

For each side, one `build.py build ROW --no-cache --force` run: its seconds and the image's size. Then the settling
of the built image's config (`docker save` read through, the settled config loaded back) timed on its own, three
times, since every build pays it whatever the templates. With --twice, today's templates build the row a second time
and the two image ids are compared. Needs the project's engine (`make engine`, `source .engine/env`) and the row's
wheelhouse. Leaves nothing behind but the engine's build stages.

Run: `python bench/reproducible_bench.py [--row TAG] [--wheelhouse DIR] [--twice]`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.build.reproducible import base_entries, iso_time, settle_image  # noqa: E402
from torchimages.peers import engine  # noqa: E402
from torchimages.project import DEFAULT_TEMPLATES  # noqa: E402

REPOSITORY = "localhost:5000/bench/reproducible"


def unnormalised_templates(into: Path) -> Path:
    """Today's templates with the OS steps' normalisation emptied (what the templates did before issue 47)."""
    shutil.copytree(DEFAULT_TEMPLATES, into)
    macros = into / "macros.j2"
    text = macros.read_text()
    text = re.sub(r"({% macro os_step_begin\(\) -%}\n).*?({% endmacro %})", r"\1\2", text, flags=re.DOTALL)
    text = re.sub(r"({% macro os_step_end\(\) -%}\n).*?({%- endmacro %})", r"\1true\n\2", text, flags=re.DOTALL)
    macros.write_text(text)
    return into


def cli(matrix: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "build.py"), "--matrix", str(matrix), *args],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"build.py {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def timed_build(matrix: Path, images: Path, row: str, wheelhouse: Path, reports: Path) -> tuple[float, str, int]:
    started = time.perf_counter()
    cli(matrix, "--images", str(images), "--reports", str(reports), "build", row, "--wheelhouse", str(wheelhouse),
        "--no-cache", "--force")
    seconds = time.perf_counter() - started
    image = engine.client().api.inspect_image(f"{REPOSITORY}:{row}")
    return seconds, image["Id"], image["Size"]


def settle_seconds(name: str) -> float:
    api = engine.client().api
    started = time.perf_counter()
    image = api.inspect_image(name)
    base = image["Config"]["Labels"]["org.opencontainers.image.base.name"]
    settle_image(api, image["Id"], name, iso_time(946684800), base_entries(api, base))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row", default="2.13.0-cpu-runtime")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--twice", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reproducible-bench-") as folder:
        scratch = Path(folder)
        matrix = scratch / "matrix.yaml"
        matrix.write_text((ROOT / "matrix.yaml").read_text().replace("localhost:5000/ml/pytorch", REPOSITORY))
        shutil.copy(ROOT / "compat.yaml", scratch / "compat.yaml")
        plain = scratch / "plain-images"
        cli(matrix, "--templates", str(unnormalised_templates(scratch / "templates")), "--images", str(plain), "render")
        results = {}
        try:
            results["without normalisation"] = timed_build(matrix, plain, args.row, args.wheelhouse, scratch / "r1")
            results["normalised (today)"] = timed_build(matrix, ROOT / "images", args.row, args.wheelhouse,
                                                        scratch / "r2")
            settling = [settle_seconds(f"{REPOSITORY}:{args.row}") for _ in range(3)]
            if args.twice:
                results["normalised, again"] = timed_build(matrix, ROOT / "images", args.row, args.wheelhouse,
                                                           scratch / "r3")
        finally:
            subprocess.run(["docker", "rmi", "-f", f"{REPOSITORY}:{args.row}"], capture_output=True, check=False)
    print(json.dumps({
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "row": args.row,
        "builds": {name: {"seconds": round(seconds, 1), "image": image_id, "size_bytes": size}
                   for name, (seconds, image_id, size) in results.items()},
        "settle_seconds": [round(value, 2) for value in settling],
    }, indent=2))


if __name__ == "__main__":
    main()
