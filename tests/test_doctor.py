"""`build.py doctor`: what this host can do with the rows, said before a long build or a 6 GB pull."""
import dataclasses
import json
import os
import stat

import pytest

from torchimages.build import doctor as doctor_module
from torchimages.build.doctor import (
    Finding,
    HostGpu,
    arch_findings,
    compute_mode_finding,
    disk_finding,
    emulated_machines,
    gzip_finding,
    mig_finding,
    parse_nvidia_smi,
    row_findings,
)
from torchimages.matrix.load import load_matrix

from .conftest import FIXTURE_MATRIX, FIXTURE_PROJECT, run_cli

SPECS = load_matrix(FIXTURE_MATRIX).specs
BY_TAG = {spec.tag: spec for spec in SPECS}
CU130, CU132, CU126 = "2.14.1-cuda13.0-cudnn9-runtime", "2.15.0-cuda13.2-cudnn9-runtime", "2.14.1-cuda12.6-cudnn9-runtime"
H100 = HostGpu("NVIDIA H100 80GB HBM3", (9, 0), "580.95.05")
P100 = HostGpu("Tesla P100-PCIE-16GB", (6, 0), "580.95.05")


# doctor probes the rows' indexes: in tests, a loopback port nothing listens on (refused at once), never a public host.
NO_PUBLIC_INDEX = ("--pip-index-url", "http://127.0.0.1:9/simple/", "--extra-index-url", "http://127.0.0.1:9/simple/")


def statuses(findings: list[Finding]) -> list[str]:
    return [finding.status for finding in findings]


def doctor(*selectors: str, env: dict) -> tuple[int, dict[str, list[Finding]]]:
    """`build.py doctor --format json` on the fixture project's rows: its exit code, and its findings by subject."""
    result = run_cli("--project", str(FIXTURE_PROJECT), "doctor", *selectors, *NO_PUBLIC_INDEX, "--format", "json",
                     env=env)
    assert "Traceback" not in result.stderr, result.stderr
    found: dict[str, list[Finding]] = {}
    for finding in json.loads(result.stdout):
        found.setdefault(finding["subject"], []).append(Finding(**finding))
    return result.returncode, found


def test_nvidia_smi_lines_become_gpus_and_other_lines_are_left_out():
    output = "NVIDIA H100 80GB HBM3, 9.0, 580.95.05\nNVIDIA GeForce RTX 5090, 12.0, 580.95.05\n[N/A]\n\n"
    assert parse_nvidia_smi(output) == [H100, HostGpu("NVIDIA GeForce RTX 5090", (12, 0), "580.95.05")]


def test_a_row_fits_a_gpu_its_driver_and_arch_list_cover():
    assert statuses(row_findings(BY_TAG[CU130], [H100], SPECS)) == ["ok"]


def test_a_driver_below_the_cuda_majors_floor_fails_naming_the_rows_that_fit():
    # CUDA 13.x needs >= 580 even in minor-version compatibility (NVIDIA "CUDA Compatibility"); 12.x runs on >= 525.
    [finding] = row_findings(BY_TAG[CU130], [HostGpu(H100.name, (9, 0), "535.261.03")], SPECS)
    assert finding.status == "fail" and "535.261.03 is older than any CUDA 13.x runs on (580" in finding.detail
    assert CU126 in finding.detail.split("older CUDA")[1] and CU132 not in finding.detail.split("older CUDA")[1]


def test_a_driver_between_the_floor_and_the_releases_own_is_a_warning_naming_what_will_not_work():
    # The cu132 rows on an R580 host (the LTS branch): cubins run, PTX JIT of 13.2 PTX does not (audit finding 2).
    [finding] = row_findings(BY_TAG[CU132], [H100], SPECS)
    assert finding.status == "warn" and "older than CUDA 13.2's own (595.45.04" in finding.detail
    assert "PTX newer than the driver cannot be JIT-compiled" in finding.detail


def test_a_gpu_the_arch_list_misses_fails_naming_the_rows_that_cover_it():
    [finding] = row_findings(BY_TAG[CU130], [P100], SPECS)
    assert finding.status == "fail" and "no kernels for the Tesla P100-PCIE-16GB (sm_60)" in finding.detail
    assert "no kernel image is available" in finding.detail and f"rows that cover sm_60: {CU126}" in finding.detail


def test_cpu_rows_and_gpu_less_hosts_give_no_row_findings():
    assert row_findings(BY_TAG["2.13.0-cpu-runtime"], [H100], SPECS) == []
    assert row_findings(BY_TAG[CU130], [], SPECS) == []


def test_rows_for_another_cpu_architecture_fail_naming_the_rows_for_this_one():
    # A GH200 or GB200 host is aarch64 (uname -m; Docker says arm64): an x86_64 image fails there at exec.
    [finding] = arch_findings([BY_TAG[CU130]], "arm64")
    assert finding.status == "fail" and finding.subject == CU130
    assert "built for x86_64, but this host is aarch64" in finding.detail
    assert "none in the matrix (add a variant with arch: aarch64)" in finding.detail
    arm_row = dataclasses.replace(BY_TAG[CU130], tag="2.14.1-cuda13.0-cudnn9-runtime-arm64", arch="aarch64")
    [finding] = arch_findings([BY_TAG[CU130], arm_row], "aarch64")
    assert finding.subject == CU130 and finding.detail.endswith(f"rows for aarch64: {arm_row.tag}")


def test_docker_and_uname_names_of_one_architecture_are_the_same_host():
    assert arch_findings(SPECS, "amd64") == [] and arch_findings(SPECS, "x86_64") == []
    arm_row = dataclasses.replace(BY_TAG[CU130], arch="aarch64")
    assert arch_findings([arm_row], "arm64") == [] and arch_findings([arm_row], "aarch64") == []


def test_disk_findings_weigh_the_rows_not_built_yet_by_their_size_budgets():
    rows = [BY_TAG[CU130], BY_TAG[CU132]]
    assert disk_finding(10 * 2**40, rows).status == "ok"
    low = disk_finding(2**30, rows)
    assert low.status == "warn" and "1.0 GiB free" in low.detail and "docker image prune" in low.detail
    assert disk_finding(2**30, []).status == "ok"


def test_without_an_engine_doctor_fails_saying_how_to_start_one(tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    code, found = doctor("2.13.0-cpu-*", env=env)
    [engine] = found["engine"]
    assert code == 1 and engine.status == "fail"
    assert "no Docker engine answers" in engine.detail and "make engine" in engine.detail
    assert "host gpus" not in found  # CPU rows: the GPUs are not asked about
    table = run_cli("--project", str(FIXTURE_PROJECT), "doctor", "2.13.0-cpu-*", *NO_PUBLIC_INDEX, env=env)
    assert table.returncode == 1 and "no Docker engine answers" in table.stdout


def with_nvidia_smi(tmp_path, script: str) -> dict:
    """This host has no GPU: an nvidia-smi that answers as a GPU host's does stands in for the driver, so that the
    command's wiring (query, parse, verdict per row, exit code) is seen end to end."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}


def test_on_a_gpu_host_doctor_names_the_rows_this_driver_cannot_run(tmp_path):
    env = with_nvidia_smi(tmp_path, "echo 'NVIDIA H100 80GB HBM3, 9.0, 580.95.05'")
    code, found = doctor("2.1[45]*-runtime", env=env)
    assert found["host gpus"] == [Finding("host gpus", "ok", "NVIDIA H100 80GB HBM3 (sm_90), driver 580.95.05")]
    assert statuses(found[CU130]) == ["ok"] and statuses(found[CU126]) == ["ok"]
    [older_than_its_own] = found[CU132]
    assert older_than_its_own.status == "warn" and "older than CUDA 13.2's own (595.45.04" in older_than_its_own.detail
    env = with_nvidia_smi(tmp_path / "r575", "echo 'NVIDIA H100 80GB HBM3, 9.0, 575.57.08'")
    code, found = doctor("2.1[45]*-runtime", env=env)
    assert code == 1 and statuses(found[CU130]) == ["fail"] and statuses(found[CU126]) == ["ok"]


def test_an_nvidia_smi_that_fails_is_reported_with_what_it_said(tmp_path):
    env = with_nvidia_smi(tmp_path, "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                    "driver\" >&2; exit 9")
    code, found = doctor(CU130, env=env)
    [gpus] = found["host gpus"]
    assert code == 1 and gpus.status == "fail" and "couldn't communicate with the NVIDIA driver" in gpus.detail


@pytest.mark.usefixtures("engine_env")
def test_on_the_engine_doctor_reports_the_engine_its_gpu_runtime_and_disk():
    code, found = doctor(env=dict(os.environ))
    [engine] = found["engine"]
    assert engine.status == "ok" and engine.detail.startswith("Docker ")
    assert statuses(found["gpu runtime"]) in (["ok"], ["warn"]) and "free" in found["disk"][0].detail
    # `make engine` installs pigz: the engine the tests pull from follows doctor's advice.
    assert statuses(found["gzip layers"]) == ["ok"] and "unpigz" in found["gzip layers"][0].detail
    assert code == (1 if any(f.status == "fail" for findings in found.values() for f in findings) else 0)


def test_an_engine_without_unpigz_is_warned_with_the_measured_pull_time_and_the_fix():
    # moby pkg/archive: gzip layers go through unpigz when dockerd finds it on its PATH, else through Go's gzip.
    finding = gzip_finding(None)
    assert finding.status == "warn" and "Go's gzip" in finding.detail and "apt-get install pigz" in finding.detail
    assert "59.4 s with Go's gzip and 52.1 s with unpigz" in finding.detail
    assert gzip_finding("/usr/bin/unpigz").status == "ok"


def test_a_gpu_only_ptx_covers_fails_where_the_driver_cannot_jit_that_ptx():
    """Below the release's own driver (minor-version compatibility) PTX newer than the driver does not JIT-compile
    (NVIDIA CUDA Compatibility): a row whose only coverage of the GPU is PTX runs nothing there."""
    ptx_row = dataclasses.replace(BY_TAG[CU132], tag="cu132-ptx-variant", arch_list=("7.5", "8.0", "8.6", "9.0+PTX"))
    b200 = HostGpu("NVIDIA B200", (10, 0), "580.95.05")
    findings = row_findings(ptx_row, [b200], SPECS)
    assert "fail" in statuses(findings)
    assert any("covered only by PTX compute_90" in f.detail and "cannot JIT-compile" in f.detail for f in findings)
    # At or above the release's own driver the same PTX is JIT-compiled: a working row.
    assert statuses(row_findings(ptx_row, [HostGpu("NVIDIA B200", (10, 0), "595.45.04")], SPECS)) == ["ok"]


def test_an_aarch64_host_judges_the_arm64_rows_by_their_own_arch_list():
    """A stand-in aarch64 host: the Grace rows' -arm64 images fit, the amd64-only ones fail on the arch rule, and the
    GPU rule reads each row's own list (PyPI's aarch64 wheels: no sm_75, so a T4G on Graviton is not covered, though
    the x86_64 row's list has sm_75; sm_110 Thor only by the aarch64 list)."""
    grace = load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs
    rows = SPECS + [spec for spec in grace if spec.arch == "aarch64"]
    failing = {finding.subject for finding in arch_findings(rows, "aarch64")}
    assert failing == {spec.tag for spec in SPECS}, "every amd64-only row, and only those"
    arm = {spec.tag: spec for spec in grace}["2.14.1-cuda13.0-cudnn9-runtime-arm64"]
    gh200 = HostGpu("NVIDIA GH200 480GB", (9, 0), "580.95.05")
    assert statuses(row_findings(arm, [gh200], rows)) == ["ok"]
    [finding] = row_findings(arm, [HostGpu("NVIDIA T4G", (7, 5), "580.95.05")], rows)
    assert finding.status == "fail" and "(8.0;9.0;10.0;11.0;12.0) has no kernels for the NVIDIA T4G (sm_75)" in (
        finding.detail)
    assert finding.detail.endswith("rows that cover sm_75: none in the matrix"), "x86_64 rows are no answer here"
    thor = HostGpu("NVIDIA Jetson AGX Thor", (11, 0), "580.95.05")
    assert statuses(row_findings(arm, [thor], rows)) == ["ok"]
    assert statuses(row_findings(BY_TAG[CU130], [thor], SPECS)) == ["fail"]


def test_an_x86_64_host_with_qemu_registered_warns_that_arm64_rows_run_emulated(tmp_path):
    """After `make engine` on x86_64 (qemu-aarch64 in binfmt_misc), the arm64 rows build and run here, slowly, and
    their GPU checks wait for a Grace host: a warning, not the failure an unregistered host gives."""
    arm = [spec for spec in load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs if spec.arch == "aarch64"]
    binfmt = tmp_path / "binfmt_misc"
    binfmt.mkdir()
    (binfmt / "register").write_text("")
    assert emulated_machines(binfmt) == frozenset()
    (binfmt / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POF\n")
    (binfmt / "qemu-riscv64").write_text("disabled\n")
    assert emulated_machines(binfmt) == frozenset({"aarch64"})
    assert statuses(arch_findings(arm, "x86_64", emulated_machines(binfmt))) == ["warn"] * len(arm)
    assert "under qemu (binfmt_misc), slowly; its GPU checks need an aarch64 GPU host" in arch_findings(
        arm, "x86_64", frozenset({"aarch64"}))[0].detail
    assert statuses(arch_findings(arm, "x86_64")) == ["fail"] * len(arm)


@pytest.mark.parametrize("line", [
    "NVIDIA H100 80GB HBM3, 9.0, 580.95.05, [Not Supported], [Not Supported]",
    "NVIDIA H100 80GB HBM3, 9.0, 580.95.05, [N/A], [N/A]",
    "NVIDIA H100 80GB HBM3, 9.0, 580.95.05, Default\x1b[31m, Enabled?",  # garbage: not reported, not a crash
    "NVIDIA H100 80GB HBM3, 9.0, 580.95.05",  # a driver asked without the mode fields
])
def test_modes_that_are_not_reported_or_garbage_keep_the_gpu_and_limit_nothing(line):
    [gpu] = parse_nvidia_smi(line + "\n")
    assert (gpu.name, gpu.capability, gpu.compute_mode, gpu.mig_mode) == (H100.name, (9, 0), "[N/A]", "[N/A]")
    assert compute_mode_finding([gpu]) is None and mig_finding([gpu], {}) is None


def test_a_gpu_in_mig_mode_without_a_mig_device_is_a_host_warning_with_the_fix():
    mig_on = dataclasses.replace(H100, compute_mode="Default", mig_mode="Enabled")
    finding = mig_finding([H100, mig_on], {})
    assert finding and finding.status == "warn" and "GPU 1 (NVIDIA H100 80GB HBM3) in MIG mode" in finding.detail
    assert "`nvidia-smi mig -i 1 -cgi <profile> -C`" in finding.detail and "MIG-<uuid>" in finding.detail
    assert mig_finding([mig_on], {"0": ["MIG 3g.40gb Device 0: (UUID: MIG-a)"]}) is None
    assert mig_finding([mig_on], None) is None  # `nvidia-smi -L` not read: doctor does not guess


def test_a_driver_that_does_not_know_the_mig_field_is_asked_again_without_it(tmp_path):
    env = with_nvidia_smi(tmp_path, 'case "$1" in *mig.mode*) echo \'Field "mig.mode.current" is not a valid field '
                                    'to query.\'; exit 2;; esac\necho "NVIDIA H100 80GB HBM3, 9.0, 580.95.05"')
    code, found = doctor(CU130, env=env)
    assert statuses(found["host gpus"]) == ["ok"] and statuses(found[CU130]) == ["ok"]


def test_an_nvidia_smi_listing_that_hangs_is_stopped_and_blames_nothing(tmp_path, monkeypatch):
    fake = with_nvidia_smi(tmp_path, 'case "$1" in -L) exec sleep 60;; esac\n'
                                     'echo "NVIDIA H100 80GB HBM3, 9.0, 580.95.05, Default, Enabled"')
    monkeypatch.setenv("PATH", fake["PATH"])
    monkeypatch.setattr(doctor_module, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    findings = doctor_module.gpu_findings([BY_TAG[CU130]])
    assert statuses(findings) == ["ok", "ok"]  # the host's GPUs and the row; the MIG listing unread, nothing guessed


# `nvidia-ctk cdi generate` names the driver's libraries by version (NVIDIA Container Toolkit, CDI support).
CDI_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: all
containerEdits:
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{driver}
  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{driver}
  - hostPath: /usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.{driver}
"""


def test_a_cdi_spec_made_before_a_driver_upgrade_is_a_warning_to_regenerate_it(tmp_path, monkeypatch):
    """gpu-audit-3 C3: the spec still names 580.65.06's files after an upgrade to 580.95.05."""
    (tmp_path / "nvidia.yaml").write_text(CDI_SPEC.format(driver="580.65.06"))
    fake = with_nvidia_smi(tmp_path / "smi", 'echo "NVIDIA H100 80GB HBM3, 9.0, 580.95.05, Default, Disabled"')
    monkeypatch.setenv("PATH", fake["PATH"])
    monkeypatch.setattr(doctor_module.engine, "CDI_DEFAULT_DIRS", (str(tmp_path),))
    [stale] = [f for f in doctor_module.gpu_findings([BY_TAG[CU130]]) if f.subject == "cdi spec"]
    assert stale.status == "warn" and f"{tmp_path}/nvidia.yaml names driver 580.65.06" in stale.detail
    assert "host driver is 580.95.05" in stale.detail and "nvidia-ctk cdi generate" in stale.detail
    (tmp_path / "nvidia.yaml").write_text(CDI_SPEC.format(driver="580.95.05"))
    assert [f for f in doctor_module.gpu_findings([BY_TAG[CU130]]) if f.subject == "cdi spec"] == []
