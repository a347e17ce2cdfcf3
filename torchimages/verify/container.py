"""Verification, step 2: one container per image, the probe copied in and run once per identity, facts out."""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import secrets
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors

from ..checks import downstream
from ..checks.probe import PROBE_VERSION
from ..checks.selection import CheckSelection
from ..model import ImageSpec
from ..peers import engine
from . import emulation, image_layers
from .plan import CHECKS_DIR, VERIFY_LABEL, Plan

PROBE_SOURCE = CHECKS_DIR / "probe.py"
PROBE_PATH = "/tmp/torchimages-probe.py"
# The standard-library modules the probe imports, copied beside it: a script's own folder is first on its sys.path.
PROBE_MODULES = ("gpu_health.py", "gpu_speed.py", "probe_base.py", "probe_files.py", "probe_gpu.py", "probe_smoke.py",
                 "rules.py")
# OpenShift-style arbitrary uid: unknown to /etc/passwd, so Docker gives it group 0.
ARBITRARY_UID = "12345"
# With network none the container's own name does not resolve, and torchrun's rendezvous waits on it forever.
CONTAINER_HOSTNAME = "torchimages-verify"
SIDE_PROBE_TIMEOUT_S = 150  # the arbitrary uid's import and pip install --user (times the plan's slowdown)
# The work beside the main probe, and the checks that read its facts: where a selection runs none of them, it is not
# done (the main probe leaves out the work of unselected checks itself, told by --checks).
SIDE_WORK_READ_BY = {"files": ("hygiene",), "import": ("hygiene", "downstream"), "downstream": ("downstream",),
                     "layers": ("layout",)}


def container_name(spec: ImageSpec) -> str:
    """Chosen before creating it, so that a Ctrl-C during the create call can still find and remove it."""
    return f"torchimages-verify-{spec.tag}-{secrets.token_hex(4)}"


def create_container(docker_client: docker.DockerClient, plan: Plan, name: str, reports: str):
    """Created apart from started: a container that fails to start still exists and must be removed.

    Labels find leftovers (`docker ps -a --filter label=io.torchimages.verify`) and tell whose they are. An arm64
    image the engine emulates gets its stand-in CPU identity (emulation.py), written under the image's reports folder,
    and qemu emulates the core it names."""
    mounts = emulation.cpu_mounts(plan.standin_cpus, plan.report_dir(Path(reports)), Path(reports))
    return docker_client.containers.create(
        plan.image_id, name=name,
        # Keep the container alive without the image's entrypoint; removal with force kills it at once.
        entrypoint=["sleep", "infinity"], command=[],
        labels={VERIFY_LABEL: "1", f"{VERIFY_LABEL}.tag": plan.spec.tag, f"{VERIFY_LABEL}.reports": reports},
        shm_size=plan.shm_size, device_requests=plan.gpus.device_requests(plan.gpu_path), network_mode="none", detach=True,
        environment={**({} if plan.gpus.wanted else engine.NO_GPUS), **emulation.cpu_environment(plan.standin_cpus)},
        hostname=CONTAINER_HOSTNAME, extra_hosts={CONTAINER_HOSTNAME: "127.0.0.1"}, mounts=mounts,
    )


def copy_probe(container) -> None:
    """The probe and the downstream wheel into /tmp, readable by every uid the probe runs as."""
    files = {os.path.basename(PROBE_PATH): (PROBE_SOURCE.read_bytes(), 0o755),
             **{module: ((CHECKS_DIR / module).read_bytes(), 0o644) for module in PROBE_MODULES},
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
            facts = json.loads(lines[-1])
        except ValueError:
            facts = None
        if isinstance(facts, dict):
            return facts if facts.get("probe_version") == PROBE_VERSION else _version_mismatch(facts)
    why = f"timed out after {timeout}s" if exit_code == 137 else f"exited with {exit_code}"
    return {"probe_error": f"the probe {why} without facts", "stderr_tail": log[-3000:]}


def _version_mismatch(facts: dict) -> dict:
    """The checks read the facts of the probe this package ships: facts of another version mean other fields."""
    return {"probe_error": f"the probe reported facts of version {facts.get('probe_version')!r}, but these checks read "
                           f"version {PROBE_VERSION}: reinstall torchimages so that probe and checks match",
            "stderr_tail": ""}


def probe_arguments(spec: ImageSpec, timeout: int, slowdown: int, selection: CheckSelection) -> list[str]:
    """The main part's flags: the devel extension, the kill budget its compile child must finish inside, what the
    probe's own bounds are multiplied by, and the checks whose work it does (every check's by default)."""
    arguments = ["--budget-s", str(timeout), "--slowdown", str(slowdown)]
    if spec.builds_extensions:
        arguments.append("--devel")
        if spec.is_gpu:
            arguments += ["--cuda-extension", f"--arch-list={';'.join(spec.arch_list)}"]
    if not selection.full:
        arguments.append(f"--checks={','.join(selection.selected())}")
    return arguments


def side_work_wanted(selection: CheckSelection) -> set[str]:
    """The work beside the main probe that a selected check reads."""
    return {work for work, readers in SIDE_WORK_READ_BY.items() if any(map(selection.runs, readers))}


def gather_facts(docker_client: docker.DockerClient, container, plan: Plan, reports: str,
                 selection: CheckSelection) -> dict:
    """The probe runs and the derived image's build side by side (those the selected checks read), plus the image's
    static facts."""
    pool = ThreadPoolExecutor(max_workers=5)
    wanted = side_work_wanted(selection)
    side_timeout = SIDE_PROBE_TIMEOUT_S * plan.slowdown
    # pip install --user of the wheel is downstream's alone: hygiene reads only how the arbitrary uid imports torch
    wheel = ["--wheel", f"{downstream.CONTAINER_DIR}/{downstream.WHEEL}"] if selection.runs("downstream") else []
    side_work = {
        "files": functools.partial(run_probe, container, ["--part", "files", "--package-caches",
                                                          ";".join(plan.spec.package_caches)], "0", side_timeout),
        "import": functools.partial(run_probe, container, ["--part", "import", "--after-main", *wheel, "--slowdown",
                                                           str(plan.slowdown)], ARBITRARY_UID, side_timeout),
        "downstream": functools.partial(downstream.derived_image_facts, docker_client, plan.image_id,
                                        {VERIFY_LABEL: "1", f"{VERIFY_LABEL}.reports": reports}),
        "layers": functools.partial(image_layers.layer_facts, docker_client, plan.image_id),
    }
    try:
        runs = {"main": pool.submit(run_probe, container,
                                    probe_arguments(plan.spec, plan.timeout, plan.slowdown, selection), "", plan.timeout),
                **{work: pool.submit(call) for work, call in side_work.items() if work in wanted}}
        facts = {part: run.result() for part, run in runs.items()}
    finally:
        # On Ctrl-C do not wait for the probes: removing the container (the caller's finally) ends them. The
        # derived image's build finishes in its thread, which the interpreter joins at exit, and removes its image.
        pool.shutdown(wait=False, cancel_futures=True)
    facts["image"] = image_facts(docker_client, plan.image_id)
    facts["cpu_identity"] = emulation.cpu_identity_note(plan.standin_cpus)  # the probe's CPU facts came from it
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


def remove_containers_of(docker_client: docker.DockerClient, reports: str) -> None:
    """Every verification container of the run that writes to `reports` (found by the labels they are made with)."""
    labels = [f"{VERIFY_LABEL}=1", f"{VERIFY_LABEL}.reports={reports}"]
    for container in docker_client.api.containers(all=True, filters={"label": labels}):
        with contextlib.suppress(docker.errors.APIError):  # its own verification may be removing it right now
            remove_container(docker_client, container["Id"])


def remove_container(docker_client: docker.DockerClient, name: str) -> None:
    try:
        docker_client.api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass
