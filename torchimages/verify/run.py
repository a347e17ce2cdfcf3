"""Verification of one image and of all: plan, container, probe, suite, reports, the container always removed."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import docker
import docker.errors

from .. import engine
from ..files import atomic_write, atomic_write_json, check_destinations, make_folder, remove_file
from ..model import ImageSpec
from .container import container_name, copy_probe, create_container, gather_facts, remove_container
from .plan import Plan, Progress, VerifyOptions, VerifyResult, plan_all
from .reports import REPORT_NAME, summary_markdown, verify_report
from .suite import expectations, failed_start_checks, run_suite


class StageClock:
    """Tells progress which stage an image is in, and keeps the seconds each stage took (for reports, benchmarks)."""

    def __init__(self, tag: str, progress: Progress):
        self.tag, self.progress = tag, progress
        self.seconds: dict[str, float] = {}
        self.current, self.since = "", time.monotonic()

    def enter(self, stage: str) -> None:
        self.stop()
        self.current, self.since = stage, time.monotonic()
        self.progress.stage(self.tag, stage)

    def stop(self) -> dict[str, float]:
        if self.current:
            self.seconds[self.current] = round(time.monotonic() - self.since, 2)
            self.current = ""
        return self.seconds


def verify_one(docker_client: docker.DockerClient, plan: Plan, options: VerifyOptions, host_gpu_runtime: bool,
               progress: Progress) -> VerifyResult:
    tag, started_at, started = plan.spec.tag, datetime.now(timezone.utc), time.monotonic()
    report_dir = options.reports_dir / tag
    make_folder(report_dir, options.reports_dir)
    # No verify.json while a run is under way: an interrupted run must not leave an older verdict looking current.
    remove_file(report_dir / REPORT_NAME, options.reports_dir)
    clock, name = StageClock(tag, progress), container_name(plan.spec)
    try:
        clock.enter("starting container")
        container = create_container(docker_client, plan, name, str(options.reports_dir.resolve()))
        try:
            container.start()
        except docker.errors.APIError as error:
            checks = failed_start_checks(error)
        else:
            checks = _probe_and_check(docker_client, container, plan, options, host_gpu_runtime, report_dir, clock)
    finally:
        clock.enter("removing container")
        remove_container(docker_client, name)
        clock.stop()
    result = VerifyResult(tag, plan.image, plan.image_id, not any(c["status"] == "failed" for c in checks.values()),
                          checks, report_dir, round(time.monotonic() - started, 2), clock.seconds)
    atomic_write_json(report_dir / REPORT_NAME, verify_report(result, plan, started_at).to_json(),
                      root=options.reports_dir)
    progress.finished(result)
    return result


def _probe_and_check(docker_client, container, plan: Plan, options: VerifyOptions, host_gpu_runtime: bool,
                     report_dir: Path, clock: StageClock) -> dict[str, dict]:
    clock.enter("probing")
    copy_probe(container)
    facts = gather_facts(docker_client, container, plan, str(options.reports_dir.resolve()))
    expect_path, facts_path = report_dir / "expect.json", report_dir / "facts.json"
    expected = expectations(plan, options, host_gpu_runtime, container.id)
    atomic_write_json(expect_path, expected, root=options.reports_dir)
    atomic_write_json(facts_path, facts, root=options.reports_dir)
    clock.enter("checking")
    return run_suite(plan, options, container.id, report_dir, expect_path, facts_path)


def verify_images(docker_client: docker.DockerClient, specs: list[ImageSpec], options: VerifyOptions,
                  progress: Progress | None = None) -> list[VerifyResult]:
    """Verify each spec's image (or options.image against the one spec); writes every report. InputError on bad input."""
    progress = progress or Progress()
    plans = plan_all(docker_client, specs, options, progress)
    check_destinations([options.reports_dir / plan.spec.tag / REPORT_NAME for plan in plans], options.reports_dir)
    host_gpu_runtime = engine.has_gpu_runtime(docker_client)
    results = [verify_one(docker_client, plan, options, host_gpu_runtime, progress) for plan in plans]
    atomic_write(options.reports_dir / "verify-summary.md", summary_markdown(results))
    return results
