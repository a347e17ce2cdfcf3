"""Verification, step 3: the pytest-testinfra check suite against the container, every check given a status.

Every run of the suite goes through suite_arguments: against a container (run_suite), or on recorded facts alone
(run_suite_on_facts: what `gpu-record` judges with and what the tests replay real hardware's facts through).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import docker.errors

from ..checks.selection import CheckSelection
from ..files import open_new, remove_file
from ..invocation import handed_on
from ..model import InputError, PeerError, Problem
from ..peers import engine
from .container import ARBITRARY_UID
from .plan import CHECKS, GPU_CHECKS, SUITE, Plan, VerifyOptions

SUITE_TIMEOUT_S = 300  # times the plan's slowdown: the checks run commands in the container


def expectations(plan: Plan, options: VerifyOptions, host_gpu_runtime: bool, container_id: str) -> dict:
    """What the checks compare against: the row, how the container was run, which rows cover which GPUs, and the
    checks selected (the plugin skips the others' tests, whose facts the probe did not gather)."""
    rows = options.matrix_specs or (plan.spec,)
    return {
        "tag": plan.spec.tag, "image": plan.image, "image_id": plan.image_id, "container_id": container_id,
        "spec": plan.spec.to_json(), "gpus": plan.gpus.to_json(), "host_gpu_runtime": host_gpu_runtime,
        "shm_size": plan.shm_size, "arbitrary_uid": int(ARBITRARY_UID),
        "arch_rows": arch_rows(rows),
        "selection": options.selection.to_json(),
    }


def arch_rows(rows) -> dict[str, dict]:
    """The GPU rows a device's arch check may name as covering it: each row's arch list with its CUDA (torch's Tegra
    coverage changes with it) and machine (an aarch64 image covers no x86_64 host's GPU)."""
    return {row.tag: {"arch_list": list(row.arch_list), "cuda": row.cuda, "arch": row.arch}
            for row in rows if row.is_gpu}


def suite_arguments(tests: Sequence[Path], host: str, expect_path: Path, facts_path: Path, results_path: Path,
                    suite: Path = SUITE) -> list[str]:
    """pytest's arguments for the check suite (tests: the suite folder or some of its files) against host
    (docker://<container>, or local:// for facts alone), writing each check's verdict to results_path."""
    return [
        *(str(test) for test in tests), f"--hosts={host}", "-p", "torchimages.checks.plugin",
        f"--expect={expect_path.resolve()}", f"--probe={facts_path.resolve()}", f"--check-results={results_path}",
        # The suite's own pytest.ini: no project's configuration or conftest applies, in a checkout or installed.
        "-c", str(suite / "pytest.ini"), "--rootdir", str(suite), "--confcutdir", str(suite), "-p", "no:cacheprovider",
    ]


def run_suite_on_facts(expect: dict, facts: dict, tests: Sequence[Path], select: str = "") -> dict[str, dict]:
    """The check suite judged on facts alone (no container; select: a pytest -k expression), in this process: what
    `gpu-record` judges a GPU host with, and how the tests replay recorded real-hardware facts through the real
    suite. Returns {check: {status, message, tests, ...}} for the checks the selected tests belong to."""
    import pytest  # here: importing it costs every command's start a tenth of a second

    with tempfile.TemporaryDirectory(prefix="torchimages-facts-") as scratch:
        paths = {name: Path(scratch) / f"{name}.json" for name in ("expect", "facts", "checks")}
        paths["expect"].write_text(json.dumps(expect))
        paths["facts"].write_text(json.dumps(facts, default=str))
        arguments = [*suite_arguments(tests, "local://", paths["expect"], paths["facts"], paths["checks"]),
                     *(["-k", select] if select else []), "-q", "--no-header", "--no-summary",
                     "-p", "no:unraisableexception", "-W", "ignore::DeprecationWarning"]
        with contextlib.redirect_stdout(sys.stderr):  # a caller's stdout may carry its own answer (gpu-record's line)
            code = pytest.main(arguments)
        if code not in (0, 1) or not paths["checks"].exists():
            raise PeerError(f"the check suite could not run on the facts (pytest exit {code})")
        return json.loads(paths["checks"].read_text())


def run_suite(plan: Plan, options: VerifyOptions, container_id: str, report_dir: Path, expect_path: Path,
              facts_path: Path) -> dict[str, dict]:
    """pytest + testinfra against the container; returns {check: {status, message, tests}}."""
    with tempfile.TemporaryDirectory(prefix="torchimages-verify-") as scratch:
        results_path = Path(scratch) / "checks.json"
        command = [
            sys.executable, "-m", "pytest",
            *suite_arguments([options.suite], f"docker://{container_id}", expect_path, facts_path, results_path,
                             options.suite),
            f"--junitxml={(report_dir / 'junit.xml').resolve()}",
            "-o", f"junit_suite_name={plan.spec.tag}", "-q", "--tb=short", "-rfs", "--color=no",
        ]
        remove_file(report_dir / "junit.xml", report_dir)  # pytest would write through a link there
        timeout = SUITE_TIMEOUT_S * plan.slowdown
        with open_new(report_dir / "pytest.log", report_dir) as log:
            try:
                exit_code = subprocess.run(command, cwd=scratch, stdout=log, stderr=subprocess.STDOUT,
                                           timeout=timeout, check=False, env=handed_on(os.environ)).returncode
            except subprocess.TimeoutExpired:
                log.write(f"\nthe check suite did not finish in {timeout}s\n")
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


def selected_verdicts(checks: dict[str, dict], selection: CheckSelection) -> dict[str, dict]:
    """A check the selection leaves out is skipped, naming the option, however the run ended (a container that did not
    start, a suite that did not run): a check that was not run neither passes nor fails."""
    return {name: check if selection.runs(name) else {"status": "skipped", "message": selection.reason,
                                                       "tests": check.get("tests", [])}
            for name, check in checks.items()}


# A CDI spec names the driver's files by version (libcuda.so.580.65.06, libEGL_nvidia.so.580.65.06): after a driver
# upgrade they are gone, injection still succeeds, and the OCI runtime fails mounting one, in words that name no GPU
# ("error mounting ... no such file or directory"; NVIDIA/nvidia-container-toolkit#450, HaveAGitGat/Tdarr#1423).
# NVIDIA: "If you change the device or CUDA driver configuration, you must generate a new CDI specification"
# (Container Toolkit, "Support for Container Device Interface").
CDI_REGENERATE = ("a GPU container that cannot start through CDI most often has a stale CDI spec (it names the driver's "
                  "files by version, and a driver upgrade removes them): regenerate it (`nvidia-ctk cdi generate "
                  "--output=/etc/cdi/nvidia.yaml`, or `systemctl restart nvidia-cdi-refresh`) after every driver or "
                  "MIG change")


def gpu_start_failure(error: docker.errors.APIError, gpu_path: str = "runtime") -> str:
    """Why a GPU container could not start, where a GPU reason is the cause (the NVIDIA hook refused, a CDI device
    does not resolve, and on the CDI path any start failure: a stale spec's words name no GPU), with the fix; "" for
    any other reason. An engine that cannot give GPUs at all is bad input. On the CDI path the caller tries a
    container without GPUs: if that fails too, the GPUs were not the cause."""
    message = engine.explain_start_error(error)
    if message == engine.GPU_RUNTIME_HINT:
        raise InputError([Problem("--gpus", 0, f"{message}; {engine.CDI_HINT}")])
    if engine.is_gpu_start_error(str(error)):
        return message
    return f"{message}; {CDI_REGENERATE}" if gpu_path == "cdi" else ""


def failed_start_checks(error: docker.errors.APIError) -> dict[str, dict]:
    """A container that cannot start, not for a GPU reason: every check fails with why."""
    message = engine.explain_start_error(error)
    return {name: {"status": "failed", "message": f"the container could not start: {message}", "tests": []}
            for name in CHECKS}


def with_gpu_start_failure(message: str, checks_without_gpus: dict[str, dict], driver_cause: bool) -> dict[str, dict]:
    """The verdicts of a GPU container that could not start, where a container without GPUs ran every check that
    needs none (identity, hygiene, shm, smoke, ...): the gpu check fails naming the start error (once), the driver
    check fails pointing there where the driver is the cause, and the checks that need a GPU say they did not run."""
    see_gpu = "the container could not start with GPUs (see the gpu check)"
    checks = dict(checks_without_gpus)
    checks["gpu"] = {"status": "failed", "message": f"the container could not start with GPUs: {message}", "tests": []}
    checks["driver"] = ({"status": "failed", "message": see_gpu, "tests": []} if driver_cause
                        else {"status": "skipped", "message": f"not run: {see_gpu}", "tests": []})
    for name in (*GPU_CHECKS, "amp"):
        if name not in ("gpu", "driver") and checks.get(name, {}).get("status") == "skipped":
            checks[name] = {"status": "skipped", "message": f"not run: {see_gpu}", "tests": []}
    return checks
