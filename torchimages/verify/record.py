"""The real-hardware record (docs/gpu-validation.md): the probe's GPU side on a GPU host, judged by the real check
suite, as one line of the record table. Runs with the host's own torch, or in an image's container (Docker)."""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..checks import checklist
from ..checks.gpu_health import CLOCKS_UNDER_LOAD, LINK_UNDER_LOAD
from ..checks.gpu_speed import host_report, peak_tflops, shared_device
from ..checks.rules import arch_flags_for
from ..files import read_json_document
from ..model import ImageSpec, InputError, PeerError, Problem
from ..redaction import inert
from ..reporting import as_object, markdown_cell
from .plan import SUITE, parse_gpus
from .suite import arch_rows, run_suite_on_facts

# The suites that judge GPU facts alone; the others need a container's files, users and smoke run.
GPU_SUITES = ("test_gpu.py", "test_gpu_host.py", "test_cudnn.py", "test_amp.py")
GPU_ONLY_TIMEOUT_S = 900
# No host has more GPUs (an NVL72 rack's are 72, seven MIG slices each): facts listing more are not one host's, and
# would make the record's lane host (one YAML entry each) take minutes to write.
MAX_GPUS = 1024
MAX_LISTED_LINES = 8 * MAX_GPUS  # of nvidia-smi -L: a GPU's line and its MIG devices'
SHOWN_KINDS = 4  # of GPU names (and of a host's health findings) in the record line; more are counted, not listed


@dataclass(frozen=True)
class Record:
    line: str  # the docs/gpu-validation.md table row
    passed: bool  # no GPU check failed, and the GPU work ran (only multi-gpu may skip, on one GPU)
    checks: dict[str, dict]


def build_mismatch(spec: ImageSpec, torch_facts: dict) -> str:
    """How the torch that gave the facts differs from the row's build ("" where it is the row's): its version, CUDA
    build and arch list, as identity compares them. Judging another build against the row would record a verdict
    for a build that never ran there."""
    found_flags, row_flags = list(torch_facts.get("arch_flags") or []), arch_flags_for(list(spec.arch_list))
    differences = []
    if str(torch_facts.get("version") or "").split("+")[0] != spec.torch:
        differences.append(f"torch {torch_facts.get('version')} where the row has {spec.torch}")
    if torch_facts.get("cuda") != spec.cuda:
        differences.append(f"CUDA {torch_facts.get('cuda') or 'none (a CPU build)'} where the row has {spec.cuda}")
    if sorted(found_flags) != sorted(row_flags):
        differences.append(f"arch list {' '.join(found_flags) or 'none'} where the row has {' '.join(row_flags)}")
    return "; ".join(differences)


def vouch_for(spec: ImageSpec, facts: dict, source: str) -> None:
    """Refuse (exit 2, one line) facts the row's checks cannot judge: no torch, no GPU part, or another build; a probe
    that stopped is one line, exit 1."""
    if facts.get("probe_error"):  # the probe printed its report, but its part stopped before any fact
        raise PeerError(f"the probe's GPU part ({source}) gave no facts: {facts['probe_error'][-300:]}")
    torch_facts = facts.get("torch") or {}
    if not torch_facts.get("importable", True):
        raise InputError([Problem(source, 0, f"no torch to record with: {torch_facts.get('error') or 'it does not import'}; "
                                             "run gpu-record with the row's image (--image REF) or in a Python that has "
                                             "the row's torch")])
    if not isinstance(facts.get("gpu"), dict):
        raise InputError([Problem(source, 0, "the facts have no GPU part: save them with `probe.py --gpu-only`")])
    mismatch = build_mismatch(spec, torch_facts)
    if mismatch:
        raise InputError([Problem(source, 0, f"not row {spec.tag}'s build: {mismatch}; record with the row's image "
                                             f"(--image REF) or a Python with torch {spec.torch} for CUDA {spec.cuda}")])


def judge(spec: ImageSpec, gpus: str, torch_facts: dict, gpu: dict, matrix: list[ImageSpec]) -> dict[str, dict]:
    """The real check suite's GPU checks on these facts, as `build.py test` runs them on a container's."""
    expect = {"tag": spec.tag, "image": spec.tag, "image_id": "", "container_id": "gpu-record",
              "spec": spec.to_json(), "gpus": parse_gpus(gpus).to_json(), "host_gpu_runtime": True,
              "shm_size": spec.shm_size, "arbitrary_uid": 12345,
              "arch_rows": arch_rows(matrix)}
    facts = {"main": {"torch": torch_facts, "gpu": gpu}, "image": {"labels": {}}}
    return run_suite_on_facts(expect, facts, [SUITE / name for name in GPU_SUITES])


def record(date: str, spec: ImageSpec, source: str, facts: dict, checks: dict[str, dict]) -> Record:
    """One row: date | device | driver | image / torch | result | bf16 matmul."""
    gpu = facts["gpu"]
    devices = gpu.get("devices") or []
    device = devices_cell(devices)
    mine = {name: checks[name] for name in checklist.GPU_CHECKS + ("amp",) if name in checks}
    failed = [name for name, check in mine.items() if check["status"] == "failed"]
    # A record says passed only where the GPU work ran: multi-gpu alone may skip (one GPU).
    not_run = [name for name, check in mine.items() if check["status"] == "skipped" and name != "multi-gpu"]
    warned = [name for name, check in mine.items() if check.get("warnings") or "warning:" in check["message"]]
    if failed:
        result = f"failed: {', '.join(failed)}"
    elif not_run:
        result = f"not run: {', '.join(not_run)} ({mine[not_run[0]]['message'][:200]})"
    else:
        result = "passed" + (f" (with a warning: {', '.join(warned)})" if warned else "")
    throughput = (gpu.get("bf16_matmul") or {}).get("tflops")
    first = devices[0]["name"] if devices else ""  # the matmul ran on cuda:0
    peak = peak_tflops(first)
    shared = shared_device(first)
    unknown = f" (peak unknown: {shared})" if shared else " (peak unknown)"
    bf16 = ("not measured" if throughput is None
            else f"{throughput} TFLOPS" + (f" ({throughput / peak:.0%} of {peak} dense peak)" if peak else unknown))
    host = host_report(gpu)
    cells = [date, device, gpu.get("driver_version") or "unknown",
             f"{source} / torch {facts['torch'].get('version')} ({spec.tag})", f"{result}{health_note(host['health'])}",
             f"{bf16}{speed_note(host['performance'])}"]
    return Record(table_row(cells), not failed and not not_run, checks)


def table_row(cells: list[object]) -> str:
    """One row of the record table. Every cell holds what a host reported (nvidia-smi's device names, the driver's
    version, the checks' words on them): made inert and its pipes escaped, so that no value ends the row, adds
    another, or moves a terminal's cursor."""
    return "| " + " | ".join(markdown_cell(inert(str(cell))) for cell in cells) + " |"


def devices_cell(devices: list[dict]) -> str:
    """The GPUs by name, counted ('NVIDIA H100 80GB HBM3 x8'), in one pass over them; past SHOWN_KINDS names, the
    rest counted: a host listing tens of thousands of GPUs gets a line of the same length as one with a few."""
    counts = Counter(device["name"] for device in devices)
    if not counts:
        return "no GPU seen"
    names = sorted(counts)
    shown = [f"{name} x{counts[name]}" if len(devices) > 1 else name for name in names[:SHOWN_KINDS]]
    more = len(names) - SHOWN_KINDS
    return ", ".join(shown) + (f" and {more} more kinds ({len(devices)} GPUs)" if more > 0 else "")


def health_note(health: dict) -> str:
    """The record's word on the host: its findings, or that it was healthy; nothing where nvidia-smi told nothing."""
    if health["healthy"] is None:
        return ""
    if health["healthy"]:
        return "; healthy host"
    findings = health["findings"]
    more = len(findings) - SHOWN_KINDS
    return ("; host: " + ", ".join(f"GPU {finding['gpu']} {finding['field']}" for finding in findings[:SHOWN_KINDS])
            + (f" and {more} more findings" if more > 0 else ""))


def speed_note(performance: dict) -> str:
    """The copy and all-reduce figures where measured, with their floors' verdicts."""
    copies, reduce = performance["pinned_copies"], performance["all_reduce"]
    notes = []
    if copies["h2d_gbps"] is not None:
        link = copies["link"]
        notes.append(f"pinned copies {copies['h2d_gbps']}/{copies['d2h_gbps']} GB/s H2D/D2H"
                     + (f" of gen {link['gen']} x{link['width']}'s {link['gbps']}" if link else "")
                     + f" ({copies['verdict']})")
    if reduce["busbw_gbps"] is not None:
        notes.append(f"NCCL all-reduce busbw {reduce['busbw_gbps']} GB/s, {reduce['topology']} ({reduce['verdict']})")
    return "".join(f"; {note}" for note in notes)


def host_gpu_facts() -> dict:
    """The probe's --gpu-only part with this Python's torch (a GPU host without Docker); its compiles end inside the
    record's timeout."""
    from .container import PROBE_SOURCE

    command = [sys.executable, str(PROBE_SOURCE), "--gpu-only", "--budget-s", str(GPU_ONLY_TIMEOUT_S)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=GPU_ONLY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise PeerError(f"the probe's GPU part ({sys.executable}) did not finish in {GPU_ONLY_TIMEOUT_S}s: a GPU or "
                        "NCCL hang; run `probe.py --gpu-only` by hand to see where it stops") from None
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode == 0 and lines:
        with contextlib.suppress(ValueError):
            return json.loads(lines[-1])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise PeerError(f"the probe's GPU part ({sys.executable}) exited {done.returncode} without facts: {last[-300:]}")


def image_gpu_facts(docker_client, spec: ImageSpec, image: str) -> dict:
    """The probe's --gpu-only part in a container of the image, given every GPU (a GPU host with Docker)."""
    from ..model import InputError, Problem
    from ..peers import engine
    from .container import container_name, copy_probe, create_container, remove_container, run_probe
    from .plan import Plan

    inspected = engine.inspect_image(docker_client, image)
    if inspected is None:
        raise InputError([Problem(image, 0, f"image {image} is not on the engine: pull or build it first")])
    plan = Plan(spec, image, inspected["Id"], parse_gpus("all"), spec.shm_size, GPU_ONLY_TIMEOUT_S,
                engine.gpu_access(docker_client).path or "runtime")
    name = container_name(spec)
    try:
        container = create_container(docker_client, plan, name, reports="")
        container.start()
        copy_probe(container)
        facts = run_probe(container, ["--gpu-only", "--budget-s", str(GPU_ONLY_TIMEOUT_S)], "", GPU_ONLY_TIMEOUT_S)
    finally:
        remove_container(docker_client, name)
    if "probe_error" in facts:
        last = (facts.get("stderr_tail", "").strip().splitlines() or [""])[-1]
        raise PeerError(f"the probe's GPU part gave no facts in {image}: {facts['probe_error']} {last[-300:]}".strip())
    return facts


# nvidia-smi -L's lines (NVIDIA nvidia-smi documentation, "-L"; MIG lines as in the MIG User Guide, "Device
# Enumeration"), as tests/gpu_hosts/nvidia-smi prints them back.
SMI_GPU_LINE = re.compile(r"^GPU \d+: (?P<name>.+) \(UUID: (?P<uuid>[^)]+)\)$", re.ASCII)
SMI_MIG_LINE = re.compile(r"^\s*MIG\s+(?P<profile>\S+)\s+Device\s+\d+: \(UUID: (?P<uuid>[^)]+)\)$", re.ASCII)
QUERY_KEYS = ("name", "uuid", "compute_cap", "driver_version", "compute_mode", "mig_mode")  # probe_gpu.RECORD_QUERY_FIELDS
# What torch.cuda.init()'s own checks warn for a GPU the arch list misses (torch/cuda/__init__.py, _check_capability
# and _check_cubins): no first-call warning, and a replay's init gives them again from the row's arch list.
ARCH_CHECK_WARNING = re.compile(r"^Found GPU\d+ |is not compatible with the current PyTorch installation",
                                re.ASCII)


def verdict(check: dict) -> str:
    """A check's verdict as lane hosts state it: passed, passed-with-warning, failed or skipped."""
    warned = check["status"] == "passed" and (check.get("warnings") or "warning:" in check["message"])
    return "passed-with-warning" if warned else check["status"]


def nvidia_smi_as_lane_host(host: dict) -> dict:
    """nvidia-smi's raw answers (`-L` and the per-GPU query the probe recorded) as a lane host lists them: its GPUs
    with their fields and MIG devices, or its exit code and words where it failed."""
    listing = host.get("nvidia_smi_list") or {"ok": False, "returncode": 127, "output": "nvidia-smi: not found"}
    if not listing.get("ok"):
        return {"returncode": listing.get("returncode") or 127,
                "output": (listing.get("output") or listing.get("error") or "").strip()}
    query = host.get("nvidia_smi_query") or {}
    rows = [[field.strip() for field in line.split(", ")] for line in (query.get("output") or "").splitlines()
            if query.get("ok") and line.count(", ") == len(QUERY_KEYS) - 1]
    gpus: list[dict] = []
    for line in listing["output"].splitlines():
        if (match := SMI_GPU_LINE.match(line)):
            fields = dict(zip(QUERY_KEYS, rows[len(gpus)], strict=False)) if len(gpus) < len(rows) else {}
            gpus.append({**fields, "name": match["name"], "uuid": match["uuid"]})
        elif (match := SMI_MIG_LINE.match(line)) and gpus:
            gpus[-1].setdefault("mig_devices", []).append({"profile": match["profile"], "uuid": match["uuid"]})
    return {"gpus": gpus}


def torch_cuda_as_lane_host(gpu: dict) -> dict:
    """What torch.cuda answered, as a lane host's stand-in replays it: availability, CUDA's and NVML's counts, the
    first-call warning, the devices in CUDA's order, and an error every device gave that is not the arch list's."""
    facts = {"available": bool(gpu.get("available")), "device_count": gpu.get("device_count") or 0}
    if gpu.get("cuda_visible_devices") is not None:  # the answers hold under this value only: the lane applies others
        facts["cuda_visible_devices"] = gpu["cuda_visible_devices"]
    if gpu.get("nvml_device_count") is not None:
        facts["nvml_device_count"] = gpu["nvml_device_count"]
    first_call = [warning for warning in gpu.get("warnings") or [] if not ARCH_CHECK_WARNING.search(warning)]
    if first_call:
        # torch's CUDA warning names why CUDA did not start; NVML's ("Can't initialize NVML") may come before it
        facts["warning"] = next((warning for warning in first_call if warning.startswith("CUDA initialization")),
                                first_call[0])
    devices = gpu.get("devices") or []
    if devices:
        facts["devices"] = [{"name": device["name"], "uuid": device.get("uuid", ""),
                             "capability": ".".join(map(str, device["capability"])),
                             **({"total_memory": device["total_memory"]} if "total_memory" in device else {})}
                            for device in devices]
    errors = {device.get("kernel_error") for device in devices if not device.get("kernel_ok", True)}
    if len(errors) == 1 and devices and all(not device.get("kernel_ok", True) for device in devices):
        [error] = errors
        if "no kernel image" not in error:  # the replay recomputes arch coverage from the row's flags
            facts["device_error"] = error
    return facts


def lane_host(date: str, spec: ImageSpec, source: str, facts: dict, checks: dict[str, dict], line: str) -> dict:
    """Every raw fact of a record, in the simulation lane's host format (tests/gpu_hosts/*.yaml): copied there, the
    real run is a lane host whose replay must give the verdicts this host gave."""
    host, gpu = facts.get("host") or {}, facts["gpu"]
    expect = {name: verdict(checks[name]) for name in checklist.GPU_CHECKS + ("amp",) if name in checks}
    smi = nvidia_smi_as_lane_host(host)
    with_health_fields(smi.get("gpus") or [], gpu.get("health"), [gpu.get(LINK_UNDER_LOAD), gpu.get(CLOCKS_UNDER_LOAD)])
    scenario = {
        "what": f"recorded on real hardware by torchimages gpu-record {spec.tag} on {date} "
                f"({host.get('hostname') or 'host unknown'}, {source}): {line}",
        "source": "this host's own answers, kept raw under `recorded`: nvidia-smi -L and --query-gpu as printed, "
                  "/proc/driver/nvidia/version, cuDriverGetVersion, NVML's and CUDA's device counts and the devices "
                  f"torch {(facts.get('torch') or {}).get('version')} listed",
        "machine": host.get("machine") or "unknown",
        "proc_driver_version": host.get("proc_driver_version"),
        "nvidia_smi": smi,
        "libcuda": {"driver_version": gpu.get("libcuda_driver_version")},
        "torch_cuda": torch_cuda_as_lane_host(gpu),
        "runs": [{"row": spec.tag, "gpus": "all", "expect": expect,
                  "why": f"the verdicts this host gave on {date} (torchimages gpu-record)",
                  # torch's view of the GPUs depends on it: the replay sets it as the record's process had it
                  **({"cuda_visible_devices": host["cuda_visible_devices"]}
                     if host.get("cuda_visible_devices") is not None else {})}],
        "expect_doctor": {},
        "recorded": {"torch": facts.get("torch"), "host": host, "gpu": gpu},
    }
    if not scenario["proc_driver_version"]:
        del scenario["proc_driver_version"]
    speed = recorded_speed(gpu)
    if speed:
        scenario["speed"] = speed
    return scenario


def _rows_by_uuid(read: object) -> dict[str, dict]:
    rows = as_object(read).get("rows")
    return {str(row.get("uuid")): row for row in rows if isinstance(row, dict)} if isinstance(rows, list) else {}


def with_health_fields(gpus: list[dict], health: object, loaded_reads: list[object] | None = None) -> None:
    """Each lane GPU gets the health fields nvidia-smi printed for its UUID (checks/gpu_health.py), as printed, and
    those it printed while the probe's copies and matmuls ran (`health_under_load`: the link's, the clocks'), so that
    the replay reads a GPU idle and under load as the real host did."""
    by_uuid = _rows_by_uuid(health)
    loaded = [_rows_by_uuid(read) for read in loaded_reads or []]
    for entry in gpus:
        uuid = str(entry.get("uuid"))
        if by_uuid.get(uuid):
            entry["health"] = {field: str(value) for field, value in by_uuid[uuid].items() if field != "uuid"}
        under_load = {field: str(value) for rows in loaded for field, value in (rows.get(uuid) or {}).items()
                      if field != "uuid"}
        if under_load:
            entry["health_under_load"] = under_load


def recorded_speed(gpu: dict) -> dict:
    """The speed figures the host measured, as a lane host replays them (tests/gpu_hosts, `speed`)."""
    copies = as_object(gpu.get("copy_bandwidth"))
    figures = {"bf16_tflops": as_object(gpu.get("bf16_matmul")).get("tflops"), "h2d_gbps": copies.get("h2d_gbps"),
               "d2h_gbps": copies.get("d2h_gbps"),
               "busbw_gbps": as_object(as_object(gpu.get("multi_gpu")).get("bandwidth")).get("busbw_gbps")}
    return {name: value for name, value in figures.items() if isinstance(value, (int, float))}


def gpu_record(date: str, spec: ImageSpec, source: str, where: str, facts: dict,
               matrix: list[ImageSpec]) -> tuple[Record, dict | None]:
    """`gpu-record`: the facts vouched for as spec's torch build (an InputError naming where otherwise), judged by the
    real GPU checks, as the record line; with the lane host that replays them where the facts hold the raw host
    answers (None for an older probe's)."""
    vouch_for(spec, facts, where)
    checks = judge(spec, "all", facts["torch"], facts["gpu"], matrix)
    result = record(date, spec, source, facts, checks)
    scenario = lane_host(date, spec, source, facts, checks, result.line) if facts.get("host") else None
    return result, scenario


def host_name(facts: dict) -> str:
    """The recorded host's name as a file name may hold it."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", (facts.get("host") or {}).get("hostname") or "")[:60] or "host"


GPU_FACTS_FIX = "save it again with `probe.py --gpu-only > FILE` on the GPU host"


def read_gpu_facts(path: Path) -> dict:
    """Saved `probe.py --gpu-only` facts: a bounded regular file (a FIFO would hang, /dev/zero never end) holding
    the fields the record line reads, of their types."""
    facts = read_json_document(path, GPU_FACTS_FIX)
    gpu = facts.get("gpu") if isinstance(facts, dict) else None
    devices = gpu.get("devices") if isinstance(gpu, dict) else None
    matmul = gpu.get("bf16_matmul") if isinstance(gpu, dict) else None
    expected = {
        "an object with `torch` and `gpu` objects": isinstance(facts, dict) and isinstance(facts.get("torch"), dict)
                                                     and isinstance(gpu, dict),
        "`gpu.devices` a list of objects with a text `name`, a `capability` of two whole numbers and any "
        "`kernel_error` text": devices is None or (isinstance(devices, list) and all(map(_device, devices))),
        f"`gpu.devices` of at most {MAX_GPUS} GPUs": not isinstance(devices, list) or len(devices) <= MAX_GPUS,
        "`gpu.warnings` a list of text": not isinstance(gpu, dict) or gpu.get("warnings") is None
                                         or _texts(gpu["warnings"]),
        "`probe_error` text": not isinstance(facts, dict) or facts.get("probe_error") is None
                              or isinstance(facts["probe_error"], str),
        "`gpu.bf16_matmul.tflops` a number": matmul is None or (
            isinstance(matmul, dict) and type(matmul.get("tflops")) in (int, float, type(None))),
        "`torch.arch_flags` a list of text": not isinstance(facts, dict) or not isinstance(facts.get("torch"), dict)
                                             or _texts(facts["torch"].get("arch_flags", [])),
        f"`host` an object of nvidia-smi answers with text outputs of at most {MAX_LISTED_LINES} lines":
            not isinstance(facts, dict) or _raw_host_answers(facts.get("host")),
    }
    wrong = [what for what, holds in expected.items() if not holds]
    if wrong:
        raise InputError([Problem(str(path), 0, f"not GPU facts: expected {wrong[0]}: {GPU_FACTS_FIX}")])
    return facts


def _device(device) -> bool:
    """A device as the probe lists it, with the fields the record and its lane host read, of their types."""
    capability = device.get("capability") if isinstance(device, dict) else None
    return (isinstance(device, dict) and isinstance(device.get("name"), str)
            and isinstance(capability, list) and len(capability) == 2
            and all(type(number) is int for number in capability)
            and isinstance(device.get("kernel_error", ""), str))


def _texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _raw_host_answers(host) -> bool:
    """The probe's raw host answers (record_host_facts): absent, or an object whose text fields are text."""
    if host is None:
        return True
    answers = [host.get(name) for name in ("nvidia_smi_list", "nvidia_smi_query")] if isinstance(host, dict) else [0]
    texts = [host.get(name) for name in ("hostname", "machine", "proc_driver_version")] if isinstance(host, dict) else []
    return (all(answer is None or (isinstance(answer, dict) and isinstance(answer.get("output", ""), str)
                                   and answer.get("output", "").count("\n") < MAX_LISTED_LINES) for answer in answers)
            and all(text is None or isinstance(text, str) for text in texts))
