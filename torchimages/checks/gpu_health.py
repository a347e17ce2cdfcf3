"""The host GPUs' health as nvidia-smi reports it, read by the probe before any GPU work and judged on the host side:
a sick node (memory errors, a throttled GPU, a degraded PCIe link) is charged to the host, never to the image. The
link's current generation and width are judged only as read while copies load it (an idle GPU lowers both).

Standard library only: the probe imports it beside its own copy in the container (verify.container.copy_probe), the
check suite, doctor, the report and gpu-record import it as torchimages.checks.gpu_health. Every value is read
leniently: nvidia-smi prints "[N/A]" or "[Not Supported]" where a GPU lacks a field, older drivers reject newer field
names, and a value out of range is taken for unknown, never for a finding.
"""
from __future__ import annotations

import time
import typing

# nvidia-smi --help-query-gpu's names, every one known to the R535 branch's nvidia-smi (535.129.03's list:
# XueSongTap/XueSongTap.github.io _posts/2024-01-04-nvidia-smi-more.md; the same names in 580.173.02's and 590.48.01's:
# utkuozdemir/nvidia_gpu_exporter internal/captures/, see tests/gpu_hosts/nvidia-smi). clocks_event_reasons.active is
# the bitmask NVML's nvmlDeviceGetCurrentClocksEventReasons returns (named clocks_throttle_reasons before driver 535,
# still accepted as an alias there). The link's current generation and width are asked here for the record only: idle,
# a GPU lowers both to save power, so they are judged as read under load (LINK_UNDER_LOAD, gpu_speed.link_under_load);
# the generation as pcie.link.gen.gpucurrent, the name --help-query-gpu gives it since pcie.link.gen.current is
# "Deprecated, use pcie.link.gen.gpucurrent instead" (535, 580, 590), the older name where a driver refuses the newer.
# pcie.link.gen.hostmax: the root port's generation ("The maximum PCI-E link generation supported by the root port
# corresponding to this GPU"). persistence_mode and the aggregate uncorrected count: "Volatile error counters track the
# number of errors detected since the last driver load" (--help-query-gpu), and without persistence mode the driver
# unloads between clients ("if persistence mode is not enabled ... volatile counts are reset each time a compute app is
# run": nvidia-smi documentation), so there the aggregate ("persist indefinitely") is the count that still says
# something.
HEALTH_FIELDS = ("uuid", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
                 "clocks_event_reasons.active", "pcie.link.gen.gpucurrent", "pcie.link.gen.max",
                 "pcie.link.gen.hostmax", "pcie.link.width.current", "pcie.link.width.max", "persistence_mode",
                 "ecc.errors.uncorrected.aggregate.total")
# NVIDIA's recovery flags, each set in a call of its own so that a driver refusing it costs the others nothing. R535
# lists reset_status.reset_required and reset_status.drain_and_reset_recommended ("Either of these being 'Yes'
# indicates that an unrecoverable error has occurred"; "not supported for vGPUs"); 580.173.02 and 590.48.01 list neither
# but gpu_recovery_action ("Reports the GPU Recovery action recommended to recover from a bad state"; 'None' on a
# healthy H100 on 590.48.01) and c2c.mode (NVLink-C2C as the host link, GH200/GB200).
RESET_FIELDS = ("uuid", "reset_status.reset_required", "reset_status.drain_and_reset_recommended")
RECOVERY_FIELDS = ("uuid", "gpu_recovery_action", "c2c.mode")
LATER_FIELDS = RESET_FIELDS + RECOVERY_FIELDS[1:]  # the fields of both calls, as reports name them
# The row remapper, asked with --query-remapped-rows (nvidia-smi documentation, SELECTIVE QUERY OPTIONS): R535's
# --query-gpu refuses remapped_rows.* (its --help-query-gpu lists retired_pages.* then temperature.*), 580's and 590's
# accept them; --query-remapped-rows answers on every driver since R450 for Ampere and later GPUs.
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure")
# A vGPU guest's nvidia-smi -q (535.216.01, "GRID V100D-8C"): "GPU Virtualization Mode / Virtualization Mode : VGPU",
# with "Remapped Rows : N/A" and "Reset Required : N/A": the host's GPU keeps its remapper and reset state, which the
# guest cannot see. No --help-query-gpu of 535, 580, 590, 595 or 610 lists a virtualization field, so the mode is read
# from nvidia-smi -q, and only where a GPU's remapper answered neither Yes nor No (a whole GPU's -q costs more than a
# field); a bare-metal GPU prints "None", a passed-through one "Pass-Through" (590.48.01's H100).
VGPU_MODE = "VGPU"
FIELD_ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active",
                 "pcie.link.gen.gpucurrent": "pcie.link.gen.current"}
UNKNOWN_FIELD = "is not a valid field"  # nvidia-smi's words for a field name this driver does not know
HEALTH_QUERY_TIMEOUT_S = 10  # one nvidia-smi call; a hung NVML must not hold the probe
HEALTH_BUDGET_S = 20  # all calls together, the one-field-at-a-time fallback included
# The facts' key for cuda:0's link as read while pinned copies ran on it (gpu_speed.link_under_load).
LINK_UNDER_LOAD = "link_under_load"
# The facts' key for the clocks event reasons and power limits as read while bf16 matmuls ran on cuda:0
# (gpu_speed.clocks_under_load): what explains a slow matmul there, where the idle read sees "GPU idle".
CLOCKS_UNDER_LOAD = "clocks_under_load"
# NVML's nvmlClocksEventReasonSwPowerCap: the clocks held at the power limit. Under the default limit that is the GPU
# working as designed; under a limit set lower (`nvidia-smi --power-limit`, --help-query-gpu's own example) it is the
# host's setting (a GB300 capped to 500 W of 1400 W ran cuBLAS GEMMs at ~617 of ~1600-2174 TFLOPS:
# facebookexperimental/triton#2023).
SW_POWER_CAP = 0x4
POWER_LIMIT_FIELDS = ("power.limit", "power.default_limit")
MAX_WATTS = 10_000.0  # no GPU draws more: a larger figure is a misread
# NVML's clocks event reason bits (nvml.h, nvmlClocksEventReason*): those that say the host slows the GPU down.
# SW power cap and GPU idle are normal (a GPU at its power limit under load, or idle at the query); sync boost,
# application and display clock settings are configuration, not sickness.
SLOWDOWN_BITS = {0x8: "HW slowdown (the GPU's own protection: power supply, temperature or an external signal)",
                 0x20: "SW thermal slowdown (the GPU is too hot for its clocks)",
                 0x40: "HW thermal slowdown (the GPU or its memory is overheating)",
                 0x80: "HW power brake slowdown (the system's power supply asserted the brake)"}
# The states that spoil new work on that GPU, so that a failed GPU test there proves nothing of the image: uncorrected
# ECC errors since the driver loaded (CUDA's cudaErrorECCUncorrectable), a failed row remap (no spare rows left) and a
# GPU that needs a reset. A pending remap or page retirement does not: NVML's nvmlDeviceGetRemappedRows, "A pending
# remapping won't affect future work on the GPU since error-containment and dynamic page blacklisting will take care
# of that" (and a remap follows two correctable errors on one row as well as an uncorrectable one).
SPOILS_WORK = ("ecc.errors.uncorrected.volatile.total", "remapped_rows.failure", "reset_status.reset_required",
               "reset_status.drain_and_reset_recommended", "gpu_recovery_action")
PCIE_GENERATIONS = range(1, 8)  # PCIe 1.0 to 7.0: a gen of 99 is a misread, not a link
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
MAX_ERROR_COUNT = 10**12  # ECC counters are 64-bit, but a count this large is a misread


class Runner(typing.Protocol):
    def __call__(self, command: list[str], timeout: float = ...) -> dict: ...


def read_health(smi: str, run_tool: Runner) -> dict:
    """nvidia-smi's health fields per GPU, as printed: {"rows": [{field: text}], "unreadable": [fields]}. Four calls:
    the R535 fields, R535's reset flags, the later recovery fields, the row remapper (merged by UUID); a fifth,
    nvidia-smi -q, only where a GPU's remapper answered neither Yes nor No (is it a vGPU guest's?). Where a driver
    rejects a field name, one call per field, within HEALTH_BUDGET_S in all. A call that fails otherwise (NVML down, a
    hang) is not repeated."""
    started = time.monotonic()
    rows, unreadable = _read_fields(smi, HEALTH_FIELDS, run_tool, started)
    if rows is None:  # nvidia-smi answered nothing: no later call would fare better
        return {"rows": [], "unreadable": list(HEALTH_FIELDS[1:] + LATER_FIELDS[1:] + REMAP_FIELDS[1:])}
    for fields in (RESET_FIELDS, RECOVERY_FIELDS):
        later, later_unread = _read_fields(smi, fields, run_tool, started)
        _merge(rows, later or [], "uuid")
        unreadable += list(fields[1:]) if later is None else later_unread
    remaps = _query(smi, REMAP_FIELDS, run_tool, "--query-remapped-rows")[0]
    _merge(rows, remaps or [], "gpu_uuid")
    unreadable += [] if remaps else list(REMAP_FIELDS[1:])
    if remaps and any(_flag(row.get("remapped_rows.failure")) is None for row in rows):
        modes = virtualization_modes(smi, run_tool)
        for row in rows:
            row["virtualization_mode"] = modes.get(str(row.get("uuid")), "[N/A]")
    return {"rows": rows, "unreadable": unreadable}


def virtualization_modes(smi: str, run_tool: Runner) -> dict[str, str]:
    """Each GPU's virtualization mode by UUID, from nvidia-smi -q's "GPU UUID" and "Virtualization Mode" lines (VGPU in
    a guest); {} where nvidia-smi -q fails."""
    done = run_tool([smi, "-q"], timeout=HEALTH_QUERY_TIMEOUT_S)
    modes, uuid = {}, ""
    for line in str(done.get("output") or "").splitlines() if done.get("ok") else []:
        name, _, value = line.partition(":")
        if name.strip() == "GPU UUID":
            uuid = value.strip()
        elif name.strip() == "Virtualization Mode" and uuid:
            modes[uuid] = value.strip()
    return modes


def _merge(rows: list[dict], extra: list[dict], key: str) -> None:
    """Each row gets the extra fields of the row with its UUID (nvidia-smi's order is the same, but a UUID is sure)."""
    by_uuid = {str(row.get(key)): row for row in extra}
    for row in rows:
        match = by_uuid.get(str(row.get("uuid")))
        row.update({field: value for field, value in (match or {}).items() if field != key})


def _read_fields(smi: str, fields: tuple[str, ...], run_tool: Runner,
                 started: float) -> tuple[list[dict] | None, list[str]]:
    """One --query-gpu call for these fields (the first is uuid); where the driver rejects a name, one call per field
    within the budget. (rows, fields left unread); rows None where nvidia-smi failed otherwise or read nothing."""
    rows, rejected = _query(smi, fields, run_tool)
    if rows is not None or not rejected:
        return rows, [] if rows is not None else list(fields[1:])
    found: list[dict] | None = None
    unreadable = []
    for field in fields[1:]:
        values = None
        for name in (field, FIELD_ALIASES.get(field)):
            if name and values is None and time.monotonic() - started < HEALTH_BUDGET_S:
                values = _query(smi, ("uuid", name), run_tool)[0]
        if values is None:
            unreadable.append(field)
            continue
        found = found or [{"uuid": row["uuid"]} for row in values]
        for row, value in zip(found, values, strict=False):
            row[field] = value[field]
    return found, unreadable


def _query(smi: str, fields: typing.Sequence[str], run_tool: Runner,
           option: str = "--query-gpu") -> tuple[list[dict] | None, bool]:
    """One query call -> a row per GPU keyed by the fields asked (the answer under the first field's name where it was
    an alias), or None where nvidia-smi failed or printed rows of another shape; and whether it failed on a field name
    it does not know ('Field "..." is not a valid field to query.')."""
    done = run_tool([smi, f"{option}={','.join(fields)}", "--format=csv,noheader,nounits"],
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
    """Yes/No (or 1/0, Enabled/Disabled) as nvidia-smi prints a boolean; None where it printed anything else."""
    value = str(text or "").strip().lower()
    return (True if value in ("yes", "1", "true", "enabled") else False if value in ("no", "0", "false", "disabled")
            else None)


# NVML's nvmlDeviceGpuRecoveryAction_t as nvidia-smi prints gpu_recovery_action: None on a healthy GPU (590.48.01's
# H100), else the action (a GPU reset, a node reboot, a drain of peer traffic, a drain and reset). Any other text is
# unknown, never a finding.
RECOVERY_WORDS = ("reset", "reboot", "drain")


def _recovery(text: object) -> str | None | bool:
    """The recovery action nvidia-smi recommends, False for "None", None where it printed no such action."""
    value = str(text or "").strip()
    if value == "None":
        return False
    return value if value and any(word in value.lower() for word in RECOVERY_WORDS) and len(value) < 64 else None


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


def _pcie(row: dict, loaded: dict | None) -> dict:
    """The link's most (the GPU's and, where the driver says, the root port's generation) from the health read, and
    its current generation and width only as read under load: "These may be reduced when the GPU is not in use"
    (nvidia-smi documentation, GPU Link Info), so an idle read is neither a finding nor an explanation."""
    current = loaded or {}
    gen = current.get("pcie.link.gen.gpucurrent", current.get("pcie.link.gen.current"))
    return {"gen_current": _one_of(gen, PCIE_GENERATIONS),
            "gen_max": _one_of(row.get("pcie.link.gen.max"), PCIE_GENERATIONS),
            "gen_hostmax": _one_of(row.get("pcie.link.gen.hostmax"), PCIE_GENERATIONS),
            "width_current": _one_of(current.get("pcie.link.width.current"), PCIE_WIDTHS),
            "width_max": _one_of(row.get("pcie.link.width.max"), PCIE_WIDTHS),
            "under_load": loaded is not None}


def _watts(text: object) -> float | None:
    try:
        value = float(str(text or "").strip().removesuffix(" W"))
    except ValueError:
        return None
    return value if 0 < value < MAX_WATTS else None


# NVML's HW slowdown bit (0x8) alone is no finding: --help-query-gpu's clocks_event_reasons.hw_slowdown "May be also
# reported during PState or clock change" (535.129.03, 580.173.02), a transient any read may catch; it is taken for the
# host's only with its cause, HW thermal slowdown (0x40) or HW power brake slowdown (0x80). The event counters that
# could show a lone 0x8 lasting (clocks_event_reasons_counters.*, 580 and later) are not read.
HW_SLOWDOWN, HW_SLOWDOWN_CAUSES = 0x8, 0x40 | 0x80


def _slowdowns(reasons: int | None) -> list[str] | None:
    if reasons is None:
        return None
    if not reasons & HW_SLOWDOWN_CAUSES:
        reasons &= ~HW_SLOWDOWN
    return [why.split(" (")[0] for bit, why in SLOWDOWN_BITS.items() if reasons & bit]


def _under_load(clocks: dict | None) -> dict | None:
    """The clocks as read while matmuls ran on the GPU: its slowdowns, and whether the SW power cap held it under a
    power limit set below the default (None where not read)."""
    if clocks is None:
        return None
    reasons = _bitmask(clocks.get("clocks_event_reasons.active"))
    limit, default = (_watts(clocks.get(field)) for field in POWER_LIMIT_FIELDS)
    capped = None if reasons is None else bool(reasons & SW_POWER_CAP)
    return {"slowdowns": _slowdowns(reasons), "power_limit_w": limit, "default_power_limit_w": default,
            "capped_below_default": bool(capped and limit and default and limit < default) if capped is not None
            else None}


def gpu_health(row: dict, loaded: dict | None = None, clocks: dict | None = None) -> dict:
    """One GPU's health fields as values (None wherever nvidia-smi did not give a usable one); `loaded`: its link's
    fields as read while copies ran on it, `clocks`: its clocks fields as read while matmuls ran on it, where they
    did."""
    reasons = _bitmask(row.get("clocks_event_reasons.active"))
    return {"uuid": str(row.get("uuid") or ""),
            "ecc_mode": _one_of_words(row.get("ecc.mode.current"), ("Enabled", "Disabled")),
            "ecc_uncorrected_volatile": _number(row.get("ecc.errors.uncorrected.volatile.total"), MAX_ERROR_COUNT),
            "retired_pages_pending": _flag(row.get("retired_pages.pending")),
            "remapped_rows_pending": _flag(row.get("remapped_rows.pending")),
            "remapped_rows_failure": _flag(row.get("remapped_rows.failure")),
            "ecc_uncorrected_aggregate": _number(row.get("ecc.errors.uncorrected.aggregate.total"), MAX_ERROR_COUNT),
            "persistence_mode": _flag(row.get("persistence_mode")),
            "reset_required": _flag(row.get("reset_status.reset_required")),
            "drain_and_reset_recommended": _flag(row.get("reset_status.drain_and_reset_recommended")),
            "recovery_action": _recovery(row.get("gpu_recovery_action")),
            # nvidia-smi -q's Virtualization Mode, read only where the remapper answered neither Yes nor No
            "vgpu": (None if row.get("virtualization_mode") in (None, "", "[N/A]")
                     else str(row.get("virtualization_mode")).strip() == VGPU_MODE),
            # c2c.mode: Enabled where NVLink-C2C, not PCIe, carries the GPU's host traffic (GH200, GB200).
            "c2c": {"Enabled": True, "Disabled": False}.get(str(row.get("c2c.mode") or "").strip()),
            "slowdowns": _slowdowns(reasons), "under_load": _under_load(clocks),
            "pcie": _pcie(row, loaded)}


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
    if health["reset_required"]:
        add("reset_status.reset_required", "memory", "the GPU needs a reset (an unrecoverable error occurred)", reset)
    if health["drain_and_reset_recommended"]:
        add("reset_status.drain_and_reset_recommended", "memory",
            "a drain and reset of the GPU is recommended (an unrecoverable error occurred)", reset)
    if health["recovery_action"]:
        add("gpu_recovery_action", "memory", f"nvidia-smi recommends a recovery action: {health['recovery_action']}",
            reset)
    if health["persistence_mode"] is False and health["ecc_uncorrected_aggregate"] and not health[
            "ecc_uncorrected_volatile"]:
        add("ecc.errors.uncorrected.aggregate.total", "memory",
            f"{health['ecc_uncorrected_aggregate']} uncorrected ECC error(s) in the GPU's lifetime, and with persistence "
            "mode off the volatile count restarts with each compute app: whether any came since the driver loaded is "
            "not known",
            "check `nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`; persistence mode on keeps the volatile count")
    if health["remapped_rows_pending"]:
        add("remapped_rows.pending", "memory", "a row remapping is pending (it takes effect at the next GPU reset)",
            reset)
    if health["retired_pages_pending"]:
        add("retired_pages.pending", "memory", "a page retirement is pending (it takes effect when the driver reloads)",
            reset)
    for slowdown in health["slowdowns"] or []:
        add("clocks_event_reasons.active", "clocks", f"the GPU's clocks are held down: {slowdown}", CLOCKS_FIX)
    # Under load: what the idle read could not see (a slowdown seen idle too is found once, above).
    for cause in load_slowdowns(health):
        if not any(slowdown in cause for slowdown in health["slowdowns"] or []):
            add("power.limit" if "power limit" in cause else "clocks_event_reasons.active", "clocks", cause,
                POWER_FIX if "power limit" in cause else CLOCKS_FIX)
    pcie = health["pcie"]
    if pcie["width_current"] and pcie["width_max"] and pcie["width_current"] < pcie["width_max"]:
        add("pcie.link.width.current", "link",
            f"the PCIe link runs x{pcie['width_current']} of x{pcie['width_max']}" + _gen_note(pcie),
            "reseat the GPU or its riser and check the slot's lanes in the BIOS")
    return found


CLOCKS_FIX = "check the node's cooling, power supply and `nvidia-smi -q -d PERFORMANCE`"
POWER_FIX = "restore the GPU's default power limit (`nvidia-smi -q -d POWER` shows both)"


def load_slowdowns(health: dict) -> list[str]:
    """What held one GPU's clocks down while matmuls ran on it: a thermal or power slowdown, or the SW power cap under
    a power limit set below the default (at the default, the cap is the GPU working as designed)."""
    loaded = health.get("under_load") or {}
    causes = [f"under load, the GPU's clocks are held down: {slowdown}" for slowdown in loaded.get("slowdowns") or []]
    if loaded.get("capped_below_default"):
        causes.append(f"under load, the SW power cap holds the clocks at a power limit of {loaded['power_limit_w']} W, "
                      f"set below the default {loaded['default_power_limit_w']} W")
    return causes


def _gen_note(pcie: dict) -> str:
    gen, most = pcie["gen_current"], pcie["gen_max"]
    return f" at gen {gen} of {most}" if gen and most else ""


def _strip(uuid: object) -> str:
    """A UUID as torch prints it: nvidia-smi's without its "GPU-" prefix."""
    return str(uuid or "").strip().removeprefix("GPU-")


def loaded_rows(gpu_facts: dict, key: str = LINK_UNDER_LOAD) -> dict[str, dict]:
    """The fields read under load (the link's unless told), by UUID as torch prints it: cuda:0's only (the copies and
    matmuls ran there), matched by UUID (CUDA's order is not nvidia-smi's), or the only row where the host has one
    GPU."""
    read = gpu_facts.get(key) if isinstance(gpu_facts, dict) else None
    rows = [row for row in read.get("rows") or [] if isinstance(row, dict)] if isinstance(read, dict) else []
    devices = gpu_facts.get("devices") if isinstance(gpu_facts.get("devices"), list) else []
    first = _strip(devices[0].get("uuid")) if devices and isinstance(devices[0], dict) else ""
    row = next((row for row in rows if first and _strip(row.get("uuid")) == first), None)
    row = row or (rows[0] if len(rows) == 1 else None)
    return {_strip(row.get("uuid")): row} if row else {}


def host_health(gpu_facts: dict) -> dict:
    """The host's health for reports: per GPU the values, every finding, and healthy (True, False, or None where
    nothing was read: no nvidia-smi, an older probe's facts, every field unreadable; or where the row remapper was
    never read, so that a GPU out of spare rows is not called healthy)."""
    raw = gpu_facts.get("health") if isinstance(gpu_facts, dict) else None
    rows: list = raw["rows"] if isinstance(raw, dict) and isinstance(raw.get("rows"), list) else []
    loaded = loaded_rows(gpu_facts) if isinstance(gpu_facts, dict) else {}
    clocks = loaded_rows(gpu_facts, CLOCKS_UNDER_LOAD) if isinstance(gpu_facts, dict) else {}
    gpus = [gpu_health(row, loaded.get(_strip(row.get("uuid"))), clocks.get(_strip(row.get("uuid"))))
            for row in rows if isinstance(row, dict)]
    findings = [finding for index, health in enumerate(gpus) for finding in gpu_findings(index, health)]
    unreadable = list(raw.get("unreadable") or []) if isinstance(raw, dict) else []
    read = any(value is not None for health in gpus for key, value in health.items()
               if key not in ("uuid", "pcie", "under_load", "vgpu"))
    # A vGPU guest's remapper answers "[Not Supported]" or "[N/A]": the host's GPU has one, which the guest cannot
    # read, so it is "not readable here", never read and healthy.
    not_here = [f"GPU {index} ({health['uuid'] or 'no UUID'}): the row remapper (a vGPU guest sees none of the host "
                "GPU's)" for index, health in enumerate(gpus)
                if health["vgpu"] and health["remapped_rows_failure"] is None]
    remaps_read = "remapped_rows.failure" not in unreadable and not not_here
    return {"healthy": (not findings if remaps_read else None) if read or findings else None,
            "findings": [finding._asdict() for finding in findings], "gpus": gpus, "unreadable": unreadable,
            "not_readable_here": not_here}


def host_causes(health: dict, kinds: typing.Collection[str], uuids: typing.Collection[str] | None = None) -> list[str]:
    """The findings of these kinds as sentences that charge the host: "host: GPU 0 (GPU-...): cause; fix"; with
    `uuids` (as torch prints them), only those GPUs' findings."""
    wanted = None if uuids is None else {_strip(uuid) for uuid in uuids}
    return [f"host: GPU {finding['gpu']} ({finding['uuid'] or 'no UUID'}): {finding['cause']}; {finding['fix']}"
            for finding in health["findings"] if finding["kind"] in kinds
            and (wanted is None or _strip(finding["uuid"]) in wanted)]


def work_spoilers(health: dict, uuids: typing.Collection[str]) -> list[str]:
    """What excuses failed GPU work on these GPUs (torch's UUIDs): only their own states that spoil new work
    (SPOILS_WORK), never another GPU's, never a pending remap or retirement. With one GPU on the host and a device
    without a UUID, that GPU."""
    wanted = {_strip(uuid) for uuid in uuids if _strip(uuid)}
    if not wanted and len(health["gpus"]) == 1:
        wanted = {_strip(health["gpus"][0]["uuid"])}
    return [f"host: GPU {finding['gpu']} ({finding['uuid'] or 'no UUID'}): {finding['cause']}; {finding['fix']}"
            for finding in health["findings"] if finding["field"] in SPOILS_WORK and _strip(finding["uuid"]) in wanted]


def load_causes(health: dict, uuids: typing.Collection[str]) -> list[str]:
    """What held these GPUs' clocks down under load, as sentences that charge the host: what explains a slow figure
    measured on them. An idle read explains nothing: a GPU idle at the query reports "GPU idle" and no slowdown, and
    the idle read's own slowdowns are warnings, not the cause of a figure measured later."""
    wanted = {_strip(uuid) for uuid in uuids}
    return [f"host: GPU {index} ({gpu['uuid'] or 'no UUID'}): {cause}; "
            f"{POWER_FIX if 'power limit' in cause else CLOCKS_FIX}"
            for index, gpu in enumerate(health["gpus"]) if _strip(gpu["uuid"]) in wanted
            for cause in load_slowdowns(gpu)]


def pcie_below_max(health: dict) -> list[str]:
    """GPUs whose link, read under load, runs below the generation or width both ends allow: what explains slow host
    copies. Idle, a link at a lower generation and width is how a GPU saves power, so only a loaded read counts."""
    causes = []
    for index, gpu in enumerate(health["gpus"]):
        pcie = gpu["pcie"]
        most = min(filter(None, (pcie["gen_max"], pcie["gen_hostmax"])), default=None)
        if (not pcie["under_load"] or None in (pcie["gen_current"], pcie["width_current"], most, pcie["width_max"])
                or (pcie["gen_current"] >= most and pcie["width_current"] >= pcie["width_max"])):
            continue
        causes.append(f"host: GPU {index} ({gpu['uuid'] or 'no UUID'}): the PCIe link runs at gen {pcie['gen_current']} "
                      f"x{pcie['width_current']} under load, of gen {most} x{pcie['width_max']}; reseat the GPU or its "
                      "riser and check the slot's generation and lanes in the BIOS")
    return causes
