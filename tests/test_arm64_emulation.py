"""An arm64 image verified on an x86_64 engine (under qemu): the stand-in CPU identity its torch needs, only there."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from torchimages.checks import probe, probe_base
from torchimages.checks.selection import CheckSelection
from torchimages.cli.display import checks_table
from torchimages.matrix.load import load_matrix
from torchimages.peers import engine
from torchimages.verify import emulation
from torchimages.verify.container import container_name, create_container, probe_arguments, remove_container
from torchimages.verify.plan import (
    CHECKS,
    RUNTIME_TIMEOUT_S,
    Plan,
    Progress,
    VerifyOptions,
    VerifyResult,
    parse_gpus,
    plan_all,
)
from torchimages.verify.reports import summary_markdown, verify_report
from torchimages.verify.run import for_this_engine

from .conftest import FIXTURE_PROJECT

GRACE = {spec.tag: spec for spec in load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs}
X86, ARM = "2.15.0-cuda13.2-cudnn9-runtime", "2.15.0-cuda13.2-cudnn9-runtime-arm64"
MIDR_PATH = f"{emulation.CPU_SYSFS}/cpu0/regs/identification/midr_el1"
ARM64_BASE = "arm64v8/debian:bookworm"
PASSED = {name: {"status": "passed", "message": "ok"} for name in CHECKS}
HWCAP = "LD_SHOW_AUXV=1 /bin/true | sed -n 's/^AT_HWCAP: *//p'"  # the CPU features the kernel (qemu) tells glibc
HWCAP_SVE = 1 << 22  # Linux's arch/arm64 uapi hwcap.h


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
    assert emulation.cpu_environment(0) == {}


def test_under_emulation_qemu_emulates_the_core_the_stand_in_names():
    """Not qemu's default "max" (SVE with 512-bit vectors, which inductor compiles 256-bit kernels for)."""
    assert emulation.cpu_environment(2) == {"QEMU_CPU": "neoverse-n1"}
    assert emulation.cpu_identity_note(2)["qemu_cpu"] == "neoverse-n1"


def plan_of(tag: str, image_architecture: str) -> Plan:
    return Plan(GRACE[tag], "image", "sha256:1", parse_gpus("none"), "64m", 60, image_architecture=image_architecture)


def test_the_plan_for_this_engine_decides_from_the_image_and_the_engine_and_the_report_says_so():
    access = engine.GpuAccess("", "no GPUs")
    x86_engine, arm_engine = {"Architecture": "x86_64", "NCPU": 2}, {"Architecture": "aarch64", "NCPU": 72}
    emulated = for_this_engine(plan_of(ARM, "arm64"), access, x86_engine, False)
    assert emulated.standin_cpus == 2 and emulated.gpu_path == "runtime"
    assert for_this_engine(plan_of(ARM, "arm64"), access, arm_engine, False).standin_cpus == 0
    assert for_this_engine(plan_of(X86, "amd64"), access, x86_engine, False).standin_cpus == 0
    result = VerifyResult(ARM, "image", "sha256:1", True, {}, FIXTURE_PROJECT)
    recorded = verify_report(result, emulated, datetime.now(timezone.utc)).run["cpu_identity"]
    assert recorded["cpu_identity"] == "stand-in" and recorded["midr_el1"] == emulation.STANDIN_MIDR_EL1
    assert "emulation" in recorded["why"]
    standin_note = emulation.cpu_identity_note(emulated.standin_cpus)["why"]
    summary = summary_markdown([dataclasses.replace(result, checks=PASSED, cpu_standin=standin_note)])
    assert f"## `{ARM}`" in summary and "**CPU identity** was a stand-in: an arm64 image under emulation" in summary
    native = verify_report(result, for_this_engine(plan_of(ARM, "arm64"), access, arm_engine, False), datetime.now(timezone.utc))
    assert native.run["cpu_identity"] == {"cpu_identity": "the engine's own CPUs"}


X86_ENGINE, ARM_ENGINE = {"Architecture": "x86_64", "NCPU": 2}, {"Architecture": "aarch64", "NCPU": 72}
NO_GPUS = engine.GpuAccess("", "no GPUs")


@pytest.mark.parametrize("tag, image_architecture, engine_info", [
    (ARM, "arm64", ARM_ENGINE), (X86, "amd64", X86_ENGINE), (ARM, "arm64", {}),
])
def test_natively_every_bound_is_as_it_was(tag, image_architecture, engine_info):
    native = for_this_engine(plan_of(tag, image_architecture), NO_GPUS, engine_info, False)
    assert (native.slowdown, native.timeout) == (1, 60)
    assert emulation.slowdown(native.standin_cpus) == 1
    assert probe_arguments(native.spec, native.timeout, native.slowdown, CheckSelection()) == ["--budget-s", "60", "--slowdown", "1"]


def test_under_emulation_every_bound_is_multiplied_by_the_measured_slowdown():
    emulated = for_this_engine(plan_of(ARM, "arm64"), NO_GPUS, X86_ENGINE, False)
    assert emulation.SLOWDOWN == 10  # docs/benchmarks-log.md: import torch 40 s under qemu against 4 s natively
    assert (emulated.slowdown, emulated.timeout) == (emulation.SLOWDOWN, 60 * emulation.SLOWDOWN)
    # The probe's kill budget is the scaled timeout, and its own bounds get the factor.
    assert probe_arguments(emulated.spec, emulated.timeout, emulated.slowdown, CheckSelection()) == [
        "--budget-s", "600", "--slowdown", "10"]


def test_a_timeout_the_user_gave_is_kept_under_emulation_and_the_other_bounds_still_scale():
    given = for_this_engine(plan_of(ARM, "arm64"), NO_GPUS, X86_ENGINE, True)
    assert (given.timeout, given.slowdown) == (60, emulation.SLOWDOWN)


def test_the_default_timeout_is_scaled_and_an_explicit_one_kept_from_the_options(tmp_path):
    """verify_images's own path: plan_all decides the row's timeout, for_this_engine scales it unless --timeout."""
    client = FakeImages({"image": {"Id": "sha256:1", "Architecture": "arm64", "Size": 1, "Config": {"Labels": {}}}})
    for timeout, expected in ((None, RUNTIME_TIMEOUT_S * emulation.SLOWDOWN), (42, 42)):
        options = VerifyOptions(tmp_path, gpus="none", image="image", timeout=timeout)
        [plan] = plan_all(client, [GRACE[ARM]], options, Progress())
        assert for_this_engine(plan, NO_GPUS, X86_ENGINE, options.timeout is not None).timeout == expected


class FakeImages:
    """An engine's image inspection alone: what planning asks of it."""

    def __init__(self, images: dict[str, dict]):
        self.api = self
        self.images = images

    def inspect_image(self, image: str) -> dict:
        return self.images[image]


def test_the_probe_multiplies_its_own_bounds_by_its_slowdown(monkeypatch):
    assert probe.parse_arguments([]).slowdown == 1 and probe_base.bound(probe_base.DATALOADER_TIMEOUT_S) == 90
    assert probe.parse_arguments(["--slowdown", "10"]).slowdown == 10
    monkeypatch.setattr(probe_base, "SLOWDOWN", 10)
    assert probe_base.bound(probe_base.DATALOADER_TIMEOUT_S) == 900
    assert probe_base.compile_timeout(None) == 10 * probe_base.SMOKE_COMPILE_TIMEOUT_S
    assert probe_base.compile_timeout(3000) <= 3000 - 10 * probe_base.BUDGET_MARGIN_S


def test_the_report_and_the_output_say_the_bounds_were_scaled():
    note = emulation.cpu_identity_note(2)
    assert note["slowdown"] == emulation.SLOWDOWN and "multiplied by 10" in note["why"]
    assert "slowdown" not in emulation.cpu_identity_note(0)
    result = VerifyResult(ARM, "image", "sha256:1", True, PASSED, FIXTURE_PROJECT, cpu_standin=note["why"])
    assert checks_table(result).caption == note["why"]
    assert checks_table(dataclasses.replace(result, cpu_standin="")).caption is None


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
    plan = for_this_engine(plan, engine.GpuAccess("", "no GPUs"), info, False)
    assert plan.standin_cpus == info["NCPU"]
    lines = run_in_verifier_container(docker_client, plan, str(tmp_path),
                                      f"uname -m; cat {MIDR_PATH} {emulation.CPU_SYSFS}/online; {HWCAP}; "
                                      f"{{ echo x > {MIDR_PATH}; }} 2>/dev/null || echo read-only")
    assert lines[:3] == ["aarch64", emulation.STANDIN_MIDR_EL1, emulation.standin_files(plan.standin_cpus)["online"][:-1]]
    assert not int(lines[3], 16) & HWCAP_SVE, f"qemu emulates a Neoverse N1, which has no SVE: AT_HWCAP {lines[3]}"
    assert "read-only" in lines, lines
    assert (tmp_path / ARM / emulation.STANDIN_FOLDER / "online").is_file(), "under the reports folder it was given"
    # Without it (what the verifier did before), the file oneDNN reads is not there: the stand-in is what supplies it.
    without = run_in_verifier_container(docker_client, dataclasses.replace(plan, standin_cpus=0), str(tmp_path),
                                        f"cat {MIDR_PATH} 2>/dev/null || echo missing; {HWCAP}")
    assert without[0] == "missing", without
    assert int(without[1], 16) & HWCAP_SVE, f"qemu's default CPU shows SVE: AT_HWCAP {without[1]}"


def run_in_verifier_container(docker_client, plan: Plan, reports: str, script: str) -> list[str]:
    name = container_name(plan.spec)
    try:
        container = create_container(docker_client, plan, name, reports)
        container.start()
        _, output = container.exec_run(["sh", "-c", script], stderr=False)
    finally:
        remove_container(docker_client, name)
    return output.decode().split("\n")
