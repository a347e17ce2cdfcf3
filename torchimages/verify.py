"""Stage 4: verify images inside their containers: one container and one probe per image, pytest checks, reports.

For each image: start one container through the Docker SDK (GPUs and /dev/shm as asked), copy the probe
(torchimages/checks/probe.py) and a small wheel in and run the probe once per identity (the image's user; root for
the file scan; an arbitrary uid), while the host builds an image FROM it that pip-installs the wheel
(torchimages/checks/downstream.py). Then the pytest-testinfra suite in torchimages/checks/suite runs against the
container with the row's expectations and those facts. The container and the derived image are removed on success,
failure and Ctrl-C. Reports: reports/<tag>/{verify.json,junit.xml,facts.json,pytest.log} and
reports/verify-summary.md. The checks ship inside the package: `build.py test` needs no source checkout.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import docker
import docker.errors
import docker.types
from rich.table import Table
from rich.text import Text

from . import engine
from .builder import local_name
from .checks import downstream
from .files import atomic_write, atomic_write_json
from .model import LABEL_PREFIX, ImageSpec, InputError, Problem, parse_size
from .project import EXIT_FAILED, EXIT_OK, Project, add_selectors, console, errors
from .reporting import markdown_cell, utc_timestamp

CHECKS = ("identity", "gpu", "driver", "cudnn", "amp", "shm", "multi-gpu", "devel", "smoke", "distributed",
          "downstream", "hygiene")
GPU_CHECKS = ("gpu", "driver", "cudnn", "multi-gpu")
VERIFY_LABEL = f"{LABEL_PREFIX}.verify"
CHECKS_DIR = Path(__file__).with_name("checks")
SUITE = CHECKS_DIR / "suite"
PROBE_SOURCE = CHECKS_DIR / "probe.py"
PROBE_PATH = "/tmp/torchimages-probe.py"
# OpenShift-style arbitrary uid: unknown to /etc/passwd, so Docker gives it group 0.
ARBITRARY_UID = "12345"
# With network none the container's own name does not resolve, and torchrun's rendezvous waits on it forever.
CONTAINER_HOSTNAME = "torchimages-verify"
RUNTIME_TIMEOUT_S = 300  # the smoke test's compiles, cold inductor cache, on a loaded 2-core machine
DEVEL_TIMEOUT_S = 600  # compiling a torch extension takes minutes on small machines
SIDE_PROBE_TIMEOUT_S = 150  # the arbitrary uid's import and pip install --user
SUITE_TIMEOUT_S = 300
REPORT_SCHEMA = 1
STATUS_MARK = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "⏭️ skipped"}
STATUS_STYLE = {"passed": "green", "failed": "red", "skipped": "yellow"}


# ---------------------------------------------------------------- options and results

@dataclass(frozen=True)
class GpuRequest:
    """What --gpus asked for: all, none, a count, or a device list."""

    text: str
    count: int = 0  # -1: all GPUs
    device_ids: tuple[str, ...] = ()

    @property
    def wanted(self) -> bool:
        return self.count != 0 or bool(self.device_ids)

    @property
    def expected_count(self) -> int | None:
        """How many GPUs torch must see; None for 'all', which only the container can tell."""
        if self.device_ids:
            return len(self.device_ids)
        return self.count if self.count > 0 else None

    def device_requests(self) -> list[docker.types.DeviceRequest]:
        if not self.wanted:
            return []
        if self.device_ids:
            return [docker.types.DeviceRequest(device_ids=list(self.device_ids), capabilities=[["gpu"]])]
        return [docker.types.DeviceRequest(count=self.count, capabilities=[["gpu"]])]

    def to_json(self) -> dict:
        return {"text": self.text, "wanted": self.wanted, "expected_count": self.expected_count,
                "device_ids": list(self.device_ids)}


def parse_gpus(text: str) -> GpuRequest:
    """--gpus all | none | N | device=0,1 (Docker's own syntax)."""
    value = text.strip()
    if value in ("all", "none"):
        return GpuRequest(value, -1 if value == "all" else 0)
    if value.isdigit():
        return GpuRequest(value, int(value))
    if value.startswith("device="):
        devices = tuple(d.strip() for d in value.removeprefix("device=").split(",") if d.strip())
        if devices:
            return GpuRequest(value, device_ids=devices)
    raise InputError([Problem("--gpus", 0, f"--gpus {text!r} is not all, none, a number or device=0,1")])


@dataclass(frozen=True)
class VerifyOptions:
    reports_dir: Path
    gpus: str | None = None  # None: all for GPU rows, none for CPU rows
    shm_size: str | None = None  # None: the row's shm_size
    image: str | None = None  # check this image instead of the row's own (exactly one row)
    timeout: int | None = None  # seconds for the main probe; None: by flavor
    matrix_specs: tuple[ImageSpec, ...] = ()  # every row, to name the ones covering a GPU that is not covered
    suite: Path = SUITE


@dataclass
class VerifyResult:
    tag: str
    image: str
    image_id: str
    passed: bool
    checks: dict[str, dict]
    report_dir: Path
    duration: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """One image to verify, decided before any container starts."""

    spec: ImageSpec
    image: str
    image_id: str
    gpus: GpuRequest
    shm_size: str
    timeout: int


class Progress:
    """Receives verification events; the CLI shows them with rich."""

    def stage(self, tag: str, text: str) -> None: ...
    def finished(self, result: VerifyResult) -> None: ...


# ---------------------------------------------------------------- planning (input checks before anything starts)

def plan_all(docker_client: docker.DockerClient, specs: list[ImageSpec], options: VerifyOptions,
             progress: Progress) -> list[Plan]:
    if options.image and len(specs) != 1:
        tags = ", ".join(spec.tag for spec in specs)
        raise InputError([Problem("--image", 0, f"--image checks one image against one row, but the selectors "
                                                f"chose {len(specs)}: {tags}; name exactly one tag")])
    problems: list[Problem] = []
    plans = []
    for spec in specs:
        try:
            plans.append(_plan(docker_client, spec, options, progress))
        except InputError as error:
            problems.extend(error.problems)
    if problems:
        raise InputError(problems)
    if any(plan.gpus.wanted for plan in plans) and not engine.has_gpu_runtime(docker_client):
        wanting = ", ".join(plan.spec.tag for plan in plans if plan.gpus.wanted)
        raise InputError([Problem("--gpus", 0, f"{engine.GPU_RUNTIME_HINT} (GPUs were requested for {wanting})")])
    return plans


def _plan(docker_client: docker.DockerClient, spec: ImageSpec, options: VerifyOptions, progress: Progress) -> Plan:
    gpus = parse_gpus(options.gpus or ("all" if spec.is_gpu else "none"))
    shm_size = options.shm_size or spec.shm_size
    try:
        parse_size(shm_size)
    except ValueError as error:
        raise InputError([Problem("--shm-size", 0, str(error))]) from None
    if options.timeout is not None and options.timeout < 1:
        raise InputError([Problem("--timeout", 0, "--timeout must be at least 1 second")])
    image = options.image or local_name(spec)
    image_id = _image_id(docker_client, image, pull=bool(options.image), progress=progress, tag=spec.tag)
    timeout = options.timeout or (DEVEL_TIMEOUT_S if spec.builds_extensions else RUNTIME_TIMEOUT_S)
    return Plan(spec, image, image_id, gpus, shm_size, timeout)


def _image_id(docker_client: docker.DockerClient, image: str, pull: bool, progress: Progress, tag: str) -> str:
    try:
        return docker_client.api.inspect_image(image)["Id"]
    except docker.errors.ImageNotFound:
        if not pull:
            raise InputError([Problem(image, 0, f"image {image} is not on the engine: build it with "
                                                f"`python build.py build {tag}`, or check another with --image")]) from None
    progress.stage(tag, f"pulling {image}")
    try:
        docker_client.images.pull(image)
        return docker_client.api.inspect_image(image)["Id"]
    except docker.errors.APIError as error:
        raise InputError([Problem(image, 0, f"image {image} is not on the engine and could not be pulled "
                                            f"({engine.explain_start_error(error)})")]) from None


# ---------------------------------------------------------------- one container

def container_name(spec: ImageSpec) -> str:
    """Chosen before creating it, so that a Ctrl-C during the create call can still find and remove it."""
    return f"torchimages-verify-{spec.tag}-{secrets.token_hex(4)}"


def create_container(docker_client: docker.DockerClient, plan: Plan, name: str, reports: str):
    """Created apart from started: a container that fails to start still exists and must be removed.

    Labels find leftovers (`docker ps -a --filter label=io.torchimages.verify`) and tell whose they are."""
    return docker_client.containers.create(
        plan.image_id, name=name,
        # Keep the container alive without the image's entrypoint; removal with force kills it at once.
        entrypoint=["sleep", "infinity"], command=[],
        labels={VERIFY_LABEL: "1", f"{VERIFY_LABEL}.tag": plan.spec.tag, f"{VERIFY_LABEL}.reports": reports},
        shm_size=plan.shm_size, device_requests=plan.gpus.device_requests(), network_mode="none", detach=True,
        hostname=CONTAINER_HOSTNAME, extra_hosts={CONTAINER_HOSTNAME: "127.0.0.1"},
    )


def copy_probe(container) -> None:
    """The probe and the downstream wheel into /tmp, readable by every uid the probe runs as."""
    files = {os.path.basename(PROBE_PATH): (PROBE_SOURCE.read_bytes(), 0o755),
             f"{os.path.basename(downstream.CONTAINER_DIR)}/{downstream.WHEEL}": (downstream.wheel_bytes(), 0o644)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        folder = tarfile.TarInfo(os.path.basename(downstream.CONTAINER_DIR))
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        archive.addfile(folder)
        for name, (payload, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), mode, int(time.time())
            archive.addfile(info, io.BytesIO(payload))
    container.put_archive(os.path.dirname(PROBE_PATH), buffer.getvalue())


def probe_command(arguments: list[str], timeout: int) -> list[str]:
    """docker exec has no timeout: the probe runs under the container's own `timeout`, with the image's Python."""
    script = (
        'py=$(command -v python || command -v python3) || { echo "no python or python3 on PATH" >&2; exit 127; }; '
        f'if command -v timeout >/dev/null; then exec timeout -s KILL {timeout} "$py" {PROBE_PATH} "$@"; '
        f'else exec "$py" {PROBE_PATH} "$@"; fi'
    )
    return ["sh", "-c", script, "probe", *arguments]


def run_probe(container, arguments: list[str], user: str, timeout: int) -> dict:
    """One probe run -> its JSON facts, or {"probe_error": why} with the end of its stderr."""
    try:
        exit_code, (stdout, stderr) = container.exec_run(probe_command(arguments, timeout), user=user, demux=True)
    except docker.errors.APIError as error:  # the container died under it (OOM killed, removed)
        return {"probe_error": f"the probe could not run: {engine.explain_start_error(error)}", "stderr_tail": ""}
    output, log = (stdout or b"").decode(errors="replace"), (stderr or b"").decode(errors="replace")
    lines = [line for line in output.splitlines() if line.strip()]
    if exit_code == 0 and lines:
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    why = f"timed out after {timeout}s" if exit_code == 137 else f"exited with {exit_code}"
    return {"probe_error": f"the probe {why} without facts", "stderr_tail": log[-3000:]}


def probe_arguments(spec: ImageSpec) -> list[str]:
    arguments = []
    if spec.builds_extensions:
        arguments.append("--devel")
        if spec.is_gpu:
            arguments += ["--cuda-extension", f"--arch-list={';'.join(spec.arch_list)}"]
    return arguments


def gather_facts(docker_client: docker.DockerClient, container, plan: Plan, reports: str) -> dict:
    """The three probe runs and the derived image's build side by side, plus the image's static facts."""
    pool = ThreadPoolExecutor(max_workers=4)
    wheel = f"{downstream.CONTAINER_DIR}/{downstream.WHEEL}"
    try:
        runs = {
            "main": pool.submit(run_probe, container, probe_arguments(plan.spec), "", plan.timeout),
            "files": pool.submit(run_probe, container, ["--part", "files"], "0", SIDE_PROBE_TIMEOUT_S),
            "import": pool.submit(run_probe, container, ["--part", "import", "--after-main", "--wheel", wheel],
                                  ARBITRARY_UID, SIDE_PROBE_TIMEOUT_S),
            "downstream": pool.submit(downstream.derived_image_facts, docker_client, plan.image_id,
                                      {VERIFY_LABEL: "1", f"{VERIFY_LABEL}.reports": reports}),
        }
        facts = {part: run.result() for part, run in runs.items()}
    finally:
        # On Ctrl-C do not wait for the probes: removing the container (the caller's finally) ends them. The
        # derived image's build finishes in its thread, which the interpreter joins at exit, and removes its image.
        pool.shutdown(wait=False, cancel_futures=True)
    facts["image"] = image_facts(docker_client, plan.image_id)
    return facts


def image_facts(docker_client: docker.DockerClient, image_id: str) -> dict:
    inspected = docker_client.api.inspect_image(image_id)
    config = inspected.get("Config") or {}
    history = docker_client.api.history(image_id)
    return {
        "id": inspected["Id"], "repo_tags": inspected.get("RepoTags") or [], "size": inspected.get("Size", 0),
        "labels": config.get("Labels") or {}, "env": config.get("Env") or [], "user": config.get("User") or "",
        "entrypoint": config.get("Entrypoint") or [], "cmd": config.get("Cmd") or [],
        "history": [entry.get("CreatedBy", "") for entry in history],
    }


def expectations(plan: Plan, options: VerifyOptions, host_gpu_runtime: bool, container_id: str) -> dict:
    """What the checks compare against: the row, how the container was run, and which rows cover which GPUs."""
    rows = options.matrix_specs or (plan.spec,)
    return {
        "tag": plan.spec.tag, "image": plan.image, "image_id": plan.image_id, "container_id": container_id,
        "spec": plan.spec.to_json(), "gpus": plan.gpus.to_json(), "host_gpu_runtime": host_gpu_runtime,
        "shm_size": plan.shm_size, "arbitrary_uid": int(ARBITRARY_UID),
        "arch_rows": {row.tag: list(row.arch_list) for row in rows if row.is_gpu},
    }


# ---------------------------------------------------------------- the check suite

def run_suite(plan: Plan, options: VerifyOptions, container_id: str, report_dir: Path, expect_path: Path,
              facts_path: Path) -> dict[str, dict]:
    """pytest + testinfra against the container; returns {check: {status, message, tests}}."""
    with tempfile.TemporaryDirectory(prefix="torchimages-verify-") as scratch:
        results_path = Path(scratch) / "checks.json"
        command = [
            sys.executable, "-m", "pytest", str(options.suite), f"--hosts=docker://{container_id}",
            "-p", "torchimages.checkplugin", f"--expect={expect_path.resolve()}", f"--probe={facts_path.resolve()}",
            f"--check-results={results_path}", f"--junitxml={(report_dir / 'junit.xml').resolve()}",
            # The suite's own pytest.ini: no project's configuration or conftest applies, in a checkout or installed.
            "-c", str(options.suite / "pytest.ini"), "--rootdir", str(options.suite), "--confcutdir", str(options.suite),
            "-o", f"junit_suite_name={plan.spec.tag}", "-q", "--tb=short", "-rfs", "--color=no",
        ]
        with open(report_dir / "pytest.log", "w", encoding="utf-8") as log:
            try:
                exit_code = subprocess.run(command, cwd=scratch, stdout=log, stderr=subprocess.STDOUT,
                                           timeout=SUITE_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                log.write(f"\nthe check suite did not finish in {SUITE_TIMEOUT_S}s\n")
                exit_code = 124
        reported = json.loads(results_path.read_text()) if results_path.exists() else {}
    return complete_checks(reported, exit_code, report_dir / "pytest.log")


def complete_checks(reported: dict[str, dict], exit_code: int, log_path: Path) -> dict[str, dict]:
    """Every check gets a status: one no test reported on failed, so a broken suite can never look green."""
    if exit_code not in (0, 1):  # usage error, internal error or interrupted: nothing it said can be trusted
        last = (log_path.read_text(errors="replace").strip().splitlines() or [""])[-1]
        why = f"the check suite could not run (pytest exit {exit_code}: {last.strip()}); see {log_path}"
        return {name: {"status": "failed", "message": why, "tests": []} for name in CHECKS}
    missing = {"status": "failed", "message": f"no test reported on this check; see {log_path}", "tests": []}
    return {name: reported.get(name, missing) for name in CHECKS}


def failed_start_checks(error: docker.errors.APIError) -> dict[str, dict]:
    """A container that cannot start: a driver refusal is the driver check's failure, anything else every check's."""
    message = engine.explain_start_error(error)
    if message == engine.GPU_RUNTIME_HINT:
        raise InputError([Problem("--gpus", 0, message)])
    if "unsatisfied condition: cuda>=" in str(error):
        skipped = {"status": "skipped", "message": "not run: the container could not start (see driver)", "tests": []}
        return {name: ({"status": "failed", "message": message, "tests": []} if name == "driver" else skipped)
                for name in CHECKS}
    return {name: {"status": "failed", "message": f"the container could not start: {message}", "tests": []}
            for name in CHECKS}


# ---------------------------------------------------------------- one image, all images

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
    report_dir.mkdir(parents=True, exist_ok=True)
    # No verify.json while a run is under way: an interrupted run must not leave an older verdict looking current.
    (report_dir / "verify.json").unlink(missing_ok=True)
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
        _remove(docker_client, name)
        clock.stop()
    result = VerifyResult(tag, plan.image, plan.image_id, not any(c["status"] == "failed" for c in checks.values()),
                          checks, report_dir, round(time.monotonic() - started, 2), clock.seconds)
    atomic_write_json(report_dir / "verify.json", verify_document(result, plan, started_at))
    progress.finished(result)
    return result


def _probe_and_check(docker_client, container, plan: Plan, options: VerifyOptions, host_gpu_runtime: bool,
                     report_dir: Path, clock: StageClock) -> dict[str, dict]:
    clock.enter("probing")
    copy_probe(container)
    facts = gather_facts(docker_client, container, plan, str(options.reports_dir.resolve()))
    expect_path, facts_path = report_dir / "expect.json", report_dir / "facts.json"
    atomic_write_json(expect_path, expectations(plan, options, host_gpu_runtime, container.id))
    atomic_write_json(facts_path, facts)
    clock.enter("checking")
    return run_suite(plan, options, container.id, report_dir, expect_path, facts_path)


def _remove(docker_client: docker.DockerClient, name: str) -> None:
    try:
        docker_client.api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass


def verify_document(result: VerifyResult, plan: Plan, started_at: datetime) -> dict:
    """reports/<tag>/verify.json: what publish reads to decide whether these exact bytes may be pushed."""
    return {
        "schema": REPORT_SCHEMA, "tag": result.tag, "image": result.image, "image_id": result.image_id,
        "spec_hash": plan.spec.spec_hash(), "passed": result.passed,
        "checks": {name: {"status": check["status"], "message": check["message"], "tests": check.get("tests", [])}
                   for name, check in result.checks.items()},
        "run": {"gpus": plan.gpus.text, "shm_size": plan.shm_size, "probe_timeout_s": plan.timeout},
        "started_at": utc_timestamp(started_at), "finished_at": utc_timestamp(),
        "duration_s": result.duration, "stage_seconds": result.stage_seconds, "junit": "junit.xml", "facts": "facts.json",
    }


def verify_images(docker_client: docker.DockerClient, specs: list[ImageSpec], options: VerifyOptions,
                  progress: Progress | None = None) -> list[VerifyResult]:
    """Verify each spec's image (or options.image against the one spec); writes every report. InputError on bad input."""
    progress = progress or Progress()
    plans = plan_all(docker_client, specs, options, progress)
    host_gpu_runtime = engine.has_gpu_runtime(docker_client)
    results = [verify_one(docker_client, plan, options, host_gpu_runtime, progress) for plan in plans]
    atomic_write(options.reports_dir / "verify-summary.md", summary_markdown(results))
    return results


# ---------------------------------------------------------------- summaries

def summary_markdown(results: list[VerifyResult]) -> str:
    """Checks x images, then what failed and what was skipped, for a CI step summary."""
    lines = ["# Image verification", "", "| check | " + " | ".join(f"`{r.tag}`" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in CHECKS:
        lines.append(f"| {name} | " + " | ".join(STATUS_MARK[r.checks[name]["status"]] for r in results) + " |")
    lines.append("| **image** | " + " | ".join("**passed**" if r.passed else "**FAILED**" for r in results) + " |")
    lines += ["", "Verified image ids: " + ", ".join(f"`{r.tag}` = `{r.image_id}`" for r in results), ""]
    for result in results:
        notes = [f"- **{name}** {check['status']}: {markdown_cell(check['message'])}"
                 for name, check in result.checks.items() if check["status"] != "passed"]
        if notes:
            lines += [f"## `{result.tag}`", "", *notes, ""]
    return "\n".join(lines) + "\n"


def checks_table(result: VerifyResult) -> Table:
    verdict = Text("passed", "green") if result.passed else Text("FAILED", "red")
    title = Text.assemble(f"{result.tag}: ", verdict, f" ({result.duration:.1f}s, {result.image_id[:19]})")
    table = Table(title=title, title_justify="left")
    for column in ("check", "status", "message"):
        table.add_column(column, no_wrap=column != "message")
    for name, check in result.checks.items():
        table.add_row(name, Text(check["status"], STATUS_STYLE[check["status"]]), Text(check["message"]))
    return table


class ConsoleProgress(Progress):
    """A rich status line on a terminal, plain lines in CI logs."""

    def __init__(self, console_):
        self.console = console_
        self.status = console_.status("") if console_.is_terminal else None

    def __enter__(self):
        if self.status:
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status:
            self.status.__exit__(*exc)

    def stage(self, tag: str, text: str) -> None:
        if self.status:
            self.status.update(f"{tag}: {text}")
        else:
            self.console.print(f"{tag}: {text}", markup=False, highlight=False)

    def finished(self, result: VerifyResult) -> None:
        verdict = "passed" if result.passed else "FAILED"
        self.console.print(f"{result.tag}: {verdict} ({result.duration:.1f}s)", markup=False, highlight=False)


# ---------------------------------------------------------------- the command

def cmd_test(project: Project, args) -> int:
    specs = project.select(args.selectors)
    options = VerifyOptions(reports_dir=project.reports, gpus=args.gpus, shm_size=args.shm_size, image=args.image,
                            timeout=args.timeout, matrix_specs=tuple(project.load().specs))
    docker_client = engine.client()
    with ConsoleProgress(errors()) as progress:
        results = verify_images(docker_client, specs, options, progress)
    out = console()
    for result in results:
        out.print(checks_table(result))
    out.print(f"reports: {project.reports}/<tag>/verify.json, junit.xml; summary: {project.reports / 'verify-summary.md'}",
              markup=False, highlight=False)
    return EXIT_OK if all(result.passed for result in results) else EXIT_FAILED


def add_commands(commands) -> None:
    """Adds `test` to build.py's subcommands."""
    testing = commands.add_parser(
        "test", help="verify images inside containers (identity, GPU, cuDNN, AMP, shm, devel, PyTorch's smoke test, "
                     "torchrun, derived images, hygiene)",
        description="Exit 0: every check passed or was skipped with a reason; 1: a check failed; 2: bad input "
                    "(unknown tag, missing image, GPUs requested from an engine without NVIDIA runtime).")
    add_selectors(testing)
    testing.add_argument("--image", metavar="REF",
                         help="check this image (e.g. an official pytorch/pytorch one) against the one selected row")
    testing.add_argument("--gpus", metavar="all|none|N|device=0,1",
                         help="GPUs for the container (default: all for GPU rows, none for CPU rows)")
    testing.add_argument("--shm-size", metavar="SIZE", help="the container's /dev/shm (default: the row's shm_size)")
    testing.add_argument("--timeout", type=int, metavar="S",
                         help=f"seconds for the in-container probe (default {RUNTIME_TIMEOUT_S}, devel {DEVEL_TIMEOUT_S})")
    testing.set_defaults(handler=cmd_test)
