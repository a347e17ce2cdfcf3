"""Issue 44 items 2 and 3: the host GPUs' health read before the checks and charged to the host, and the speed floors
judged per GPU model; what verify.json, the summary, the signed report, the catalog and gpu-record's line carry.

The lane hosts (tests/gpu_hosts/h100-row-remap-pending, h100-hw-slowdown, h100-pcie-degraded) say where each value
comes from; the bad inputs are nvidia-smi's own ways of not answering ("[N/A]", "[Not Supported]", a field an older
driver rejects) and values no link has (a PCIe gen of 99)."""
import copy
import types
from pathlib import Path

import pytest

from torchimages.checks import gpu_health, gpu_speed, probe_gpu
from torchimages.checks.rules import arch_flags_for
from torchimages.trust import attestations
from torchimages.trust.attestations import verified_on
from torchimages.verify import CHECKS, record
from torchimages.verify.plan import VerifyResult
from torchimages.verify.reports import CheckVerdict, VerifyReport, judged_host, summary_markdown

from . import gpu_hosts
from .gpu_fixtures import BY_TAG, gather_gpu_facts, judge

CU130 = "2.14.1-cuda13.0-cudnn9-runtime"
SICK_HOSTS = {"h100-row-remap-pending": "remapped_rows.pending", "h100-hw-slowdown": "clocks_event_reasons.active",
              "h100-pcie-degraded": "pcie.link.width.current"}
GPU_CHECKS = ("gpu", "driver", "cudnn", "amp", "multi-gpu")


def gathered(scenario: dict, tmp_path: Path, monkeypatch, row: str = CU130) -> tuple[dict, dict]:
    """The probe's GPU facts on this host (its stand-in nvidia-smi first on PATH) and the suite's verdicts."""
    for name, value in gpu_hosts.stand_in_nvidia_smi(scenario, tmp_path / "bin").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(probe_gpu, "NVIDIA_DRIVER_PROC", gpu_hosts.proc_driver_version(scenario, tmp_path / "proc"))
    monkeypatch.setattr(probe_gpu, "libcuda_driver_version", lambda: scenario["libcuda"]["driver_version"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec, flags = BY_TAG[row], arch_flags_for(list(BY_TAG[row].arch_list))
    gpu = gather_gpu_facts(scenario, spec, flags)
    return gpu, judge(spec, {"gpus": "all"}, gpu, flags)


def with_health(scenario: dict, **fields: str) -> dict:
    changed = copy.deepcopy(scenario)
    for gpu in changed["nvidia_smi"]["gpus"]:
        gpu["health"] = {**gpu.get("health", {}), **fields}
    return changed


# ------------------------------------------------------------------ a sick host fails nothing of the image

@pytest.mark.parametrize("host", sorted(SICK_HOSTS), indirect=True)
def test_a_sick_host_fails_nothing_of_the_image_and_the_gpu_check_says_host(host, tmp_path, monkeypatch):
    gpu, checks = gathered(host, tmp_path, monkeypatch)
    assert not [name for name in GPU_CHECKS if checks[name]["status"] == "failed"]
    assert checks["gpu"]["blame"] == "host" and "host: GPU 0" in checks["gpu"]["message"]
    health = gpu_health.host_health(gpu)
    assert health["healthy"] is False and [finding["field"] for finding in health["findings"]] == [SICK_HOSTS[host["name"]]]


@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_a_healthy_host_is_said_healthy_and_blames_nothing(host, tmp_path, monkeypatch):
    healthy = next(gpu for gpu in gpu_hosts.load("h100-hw-slowdown")["nvidia_smi"]["gpus"])["health"]
    gpu, checks = gathered(with_health(host, **{**healthy, "clocks_event_reasons.active": "0x0000000000000001"}),
                           tmp_path, monkeypatch)
    assert gpu_health.host_health(gpu)["healthy"] is True
    assert checks["gpu"]["status"] == "passed" and checks["gpu"]["blame"] == "" and not checks["gpu"]["warnings"]


# ------------------------------------------------------------------ below a floor: the host where health explains it

@pytest.mark.parametrize("host", ["h100-row-remap-pending"], indirect=True)
def test_a_slow_matmul_on_a_host_whose_health_explains_nothing_fails_the_image(host, tmp_path, monkeypatch):
    scenario = with_health(host, **{"remapped_rows.pending": "No"})
    scenario["speed"] = {"bf16_tflops": 402.5}
    _, checks = gathered(scenario, tmp_path, monkeypatch)
    assert checks["gpu"]["status"] == "failed" and checks["gpu"]["blame"] == "image"
    assert "41% of NVIDIA H100 80GB HBM3's 989.4 dense peak" in checks["gpu"]["message"]
    assert "health explains none of it" in checks["gpu"]["message"]


@pytest.mark.parametrize(("busbw", "slowdown", "status"), [
    (400.0, "0x0000000000000001", "passed"), (40.0, "0x0000000000000001", "failed"), (40.0, "0x0000000000000041", "passed"),
])
@pytest.mark.parametrize("host", ["h100x8-nvlink"], indirect=True)
def test_the_all_reduce_bus_bandwidth_is_judged_against_the_nvswitch_floor(host, busbw, slowdown, status, tmp_path,
                                                                          monkeypatch):
    scenario = with_health(host, **{"clocks_event_reasons.active": slowdown})
    scenario["speed"] = {"busbw_gbps": busbw}
    gpu, checks = gathered(scenario, tmp_path, monkeypatch)
    assert checks["multi-gpu"]["status"] == status, checks["multi-gpu"]["message"]
    assert (checks["multi-gpu"]["blame"] == "host") == (status == "passed" and busbw < 100)
    assert gpu_speed.all_reduce_figure(gpu, gpu_health.host_health(gpu))["topology"] == "nvlink"


def test_the_bus_bandwidth_is_nccl_tests_formula(monkeypatch):
    """busbw = algbw * 2(n-1)/n (NVIDIA/nccl-tests doc/PERFORMANCE.md): 8 GPUs at an algbw of 100 GB/s are 175."""
    monkeypatch.setattr(gpu_speed, "_gbps", lambda *args: 100.0)

    class Torch:
        @staticmethod
        def ones(*args, **kwargs):
            return None

    figure = gpu_speed.all_reduce_bus_bandwidth(Torch, 8)
    assert figure["algbw_gbps"] == 100.0 and figure["busbw_gbps"] == 175.0


@pytest.mark.parametrize(("gen", "width", "gbps"), [(5, 16, 63.01), (4, 16, 31.5), (3, 8, 7.88), (1, 4, 1.0)])
def test_the_links_rate_is_its_generation_times_its_lanes(gen, width, gbps):
    health = {"gpus": [{"uuid": "GPU-1", "pcie": {"gen_max": gen, "width_max": width}}]}
    assert gpu_speed.link_of({"devices": [{"uuid": "1"}]}, health)["gbps"] == gbps


# ------------------------------------------------------------------ a sick host's failed kernels

ECC_ERROR = "CUDA error: uncorrectable ECC error encountered"


@pytest.mark.parametrize(("check", "failure", "errors", "blame"), [
    ("gpu", {"kernel_ok": False, "kernel_error": ECC_ERROR}, "3", "host"),
    ("gpu", {"kernel_ok": False, "kernel_error": ECC_ERROR}, "0", "image"),  # no memory error: the image's
    # no host makes a cubin: the arch list misses the GPU, whatever its memory
    ("gpu", {"kernel_ok": False, "kernel_error": gpu_hosts.NO_KERNEL_IMAGE}, "3", "image"),
    ("amp", {"amp_fp16": {"ok": False, "error": ECC_ERROR}}, "3", "host"),
    ("cudnn", {"cudnn": {"ok": False, "max_abs_error": 1e9, "grad_relative_errors": {}, "grads_ok": False}}, "3",
     "host"),
])
@pytest.mark.parametrize("host", ["h100-r580-real"], indirect=True)
def test_gpu_work_that_fails_on_a_gpu_with_memory_errors_is_charged_to_the_host(host, check, failure, errors, blame,
                                                                              tmp_path, monkeypatch):
    scenario = with_health(host, **{"ecc.errors.uncorrected.volatile.total": errors})
    gpu, _ = gathered(scenario, tmp_path, monkeypatch)
    (gpu["devices"][0] if check == "gpu" else gpu).update(failure)
    spec = BY_TAG[CU130]
    checks = judge(spec, {"gpus": "all"}, gpu, arch_flags_for(list(spec.arch_list)))
    assert checks[check]["blame"] == blame and (checks[check]["status"] == "failed") == (blame == "image")
    assert ("3 uncorrected ECC error(s)" in checks[check]["message"]) == (blame == "host"), checks[check]["message"]
    # Charged to the host, the failed work is not judged (skipped with the reason), never counted as a pass.
    assert ("not judged on a GPU with memory errors" in checks[check]["message"]) == (blame == "host")


# ------------------------------------------------------------------ what nvidia-smi may answer instead

ODD_VALUES = ("[N/A]", "[Not Supported]", "", "abc", "-1", "99", "0xZZ", "1e9", "Unknown Error", "10000000000000000")


@pytest.mark.parametrize("value", ODD_VALUES)
def test_an_odd_value_in_any_health_field_neither_crashes_nor_blames_the_image(value):
    row = {field: value for field in gpu_health.HEALTH_FIELDS}
    health = gpu_health.gpu_health(row)
    assert [finding for finding in gpu_health.gpu_findings(0, health) if finding.kind != "memory"] == []
    assert health["pcie"] == {"gen_current": None, "gen_max": None, "width_current": None, "width_max": None}
    report = gpu_speed.host_report({"health": {"rows": [row]}, "devices": [{"name": "NVIDIA H100 80GB HBM3"}],
                                    "copy_bandwidth": {"h2d_gbps": 0.1, "d2h_gbps": 0.1}})
    assert "image" not in [figure["verdict"] for figure in report["performance"].values()]


@pytest.mark.parametrize("figure", ["fast", True, -3.0, 0, float("inf"), float("nan"), None, [1]])
def test_a_figure_that_is_no_measurement_is_not_judged(figure):
    gpu = {"devices": [{"name": "NVIDIA H100 80GB HBM3"}], "bf16_matmul": {"tflops": figure}}
    assert gpu_speed.host_report(gpu)["performance"]["bf16_matmul"]["verdict"] == "not judged"


def test_a_missing_or_malformed_health_part_is_unknown_not_healthy():
    for gpu in ({}, {"health": None}, {"health": {"rows": "x"}}, {"health": {"rows": [None, 3]}}, None):
        assert gpu_health.host_health(gpu)["healthy"] is None


@pytest.mark.parametrize("host", ["h100-row-remap-pending"], indirect=True)
def test_fields_an_older_driver_rejects_are_read_one_by_one_and_named(host, tmp_path, monkeypatch):
    scenario = copy.deepcopy(host)
    scenario["nvidia_smi"]["invalid_fields"] = ["clocks_event_reasons.active", "remapped_rows.failure"]
    scenario["nvidia_smi"]["gpus"][0]["health"]["clocks_throttle_reasons.active"] = "0x0000000000000009"
    gpu, checks = gathered(scenario, tmp_path, monkeypatch)
    assert gpu["health"]["unreadable"] == ["remapped_rows.failure"]  # the older name answered for the clocks
    assert gpu_health.host_health(gpu)["gpus"][0]["slowdowns"] == ["HW slowdown"]
    assert checks["gpu"]["blame"] == "host" and checks["gpu"]["status"] == "passed"


def test_a_hung_health_query_is_bounded_and_not_repeated():
    calls = []

    def hanging(command, timeout):
        calls.append(timeout)
        return {"ok": False, "error": f"TimeoutExpired: timed out after {timeout}s"}

    assert gpu_health.read_health("nvidia-smi", hanging)["rows"] == [] and calls == [gpu_health.HEALTH_QUERY_TIMEOUT_S]


def test_fields_asked_one_by_one_stop_at_the_budget(monkeypatch):
    """An older driver rejecting names: each field is asked alone, until HEALTH_BUDGET_S is spent (20 s: here each
    call is seen 7 s after the last, so the one call for every field and two more)."""
    calls = []

    def rejecting(command, timeout):
        calls.append(timeout)
        return {"ok": False, "returncode": 2, "output": 'Field "x" is not a valid field to query.'}

    clock = iter(range(0, 10**6, 7))
    monkeypatch.setattr(gpu_health, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    health = gpu_health.read_health("nvidia-smi", rejecting)
    assert health["rows"] == [] and health["unreadable"] == list(gpu_health.HEALTH_FIELDS[1:])
    assert calls == [gpu_health.HEALTH_QUERY_TIMEOUT_S] * 3


# ------------------------------------------------------------------ where the health and the figures go

@pytest.mark.parametrize("host", ["h100-pcie-degraded"], indirect=True)
def test_the_report_the_catalog_the_summary_and_the_record_line_carry_the_health_and_the_figures(host, tmp_path,
                                                                                                   monkeypatch):
    gpu, checks = gathered(host, tmp_path, monkeypatch)
    verdicts = {name: CheckVerdict(check["status"], check["message"], check["tests"], check["warnings"], check["blame"])
                for name, check in checks.items()}
    report = VerifyReport("sha256:" + "12" * 32, True, verdicts, tag=CU130, host=judged_host(checks, gpu))

    predicate = attestations.verification_predicate(BY_TAG[CU130], report.image_id, report)
    assert predicate["host"]["kind"] == "gpu" and predicate["host"]["health"]["healthy"] is False
    assert predicate["checks"]["gpu"]["blame"] == "host"
    assert predicate["host"]["performance"]["pinned_copies"]["verdict"] == "host"
    assert predicate["host"]["performance"]["bf16_matmul"] == {
        "tflops": 805.0, "device": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.4, "floor": 0.5, "ratio": 0.814,
        "verdict": "ok"}

    catalog = verified_on(report)
    assert catalog["healthy"] is False and catalog["performance"]["bf16_tflops"] == 805.0
    assert catalog["performance"]["h2d_gbps"] == 0.8

    every_check = {name: checks.get(name, {"status": "skipped", "message": "not judged here"}) for name in CHECKS}
    summary = summary_markdown([VerifyResult(CU130, "ref", report.image_id, True, every_check, Path("r"),
                                             host=report.host)])
    assert "charged to the host" in summary and "the PCIe link runs x4 of x16 at gen 1 of 5" in summary

    line = record.record("2026-11-27", BY_TAG[CU130], "lane", {"torch": {"version": "2.14.1+cu130"}, "gpu": gpu},
                         checks).line
    assert "; host: GPU 0 pcie.link.width.current |" in line
    assert "pinned copies 0.8/0.8 GB/s H2D/D2H of gen 5 x16's 63.01 (host)" in line


def test_the_probe_as_copied_into_a_container_finds_its_health_and_speed_modules(tmp_path):
    """copy_probe puts the modules beside the probe; run from there (no torchimages package), it imports them."""
    import io
    import subprocess
    import sys
    import tarfile

    from torchimages.verify import container

    class Container:
        def put_archive(self, folder, payload):
            tarfile.open(fileobj=io.BytesIO(payload)).extractall(tmp_path, filter="data")

    container.copy_probe(Container())
    script = tmp_path / Path(container.PROBE_PATH).name
    done = subprocess.run([sys.executable, "-I", str(script), "--part", "files"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0 and '"part": "files"' in done.stdout, done.stderr[-800:]


@pytest.mark.parametrize(("host", "status", "says"), [
    ("h100-row-remap-pending", "warn", "a row remapping is pending"),
    ("h100-pcie-degraded", "warn", "the PCIe link runs x4 of x16 at gen 1 of 5"),
    ("h100x8-nvlink", None, ""),  # no health fields recorded: doctor says nothing of health
], indirect=["host"])
def test_doctor_shows_the_host_findings_before_a_pull(host, status, says):
    from torchimages.build.doctor import gpu_findings

    found = [finding for finding in gpu_findings([BY_TAG[CU130]]) if finding.subject == "host gpu health"]
    assert [finding.status for finding in found] == ([status] if status else [])
    assert all(says in finding.detail for finding in found)


POLICIES_README = Path(__file__).resolve().parents[1] / "docs" / "policies" / "README.md"


@pytest.mark.parametrize(("host", "admitted"), [("h100-row-remap-pending", False), ("h100-r580-real", True)],
                         indirect=["host"])
def test_the_documented_healthy_host_conditions_judge_real_predicates(host, admitted, tmp_path, monkeypatch):
    """docs/policies/README.md's example, JMESPath as the ClusterPolicy evaluates it and CEL as the
    ImageValidatingPolicy does (tests/policy_eval.py), on the predicate of a sick and of a healthy H100."""
    import re

    import celpy
    import yaml

    from .policy_eval import _conditions_hold

    healthy = gpu_hosts.load("h100-hw-slowdown")["nvidia_smi"]["gpus"][0]["health"]
    scenario = host if not admitted else with_health(host, **{**healthy, "clocks_event_reasons.active": "0x1"})
    scenario["speed"] = {"bf16_tflops": 805.0}
    gpu, checks = gathered(scenario, tmp_path, monkeypatch)
    verdicts = {name: CheckVerdict(check["status"], check["message"], check["tests"], check["warnings"], check["blame"])
                for name, check in checks.items()}
    report = VerifyReport("sha256:" + "12" * 32, True, verdicts, tag=CU130, host=judged_host(checks, gpu))
    predicate = attestations.verification_predicate(BY_TAG[CU130], report.image_id, report)
    text = POLICIES_README.read_text()
    conditions = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    assert _conditions_hold([{"all": conditions}], predicate)[0] == admitted
    expression = re.search(r"```cel\n(.*?)```", text, re.S).group(1).strip()
    environment = celpy.Environment()
    result = environment.program(environment.compile(expression)).evaluate({"report": celpy.json_to_cel(predicate)})
    assert bool(result) == admitted


@pytest.mark.parametrize("host", ["h100-pcie-degraded"], indirect=True)
def test_a_records_lane_host_keeps_the_health_fields_and_the_speed_figures(host, tmp_path, monkeypatch):
    """gpu-record writes a real host as a lane host: replayed, the same findings and figures."""
    gpu, checks = gathered(host, tmp_path, monkeypatch)
    facts = {"torch": {"version": "2.14.1+cu130"}, "host": probe_gpu.record_host_facts(), "gpu": gpu}
    written = record.lane_host("2026-11-27", BY_TAG[CU130], "lane", facts, checks, "line")
    assert written["nvidia_smi"]["gpus"][0]["health"] == host["nvidia_smi"]["gpus"][0]["health"]
    assert written["speed"] == host["speed"]
