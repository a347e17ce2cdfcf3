"""Verification of one image and of all: plan, container, probe, suite, reports, the container always removed."""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import docker
import docker.errors

from ..files import atomic_write, atomic_write_json, check_destinations, make_folder, remove_file
from ..model import ImageSpec, InputError, TorchImagesError
from ..peers import engine
from . import emulation
from .container import (
    container_name,
    copy_probe,
    create_container,
    gather_facts,
    remove_container,
    remove_containers_of,
)
from .plan import Plan, Progress, VerifyOptions, VerifyResult, parse_gpus, plan_all
from .reports import FACTS_NAME, REPORT_NAME, judged_host, read_verify_report, summary_markdown, verify_report
from .reuse import reusable, reused_result
from .suite import (
    expectations,
    failed_start_checks,
    gpu_start_failure,
    run_suite,
    selected_verdicts,
    with_gpu_start_failure,
)


class Cancelled(TorchImagesError):
    """Another image's verification was interrupted (Ctrl-C): this one stops at its next stage."""


class StageClock:
    """Tells progress which stage an image is in, and keeps the seconds each stage took (for reports, benchmarks);
    a cancelled run stops at the next stage (its container is removed on the way out)."""

    def __init__(self, tag: str, progress: Progress, cancelled: threading.Event | None = None):
        self.tag, self.progress, self.cancelled = tag, progress, cancelled
        self.seconds: dict[str, float] = {}
        self.current, self.since = "", time.monotonic()

    def enter(self, stage: str, detail: str = "") -> None:
        self.stop()
        if self.cancelled and self.cancelled.is_set() and stage != "removing container":
            raise Cancelled(self.tag)
        self.current, self.since = stage, time.monotonic()
        self.progress.stage(self.tag, f"{stage} ({detail})" if detail else stage)

    def stop(self) -> dict[str, float]:
        if self.current:
            self.seconds[self.current] = round(time.monotonic() - self.since, 2)
            self.current = ""
        return self.seconds


def verification_jobs(plans: list[Plan], jobs: int) -> int:
    """How many images are verified at once: one where a GPU is given, since the GPU checks measure the GPUs
    (throughput against the datasheet, memory, NCCL) and two images on them would halve each other's figures."""
    if any(plan.gpus.wanted for plan in plans):
        return 1
    return max(1, min(jobs, len(plans)))


def verify_all(docker_client: docker.DockerClient, plans: list[Plan], options: VerifyOptions,
               host_gpu_runtime: bool, progress: Progress) -> list[VerifyResult]:
    """Each plan verified, `verification_jobs` at a time; on Ctrl-C every container of this run is removed at once
    (the probes in them end) and the other verifications stop at their next stage."""
    jobs = verification_jobs(plans, options.jobs)
    if jobs == 1:
        return [verify_one(docker_client, plan, options, host_gpu_runtime, progress) for plan in plans]
    cancelled = threading.Event()
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(verify_one, docker_client, plan, options, host_gpu_runtime, progress, cancelled)
                   for plan in plans]
        return [future.result() for future in futures]
    except KeyboardInterrupt:
        cancelled.set()
        remove_containers_of(docker_client, str(options.reports_dir.resolve()))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if cancelled.is_set():  # a derived image's build step may have ended after the first removal: removed too
            remove_containers_of(docker_client, str(options.reports_dir.resolve()))


def verify_one(docker_client: docker.DockerClient, plan: Plan, options: VerifyOptions, host_gpu_runtime: bool,
               progress: Progress, cancelled: threading.Event | None = None) -> VerifyResult:
    tag, started_at, started = plan.spec.tag, datetime.now(timezone.utc), time.monotonic()
    report_dir = plan.report_dir(options.reports_dir)
    make_folder(report_dir, options.reports_dir)
    # No verify.json while a run is under way: an interrupted run must not leave an older verdict looking current;
    # nor an older run's facts, which the report's host part and publishing read (a container that never started
    # has none).
    remove_file(report_dir / REPORT_NAME, options.reports_dir)
    remove_file(report_dir / FACTS_NAME, options.reports_dir)
    clock = StageClock(tag, progress, cancelled)
    names: list[str] = []
    try:
        clock.enter("starting container")
        try:
            container = _started_container(docker_client, plan, options, names)
        except docker.errors.APIError as error:
            checks = _checks_after_a_failed_start(docker_client, error, plan, options, host_gpu_runtime, report_dir,
                                                  clock, names)
        else:
            checks = _probe_and_check(docker_client, container, plan, options, host_gpu_runtime, report_dir, clock)
    finally:
        clock.enter("removing container")
        for name in names:
            remove_container(docker_client, name)
        clock.stop()
    checks = selected_verdicts(checks, options.selection)
    result = VerifyResult(tag, plan.image, plan.image_id, not any(c["status"] == "failed" for c in checks.values()),
                          checks, report_dir, round(time.monotonic() - started, 2), clock.seconds,
                          emulation.cpu_identity_note(plan.standin_cpus).get("why", ""), options.selection,
                          judged_host(checks, _gpu_facts(report_dir / FACTS_NAME)))
    atomic_write_json(report_dir / REPORT_NAME, verify_report(result, plan, started_at).to_json(),
                      root=options.reports_dir)
    progress.finished(result)
    return result


def _gpu_facts(path: Path) -> dict:
    """The main probe's GPU facts this run wrote ({} where it wrote none, or they are not an object)."""
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    main = facts.get("main") if isinstance(facts, dict) else None
    gpu = main.get("gpu") if isinstance(main, dict) else None
    return gpu if isinstance(gpu, dict) else {}


def _started_container(docker_client, plan: Plan, options: VerifyOptions, names: list[str]):
    """A container of the plan, started; its name is kept before it exists, so that it is removed whatever happens."""
    names.append(container_name(plan.spec))
    container = create_container(docker_client, plan, names[-1], str(options.reports_dir.resolve()))
    container.start()
    return container


def _checks_after_a_failed_start(docker_client, error: docker.errors.APIError, plan: Plan, options: VerifyOptions,
                                 host_gpu_runtime: bool, report_dir: Path, clock: StageClock,
                                 names: list[str]) -> dict[str, dict]:
    """A container that could not start for a GPU reason: the checks that need no GPU still run, in a container
    without GPUs, and the GPU checks report the start error; any other reason fails every check."""
    message = gpu_start_failure(error, plan.gpu_path) if plan.gpus.wanted else ""
    if not message:
        return failed_start_checks(error)
    clock.enter("starting container without GPUs")
    without_gpus = dataclasses.replace(plan, gpus=parse_gpus("none"))
    try:
        container = _started_container(docker_client, without_gpus, options, names)
    except docker.errors.APIError as second:
        return failed_start_checks(second)
    checks = _probe_and_check(docker_client, container, without_gpus, options, host_gpu_runtime, report_dir, clock)
    return with_gpu_start_failure(message, checks, engine.is_driver_start_error(str(error)))


def _probe_and_check(docker_client, container, plan: Plan, options: VerifyOptions, host_gpu_runtime: bool,
                     report_dir: Path, clock: StageClock) -> dict[str, dict]:
    clock.enter("probing", f"under emulation: every time bound x{plan.slowdown}, the main probe's {plan.timeout}s"
                           if plan.slowdown > 1 else "")
    copy_probe(container)
    facts = gather_facts(docker_client, container, plan, str(options.reports_dir.resolve()), options.selection)
    expect_path, facts_path = report_dir / "expect.json", report_dir / FACTS_NAME
    expected = expectations(plan, options, host_gpu_runtime, container.id)
    atomic_write_json(expect_path, expected, root=options.reports_dir)
    atomic_write_json(facts_path, facts, root=options.reports_dir)
    clock.enter("checking")
    return run_suite(plan, options, container.id, report_dir, expect_path, facts_path)


def for_this_engine(plan: Plan, access: engine.GpuAccess, engine_info: dict, timeout_given: bool) -> Plan:
    """GPUs through CDI where that is the path the engine offers, --gpus otherwise (its start error says what is
    wrong); where the engine emulates the image's arm64 machine, a stand-in CPU identity and every time bound
    multiplied by emulation.SLOWDOWN: the main probe's too, unless --timeout gave it (timeout_given)."""
    cpus = emulation.standin_cpus(plan.image_architecture, engine_info)
    slowdown = emulation.slowdown(cpus)
    return dataclasses.replace(plan, gpu_path=access.path or "runtime", standin_cpus=cpus, slowdown=slowdown,
                               timeout=plan.timeout if timeout_given else plan.timeout * slowdown)


def verify_images(docker_client: docker.DockerClient, specs: list[ImageSpec], options: VerifyOptions,
                  progress: Progress | None = None) -> list[VerifyResult]:
    """Verify each spec's image (or options.image against the one spec); writes every report. InputError on bad input."""
    progress = progress or Progress()
    access, info = engine.gpu_access(docker_client), engine.daemon_info(docker_client)
    plans = [for_this_engine(plan, access, info, options.timeout is not None)
             for plan in plan_all(docker_client, specs, options, progress)]
    check_destinations([plan.report_dir(options.reports_dir) / REPORT_NAME for plan in plans], options.reports_dir)
    kept = {} if options.force else kept_verifications(plans, options)
    ran = verify_all(docker_client, [plan for plan in plans if plan.spec.tag not in kept], options, bool(access.path),
                     progress)
    by_tag = {**kept, **{result.tag: result for result in ran}}
    results = [by_tag[plan.spec.tag] for plan in plans]
    # The checks of an image given by --image keep their summary in their own folder, apart from the rows'.
    folder = plans[0].report_dir(options.reports_dir) if options.image and plans else options.reports_dir
    atomic_write(folder / "verify-summary.md", summary_markdown(results), root=options.reports_dir)
    return results


def kept_verifications(plans: list[Plan], options: VerifyOptions) -> dict[str, VerifyResult]:
    """tag -> the passing verification kept for its plan (reuse.py): the report its folder holds, read back; one that
    cannot be read is not kept, and this run writes a new one."""
    kept = {}
    for plan in plans:
        folder = plan.report_dir(options.reports_dir)
        try:
            report = read_verify_report(folder / REPORT_NAME)
        except InputError:
            continue
        if report is not None and reusable(report, plan, options.selection):
            kept[plan.spec.tag] = reused_result(report, plan, folder)
    return kept
