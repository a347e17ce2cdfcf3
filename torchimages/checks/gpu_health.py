"""The host GPUs' health as nvidia-smi reports it, read by the probe before any GPU work and judged on the host side:
a sick node (memory errors, a throttled GPU, a degraded PCIe link) is charged to the host, never to the image.

Standard library only: the probe imports it beside its own copy in the container (verify.container.copy_probe), the
check suite, doctor, the report and gpu-record import it as torchimages.checks.gpu_health. Every value is read
leniently: nvidia-smi prints "[N/A]" or "[Not Supported]" where a GPU lacks a field, older drivers reject newer field
names, and a value out of range is taken for unknown, never for a finding.
"""
from __future__ import annotations

import time
import typing

# nvidia-smi --help-query-gpu's names. clocks_event_reasons.active is the bitmask NVML's nvmlDeviceGetCurrentClocks-
# EventReasons returns (named clocks_throttle_reasons before driver 535, still accepted as an alias there).
HEALTH_FIELDS = ("uuid", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
                 "remapped_rows.pending", "remapped_rows.failure", "clocks_event_reasons.active",
                 "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
FIELD_ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
UNKNOWN_FIELD = "is not a valid field"  # nvidia-smi's words for a field name this driver does not know
HEALTH_QUERY_TIMEOUT_S = 10  # one nvidia-smi call; a hung NVML must not hold the probe
HEALTH_BUDGET_S = 20  # all calls together, the one-field-at-a-time fallback included
# NVML's clocks event reason bits (nvml.h, nvmlClocksEventReason*): those that say the host slows the GPU down.
# SW power cap and GPU idle are normal (a GPU at its power limit under load, or idle at the query); sync boost,
# application and display clock settings are configuration, not sickness.
SLOWDOWN_BITS = {0x8: "HW slowdown (the GPU's own protection: power supply, temperature or an external signal)",
                 0x20: "SW thermal slowdown (the GPU is too hot for its clocks)",
                 0x40: "HW thermal slowdown (the GPU or its memory is overheating)",
                 0x80: "HW power brake slowdown (the system's power supply asserted the brake)"}
PCIE_GENERATIONS = range(1, 8)  # PCIe 1.0 to 7.0: a gen of 99 is a misread, not a link
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
MAX_ERROR_COUNT = 10**12  # ECC counters are 64-bit, but a count this large is a misread


class Runner(typing.Protocol):
    def __call__(self, command: list[str], timeout: float = ...) -> dict: ...


def read_health(smi: str, run_tool: Runner) -> dict:
    """nvidia-smi's health fields per GPU, as printed: {"rows": [{field: text}], "unreadable": [fields]}. One call
    for every field; where the driver rejects a field name (an older nvidia-smi), one call per field, within
    HEALTH_BUDGET_S in all. A call that fails otherwise (NVML down, a hang) is not repeated: nothing is read."""
    started = time.monotonic()
    rows, rejected = _query(smi, HEALTH_FIELDS, run_tool)
    if rows is not None or not rejected:
        return {"rows": rows or [], "unreadable": [] if rows is not None else list(HEALTH_FIELDS[1:])}
    rows, unreadable = [], []
    for field in HEALTH_FIELDS[1:]:
        values = None
        for name in (field, FIELD_ALIASES.get(field)):
            if name and values is None and time.monotonic() - started < HEALTH_BUDGET_S:
                values = _query(smi, ("uuid", name), run_tool)[0]
        if values is None:
            unreadable.append(field)
            continue
        rows = rows or [{"uuid": row["uuid"]} for row in values]
        for row, value in zip(rows, values, strict=False):
            row[field] = value[field]
    return {"rows": rows, "unreadable": unreadable}


def _query(smi: str, fields: typing.Sequence[str], run_tool: Runner) -> tuple[list[dict] | None, bool]:
    """One --query-gpu call -> a row per GPU keyed by the fields asked (the answer under the first field's name where
    it was an alias), or None where nvidia-smi failed or printed rows of another shape; and whether it failed on a
    field name it does not know ('Field "..." is not a valid field to query.')."""
    done = run_tool([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                    timeout=HEALTH_QUERY_TIMEOUT_S)
    output = str(done.get("output") or "")
    if not done.get("ok"):
        return None, UNKNOWN_FIELD in output
    rows = [[value.strip() for value in line.split(",")] for line in output.splitlines() if line.strip()]
    if not rows or any(len(row) != len(fields) for row in rows):
        return None, False
    canonical = [next((key for key, alias in FIELD_ALIASES.items() if alias == field), field) for field in fields]
    return [dict(zip(canonical, row, strict=True)) for row in rows], False


# ---------------------------------------------------------------- reading the values

def _number(text: object, limit: int) -> int | None:
    """An integer nvidia-smi printed, or None: "[N/A]", "[Not Supported]", "", words, negatives, past limit."""
    value = str(text or "").strip()
    return int(value) if value.isdigit() and int(value) <= limit else None


def _flag(text: object) -> bool | None:
    """Yes/No (or 1/0) as nvidia-smi prints a boolean; None where it printed anything else."""
    value = str(text or "").strip().lower()
    return True if value in ("yes", "1", "true") else False if value in ("no", "0", "false") else None


def _bitmask(text: object) -> int | None:
    value = str(text or "").strip().lower()
    try:
        number = int(value, 16) if value.startswith("0x") else None
    except ValueError:
        return None
    return number if number is not None and number < 1 << 64 else None


def _one_of_words(text: object, allowed: tuple[str, ...]) -> str | None:
    value = str(text or "").strip()
    return value if value in allowed else None


def _one_of(text: object, allowed: typing.Container[int]) -> int | None:
    value = _number(text, MAX_ERROR_COUNT)
    return value if value in allowed else None


def _pcie(row: dict) -> dict:
    return {f"{kind}_{which}": _one_of(row.get(f"pcie.link.{kind}.{which}"), allowed)
            for kind, allowed in (("gen", PCIE_GENERATIONS), ("width", PCIE_WIDTHS)) for which in ("current", "max")}


def gpu_health(row: dict) -> dict:
    """One GPU's health fields as values (None wherever nvidia-smi did not give a usable one)."""
    reasons = _bitmask(row.get("clocks_event_reasons.active"))
    return {"uuid": str(row.get("uuid") or ""),
            "ecc_mode": _one_of_words(row.get("ecc.mode.current"), ("Enabled", "Disabled")),
            "ecc_uncorrected_volatile": _number(row.get("ecc.errors.uncorrected.volatile.total"), MAX_ERROR_COUNT),
            "retired_pages_pending": _flag(row.get("retired_pages.pending")),
            "remapped_rows_pending": _flag(row.get("remapped_rows.pending")),
            "remapped_rows_failure": _flag(row.get("remapped_rows.failure")),
            "slowdowns": None if reasons is None else [why.split(" (")[0] for bit, why in SLOWDOWN_BITS.items()
                                                       if reasons & bit],
            "pcie": _pcie(row)}


# ---------------------------------------------------------------- what is wrong with the host

class Finding(typing.NamedTuple):
    gpu: int
    uuid: str
    field: str
    kind: str  # "memory" (errors in the GPU's memory), "clocks" (slowed down) or "link" (a degraded PCIe link)
    cause: str
    fix: str


def gpu_findings(index: int, health: dict) -> list[Finding]:
    """What one GPU's health says is wrong with the host (NVIDIA's GPU memory error management guide for the ECC
    and row-remapping fields; NVML's clocks event reasons; the PCIe link against what both ends allow)."""
    uuid, found = health["uuid"], []
    reset = f"drain the node and reset the GPU (`nvidia-smi -r -i {uuid or index}`) or reboot it"

    def add(field: str, kind: str, cause: str, fix: str) -> None:
        found.append(Finding(index, uuid, field, kind, cause, fix))

    if health["ecc_uncorrected_volatile"]:
        add("ecc.errors.uncorrected.volatile.total", "memory",
            f"{health['ecc_uncorrected_volatile']} uncorrected ECC error(s) since the driver loaded", reset)
    if health["remapped_rows_failure"]:
        add("remapped_rows.failure", "memory", "a row remapping failed (the GPU's memory has run out of spare rows)",
            "take the GPU out of service: NVIDIA's RMA policy applies")
    if health["remapped_rows_pending"]:
        add("remapped_rows.pending", "memory", "a row remapping is pending (it takes effect at the next GPU reset)",
            reset)
    if health["retired_pages_pending"]:
        add("retired_pages.pending", "memory", "a page retirement is pending (it takes effect when the driver reloads)",
            reset)
    for slowdown in health["slowdowns"] or []:
        add("clocks_event_reasons.active", "clocks", f"the GPU's clocks are held down: {slowdown}",
            "check the node's cooling, power supply and `nvidia-smi -q -d PERFORMANCE`")
    pcie = health["pcie"]
    if pcie["width_current"] and pcie["width_max"] and pcie["width_current"] < pcie["width_max"]:
        add("pcie.link.width.current", "link",
            f"the PCIe link runs x{pcie['width_current']} of x{pcie['width_max']}" + _gen_note(pcie),
            "reseat the GPU or its riser and check the slot's lanes in the BIOS")
    return found


def _gen_note(pcie: dict) -> str:
    gen, most = pcie["gen_current"], pcie["gen_max"]
    return f" at gen {gen} of {most}" if gen and most else ""


def host_health(gpu_facts: dict) -> dict:
    """The host's health for reports: per GPU the values, every finding, and healthy (True, False, or None where
    nothing was read: no nvidia-smi, an older probe's facts, every field unreadable)."""
    raw = gpu_facts.get("health") if isinstance(gpu_facts, dict) else None
    rows: list = raw["rows"] if isinstance(raw, dict) and isinstance(raw.get("rows"), list) else []
    gpus = [gpu_health(row) for row in rows if isinstance(row, dict)]
    findings = [finding for index, health in enumerate(gpus) for finding in gpu_findings(index, health)]
    read = any(value is not None for health in gpus for key, value in health.items() if key not in ("uuid", "pcie"))
    return {"healthy": (not findings) if read or findings else None,
            "findings": [finding._asdict() for finding in findings], "gpus": gpus,
            "unreadable": list(raw.get("unreadable") or []) if isinstance(raw, dict) else []}


def host_causes(health: dict, kinds: typing.Collection[str]) -> list[str]:
    """The findings of these kinds as sentences that charge the host: "host: GPU 0 (GPU-...): cause; fix"."""
    return [f"host: GPU {finding['gpu']} ({finding['uuid'] or 'no UUID'}): {finding['cause']}; {finding['fix']}"
            for finding in health["findings"] if finding["kind"] in kinds]


def pcie_below_max(health: dict) -> list[str]:
    """GPUs whose link runs below the generation or width both ends allow: what explains slow host copies (a link
    at a lower generation is also how an idle GPU saves power, so alone it is no finding)."""
    return [f"host: GPU {index} ({gpu['uuid'] or 'no UUID'}): the PCIe link runs at gen {gpu['pcie']['gen_current']} "
            f"x{gpu['pcie']['width_current']} of gen {gpu['pcie']['gen_max']} x{gpu['pcie']['width_max']}; reseat the "
            "GPU or its riser and check the slot's generation and lanes in the BIOS"
            for index, gpu in enumerate(health["gpus"])
            if None not in gpu["pcie"].values() and (gpu["pcie"]["gen_current"] < gpu["pcie"]["gen_max"]
                                                     or gpu["pcie"]["width_current"] < gpu["pcie"]["width_max"])]
