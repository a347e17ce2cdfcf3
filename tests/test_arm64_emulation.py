"""An arm64 image verified on an x86_64 engine (under qemu): the stand-in CPU identity its torch needs, only there."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from torchimages import engine
from torchimages.matrix import load_matrix
from torchimages.verify import emulation
from torchimages.verify.container import container_name, create_container, remove_container
from torchimages.verify.plan import CHECKS, Plan, VerifyResult, parse_gpus
from torchimages.verify.reports import summary_markdown, verify_report
from torchimages.verify.run import for_this_engine

from .conftest import FIXTURE_PROJECT

GRACE = {spec.tag: spec for spec in load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs}
X86, ARM = "2.15.0-cuda13.2-cudnn9-runtime", "2.15.0-cuda13.2-cudnn9-runtime-arm64"
MIDR_PATH = f"{emulation.CPU_SYSFS}/cpu0/regs/identification/midr_el1"
ARM64_BASE = "arm64v8/debian:bookworm"
PASSED = {name: {"status": "passed", "message": "ok"} for name in CHECKS}


@pytest.mark.parametrize("image, engine_machine, standin", [
    ("arm64", "x86_64", True),  # the case qemu 7.2 crashes in: the only one that gets the stand-in
    ("arm64", "aarch64", False),  # a Grace host or an arm64 runner: its own CPUs
    ("amd64", "x86_64", False),
    ("amd64", "aarch64", False),  # emulated too, but x86_64's torch reads no MIDR_EL1
    ("arm64", "", False),  # an engine that does not say its machine: nothing changes
])
def test_only_an_arm64_image_on_an_engine_of_another_machine_gets_a_stand_in(image, engine_machine, standin):
    assert emulation.needs_cpu_standin(image, engine_machine) is standin
    cpus = emulation.standin_cpus(image, {"Architecture": engine_machine, "NCPU": 2})
    assert cpus == (2 if standin else 0)


def test_the_stand_in_describes_the_engines_cpus_or_one():
    x86 = {"Architecture": "x86_64"}
    assert emulation.standin_cpus("arm64", {**x86, "NCPU": 16}) == 16
    for count in (None, 0, "2", True):
        assert emulation.standin_cpus("arm64", {**x86, "NCPU": count}) == 1, count


def test_the_stand_in_folder_names_a_neoverse_n1_for_every_cpu():
    assert emulation.standin_files(2) == {
        "online": "0-1\n", "possible": "0-1\n", "present": "0-1\n",
        "cpu0/regs/identification/midr_el1": "0x00000000413fd0c1\n",
        "cpu1/regs/identification/midr_el1": "0x00000000413fd0c1\n",
    }
    assert emulation.standin_files(1)["online"] == "0\n"


def test_the_stand_in_is_written_under_the_images_reports_folder_and_mounted_read_only(tmp_path):
    reports = tmp_path / "reports"
    [mount] = emulation.cpu_mounts(3, reports / ARM, reports)
    folder = reports / ARM / emulation.STANDIN_FOLDER
    assert (mount["Target"], mount["Source"], mount["Type"], mount["ReadOnly"]) == (
        emulation.CPU_SYSFS, str(folder.resolve()), "bind", True)
    assert sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()) == sorted(
        emulation.standin_files(3))
    assert (folder / "cpu2/regs/identification/midr_el1").read_text() == "0x00000000413fd0c1\n"


def test_a_native_run_mounts_nothing_and_writes_nothing(tmp_path):
    assert emulation.cpu_mounts(0, tmp_path / ARM, tmp_path) == []
    assert not any(tmp_path.iterdir())


def plan_of(tag: str, image_architecture: str) -> Plan:
    return Plan(GRACE[tag], "image", "sha256:1", parse_gpus("none"), "64m", 60, image_architecture=image_architecture)


def test_the_plan_for_this_engine_decides_from_the_image_and_the_engine_and_the_report_says_so():
    access = engine.GpuAccess("", "no GPUs")
    x86_engine, arm_engine = {"Architecture": "x86_64", "NCPU": 2}, {"Architecture": "aarch64", "NCPU": 72}
    emulated = for_this_engine(plan_of(ARM, "arm64"), access, x86_engine)
    assert emulated.standin_cpus == 2 and emulated.gpu_path == "runtime"
    assert for_this_engine(plan_of(ARM, "arm64"), access, arm_engine).standin_cpus == 0
    assert for_this_engine(plan_of(X86, "amd64"), access, x86_engine).standin_cpus == 0
    result = VerifyResult(ARM, "image", "sha256:1", True, {}, FIXTURE_PROJECT)
    recorded = verify_report(result, emulated, datetime.now(timezone.utc)).run["cpu_identity"]
    assert recorded["cpu_identity"] == "stand-in" and recorded["midr_el1"] == emulation.STANDIN_MIDR_EL1
    assert "emulation" in recorded["why"]
    standin_note = emulation.cpu_identity_note(emulated.standin_cpus)["why"]
    summary = summary_markdown([dataclasses.replace(result, checks=PASSED, cpu_standin=standin_note)])
    assert f"## `{ARM}`" in summary and "**CPU identity** was a stand-in: an arm64 image under emulation" in summary
    native = verify_report(result, for_this_engine(plan_of(ARM, "arm64"), access, arm_engine), datetime.now(timezone.utc))
    assert native.run["cpu_identity"] == {"cpu_identity": "the engine's own CPUs"}


@pytest.mark.engine
def test_the_verifiers_container_of_an_emulated_arm64_image_reads_the_stand_in_midr(docker_client, tmp_path):
    """The container verification creates (create_container, with the plan verify_images makes for this engine) from
    the arm64 base, under qemu here: the CPU identity oneDNN reads is the stand-in's, and read-only."""
    info = engine.daemon_info(docker_client)
    if not emulation.needs_cpu_standin("arm64", str(info.get("Architecture") or "")):
        pytest.skip(f"this engine runs arm64 itself ({info.get('Architecture')}): no stand-in to see")
    image = docker_client.images.get(ARM64_BASE)
    plan = Plan(GRACE[ARM], ARM64_BASE, image.id, parse_gpus("none"), "64m", 60,
                image_architecture=image.attrs["Architecture"])
    plan = for_this_engine(plan, engine.GpuAccess("", "no GPUs"), info)
    assert plan.standin_cpus == info["NCPU"]
    lines = run_in_verifier_container(docker_client, plan, str(tmp_path),
                                      f"uname -m; cat {MIDR_PATH} {emulation.CPU_SYSFS}/online; "
                                      f"echo x > {MIDR_PATH} || echo read-only")
    assert lines[:3] == ["aarch64", emulation.STANDIN_MIDR_EL1, emulation.standin_files(plan.standin_cpus)["online"][:-1]]
    assert "read-only" in lines, lines
    assert (tmp_path / ARM / emulation.STANDIN_FOLDER / "online").is_file(), "under the reports folder it was given"
    # Without it (what the verifier did before), the file oneDNN reads is not there: the stand-in is what supplies it.
    without = run_in_verifier_container(docker_client, dataclasses.replace(plan, standin_cpus=0), str(tmp_path),
                                        f"cat {MIDR_PATH} 2>/dev/null || echo missing")
    assert without[0] == "missing", without


def run_in_verifier_container(docker_client, plan: Plan, reports: str, script: str) -> list[str]:
    name = container_name(plan.spec)
    try:
        container = create_container(docker_client, plan, name, reports)
        container.start()
        _, output = container.exec_run(["sh", "-c", script])
    finally:
        remove_container(docker_client, name)
    return output.decode().split("\n")
