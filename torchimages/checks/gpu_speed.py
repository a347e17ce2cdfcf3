"""Speed floors, judged per GPU model: the bf16 matmul against the model's dense peak, pinned host<->device copies
against the PCIe link's rate, and with 2+ GPUs the NCCL all-reduce bus bandwidth against a floor for the topology.
Below a floor, the host's health (gpu_health) says whether the host explains it (a warning charged to the host) or
nothing does (a failure charged to the image).

The measuring half runs in the container with the image's torch (the probe imports it beside its own copy); the
judging half runs on the host side. Standard library only. Each measurement is a handful of repeats of one size,
after a warm-up (its duration on a GPU is not measured; docs/benchmarks.md).
"""
from __future__ import annotations

import math
import re
import subprocess
import time
import typing

try:
    from .gpu_health import host_causes, host_health, load_causes, pcie_below_max
except ImportError:  # beside the probe in a container, a top-level module (verify.container.copy_probe)
    from gpu_health import host_causes, host_health, load_causes, pcie_below_max  # type: ignore[no-redef]

# Dense (no sparsity) BF16 Tensor Core peaks, TFLOPS, by the model torch's device name starts with ("NVIDIA " and the
# model, then the name's end or a character that is no letter or digit: "NVIDIA A100-SXM4-80GB" is an A100, "NVIDIA
# RTX A1000", a 72-Tensor-core GA107 card, is not); the first match wins (H200 NVL before H200). NVIDIA datasheets:
# H100 (SXM5 989.4, PCIe 756.5, NVL 835.5: "H100 Tensor Core GPU" datasheet, BF16 1,979/1,513/1,671 with sparsity,
# halved), H200 and GH200 (H200 datasheet, GH200 datasheet: 989.4 dense; H200 NVL 1,671 with sparsity, 835.5 dense),
# A100 (A100 datasheet: 312), L40S (L40S datasheet: 362.05), L40 (L40 datasheet: 181.05), L4 (L4 datasheet: 121),
# GB200 (GB200 NVL72 datasheet: 360 PFLOPS with sparsity for 72 GPUs, 2,500 dense each), B200 (HGX B200 datasheet:
# 2.25 PFLOPS dense per GPU).
PEAK_BF16_DENSE_TFLOPS = (
    ("GH200", 989.4), ("H200 NVL", 835.5), ("H200", 989.4), ("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H100", 989.4),
    ("A100", 312.0), ("L40S", 362.05), ("L40", 181.05), ("L4", 121.0), ("GB200", 2500.0), ("B200", 2250.0),
)
# Issue 44's floor: half the dense peak. The real H100 SXM gave 794-805 TFLOPS, 80-81% (docs/gpu-records/).
BF16_FLOOR = 0.5
# PCIe bandwidth per lane and direction, GB/s, after line coding: 2.5 and 5 GT/s with 8b/10b, 8 to 32 GT/s with
# 128b/130b (PCI-SIG base specifications 1.0 to 5.0); 64 and 128 GT/s FLIT mode, 242/256 payload (6.0, 7.0).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}
# Pinned copies reach 75-90% of the link on a healthy host (NVIDIA's bandwidthTest on gen4/gen5 x16: 24-26 of 31.5,
# 50-55 of 63 GB/s); half is the floor.
COPY_FLOOR = 0.5
# Boards whose GPUs talk over NVLink through NVSwitch (HGX/DGX SXM boards, Grace superchips); PCIe cards, NVL cards
# included (an NVLink bridge joins pairs only), talk over PCIe.
NVLINK_BOARDS = ("SXM", "H100 80GB HBM3", "H200", "B200", "B300", "GB200", "GH200")
PCIE_BOARDS = (" NVL", "PCIe")
# nccl-tests' all_reduce_perf busbw on an 8-GPU HGX H100 reaches about 450 GB/s with large messages; 100 GB/s at this
# message size, 2 to 8 GPUs, is far below any healthy NVSwitch board and above any PCIe one. Over PCIe, a fifth of one
# link (P2P through the host bridge, or staged through host memory where P2P is off).
ALL_REDUCE_FLOOR_GBPS = {"nvlink": 100.0}
PCIE_ALL_REDUCE_FLOOR = 0.2

# NVLink-C2C, not PCIe, carries a Grace superchip's host copies (nvidia-smi documentation, GPU Link Info: "Not all
# platforms use PCI Express as the primary data path ... such as C2C ... PCIe metrics here may not be representative").
# Named here for drivers that do not answer c2c.mode: GH200 (450 GB/s per direction), GB200, GB300.
C2C_BOARDS = ("GH200", "GB200", "GB300")
# cuda:0's link as nvidia-smi reads it while copies load it (gpu_health.LINK_UNDER_LOAD); one call, bounded. The
# generation by the name --help-query-gpu prefers ("pcie.link.gen.current ... Deprecated, use pcie.link.gen.gpucurrent
# instead": 535.129.03, 580.173.02, 590.48.01), asked again by the older name where a driver refuses it.
LINK_QUERY = ("uuid", "pcie.link.gen.gpucurrent", "pcie.link.width.current")
LINK_ALIAS = {"pcie.link.gen.gpucurrent": "pcie.link.gen.current"}
LINK_READ_TIMEOUT_S = 10
# The GPUs' clocks event reasons and power limits as nvidia-smi reads them while a bf16 matmul loads cuda:0
# (gpu_health.CLOCKS_UNDER_LOAD): idle, a GPU reports "GPU idle" (0x1) and no slowdown a failing cooler or a lowered
# power limit (`nvidia-smi -pl`) causes under load. power.limit and power.default_limit (--help-query-gpu) tell a
# lowered limit from the GPU at its design limit.
CLOCKS_QUERY = ("uuid", "clocks_event_reasons.active", "power.limit", "power.default_limit")
CLOCKS_ALIAS = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}  # its name before driver 535

COPY_BYTES = 256 << 20
COPY_REPEATS = 5
# The all-reduce's message per GPU: 1 GiB where every GPU has four times that free (the input, NCCL's own buffers and
# room for the rest of the probe), never less than 64 MiB. nccl-tests' all_reduce_perf busbw keeps rising with the
# message size into the GiB range on NVSwitch boards (its usual sweep runs -b 8 -e 8G, and HGX H100 figures of ~450
# GB/s are quoted at 8 GiB); at 64 MiB, a few milliseconds on NVSwitch, the figure is below that plateau. Even at 1 GiB
# it is this message size's bus bandwidth, not the fabric's peak, and the report says which size it timed.
ALL_REDUCE_BYTES = 1 << 30
ALL_REDUCE_MIN_BYTES = 64 << 20
ALL_REDUCE_REPEATS = 5


# A vGPU guest's device: "GRID A100D-20C" (a time-sliced profile: the VM's share of the GPU's time) or "GRID
# A100D-1-10C" (MIG-backed: one slice's SMs), named by the profile: the model, the frame buffer in GB, a MIG slice's
# size, and the series letter (NVIDIA vGPU documentation, virtual GPU types: A, B, C, Q). nvidia-smi in a guest prints
# Product Name "GRID A100-4C", Virtualization Mode "VGPU".
VGPU_NAME = re.compile(r"^GRID |-\d+(?:-\d+)?[ABCQ]$")


def shared_device(device_name: str) -> str:
    """Why the device is a share of a GPU, not a whole one (a MIG slice, a vGPU profile), or ""."""
    if " MIG " in device_name:
        return "a MIG slice has part of the GPU's SMs"
    if VGPU_NAME.search(device_name.strip()):
        return "a vGPU profile has a share of the GPU's time or one MIG slice's SMs"
    return ""


def peak_tflops(device_name: str) -> float | None:
    """The device's dense bf16 peak: the model named exactly; None for a share of a GPU (shared_device), which has a
    part of the GPU's SMs or time, not its peak, and for a model the table lacks."""
    if shared_device(device_name):
        return None
    name = device_name.strip().removeprefix("NVIDIA ")
    return next((peak for part, peak in PEAK_BF16_DENSE_TFLOPS
                 if re.match(re.escape(part) + r"(?![A-Za-z0-9])", name)), None)


# ---------------------------------------------------------------- measured in the container

def _gbps(torch, work: typing.Callable[[], object], nbytes: int, repeats: int, devices: int = 1) -> float:
    """GB/s (10^9) of `work` moving nbytes, after one warm-up run, every device synchronised."""
    def synchronise() -> None:
        for index in range(devices):
            torch.cuda.synchronize(index)

    work()
    synchronise()
    started = time.perf_counter()
    for _ in range(repeats):
        work()
    synchronise()
    return round(nbytes * repeats / (time.perf_counter() - started) / 1e9, 2)


def pinned_copy_bandwidth(torch) -> dict:
    """Host-to-device and device-to-host copies of pinned memory on cuda:0, as a DataLoader with pin_memory does."""
    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda:0")
    h2d = _gbps(torch, lambda: device.copy_(host, non_blocking=True), COPY_BYTES, COPY_REPEATS)
    d2h = _gbps(torch, lambda: host.copy_(device, non_blocking=True), COPY_BYTES, COPY_REPEATS)
    return {"ok": True, "bytes": COPY_BYTES, "repeats": COPY_REPEATS, "h2d_gbps": h2d, "d2h_gbps": d2h}


def link_under_load(torch, smi: str | None) -> dict:
    """cuda:0's PCIe link as nvidia-smi reads it while pinned host-to-device copies run on it. Idle, a GPU lowers its
    link's generation and width to save power ("These may be reduced when the GPU is not in use": nvidia-smi
    documentation, GPU Link Info), so only a read under load says what the link carries."""
    if not smi:
        return {"ok": True, "not_read": "no nvidia-smi in the container"}
    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda:0")

    def load() -> None:
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize(0)

    load()  # the link trains up before nvidia-smi starts reading
    return read_link_under_load(smi, load)


def read_link_under_load(smi: str, load: typing.Callable[[], None], env: dict | None = None) -> dict:
    """LINK_QUERY while `load` runs; where the driver refuses pcie.link.gen.gpucurrent, again under its older name
    (the rows keep the newer)."""
    return _with_older_names(smi, load, env, LINK_QUERY, LINK_ALIAS)


def clocks_under_load(torch, smi: str | None, size: int = 8192) -> dict:
    """Every GPU's clocks event reasons and power limits as nvidia-smi reads them while bf16 matmuls run on cuda:0,
    after the timed ones: a slowdown the load brings (a failing cooler, a lowered power limit) shows only here."""
    if not smi:
        return {"ok": True, "not_read": "no nvidia-smi in the container"}
    a = torch.randn(size, size, device="cuda:0", dtype=torch.bfloat16)

    def load() -> None:
        a @ a
        torch.cuda.synchronize(0)

    load()
    return read_clocks_while(smi, load)


def read_clocks_while(smi: str, load: typing.Callable[[], None], env: dict | None = None) -> dict:
    """CLOCKS_QUERY per GPU while `load` runs; where the driver predates the clocks_event_reasons names, again under
    their older clocks_throttle_reasons names (the rows keep the newer)."""
    return _with_older_names(smi, load, env, CLOCKS_QUERY, CLOCKS_ALIAS)


def _with_older_names(smi: str, load: typing.Callable[[], None], env: dict | None, fields: tuple[str, ...],
                      aliases: dict[str, str]) -> dict:
    read = read_link_while(smi, load, env, fields)
    if not read["ok"] and "is not a valid field" in read["error"]:
        read = read_link_while(smi, load, env, tuple(aliases.get(field, field) for field in fields))
        renamed = {alias: field for field, alias in aliases.items()}
        read["rows"] = [{renamed.get(key, key): value for key, value in row.items()} for row in read.get("rows", [])]
    return read


def read_link_while(smi: str, load: typing.Callable[[], None], env: dict | None = None,
                    fields: tuple[str, ...] = LINK_QUERY) -> dict:
    """nvidia-smi's fields per GPU (the link's unless told), asked while `load` runs again and again (at most
    LINK_READ_TIMEOUT_S)."""
    query = subprocess.Popen([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + LINK_READ_TIMEOUT_S
    while query.poll() is None and time.monotonic() < deadline:
        load()
    try:
        output = query.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
    except subprocess.TimeoutExpired:
        query.kill()
        query.communicate()
        return {"ok": False, "error": f"nvidia-smi did not answer in {LINK_READ_TIMEOUT_S}s"}
    rows = [[value.strip() for value in line.split(",")] for line in output.splitlines() if line.strip()]
    if query.returncode or not rows or any(len(row) != len(fields) for row in rows):
        return {"ok": False, "error": f"nvidia-smi exit {query.returncode}: {output.strip()[-300:]}"}
    return {"ok": True, "device": "cuda:0", "rows": [dict(zip(fields, row, strict=True)) for row in rows]}


def all_reduce_bytes(torch, count: int) -> int:
    """ALL_REDUCE_BYTES, or a quarter of the least free memory of the GPUs (torch.cuda.mem_get_info) where that is
    less, in whole MiB, never under ALL_REDUCE_MIN_BYTES; ALL_REDUCE_MIN_BYTES where free memory is not known."""
    try:
        free = min(int(torch.cuda.mem_get_info(index)[0]) for index in range(count))
    except Exception:  # noqa: BLE001 - a torch without mem_get_info, or a device that cannot say: the smaller size
        return ALL_REDUCE_MIN_BYTES
    return max(ALL_REDUCE_MIN_BYTES, min(ALL_REDUCE_BYTES, free // 4 >> 20 << 20))


def all_reduce_bus_bandwidth(torch, count: int) -> dict:
    """NCCL all-reduce of float32 tensors, one per GPU: algorithm bandwidth (bytes per GPU / time) and bus bandwidth,
    nccl-tests' busbw = algbw * 2(n-1)/n (NVIDIA/nccl-tests doc/PERFORMANCE.md), which compares across GPU counts."""
    nbytes = all_reduce_bytes(torch, count)
    tensors = [torch.ones(nbytes // 4, device=f"cuda:{index}") for index in range(count)]
    algbw = _gbps(torch, lambda: torch.cuda.nccl.all_reduce(tensors), nbytes, ALL_REDUCE_REPEATS, count)
    return {"ok": True, "bytes": nbytes, "repeats": ALL_REDUCE_REPEATS, "gpus": count, "algbw_gbps": algbw,
            "busbw_gbps": round(algbw * 2 * (count - 1) / count, 2)}


# ---------------------------------------------------------------- judged on the host side

class Shortfall(typing.NamedTuple):
    what: str  # the figure against its floor, in a sentence
    host: list[str]  # the host findings that explain it; none: the image is charged


def _figure(value: object) -> float | None:
    """A measured figure, or None: not a number, not above zero, or not finite (JSON's Infinity parses)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _section(gpu: dict, name: str) -> dict:
    value = gpu.get(name)
    return value if isinstance(value, dict) else {}


def _first_device(gpu: dict) -> dict:
    devices = gpu.get("devices")
    return devices[0] if isinstance(devices, list) and devices and isinstance(devices[0], dict) else {}


def bf16_figure(gpu: dict, health: dict | None = None) -> dict:
    """The bf16 matmul on cuda:0 against its model's dense peak (none known: not judged; none for a vGPU, known by
    nvidia-smi's Virtualization Mode "VGPU" as well as by its profile's name)."""
    tflops = _figure(_section(gpu, "bf16_matmul").get("tflops"))
    name = str(_first_device(gpu).get("name") or "")
    row = _health_row(gpu, health if health is not None else host_health(gpu))
    peak = None if row and row.get("vgpu") else peak_tflops(name)
    figure = {"tflops": tflops, "device": name, "peak_tflops": peak, "floor": BF16_FLOOR}
    figure["ratio"] = round(tflops / peak, 3) if tflops and peak else None
    return figure


def _health_row(gpu: dict, health: dict) -> dict | None:
    """cuda:0's health from the row with its UUID (CUDA's order is not nvidia-smi's), or the only row."""
    rows = health.get("gpus") or []
    uuid = str(_first_device(gpu).get("uuid") or "").removeprefix("GPU-")
    row = next((row for row in rows if uuid and row["uuid"].removeprefix("GPU-") == uuid), None)
    return row or (rows[0] if len(rows) == 1 else None)


def _cuda0(gpu: dict, health: dict) -> list[str] | None:
    """cuda:0's UUID, whose health alone explains the figures measured on it; None where unknown (every GPU's)."""
    row = _health_row(gpu, health)
    return [row["uuid"]] if row and row["uuid"] else None


def host_link(gpu: dict, health: dict) -> str:
    """What carries cuda:0's host copies: "c2c" where c2c.mode says Enabled or the board is a Grace superchip, else
    "pcie"."""
    row = _health_row(gpu, health)
    name = str(_first_device(gpu).get("name") or "")
    c2c = row.get("c2c") if row else None
    return "c2c" if c2c or (c2c is None and any(board in name for board in C2C_BOARDS)) else "pcie"


def link_of(gpu: dict, health: dict) -> dict | None:
    """cuda:0's PCIe path: the least of the GPU's link generation and the root port's (pcie.link.gen.hostmax, where the
    driver says), at the GPU's width; None where unknown or absurd, or where C2C carries the copies."""
    row = _health_row(gpu, health)
    if row is None or None in (row["pcie"]["gen_max"], row["pcie"]["width_max"]) or host_link(gpu, health) == "c2c":
        return None
    gen = min(filter(None, (row["pcie"]["gen_max"], row["pcie"].get("gen_hostmax"))))
    width = row["pcie"]["width_max"]
    return {"gen": gen, "width": width, "gbps": round(PCIE_LANE_GBPS[gen] * width, 2)}


def copy_figure(gpu: dict, health: dict) -> dict:
    copies = _section(gpu, "copy_bandwidth")
    link = link_of(gpu, health)
    return {"h2d_gbps": _figure(copies.get("h2d_gbps")), "d2h_gbps": _figure(copies.get("d2h_gbps")),
            "host_link": host_link(gpu, health), "link": link, "floor": COPY_FLOOR}


def every_pair_has_peer_access(gpu: dict) -> bool:
    """Whether CUDA said every ordered pair of GPUs can reach the other's memory (the probe's own
    torch.cuda.can_device_access_peer, multi_gpu.peer_access); False where any pair cannot or it was not recorded."""
    peers = _section(_section(gpu, "multi_gpu"), "peer_access")
    return bool(peers) and all(value is True for value in peers.values())


def topology(gpu: dict) -> str:
    """nvlink where every device is an NVSwitch board's and every pair has peer access, else pcie. The names alone do
    not say it: two GH200 superchips joined on the CPU side have no GPU peer path (topology SYS, `nvidia-smi topo -p2p
    n`: dnhkng.github.io/posts/gh200-benchmarking), and their all-reduce crosses the Grace CPUs."""
    devices: list = gpu["devices"] if isinstance(gpu.get("devices"), list) else []
    names = [str(device.get("name") or "") for device in devices if isinstance(device, dict)]
    nvlink = names and all(any(part in name for part in NVLINK_BOARDS)
                           and not any(part in name for part in PCIE_BOARDS) for name in names)
    return "nvlink" if nvlink and every_pair_has_peer_access(gpu) else "pcie"


def all_reduce_figure(gpu: dict, health: dict) -> dict:
    measured = _section(_section(gpu, "multi_gpu"), "bandwidth")
    kind = topology(gpu)
    link = link_of(gpu, health)
    floor = ALL_REDUCE_FLOOR_GBPS.get(kind) or (round(link["gbps"] * PCIE_ALL_REDUCE_FLOOR, 2) if link else None)
    nbytes = measured.get("bytes")
    return {"busbw_gbps": _figure(measured.get("busbw_gbps")), "gpus": measured.get("gpus"), "topology": kind,
            "floor_gbps": floor, "bytes": nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) else None}


def bf16_shortfall(gpu: dict, health: dict) -> Shortfall | None:
    figure = bf16_figure(gpu, health)
    if figure["ratio"] is None or figure["ratio"] >= BF16_FLOOR:
        return None
    return Shortfall(f"the bf16 matmul ran at {figure['tflops']} TFLOPS, {figure['ratio']:.0%} of {figure['device']}'s "
                     f"{figure['peak_tflops']} dense peak, below the {BF16_FLOOR:.0%} floor",
                     load_causes(health, _cuda0(gpu, health) or []))


def copy_shortfall(gpu: dict, health: dict) -> Shortfall | None:
    figure = copy_figure(gpu, health)
    link = figure["link"]
    slow = [f"{name} {figure[key]} GB/s" for name, key in (("host-to-device", "h2d_gbps"), ("device-to-host", "d2h_gbps"))
            if link and figure[key] is not None and figure[key] < COPY_FLOOR * link["gbps"]]
    if not slow:
        return None
    return Shortfall(f"pinned copies ran at {' and '.join(slow)}, below {COPY_FLOOR:.0%} of the PCIe gen "
                     f"{link['gen']} x{link['width']} link's {link['gbps']} GB/s",
                     host_causes(health, ("link",), _cuda0(gpu, health)) or pcie_below_max(health))


def all_reduce_shortfall(gpu: dict, health: dict) -> Shortfall | None:
    figure = all_reduce_figure(gpu, health)
    if figure["busbw_gbps"] is None or figure["floor_gbps"] is None or figure["busbw_gbps"] >= figure["floor_gbps"]:
        return None
    # Nothing of the host's health is read while the all-reduce runs (its own process, after the matmul and copies):
    # an idle read explains none of it (a GPU idle at the query reports "GPU idle" and its link at rest), so the host
    # is charged only where a read under load says so: over PCIe, cuda:0's link as read while copies ran on it. NVLink
    # carries an NVSwitch board's all-reduce: its PCIe links explain nothing of it (an image that disables P2P,
    # NCCL_P2P_DISABLE=1, stages it through host memory: NCCL documentation, SHM transport).
    causes = pcie_below_max(health) if figure["topology"] == "pcie" else []
    size = f" of {figure['bytes'] >> 20} MiB per GPU" if figure["bytes"] else ""
    return Shortfall(f"the NCCL all-reduce{size} across {figure['gpus']} GPUs ran at a bus bandwidth of "
                     f"{figure['busbw_gbps']} GB/s, below the {figure['floor_gbps']} GB/s floor for "
                     f"{figure['topology']} GPUs (nothing of the host's health was read while it ran)", causes)


def performance(gpu: dict, health: dict) -> dict:
    """The figures and their floors, for the signed report and the catalog; each with its verdict: ok, host (below
    its floor, explained by the host's health), image (below, unexplained) or not judged (no figure or no floor)."""
    def verdict(figure_known: bool, shortfall: Shortfall | None) -> str:
        return "not judged" if not figure_known else "ok" if shortfall is None else "host" if shortfall.host else "image"

    bf16, copies, reduce = bf16_figure(gpu, health), copy_figure(gpu, health), all_reduce_figure(gpu, health)
    bf16["verdict"] = verdict(bf16["ratio"] is not None, bf16_shortfall(gpu, health))
    copies["verdict"] = verdict(bool(copies["link"]) and copies["h2d_gbps"] is not None, copy_shortfall(gpu, health))
    reduce["verdict"] = verdict(None not in (reduce["busbw_gbps"], reduce["floor_gbps"]), all_reduce_shortfall(gpu, health))
    return {"bf16_matmul": bf16, "pinned_copies": copies, "all_reduce": reduce}


def host_report(gpu: dict) -> dict:
    """The host's health and the speed figures with their verdicts, from the probe's GPU facts: what verify.json, the
    signed verification report, the catalog and gpu-record's line carry."""
    gpu = gpu if isinstance(gpu, dict) else {}
    health = host_health(gpu)
    return {"health": health, "performance": performance(gpu, health)}
