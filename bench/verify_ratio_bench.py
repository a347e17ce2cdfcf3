#!/usr/bin/env python3
"""Verification cost as a ratio (issue 12), printed as Markdown for docs/benchmarks-log.md.

Target: the whole verification of an image (`build.py test TAG` as a user runs it: every check, the smoke test's
compiles, the extension build on devel images, torchrun, the derived image) costs at most 1.3x PyTorch's smoke-test
assertions alone on the same image. Both are measured in one run, alternating, each in a fresh container (so with
a cold inductor cache):

- smoke alone: a container as verification starts it, the probe copied in, `probe.py --part smoke` (import torch,
  then upstream's assertions one after the other, as upstream's smoke_test.py runs them), the container removed;
- whole: `build.py test TAG --gpus none`, the whole CLI, Python start-up included.

Needs a running engine (`make engine`, `source .engine/env`) and the image built (`build.py build`).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from timing import timed_verification  # noqa: E402 (bench/ is the script's folder, so on sys.path)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages import verify  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402
from torchimages.peers import engine  # noqa: E402

TARGET_RATIO = 1.3
# The machine may be shared: each run starts once the CPUs were at most this busy for a few seconds.
QUIET_BUSY = 0.15
QUIET_WAIT_S = 300


def busy_fraction(seconds: float = 3.0) -> float:
    """How busy all CPUs were over the next few seconds, from /proc/stat."""
    def sample() -> tuple[int, int]:
        values = [int(field) for field in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    total, idle = sample()
    time.sleep(seconds)
    total_after, idle_after = sample()
    return 1 - (idle_after - idle) / max(1, total_after - total)


def wait_until_quiet() -> float:
    """Wait for other jobs on the machine to calm down; returns how busy it was when the run started."""
    deadline = time.monotonic() + QUIET_WAIT_S
    busy = busy_fraction()
    while busy > QUIET_BUSY and time.monotonic() < deadline:
        busy = busy_fraction()
    return busy


def smoke_alone(docker_client, plan: verify.Plan) -> dict:
    started = time.perf_counter()
    name = verify.container_name(plan.spec)
    try:
        container = verify.create_container(docker_client, plan, name, "verify-bench")
        container.start()
        verify.copy_probe(container)
        facts = verify.run_probe(container, ["--part", "smoke"], "", plan.timeout)
    finally:
        docker_client.api.remove_container(name, force=True)
    if "smoke" not in facts:
        raise SystemExit(f"the smoke test did not run: {facts}")
    return {"wall": time.perf_counter() - started, "probe": facts["probe_seconds"],
            "import": facts["torch"]["import_seconds"], "compiles": facts["smoke"]["compiles"]["seconds"],
            "passed": all_ok(facts["smoke"])}


def all_ok(facts) -> bool:
    """Every section in a fact tree passed."""
    if isinstance(facts, dict):
        return facts.get("ok", True) is not False and all(all_ok(value) for value in facts.values())
    return True


def whole(tag: str, reports: Path) -> dict:
    wall, report, facts = timed_verification(tag, reports)
    main = facts["main"]
    return {"wall": wall, "stages": report["stage_seconds"], "passed": report["passed"],
            "failed": [name for name, check in report["checks"].items() if check["status"] == "failed"],
            "probe": main["probe_seconds"], "import": main["torch"]["import_seconds"],
            "compiles": main["smoke"]["compiles"]["seconds"], "extension": (main.get("extension") or {}).get("seconds"),
            "import_part": facts["import"]["probe_seconds"], "downstream": facts["downstream"]["seconds"]}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs if run.get(key) is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tag", default="2.13.0-cpu-devel")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    docker_client = engine.client()
    [spec] = select(load_matrix(ROOT / "matrix.yaml").specs, [args.tag])
    alone, full, background = [], [], []
    with tempfile.TemporaryDirectory(prefix="verify-bench-") as reports:
        options = verify.VerifyOptions(reports_dir=Path(reports), gpus="none")
        [plan] = verify.plan_all(docker_client, [spec], options, verify.Progress())
        for round_ in range(args.rounds):
            # Alternate which goes first, so that a drifting machine load favours neither.
            order = (lambda: alone.append(smoke_alone(docker_client, plan)),
                     lambda: full.append(whole(args.tag, options.reports_dir)))
            for run in order if round_ % 2 == 0 else reversed(order):
                background.append(wait_until_quiet())
                run()
    ratios = sorted(w["wall"] / a["wall"] for w, a in zip(full, alone, strict=False))
    ratio = median(full, "wall") / median(alone, "wall")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"Machine: {os.cpu_count()} cores ({cpu}), {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}"
          f" GiB, {platform.machine()}, no GPU; {date.today()}; load average {os.getloadavg()[0]:.1f} at the end; "
          f"image {args.tag} ({plan.image_id[:19]}); {args.rounds} rounds, alternating; each run started when the "
          f"CPUs were at most {max(background):.0%} busy with other work\n")
    print(f"| `{args.tag}`, seconds | median | min .. max |\n|---|---|---|")
    for label, runs in (("smoke-test assertions alone (fresh container, `probe.py --part smoke`)", alone),
                        ("whole verification (`build.py test`, every check)", full)):
        walls = sorted(run["wall"] for run in runs)
        print(f"| {label} | **{statistics.median(walls):.1f}** | {walls[0]:.1f} .. {walls[-1]:.1f} |")
    print(f"| ratio whole / smoke alone | **{ratio:.2f}x** | {ratios[0]:.2f} .. {ratios[-1]:.2f} (per round) |")
    print("\n| inside the runs, medians | smoke alone | whole |\n|---|---|---|")
    print(f"| `import torch` (first in the container) | {median(alone, 'import'):.1f} | {median(full, 'import'):.1f} |")
    print(f"| the smoke test's compiles (fp16/32/64, vector ISA, max-autotune) | {median(alone, 'compiles'):.1f} | "
          f"{median(full, 'compiles'):.1f} (forked child, beside the rest) |")
    print(f"| main probe | {median(alone, 'probe'):.1f} | {median(full, 'probe'):.1f} |")
    if any(run["extension"] for run in full):
        print(f"| torch extension build (devel), beside the compiles | - | {median(full, 'extension'):.1f} |")
    print(f"| arbitrary-uid part (waits for the main import; import torch, pip install --user), beside | - | "
          f"{median(full, 'import_part'):.1f} |")
    print(f"| derived image built FROM it on the host (pip install as its user), beside | - | "
          f"{median(full, 'downstream'):.1f} |")
    for stage in ("starting container", "probing", "checking", "removing container"):
        print(f"| stage: {stage} | - | {statistics.median(run['stages'].get(stage, 0.0) for run in full):.2f} |")
    failed = sorted({name for run in full for name in run["failed"]})
    print(f"\nSmoke alone passed in {sum(run['passed'] for run in alone)} of {len(alone)} runs; checks failed in the whole "
          f"runs: {', '.join(failed) or 'none'}.")
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f"Target ≤ {TARGET_RATIO}x the smoke test alone: the median ratio {ratio:.2f}x {verdict} it.")


if __name__ == "__main__":
    main()
