"""The GPU-simulation lane: the real probe, check suite and doctor on recorded real-hardware GPU hosts.

Each scenario in tests/gpu_hosts/ is a host as it really answers (its nvidia-smi, its torch.cuda, its CPU
architecture) and the verdict a real host gives, per check and per doctor row, with the source of each fact. The
probe's own functions gather the GPU facts under a stand-in nvidia-smi and the test environment's torch answering
as the host's torch.cuda does (tests/gpu_hosts/__init__.py); the real suite then judges them, as `build.py test`
does with a container's facts. No GPU and no engine are needed, so this runs in `make test-fast`."""
import pytest

from torchimages.build.doctor import arch_findings, gpu_findings
from torchimages.checks import probe_base, probe_gpu, probe_smoke, rules
from torchimages.checks.rules import arch_flags_for
from torchimages.checks.suite.helpers import driver_verdict, expected_device_count
from torchimages.verify.plan import parse_gpus

from . import gpu_hosts
from .gpu_fixtures import BY_TAG, gather_gpu_facts, judge

DOCTOR_ORDER = ("none", "ok", "warn", "fail")  # a subject's worst finding; "none": doctor says nothing about it
RUNS = [(name, index) for name in gpu_hosts.SCENARIOS for index, _ in enumerate(gpu_hosts.load(name)["runs"])]


def verdict_of(check: dict) -> str:
    return "passed-with-warning" if check["status"] == "passed" and "warning:" in check["message"] else check["status"]


@pytest.mark.parametrize(("host", "run_index"), RUNS, indirect=["host"], ids=[f"{n}-{i}" for n, i in RUNS])
def test_every_check_gives_the_verdict_a_real_host_gives(host, run_index, tmp_path, monkeypatch):
    run = host["runs"][run_index]
    host = gpu_hosts.as_run(host, run)
    for name, value in gpu_hosts.stand_in_nvidia_smi(host, tmp_path / "run-bin").items():
        monkeypatch.setenv(name, value)
    gpu_hosts.cuda_visible_devices(run, monkeypatch)
    spec = BY_TAG[run["row"]]
    flags = run.get("arch_flags") or arch_flags_for(list(spec.arch_list))
    gpu = gather_gpu_facts(host, spec, flags)
    checks = judge(spec, run, gpu, flags)
    got = {name: verdict_of(checks[name]) for name in run["expect"]}
    assert got == run["expect"], (f"{host['name']} with {spec.tag}: {run['why']}\n"
                                  + "\n".join(f"{name}: {checks[name]['message']}" for name in run["expect"]))
    # `says`: words the verdict must carry, where the cause is the point (the variable that hides a GPU, not the driver)
    unsaid = {name: checks[name]["message"] for name, words in run.get("says", {}).items()
              if words not in checks[name]["message"]}
    assert not unsaid, f"{host['name']}: {run['why']}\nexpected {run['says']}\ngot {unsaid}"


@pytest.mark.parametrize("host", [name for name in gpu_hosts.SCENARIOS if gpu_hosts.load(name)["expect_doctor"]],
                         indirect=True)
def test_doctor_gives_the_verdict_a_real_host_gives(host):
    """Per row, and per host subject ("host gpus") where named."""
    rows = [BY_TAG[tag] for tag in host["expect_doctor"] if tag in BY_TAG]
    findings = gpu_findings(rows) + arch_findings(rows, host["machine"])
    worst = dict.fromkeys(host["expect_doctor"], "none")
    for finding in findings:
        if finding.subject in worst:
            worst[finding.subject] = max(worst[finding.subject], finding.status, key=DOCTOR_ORDER.index)
    assert worst == host["expect_doctor"], [f"{f.subject}: {f.status}: {f.detail}" for f in findings]


# ------------------------------------------------------------------ what the verdicts say, beyond pass and fail

@pytest.mark.parametrize("host", ["nvml-error"], indirect=True)
def test_an_nvml_error_is_quoted_not_reported_as_no_nvidia_smi(host, tmp_path):
    spec = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
    flags = arch_flags_for(list(spec.arch_list))
    checks = judge(spec, host["runs"][0], gather_gpu_facts(host, spec, flags), flags)
    assert "Failed to initialize NVML: Unknown Error" in checks["gpu"]["message"]
    assert "exit 255" in checks["gpu"]["message"] and "not present" not in checks["gpu"]["message"]
    assert "CUDA unknown error" in checks["gpu"]["message"]  # torch's first-call warning, kept


@pytest.mark.parametrize(("host", "cause", "host_nvidia_smi_fails"), [
    ("driver-library-mismatch", "reboot the host", True),
    ("rtx4090-forward-compat", "does not support forward compatibility", False),  # the compat libcuda is the image's
], indirect=["host"])
def test_a_driver_that_stops_cuda_fails_the_driver_check_naming_the_cause(host, cause, host_nvidia_smi_fails):
    """The versions alone would pass: the mismatch's libcuda and kernel module, or a compat libcuda, say 13.0."""
    spec = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
    flags = arch_flags_for(list(spec.arch_list))
    checks = judge(spec, host["runs"][0], gather_gpu_facts(host, spec, flags), flags)
    assert checks["driver"]["status"] == "failed" and cause in checks["driver"]["message"]
    assert cause in checks["gpu"]["message"]
    assert (cause in gpu_findings([spec])[0].detail) == host_nvidia_smi_fails


@pytest.mark.parametrize("host", ["hgx-h100-no-fabricmanager"], indirect=True)
def test_a_host_service_that_stops_cuda_is_named_in_the_gpu_check_and_spares_the_driver(host):
    spec = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
    flags = arch_flags_for(list(spec.arch_list))
    checks = judge(spec, host["runs"][0], gather_gpu_facts(host, spec, flags), flags)
    assert "start nvidia-fabricmanager" in checks["gpu"]["message"] and checks["driver"]["status"] == "passed"


@pytest.mark.parametrize("host", ["h100-r535"], indirect=True)
def test_torchs_first_cuda_warning_is_kept_when_another_part_called_cuda_first(host):
    import torch

    spec = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
    flags = arch_flags_for(list(spec.arch_list))
    with gpu_hosts.simulated_cuda(torch, host, spec.cuda, flags, rules.arch_covers):
        availability = probe_gpu.cuda_availability(torch)  # the main part's first CUDA call, before smoke_eager's
        probe_smoke.gpu_devices(torch)
        gpu = probe_gpu.gpu_facts(torch, flags, availability=availability)
    assert gpu["warnings"] and "too old (found version 12020)" in gpu["warnings"][0]


@pytest.mark.parametrize("host", ["a100-mig2"], indirect=True)
def test_mig_devices_are_recorded_and_one_cuda_device_is_expected(host, tmp_path):
    facts = probe_gpu.driver_facts()
    assert len(facts["nvidia_smi_gpus"]) == 2 and [len(v) for v in facts["mig_devices"].values()] == [2, 1]
    spec = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
    flags = arch_flags_for(list(spec.arch_list))
    checks = judge(spec, host["runs"][0], gather_gpu_facts(host, spec, flags), flags)
    [count_test] = [t for t in checks["gpu"]["tests"] if "device_count" in t["test"]]
    assert count_test["status"] == "passed" and parse_gpus("device=0:0,0:1").expected_count == 1


@pytest.mark.parametrize("host", ["exclusive-process"], indirect=True)
def test_an_exclusive_compute_mode_keeps_the_compile_child_off_the_gpus(host, monkeypatch):
    import torch

    assert probe_gpu.driver_facts()["compute_modes"] == ["Exclusive_Process", "Exclusive_Process"]
    ran_on = []
    for name in ("compile_matches_eager", "max_autotune_compile"):
        monkeypatch.setattr(probe_smoke, name, lambda torch, device: ran_on.append(device) or {"ok": True})
    monkeypatch.setattr(probe_smoke, "vectorized_isa", lambda torch: {"ok": True})
    reason = rules.EXCLUSIVE_REASON.format(mode="Exclusive_Process")
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], rules.arch_covers):
        skipped = probe_smoke.smoke_compiles(torch, reason)
        shared = probe_smoke.smoke_compiles(torch)
    assert set(ran_on) == {"cpu", "cuda:0"} and skipped["gpu_skipped"] == reason and list(skipped["devices"]) == ["cpu"]
    assert list(shared["devices"]) == ["cpu", "cuda:0"]  # cuda:0 only, as upstream's smoke test: not every GPU


def test_the_driver_verdict_has_two_levels_and_sees_a_forward_compatible_libcuda():
    cu130, cu126 = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"], BY_TAG["2.14.1-cuda12.6-cudnn9-runtime"]
    assert driver_verdict("535.261.03", 12020, cu130)[0] == "fail"
    assert driver_verdict("535.261.03", 12020, cu126)[0] == "warn"
    assert driver_verdict("560.35.03", 12060, cu126)[0] == "ok"
    # A cuda-compat libcuda on an R535 kernel driver supports CUDA 13.0: the kernel branch does not decide.
    status, why = driver_verdict("535.261.03", 13000, cu130)
    assert status == "ok" and "supports CUDA 13.0" in why


# ------------------------------------------------------------------ the probe's decisions on their own

@pytest.mark.parametrize(("flags", "capability", "covered"), [
    (["sm_100a"], (10, 3), None),  # arch-specific cubins run on exactly 10.0 (Feature Set Compiler Targets)
    (["sm_100a"], (10, 0), "cubin sm_100a"),
    (["compute_90a"], (10, 0), None),  # arch-specific PTX is not forward compatible
    (["compute_100f"], (12, 0), None),  # family code stays within its major
    (["sm_100f"], (10, 3), "cubin sm_100f"),
    (["sm_100"], (10, 3), "cubin sm_100"),  # plain cubins: same major, minor at or below
    (["sm_120", "compute_120"], (13, 0), "PTX compute_120 (JIT-compiled on first use)"),
    (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], (11, 0), None),  # Thor: no cubin, no PTX
    (["sm_80", "sm_86"], (8, 7), None),  # Orin is Tegra: no binary compatibility with desktop cubins
    (["sm_100"], (10, 1), None),  # Thor in CUDA 12 numbering: torch excludes it from sm_100
    (["sm_101"], (11, 0), "cubin sm_101"),  # Thor's sm_101 cubin runs under CUDA 13's number too
    (["sm_86", "sm_87"], (8, 7), "cubin sm_87"),
    (["sm_87"], (8, 9), None),  # nor the other way
    (["sm_86", "compute_86"], (8, 7), "PTX compute_86 (JIT-compiled on first use)"),
    (["sm_80", "sm_86"], (8, 9), "cubin sm_86"),  # an L4 or L40S on desktop cubins: X.y runs on X.z, z >= y
])
def test_arch_coverage_follows_nvidias_rules_for_arch_specific_and_family_code(flags, capability, covered):
    assert rules.arch_covers(flags, capability) == covered


@pytest.mark.parametrize(("flag", "capability", "before_13_2", "from_13_2"), [
    # torch 2.14.1's DEVICE_REQUIREMENT and DEVICE_REQUIREMENT_POST_JETSON_SBSA_UNIFICATION (torch/cuda/__init__.py),
    # as gpu-audit-2 B6 read them from the wheel.
    ("sm_80", (8, 7), False, True), ("sm_86", (8, 7), False, True), ("sm_70", (7, 2), False, True),  # Orin, Xavier
    ("sm_100", (10, 1), False, False), ("sm_101", (11, 0), True, True),  # Thor, CUDA 12 and 13 numbering
    ("sm_120", (12, 1), True, True),  # DGX Spark GB10
    ("sm_100", (10, 3), True, True), ("sm_86", (8, 9), True, True),  # B300, L4: desktop rules
])
def test_tegra_coverage_follows_the_table_torchs_wheel_carries_for_its_cuda(flag, capability, before_13_2, from_13_2):
    assert bool(rules.arch_covers([flag], capability, "13.0")) == before_13_2
    assert bool(rules.arch_covers([flag], capability, "13.2")) == from_13_2


def test_the_compile_child_ends_inside_the_probes_kill_budget(monkeypatch):
    monkeypatch.setattr(probe_base, "PROBE_STARTED", probe_base.time.monotonic() - 20)
    assert probe_base.compile_timeout(300) <= 300 - 20 - probe_base.BUDGET_MARGIN_S
    assert probe_base.compile_timeout(None) == probe_base.SMOKE_COMPILE_TIMEOUT_S


def test_torchrun_runs_one_rank_per_gpu_up_to_eight():
    assert [probe_gpu.distributed_processes(n) for n in (0, 1, 2, 8, 16)] == [2, 2, 2, 8, 8]


def test_gds_that_this_host_cannot_test_is_not_a_failure(monkeypatch):
    import torch

    def no_o_direct(*_):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(torch.cuda.gds, "GdsFile", no_o_direct)
    result = probe_smoke.gds_errors_reach_python(torch)
    assert result["ok"] and "Invalid argument" in result["not_testable"]


MIG_LINE = "MIG 1g.10gb Device 0:"


@pytest.mark.parametrize(("gpus", "smi_gpus", "mig_modes", "mig_devices", "allowed"), [
    ("all", ["GPU 0", "GPU 1"], ["Enabled", "Enabled"], {"0": [MIG_LINE], "1": [MIG_LINE]}, 1),
    ("all", ["GPU 0", "GPU 1"], ["Enabled", "Disabled"], {"0": [MIG_LINE]}, range(1, 3)),  # one whole, one in MIG
    ("all", ["GPU 0", "GPU 1"], None, {"0": [MIG_LINE]}, range(1, 3)),  # the modes not read: MIG lines tell
    ("all", ["GPU 0", "GPU 1"], ["Enabled", "Disabled"], {}, 1),  # MIG on, no MIG device made yet: CUDA skips it
    ("device=MIG-a,MIG-b", ["GPU 0"], ["Enabled"], {"0": [MIG_LINE, MIG_LINE]}, 1),
    ("device=1,MIG-a", ["GPU 0", "GPU 1"], ["Enabled", "Disabled"], {"0": [MIG_LINE]}, range(1, 3)),
    ("all", ["GPU 0", "GPU 1"], ["[N/A]", "[N/A]"], {}, 2),  # GPUs without MIG
])
def test_mig_hosts_allow_what_cuda_may_enumerate(gpus, smi_gpus, mig_modes, mig_devices, allowed):
    expect = {"gpus": parse_gpus(gpus).to_json()}
    gpu = {"nvidia_smi_gpus": smi_gpus, "mig_modes": mig_modes, "mig_devices": mig_devices}
    assert expected_device_count(expect, gpu)[0] == allowed


@pytest.mark.parametrize(("modes", "exclusive", "children_stay_off", "unusable"), [
    (["Default", "[N/A]", "[Not Supported]"], False, False, False),  # no mode reported limits nothing
    (["Exclusive_Process", "Default"], True, True, False),
    (["Default", "Prohibited"], False, True, True),
])
def test_only_exclusive_and_prohibited_compute_modes_limit_the_probe(modes, exclusive, children_stay_off,
                                                                     unusable):
    listed = [f"GPU {index}" for index in range(len(modes))]
    limits = rules.compute_mode_limits({"compute_modes": modes, "nvidia_smi_gpus": listed})
    decided = (limits.exclusive, bool(limits.children_skip), bool(limits.unusable))
    assert decided == (exclusive, children_stay_off, unusable)


@pytest.mark.parametrize("host", ["prohibited"], indirect=True)
def test_a_prohibited_gpu_skips_the_gpu_checks_naming_it_and_the_fix(host):
    spec = BY_TAG["2.14.1-cuda13.0-cudnn9-runtime"]
    flags = arch_flags_for(list(spec.arch_list))
    checks = judge(spec, host["runs"][0], gather_gpu_facts(host, spec, flags), flags)
    for name in ("gpu", "amp", "multi-gpu"):
        assert checks[name]["status"] == "skipped"
        assert "GPU 1: NVIDIA H100 PCIe" in checks[name]["message"]
        # The UUID names the host's GPU, where the container's index may not (--gpus device=1,3 numbers them 0, 1).
        assert "`nvidia-smi -i GPU-0b0c0d0e-1111-2222-3333-444455550001 -c DEFAULT`" in checks[name]["message"]


@pytest.mark.parametrize(("capability", "cudnn", "forced"), [
    ((7, 5), 92400, False), ((8, 0), 92400, True), ((8, 9), 92400, True), ((10, 3), 92400, True),
    ((12, 1), 92400, True),
    ((13, 0), 92400, False),  # past torch's sm121 bound: forcing cuDNN would fail a good image with "No available kernel"
    ((9, 0), 91002, False),  # the cu126 row's cuDNN 9.10: PyTorch turned cuDNN attention off there (pytorch#171627)
    ((9, 0), 91500, False), ((9, 0), 91501, True),  # torch prefers it above 9.15.0 (sdp_utils.cpp)
    ((9, 0), None, False),
])
def test_cudnn_attention_is_forced_where_torch_runs_it_by_default(capability, cudnn, forced):
    assert rules.cudnn_attention_forced(capability, cudnn) == forced


@pytest.mark.parametrize(("host", "row", "forced"), [
    ("h100-r580", "2.14.1-cuda12.6-cudnn9-runtime", False), ("h100-r580", "2.14.1-cuda13.0-cudnn9-runtime", True),
], indirect=["host"])
def test_the_cu126_rows_cudnn_runs_attention_by_torchs_default_dispatch(host, row, forced):
    spec = BY_TAG[row]
    gpu = gather_gpu_facts(host, spec, arch_flags_for(list(spec.arch_list)))
    assert gpu["cudnn_attention"]["cudnn_forced"] == forced and gpu["cudnn_attention"]["ok"]


@pytest.mark.parametrize("host", ["exclusive-process"], indirect=True)
def test_the_records_multi_gpu_process_runs_before_the_probe_makes_its_contexts(host, monkeypatch):
    """gpu-record on an Exclusive_Process node: a multi-GPU process started after the probe's own contexts would find
    every GPU busy and fail a good image."""
    import torch

    order = []
    monkeypatch.setattr(probe_gpu, "multi_gpu_in_subprocess", lambda: order.append("multi-gpu process") or {"ok": True})
    make_context = probe_gpu.device_facts
    monkeypatch.setattr(probe_gpu, "device_facts", lambda *args: order.append("own context") or make_context(*args))
    monkeypatch.setattr(probe_gpu, "bf16_matmul_throughput", lambda torch: {"ok": True, "tflops": 1.0})
    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_90"], rules.arch_covers):
        facts = probe_gpu.record_gpu_facts(torch, ["sm_90"])
    assert order[0] == "multi-gpu process" and facts["multi_gpu"] == {"ok": True}


@pytest.mark.parametrize(("host", "nvml", "cuda"), [
    ("a100-mig2", 2, 1), ("h100x4-mig-all", 4, 1), ("h100x4-mig-no-instances-beside-whole", 4, 3),
], indirect=["host"])
def test_the_probe_counts_cudas_devices_not_nvmls_gpus(host, nvml, cuda):
    """torch.cuda.device_count() answers NVML's count until torch initialises CUDA (torch/cuda/__init__.py); the probe,
    its smoke devices and torchrun's ranks take CUDA's."""
    import torch

    with gpu_hosts.simulated_cuda(torch, host, "13.0", ["sm_80", "sm_90"], rules.arch_covers):
        assert torch.cuda.device_count() == nvml  # what a probe reading it first would record
        availability = probe_gpu.cuda_availability(torch)
        devices = probe_smoke.gpu_devices(torch)
    assert (availability["device_count"], availability["nvml_device_count"], len(devices)) == (cuda, nvml, cuda)
    assert probe_gpu.all_reduce_plan(cuda, "") == ((cuda, "nccl") if cuda >= 2 else (2, "gloo"))


@pytest.mark.parametrize(("names", "mig_lines", "skipped"), [
    (["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB MIG 1g.10gb"], {}, True),  # named by torch
    (["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"], {"0": [MIG_LINE]}, True),  # listed by nvidia-smi
    (["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"], {}, False),
    (["NVIDIA A100-SXM4-80GB MIG 1g.10gb"], {"0": [MIG_LINE]}, False),  # one device: nothing to skip
])
def test_peer_copies_and_nccl_skip_across_a_mig_device_and_a_whole_gpu(names, mig_lines, skipped):
    reason = rules.mig_multi_gpu_reason(len(names), {"mig_devices": mig_lines}, names)
    assert bool(reason) == skipped
    assert probe_gpu.all_reduce_plan(len(names), reason)[1] == ("gloo" if skipped or len(names) < 2 else "nccl")
