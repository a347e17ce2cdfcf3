"""Verification's GPU plumbing on a host without GPUs: what the suite's driver verdict writes, how a GPU container
that cannot start is reported, and the GPU environment each --gpus form gives the container."""
from __future__ import annotations

import io
import os
import secrets
from pathlib import Path

import docker.errors
import pytest

from torchimages.checks.suite.helpers import driver_verdict
from torchimages.matrix.load import load_compat, load_matrix
from torchimages.model import InputError
from torchimages.peers import engine
from torchimages.security.sbom import collect_inventory
from torchimages.verify.container import container_name, create_container, remove_container
from torchimages.verify.plan import CHECKS, SUITE, Plan, Progress, VerifyOptions, VerifyResult, parse_gpus, plan_all
from torchimages.verify.reports import REPORT_SCHEMA, VerifyReport, summary_markdown
from torchimages.verify.suite import failed_start_checks, gpu_start_failure, run_suite_on_facts, with_gpu_start_failure

from .conftest import FIXTURE_COMPAT, FIXTURE_MATRIX

BY_TAG = {spec.tag: spec for spec in load_matrix(FIXTURE_MATRIX).specs}
CU132 = "2.15.0-cuda13.2-cudnn9-runtime"
H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}


def driver_check(tag: str, driver: str, libcuda: int | None) -> dict:
    """The real suite's driver test, run by pytest with the real check plugin on recorded facts (testinfra's
    local:// host: the test reads no file), as `build.py test` runs it against a container."""
    spec = BY_TAG[tag]
    expect = {"tag": tag, "container_id": "recorded", "spec": spec.to_json(), "host_gpu_runtime": True,
              "gpus": parse_gpus("all").to_json()}
    gpu = {"available": True, "device_count": 1, "devices": [H100], "driver_version": driver,
           "libcuda_driver_version": libcuda, "nvidia_smi_gpus": [H100["name"]], "warnings": []}
    facts = {"image": {"labels": {}}, "main": {"torch": {"importable": True}, "gpu": gpu}}
    return run_suite_on_facts(expect, facts, [SUITE / "test_gpu.py"], "test_host_driver_meets_the_cuda_minimum")["driver"]


def test_a_driver_below_the_releases_own_passes_the_driver_check_with_its_warning_in_the_report():
    # R580 (the LTS branch) under a CUDA 13.2 row: minor-version compatibility runs it; PTX JIT of 13.2 PTX does not.
    verdict = driver_check(CU132, "580.95.05", 13000)
    assert verdict["status"] == "passed", verdict
    [warning] = verdict["warnings"]
    assert "older than CUDA 13.2's own (595.45.04" in warning and "cannot be JIT-compiled" in warning
    assert "warning: " + warning in verdict["message"]


@pytest.mark.parametrize("driver, libcuda, verdict, says", [
    ("595.45.04", None, "ok", "driver 595.45.04 >= 595.45.04"),
    ("580.95.05", 13000, "warn", "minor-version compatibility (>= 580)"),
    ("575.57.08", 12090, "fail", "older than any CUDA 13.x runs on (580"),
    ("575.57.08", None, "fail", "older than any CUDA 13.x runs on (580"),
    # cuda-compat's libcuda 13.2 on the 535 datacenter branch: the kernel driver's branch does not decide.
    ("535.261.03", 13020, "ok", "the libcuda this process loads supports CUDA 13.2"),
])
def test_the_driver_verdict_has_two_floors_and_knows_a_forward_compatible_libcuda(driver, libcuda, verdict, says):
    status, why = driver_verdict(driver, libcuda, BY_TAG[CU132])
    assert status == verdict and says in why, why


@pytest.mark.parametrize("floor", ["", "driver_floor: \"600\"", "driver_floor: r580"])
def test_a_cuda_release_without_a_floor_at_or_below_its_own_driver_is_refused_naming_the_line(tmp_path, floor):
    text = FIXTURE_COMPAT.read_text()
    entry = '  "13.2":\n    full: "13.2.2"\n    min_driver: "595.45.04"\n    driver_floor: "580"\n'
    assert entry in text
    broken = tmp_path / "compat.yaml"
    broken.write_text(text.replace(entry, entry.replace('    driver_floor: "580"\n', f"    {floor}\n")))
    with pytest.raises(InputError) as raised:
        load_compat(broken)
    [problem] = raised.value.problems
    assert problem.file == str(broken) and text.splitlines()[problem.line - 1] == '  "13.2":'
    assert "driver_floor: (its major's minor-version-compatibility floor" in problem.message


def test_the_summary_names_a_check_that_passed_with_a_warning():
    checks = {name: {"status": "passed", "message": "1 of 1 tests passed", "tests": []} for name in CHECKS}
    checks["driver"] = {"status": "passed", "message": "1 of 1 tests passed; warning: the host driver 580.95.05 ...",
                        "tests": [], "warnings": ["the host driver 580.95.05 is older than CUDA 13.2's own"]}
    report = VerifyReport.from_json({"schema": REPORT_SCHEMA, "image_id": "sha256:" + "a" * 64, "passed": True,
                                     "checks": checks})
    assert report.checks["driver"].warnings == ["the host driver 580.95.05 is older than CUDA 13.2's own"]
    summary = summary_markdown([VerifyResult(CU132, "ref", report.image_id, True, checks, Path("r"))])
    assert "| driver | ⚠️ passed |" in summary
    assert "- **driver** passed with a warning: the host driver 580.95.05 is older than CUDA 13.2's own" in summary


# How dockerd words a failed NVIDIA hook: the hook's reason is on the second line (NVIDIA/nvidia-container-toolkit#556).
HOOK_FAILED = ("failed to create shim task: OCI runtime create failed: runc create failed: unable to start container "
               "process: error during container init: error running hook #0: error running hook: exit status 1, "
               "stdout: , stderr: Auto-detected mode as 'legacy'\n")


def start_error(explanation: str) -> docker.errors.APIError:
    return docker.errors.APIError("500 Server Error", explanation=explanation)


# dockerd's CDI injection failing for a device its specs do not name (moby's CDI injection; the CDI library words it
# "unresolvable CDI devices"), and NVIDIA's CDI hook failing in the OCI runtime (its createContainer hook).
CDI_UNRESOLVABLE = ("could not select device driver \"cdi\" with capabilities: []: CDI device injection failed: "
                    "unresolvable CDI devices nvidia.com/gpu=all")
CDI_HOOK_FAILED = ("failed to create task for container: failed to create shim task: OCI runtime create failed: "
                   "runc create failed: unable to start container process: error during container init: error running "
                   "createContainer hook #0: exit status 1, stdout: , stderr: time=\"...\" level=error msg=\"failed "
                   "to create link [libcuda.so.1 /lib/x86_64-linux-gnu/libcuda.so]: nvidia-cdi-hook: file exists\"")


@pytest.mark.parametrize("explanation, says, driver_cause", [
    (f"{HOOK_FAILED}nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
     "the host's NVIDIA driver is not usable", True),
    # libnvidia-container's own words, lower case (as seen in many reports of a driver upgraded without a reboot)
    (f"{HOOK_FAILED}nvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown",
     "a driver upgraded without a reboot", True),
    (f"{HOOK_FAILED}nvidia-container-cli: device error: 3: unknown device: unknown", "nvidia-smi -L", False),
    (f"{HOOK_FAILED}nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.2, please update your "
     "driver to a newer version, or use an earlier cuda container: unknown", "too old for this image", True),
    (CDI_UNRESOLVABLE, "nvidia-ctk cdi generate", False),
    (CDI_HOOK_FAILED, "nvidia-cdi-hook", False),
])
def test_a_gpu_container_that_cannot_start_still_runs_the_checks_that_need_no_gpu(explanation, says, driver_cause):
    message = gpu_start_failure(start_error(explanation))
    assert says in message
    assert engine.is_driver_start_error(explanation) == driver_cause
    without_gpus = {name: {"status": "passed", "message": "1 of 1 tests passed", "tests": []} for name in CHECKS}
    without_gpus.update({name: {"status": "skipped", "message": "not run: no GPUs were requested (--gpus none)",
                                "tests": []} for name in ("gpu", "driver", "cudnn", "multi-gpu", "amp")})
    without_gpus["hygiene"] = {"status": "failed", "message": "2 copies of libcudnn", "tests": []}
    checks = with_gpu_start_failure(message, without_gpus, engine.is_driver_start_error(explanation))
    assert checks["gpu"]["status"] == "failed" and says in checks["gpu"]["message"]
    assert [name for name, check in checks.items() if says in check["message"]] == ["gpu"]  # named once
    assert checks["driver"]["status"] == ("failed" if driver_cause else "skipped")
    assert {checks[name]["status"] for name in ("identity", "shm", "smoke", "distributed")} == {"passed"}
    assert checks["hygiene"]["status"] == "failed"  # what the container without GPUs found stands
    assert all("could not start with GPUs" in checks[name]["message"] for name in ("cudnn", "multi-gpu", "amp"))


def test_an_engine_that_cannot_give_gpus_is_bad_input_with_the_fix():
    with pytest.raises(InputError) as raised:
        gpu_start_failure(start_error('could not select device driver "" with capabilities: [[gpu]]'))
    assert raised.value.problems[0].message.startswith(engine.GPU_RUNTIME_HINT)
    assert "nvidia-ctk cdi generate" in raised.value.problems[0].message


def test_a_container_that_cannot_start_for_another_reason_fails_every_check():
    error = start_error("OCI runtime create failed: exec: \"sleep\": executable file not found")
    assert gpu_start_failure(error) == ""
    checks = failed_start_checks(error)
    assert all(check["status"] == "failed" and "could not start" in check["message"] for check in checks.values())


def test_a_failed_gpu_start_reruns_the_probe_in_a_container_without_gpus(monkeypatch, tmp_path):
    """verify_one's path on a GPU start error, with stand-ins for the engine: a second container without GPUs runs the
    probe and the suite, and both containers are kept for removal."""
    from torchimages.verify import run

    started, names = [], []

    def start(docker_client, plan, options, kept):
        kept.append(f"container-{len(kept)}")
        started.append(plan.gpus.text)
        return object()

    no_gpu_checks = {name: {"status": "passed", "message": "ok", "tests": []} for name in CHECKS}
    monkeypatch.setattr(run, "_started_container", start)
    monkeypatch.setattr(run, "_probe_and_check", lambda *args: dict(no_gpu_checks))
    plan = Plan(BY_TAG[CU132], "image", "sha256:1", parse_gpus("all"), "8g", 60, "cdi")
    clock = run.StageClock(CU132, Progress())
    checks = run._checks_after_a_failed_start(None, start_error(CDI_UNRESOLVABLE), plan, VerifyOptions(tmp_path), True,
                                              tmp_path, clock, names)
    assert started == ["none"] and names == ["container-0"]
    assert checks["gpu"]["status"] == "failed" and checks["identity"]["status"] == "passed"


# A CDI spec made before a driver upgrade (580.65.06 -> 580.95.05): injection succeeds, runc fails on a file the old
# driver had (gpu-audit-3 C3; NVIDIA/nvidia-container-toolkit#450, HaveAGitGat/Tdarr#1423): no GPU words in it.
STALE_CDI_SPEC = ("failed to create task for container: failed to create shim task: OCI runtime create failed: runc "
                  "create failed: unable to start container process: error during container init: error mounting "
                  "\"/usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.580.65.06\" to rootfs at "
                  "\"/usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.580.65.06\": stat "
                  "/usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.580.65.06: no such file or directory: unknown")


def test_a_gpu_container_that_cannot_start_through_cdi_says_regenerate_the_spec():
    message = gpu_start_failure(start_error(STALE_CDI_SPEC), "cdi")
    assert "libEGL_nvidia.so.580.65.06" in message and "stale CDI spec" in message
    assert "nvidia-ctk cdi generate" in message and "nvidia-cdi-refresh" in message
    assert gpu_start_failure(start_error(STALE_CDI_SPEC), "runtime") == ""  # the runtime path reads no spec


@pytest.mark.parametrize(("second_start_fails", "identity"), [(False, "passed"), (True, "failed")])
def test_a_stale_cdi_spec_reruns_the_checks_without_gpus_and_blames_the_gpus_only_if_that_starts(
        monkeypatch, tmp_path, second_start_fails, identity):
    """A container without GPUs starts on that host: the checks that need no GPU run there. Where it fails too, the
    cause was not the GPUs, and every check fails with the second error."""
    from torchimages.verify import run

    started: list[str] = []

    def start(docker_client, plan, options, kept):
        started.append(plan.gpus.text)
        if second_start_fails:
            raise start_error("OCI runtime create failed: exec: \"sleep\": executable file not found")
        return object()

    monkeypatch.setattr(run, "_started_container", start)
    monkeypatch.setattr(run, "_probe_and_check", lambda *args: {name: {"status": "passed", "message": "ok",
                                                                      "tests": []} for name in CHECKS})
    plan = Plan(BY_TAG[CU132], "image", "sha256:1", parse_gpus("all"), "8g", 60, "cdi")
    checks = run._checks_after_a_failed_start(None, start_error(STALE_CDI_SPEC), plan, VerifyOptions(tmp_path), True,
                                              tmp_path, run.StageClock(CU132, Progress()), [])
    assert started == ["none"] and checks["identity"]["status"] == identity and checks["gpu"]["status"] == "failed"
    assert ("stale CDI spec" in checks["gpu"]["message"]) != second_start_fails


RUNTIME_HOOK, CDI_HOOK = ("nvidia-container-runtime-hook",), ("nvidia-cdi-hook",)
CDI_ENGINE = {"Runtimes": {"runc": {}}, "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}


@pytest.mark.parametrize("info, hooks, specs, path", [
    ({"Runtimes": {"nvidia": {}, "runc": {}}}, (), [], "runtime"),
    ({"Runtimes": {"runc": {}}}, RUNTIME_HOOK, [], "runtime"),  # dockerd's nvidia driver from the hook on its PATH
    ({**CDI_ENGINE}, (), ["/etc/cdi/nvidia.yaml"], "cdi"),
    ({"CDISpecDirs": ["/etc/cdi"], "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}, (), [],
     "cdi"),  # a remote engine: its discovered devices tell
    ({"CDISpecDirs": ["/etc/cdi"]}, (), [], ""),  # CDI on, but no spec names NVIDIA GPUs
    ({"Runtimes": {"runc": {}}}, (), ["/etc/cdi/nvidia.yaml"], ""),  # a spec, but an engine without CDI
    # nvidia-container-toolkit-base alone (nvidia-cdi-hook, no runtime hook): moby registers --gpus for the CDI hook
    # only from docker-v29.2.0 (daemon/devices_nvidia_linux.go, getNVIDIADeviceDrivers; gpu-audit-3 C2)
    ({**CDI_ENGINE, "ServerVersion": "28.5.1"}, CDI_HOOK, ["/etc/cdi/nvidia.yaml"], "cdi"),
    ({**CDI_ENGINE, "ServerVersion": "27.5.1"}, CDI_HOOK, ["/etc/cdi/nvidia.yaml"], "cdi"),
    ({**CDI_ENGINE, "ServerVersion": "29.1.5"}, CDI_HOOK, ["/etc/cdi/nvidia.yaml"], "cdi"),
    ({**CDI_ENGINE, "ServerVersion": "29.2.0"}, CDI_HOOK, ["/etc/cdi/nvidia.yaml"], "runtime"),
    ({**CDI_ENGINE, "ServerVersion": "30.0.1"}, CDI_HOOK, [], "runtime"),
    ({"Runtimes": {"runc": {}}, "ServerVersion": "28.5.1"}, CDI_HOOK, [], ""),  # no CDI either: no path at all
    ({**CDI_ENGINE, "ServerVersion": "dev"}, CDI_HOOK, ["/etc/cdi/nvidia.yaml"], "cdi"),  # unknown: not 29.2+
    ({**CDI_ENGINE, "ServerVersion": "28.5.1"}, RUNTIME_HOOK + CDI_HOOK, [], "runtime"),
])
def test_the_gpu_path_is_the_nvidia_runtime_or_cdi_where_the_engine_and_a_spec_allow(info, hooks, specs, path):
    access = engine.gpu_access_of(info, hooks, specs)
    assert access.path == path
    assert ("CDI" in access.why) == (path in ("cdi", "")) and bool(doctor_says(access)) == bool(path)
    if path:  # doctor names the path it found: the hook, the runtime or CDI
        assert ("cdi" if path == "cdi" else "nvidia") in doctor_says(access).lower()


@pytest.mark.parametrize("version", ["28.5.1", "29.1.5"])
def test_a_cdi_only_host_before_docker_29_2_says_why_its_cdi_hook_is_not_a_gpus_path(version):
    access = engine.gpu_access_of({**CDI_ENGINE, "ServerVersion": version}, CDI_HOOK, ["/etc/cdi/nvidia.yaml"])
    assert "29.2" in access.why and version in access.why


def doctor_says(access) -> str:
    from torchimages.build.doctor import gpu_access_finding

    finding = gpu_access_finding(access)
    return finding.detail if finding.status == "ok" else ""


def test_nvidia_cdi_specs_are_found_in_the_engines_spec_folders(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    (tmp_path / "etc" / "other.json").write_text('{"kind": "vendor.com/fpga"}')
    assert engine.nvidia_cdi_specs([tmp_path / "etc", tmp_path / "missing"]) == [str(tmp_path / "etc" / "nvidia.yaml")]


@pytest.mark.parametrize("gpus, device_ids", [
    ("all", ["nvidia.com/gpu=all"]), ("2", ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),
    ("device=0,GPU-5d5b", ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-5d5b"]),
    ("device=MIG-c6d4", ["nvidia.com/gpu=MIG-c6d4"]), ("none", None),
])
def test_gpus_are_requested_by_cdi_device_name_on_the_cdi_path(gpus, device_ids):
    requests = parse_gpus(gpus).device_requests("cdi")
    assert [(request["Driver"], request["DeviceIDs"]) for request in requests] == (
        [("cdi", device_ids)] if device_ids else [])


@pytest.fixture
def image_giving_every_gpu(docker_client):
    """A tiny image that says NVIDIA_VISIBLE_DEVICES=all, as ours do (built on the base the engine is seeded with);
    its dpkg-query lists one package, named `visible`, whose version is what the container was given."""
    reference = f"torchimages-test-gpu-env:{secrets.token_hex(4)}"
    dockerfile = io.BytesIO(b"FROM debian:bookworm\nENV NVIDIA_VISIBLE_DEVICES=all\n"
                            b"RUN echo '#!/bin/sh' > /usr/local/bin/dpkg-query"
                            b" && echo 'echo \"visible\t$NVIDIA_VISIBLE_DEVICES\tall\"' >> /usr/local/bin/dpkg-query"
                            b" && chmod +x /usr/local/bin/dpkg-query\n")
    image, _ = docker_client.images.build(fileobj=dockerfile, tag=reference, rm=True, pull=False)
    yield image
    docker_client.images.remove(image.id, force=True)


@pytest.mark.engine
@pytest.mark.parametrize("gpus, visible, requests", [
    # On an engine whose default runtime is nvidia the image's "all" alone would give every GPU: "void" is the NVIDIA
    # runtime's no GPU (NVIDIA Container Toolkit, "Specialized Configurations with Docker", GPU Enumeration).
    ("none", "void", None),
    ("all", "all", [{"Count": -1, "DeviceIDs": []}]),
    ("2", "all", [{"Count": 2, "DeviceIDs": []}]),
    ("device=0,2", "all", [{"Count": 0, "DeviceIDs": ["0", "2"]}]),
])
def test_each_gpus_form_gives_the_container_its_gpu_environment(docker_client, image_giving_every_gpu, tmp_path,
                                                                 gpus, visible, requests):
    spec = BY_TAG[CU132]
    image = image_giving_every_gpu
    plan = Plan(spec, image.tags[0], image.id, parse_gpus(gpus), "64m", 60)
    name = container_name(spec)
    try:
        create_container(docker_client, plan, name, str(tmp_path))
        inspected = docker_client.api.inspect_container(name)
    finally:
        remove_container(docker_client, name)
    assert f"NVIDIA_VISIBLE_DEVICES={visible}" in inspected["Config"]["Env"]
    found = inspected["HostConfig"].get("DeviceRequests")
    assert [{key: request[key] for key in ("Count", "DeviceIDs")} for request in found or []] == (requests or [])


@pytest.mark.engine
def test_gpus_are_not_refused_up_front_on_an_engine_without_an_nvidia_runtime_entry(
        engine_without_gpus, image_giving_every_gpu, tmp_path, monkeypatch):
    # dockerd registers its nvidia device driver when nvidia-container-runtime-hook is on its PATH, with no Runtimes
    # entry (moby daemon/nvidia_linux.go): the container's start decides, not the engine's Runtimes.
    [plan] = plan_all(engine_without_gpus, [BY_TAG[CU132]],
                      VerifyOptions(tmp_path, gpus="all", image=image_giving_every_gpu.tags[0]), Progress())
    assert plan.gpus.wanted and plan.image_id == image_giving_every_gpu.id
    hook = tmp_path / "bin" / "nvidia-container-runtime-hook"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    monkeypatch.setenv("PATH", f"{hook.parent}:{os.environ['PATH']}")
    assert engine.has_gpu_runtime(engine_without_gpus), "a local engine with the NVIDIA hook on PATH can give GPUs"


@pytest.mark.engine
def test_reading_an_images_package_lists_gives_its_container_no_gpu(docker_client, image_giving_every_gpu):
    inventory = collect_inventory(docker_client, image_giving_every_gpu.id)
    assert inventory.debs == [("visible", "void", "all")]


def distributed_checks(gpu: dict, distributed: dict) -> dict:
    """The real suite's distributed tests on recorded facts, as `build.py test` runs them against a container."""
    spec = BY_TAG[CU132]
    expect = {"tag": CU132, "container_id": "recorded", "spec": spec.to_json(), "host_gpu_runtime": True,
              "gpus": parse_gpus("all").to_json()}
    facts = {"image": {"labels": {}}, "main": {"torch": {"importable": True}, "gpu": gpu, "distributed": distributed}}
    return run_suite_on_facts(expect, facts, [SUITE / "test_distributed.py"])["distributed"]


@pytest.mark.parametrize("backend, status", [("gloo", "passed"), ("nccl", "failed")])
def test_torchrun_runs_over_gloo_across_a_mig_device_and_a_whole_gpu(backend, status):
    """NCCL supports MIG devices only experimentally (NVIDIA/nccl#1716): beside a whole GPU the all-reduce must run
    over gloo, and one over NCCL is not what the probe was asked to run."""
    mig = {"name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "capability": [8, 0]}
    gpu = {"available": True, "device_count": 2, "devices": [{**H100, "name": "NVIDIA A100-SXM4-80GB"}, mig],
           "mig_devices": {"0": ["MIG 1g.10gb     Device  0: (UUID: MIG-1)"]}, "warnings": []}
    ranks = [{"rank": rank, "backend": backend, "device": "cpu", "value": 3.0, "expected": 3.0, "ok": True}
             for rank in range(2)]
    distributed = {"command": "torchrun --standalone --nproc-per-node 2", "processes": 2, "returncode": 0,
                   "ranks": ranks, "error": "", "output": "", "ok": True}
    verdict = distributed_checks(gpu, distributed)
    assert verdict["status"] == status, verdict
