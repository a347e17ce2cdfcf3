"""Before a long build or a 6 GB pull: what this host can do with the selected rows.

The engine answers; it holds the base images the rows build FROM (or says how to pull or make them); the build's pip
reaches the rows' indexes, or a wheelhouse holds their wheels; it can give containers GPUs; its disk holds the
images; it finds unpigz for gzip layers; skopeo is there for publishing; and, on a GPU host, each GPU row's minimum driver and arch list fit this host's driver and every GPU's compute capability
(which is what "no kernel image is available" and "CUDA driver version is insufficient" mean at run time).
"""
from __future__ import annotations

import contextlib
import os
import platform
import re
import selectors
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..checks.gpu_health import host_causes, host_health, read_health
from ..checks.rules import PROHIBITED_COMPUTE_MODE, arch_covers, arch_flags_for, parse_nvidia_smi_list
from ..checks.suite.helpers import driver_start_failure, driver_verdict, ptx_only_without_jit
from ..invocation import command
from ..model import ImageSpec, InputError, parse_size
from ..peers import engine
from ..redaction import Secrets, inert
from ..reporting import human_size
from . import offline_base, wheels
from .builder import base_reference, local_name
from .context import wheel_dir

NVIDIA_SMI_QUERY = ["--query-gpu=name,compute_cap,driver_version,compute_mode,mig.mode.current", "--format=csv,noheader"]
# A driver that does not know a field refuses the whole query ('Field "mig.mode.current" is not a valid field to
# query.', exit 2): asked again without the optional fields, the GPUs are still known.
NVIDIA_SMI_BASE_QUERY = ["--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]
UNKNOWN_FIELD = "is not a valid field to query"
NVIDIA_SMI_TIMEOUT_S = 30
# What nvidia-smi may say: a line per GPU (an 8-GPU node says under 1 KiB); more is not a driver's answer, and a host
# with more GPUs than this is not one host.
NVIDIA_SMI_MAX_BYTES = 1 << 20
MAX_HOST_GPUS = 64
GPU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,95}", re.ASCII)
DRIVER_VERSION = re.compile(r"[0-9]{2,4}(\.[0-9]{1,3}){1,2}", re.ASCII)
CAPABILITY = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})", re.ASCII)
COMPUTE_MODES = {"Default", "Exclusive_Process", "Exclusive_Thread", "Prohibited"}
MIG_MODES = {"Enabled", "Disabled"}
NOT_REPORTED = "[N/A]"  # what nvidia-smi prints for a field a GPU lacks; also ours for "[Not Supported]", garbage
# The PATH systemd gives a service that sets none (systemd.exec(5)): where dockerd and containerd look for unpigz.
DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# dockerd decompresses gzip layers with unpigz when it finds it on its PATH (moby pkg/archive gzDecompress), else
# with Go's gzip. Measured on the CUDA 13.0 runtime image (docs/benchmarks-log.md, "Cold start and republish").
UNPIGZ_MEASURED = ("`docker pull` of the 6.1 GB CUDA 13.0 runtime image took 59.4 s with Go's gzip and 52.1 s with "
                   "unpigz (0.88x; 2 cores, Docker 20.10, docs/benchmarks-log.md)")


@dataclass(frozen=True)
class Finding:
    subject: str  # what was looked at: "engine", "disk", a tag
    status: str  # ok | warn (works, with a limit worth knowing) | fail (will not work as it is)
    detail: str  # what was found, and the fix when it is not ok


@dataclass(frozen=True)
class HostGpu:
    name: str
    capability: tuple[int, int]  # compute capability (9, 0)
    driver: str  # "580.65.06"
    compute_mode: str = NOT_REPORTED  # compute_mode: Default, Exclusive_Process, Prohibited, [N/A] (not reported)
    mig_mode: str = NOT_REPORTED  # mig.mode.current: Enabled, Disabled, [N/A] (no MIG, or not reported)


# ------------------------------------------------------------------------------------------------ pure decisions

def parse_nvidia_smi(output: str) -> list[HostGpu]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version[,compute_mode[,mig.mode.current]]
    --format=csv,noheader` -> the host's GPUs. A GPU needs its name, capability and driver; a mode that is missing,
    [N/A], [Not Supported] or anything else is "not reported", which limits nothing."""
    gpus = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if not 3 <= len(parts) <= 5:
            continue
        name, capability, driver, *modes = parts
        version = CAPABILITY.fullmatch(capability)
        # Each value checked for its shape: it is printed, compared and put in messages.
        if GPU_NAME.fullmatch(name) and version and DRIVER_VERSION.fullmatch(driver):
            compute, mig = (modes + [NOT_REPORTED] * 2)[:2]
            gpus.append(HostGpu(name, (int(version[1]), int(version[2])), driver,
                                compute if compute in COMPUTE_MODES else NOT_REPORTED,
                                mig if mig in MIG_MODES else NOT_REPORTED))
    return gpus


def mig_finding(gpus: list[HostGpu], mig_devices: dict[str, list[str]] | None) -> Finding | None:
    """GPUs in MIG mode with no MIG device made on them (`nvidia-smi -L` lists none under them): no CUDA work runs
    there until one is made (NVIDIA MIG User Guide, "Getting Started with MIG"; instances do not survive a reboot).
    None where the listing could not be read: doctor does not guess."""
    if mig_devices is None:
        return None
    bare = [str(index) for index, gpu in enumerate(gpus) if gpu.mig_mode == "Enabled" and str(index) not in mig_devices]
    if not bare:
        return None
    named = ", ".join(f"GPU {index} ({gpus[int(index)].name})" for index in bare)
    return Finding("host gpus", "warn", f"{named} in MIG mode with no MIG device made on it: no container can run CUDA "
                                        "there (verification skips the GPU checks, naming it); create one "
                                        f"(`nvidia-smi mig -i {','.join(bare)} -cgi <profile> -C`, or start "
                                        "nvidia-mig-manager after a reboot) and give containers its MIG-<uuid> from "
                                        "`nvidia-smi -L`, or take the GPU out of MIG mode")


def compute_mode_finding(gpus: list[HostGpu]) -> Finding | None:
    """GPUs no container can use (Prohibited compute mode): their GPU checks would be skipped, never passed."""
    indices = [str(index) for index, gpu in enumerate(gpus) if gpu.compute_mode == PROHIBITED_COMPUTE_MODE]
    if not indices:
        return None
    prohibited = ", ".join(f"GPU {index} ({gpus[int(index)].name})" for index in indices)
    # doctor reads the host's own nvidia-smi: its indices are the host's, which `nvidia-smi -i` takes as a list.
    return Finding("host gpus", "warn", f"{prohibited} in Prohibited compute mode: no process may use it, so "
                                        "verification skips the GPU checks while it is given to the container; use "
                                        f"--gpus device=<the others>, or `nvidia-smi -i {','.join(indices)} -c DEFAULT`")


# The driver libraries a CDI spec names by version (`nvidia-ctk cdi generate` mounts libcuda.so.<driver>,
# libnvidia-ml.so.<driver>): another version than the loaded driver's is a spec made before a driver upgrade.
CDI_DRIVER_LIBRARY = re.compile(r"lib(?:cuda|nvidia-ml)\.so\.([0-9]{2,4}\.[0-9]{1,3}(?:\.[0-9]{1,3})?)\b", re.ASCII)


def cdi_spec_finding(specs: dict[str, str], driver: str) -> Finding | None:
    """A CDI spec ({path: text}) whose driver libraries are not the host driver's: GPU containers started through it
    fail mounting files that are gone ("no such file or directory"). NVIDIA: "If you change the device or CUDA driver
    configuration, you must generate a new CDI specification" (Container Toolkit, "Support for Container Device
    Interface"; NVIDIA/nvidia-container-toolkit#450)."""
    stale = {path: sorted(set(CDI_DRIVER_LIBRARY.findall(text)) - {driver}) for path, text in specs.items()}
    stale = {path: versions for path, versions in stale.items() if versions}
    if not stale:
        return None
    named = "; ".join(f"{inert(path)} names driver {', '.join(versions)}" for path, versions in stale.items())
    return Finding("cdi spec", "warn", f"{named}, but the host driver is {driver}: a GPU container started through CDI "
                                      "fails mounting the old driver's files; regenerate the spec (`nvidia-ctk cdi "
                                      "generate --output=/etc/cdi/nvidia.yaml`, or `systemctl restart "
                                      "nvidia-cdi-refresh`)")


def host_cdi_specs() -> dict[str, str]:
    """This host's NVIDIA CDI specs, by path (the folders `nvidia-ctk cdi generate` and nvidia-cdi-refresh write)."""
    texts = {}
    for path in engine.nvidia_cdi_specs(engine.CDI_DEFAULT_DIRS):
        with contextlib.suppress(OSError):
            texts[path] = Path(path).read_text(errors="replace")
    return texts


# Where the kernel lists the interpreters it runs foreign binaries with (qemu-aarch64 after `make engine`).
BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
# `uname -m` and Docker's Architecture spell the same machines two ways.
MACHINE_NAMES = {"amd64": "x86_64", "arm64": "aarch64"}


def machine_name(text: str) -> str:
    return MACHINE_NAMES.get(text.lower(), text.lower())


def arch_findings(specs: list[ImageSpec], machine: str, emulated: frozenset[str] = frozenset()) -> list[Finding]:
    """Rows built for another CPU architecture than this host's: their images fail at exec, or run under qemu where
    it is registered for their machine (`emulated`: an x86_64 host after `make engine`), and a local build would
    fetch the other architecture's wheels (a GH200 or GB200 host is aarch64)."""
    host = machine_name(machine)
    fitting = [spec.tag for spec in specs if machine_name(spec.arch) == host]
    findings = []
    for spec in (spec for spec in specs if machine_name(spec.arch) != host):
        if spec.arch in emulated:
            findings.append(Finding(spec.tag, "warn", f"built for {spec.arch}: this {host} host builds and runs it "
                                                      f"under qemu (binfmt_misc), slowly; its GPU checks need an "
                                                      f"{spec.arch} GPU host"))
            continue
        findings.append(Finding(spec.tag, "fail", f"built for {spec.arch}, but this host is {host}: its image "
                                                  f"cannot run here; rows for {host}: "
                                                  f"{', '.join(fitting) or f'none in the matrix (add a variant with arch: {host})'}"))
    return findings


def emulated_machines(binfmt_misc: Path = BINFMT_MISC) -> frozenset[str]:
    """The machines qemu is registered for on this host (the engine's, when it is local as `make engine`'s is)."""
    try:
        entries = list(binfmt_misc.glob("qemu-*"))
    except OSError:
        return frozenset()
    return frozenset(entry.name.removeprefix("qemu-") for entry in entries
                     if entry.is_file() and _enabled(entry))


def _enabled(entry: Path) -> bool:
    try:
        return entry.read_text(errors="replace").startswith("enabled")
    except OSError:
        return False


def row_findings(spec: ImageSpec, gpus: list[HostGpu], specs: list[ImageSpec]) -> list[Finding]:
    """Whether a GPU row runs on these GPUs: the driver meets its floor (a warning below the release's own driver),
    its arch list covers every GPU."""
    if not spec.is_gpu or not gpus:
        return []
    findings = []
    driver = gpus[0].driver
    status, why = driver_verdict(driver, None, spec)
    if status == "fail":
        fitting = [other.tag for other in _same_machine(spec, specs)
                   if other.is_gpu and driver_verdict(driver, None, other)[0] != "fail"]
        findings.append(Finding(spec.tag, "fail", f"{why}: upgrade the driver, or use a row built for an older CUDA "
                                                  f"({', '.join(fitting) or 'none in the matrix'})"))
    elif status == "warn":
        findings.append(Finding(spec.tag, "warn", why))
    for gpu in sorted(set(gpus), key=lambda gpu: gpu.capability):
        coverage = arch_covers(arch_flags_for(spec.arch_list), gpu.capability, spec.cuda)
        if ptx_only_without_jit(coverage, status):
            findings.append(Finding(spec.tag, "fail", f"the {gpu.name} is covered only by {coverage}, and the driver "
                                                      f"{driver} is older than CUDA {spec.cuda}'s own "
                                                      f"({spec.min_driver}): it cannot JIT-compile that PTX, so nothing "
                                                      f"runs on this GPU; upgrade the driver to {spec.min_driver}+"))
        if coverage is None:
            sm = f"sm_{gpu.capability[0]}{gpu.capability[1]}"
            covering = [other.tag for other in _same_machine(spec, specs)
                        if other.is_gpu and arch_covers(arch_flags_for(other.arch_list), gpu.capability, other.cuda)]
            findings.append(Finding(spec.tag, "fail", f"its arch list ({';'.join(spec.arch_list)}) has no kernels for "
                                                      f"the {gpu.name} ({sm}): torch would fail with 'no kernel image "
                                                      f"is available'; rows that cover {sm}: "
                                                      f"{', '.join(covering) or 'none in the matrix'}"))
    if not findings:
        findings.append(Finding(spec.tag, "ok", f"{why}; kernels for {', '.join(sorted({gpu.name for gpu in gpus}))}"))
    return findings


def _same_machine(spec: ImageSpec, specs: list[ImageSpec]) -> list[ImageSpec]:
    """The rows a user of this row's host could take instead: an aarch64 row's own arch list is not x86_64's."""
    return [other for other in specs if other.arch == spec.arch]


def gpu_access_finding(access: engine.GpuAccess) -> Finding:
    """Which path (the NVIDIA runtime's --gpus, or CDI) the engine offers for GPUs, or how to get one."""
    if not access.path:
        return Finding("gpu runtime", "warn", f"{access.why}. Until then, GPU rows build and pass their static checks "
                                              "here, and their GPU checks are skipped with the reason")
    return Finding("gpu runtime", "ok", f"the engine gives containers GPUs {access.why}")


def disk_finding(free: int, to_build: list[ImageSpec]) -> Finding:
    """Room for the rows not built yet: at most their size budgets, plus the largest once more for its build stage
    (at most: rows of one torch and CUDA share most of their layers)."""
    budgets = [parse_size(spec.size_budget) for spec in to_build if spec.size_budget]
    needed = int(sum(budgets) + max(budgets, default=0))
    unbuilt = "the row not built yet" if len(to_build) == 1 else f"the {len(to_build)} rows not built yet"
    if needed and free < needed:
        return Finding("disk", "warn", f"{human_size(free)} free where the engine keeps images; {unbuilt} may need up "
                                       f"to {human_size(needed)} (size budgets and one build stage, less the layers "
                                       f"rows share): free space (`docker image prune`), or build fewer rows at once")
    return Finding("disk", "ok", f"{human_size(free)} free" + (f", at most {human_size(needed)} needed for {unbuilt}"
                                                                if needed else ""))


def gzip_finding(unpigz: str | None) -> Finding:
    """Whether the engine decompresses the gzip layers of a pull (every default publish) with unpigz."""
    if unpigz is None:
        return Finding("gzip layers", "warn", f"no unpigz on the engine's PATH ({DAEMON_PATH}): dockerd decompresses "
                                              f"gzip layers with Go's gzip, slower: {UNPIGZ_MEASURED}; install pigz "
                                              "(apt-get install pigz, dnf install pigz) and restart dockerd")
    return Finding("gzip layers", "ok", f"{unpigz} decompresses gzip layers for dockerd and containerd")


def _rows(specs: list[ImageSpec]) -> str:
    """The rows a finding is about: named where there are a few, counted where there are many."""
    tags = [spec.tag for spec in specs]
    return ", ".join(tags) if len(tags) <= 3 else f"{len(tags)} rows ({tags[0]}, …)"


def _selector(specs: list[ImageSpec]) -> str:
    return " ".join(f"'{spec.tag}'" for spec in specs)


def base_findings(specs: list[ImageSpec], images_dir: Path | None,
                  image_id: Callable[[str], str | None]) -> list[Finding]:
    """Each base the rows would build FROM (the rendered Dockerfile's, a lock-pinned digest where there is one): on
    the engine, or absent with how to pull or make it. Absent is a failure: the build fails at once without it
    (unless --pull reaches its registry)."""
    by_base: dict[str, list[ImageSpec]] = {}
    for spec in specs:
        try:
            reference = base_reference(spec, images_dir) if images_dir is not None else spec.base_image
        except InputError:  # not rendered yet: the matrix's base is what render will write
            reference = spec.base_image
        by_base.setdefault(reference, []).append(spec)
    findings = []
    for reference, rows in by_base.items():
        found = image_id(reference)
        if found:
            findings.append(Finding("base images", "ok", f"{reference} is on the engine (image {found[:19]}), for "
                                                         f"{_rows(rows)}"))
            continue
        findings.append(Finding("base images", "fail", f"{reference} is not on the engine, and {_rows(rows)} "
                                                       f"build{'s' if len(rows) == 1 else ''} FROM it: "
                                                       f"{base_remedy(reference, rows[0].base_image)}"))
    return findings


def base_remedy(reference: str, name: str) -> str:
    """How to get a missing base: pull it where its registry answers; else make it offline, with `torchimages base`
    where that makes it, or by hand as the docs say."""
    pull = f"pull it where its registry is reachable (`docker pull {reference}`, or build with --pull)"
    try:
        offline_base.parse_base(name)
    except InputError:
        return f"{pull}; with no registry, make {name} as docs/building.md, \"Offline bases\", says"
    made = f"{command(f'base {name}')} (root, debootstrap)"
    if "@sha256:" in reference:
        return f"{pull}; with no registry, make {name} with {made} and pin it again ({command('lock')})"
    return f"{pull}; with no registry, make it with {made}"


# ------------------------------------------------------------------------------------------------------ the wheels

def wheel_findings(specs: list[ImageSpec], sources: wheels.WheelSources,
                   probe: Callable[[str, Path | None], str | None] = wheels.probe_index) -> list[Finding]:
    """Whether each row's build gets its wheels: from the wheelhouse given (it holds what `wheels` fetches for the
    row), or from its indexes, probed from this host at once, each within wheels.INDEX_PROBE_TIMEOUT_S."""
    if sources.wheelhouse is not None:
        return wheelhouse_findings(specs, sources.wheelhouse)
    pages = list(dict.fromkeys(page for spec in specs for page in wheels.index_pages(spec, sources)))
    answers = wheels.probe_all(pages, lambda page: probe(page, sources.ca_bundle))
    secrets = Secrets.in_urls(sources.index_url, sources.extra_index_url)
    by_pages: dict[tuple[str, ...], list[ImageSpec]] = {}
    for spec in specs:
        by_pages.setdefault(tuple(wheels.index_pages(spec, sources)), []).append(spec)
    findings = []
    for row_pages, rows in by_pages.items():
        failed = [(page, why) for page in row_pages if (why := answers[page])]
        indexes = " and ".join(dict.fromkeys(secrets.redact(page.rsplit("/", 2)[0]) for page in row_pages))
        if not failed:
            findings.append(Finding("wheels", "ok", f"the build's pip reaches {indexes}, for {_rows(rows)}"))
            continue
        said = "; ".join(f"{secrets.redact(page.rsplit('/', 2)[0])}: {why}" for page, why in failed)
        tls = any(wheels.CA_BUNDLE_REMEDY in why for _, why in failed)
        remedy = (f"{'' if tls else 'behind a TLS-intercepting proxy, --ca-bundle FILE; '}where the build cannot reach "
                  f"it, fetch the wheels on a host that can ({command(f'wheels {_selector(rows)} --dest DIR')}) and "
                  "build with --wheelhouse DIR")
        findings.append(Finding("wheels", "fail", f"the build of {_rows(rows)} cannot reach its index ({said}); "
                                                  f"{remedy}"))
    return findings


def wheelhouse_findings(specs: list[ImageSpec], wheelhouse: Path) -> list[Finding]:
    """A wheelhouse covers a row when its folder holds a wheel of each of the row's requirements (wheels.py)."""
    findings = []
    covered: dict[Path, list[ImageSpec]] = {}
    for spec in specs:
        if wheels.wheelhouse_gaps(spec, wheelhouse):
            findings.append(Finding("wheels", "fail", wheels.wheelhouse_refusal(spec, wheelhouse)))
        else:
            covered.setdefault(wheel_dir(wheelhouse, spec), []).append(spec)
    return [Finding("wheels", "ok", f"{folder} holds the wheels of {_rows(rows)}: the build needs no index")
            for folder, rows in covered.items()] + findings


# ---------------------------------------------------------------------------------------------------- the host

def host_gpus() -> list[HostGpu] | str | None:
    """The host's NVIDIA GPUs; None when it has no nvidia-smi (no NVIDIA driver); what went wrong when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    answer = ask_nvidia_smi(smi, NVIDIA_SMI_QUERY)
    if not isinstance(answer, str) and answer[0] != 0 and UNKNOWN_FIELD in answer[1] + answer[2]:
        answer = ask_nvidia_smi(smi, NVIDIA_SMI_BASE_QUERY)
    if isinstance(answer, str):
        return answer
    returncode, stdout, stderr = answer
    gpus = parse_nvidia_smi(stdout) if returncode == 0 else []
    if len(gpus) > MAX_HOST_GPUS:
        return f"`nvidia-smi` listed {len(gpus)} GPUs, more than one host has ({MAX_HOST_GPUS}): not a driver's answer"
    said = inert((stderr or stdout).strip()[:300])
    return gpus or f"`nvidia-smi {' '.join(NVIDIA_SMI_QUERY)}` listed no GPU ({said})"


def health_finding() -> Finding | None:
    """The GPUs' health as verification reads it (checks/gpu_health.py), before a pull: a sick node is named with its
    fix, as the checks will charge what it explains to the host; nothing where nvidia-smi tells nothing."""
    smi = shutil.which("nvidia-smi")
    health = host_health({"health": read_health(smi, _nvidia_smi_tool)}) if smi else None
    if health is None or health["healthy"] is None:
        return None
    if health["healthy"]:
        return Finding("host gpu health", "ok", "no uncorrected ECC error, no pending or failed row remap or page "
                                                "retirement, no clock slowdown, no PCIe link below its width")
    causes = host_causes(health, ("memory", "clocks", "link"))
    return Finding("host gpu health", "warn", "; ".join(causes) + ": GPU checks on this host charge what this "
                                                                   "explains to the host, not the image")


def _nvidia_smi_tool(command: list[str], timeout: float = NVIDIA_SMI_TIMEOUT_S) -> dict:
    """ask_nvidia_smi in the probe's run_tool shape, which read_health takes."""
    answer = ask_nvidia_smi(command[0], command[1:])
    if isinstance(answer, str):
        return {"ok": False, "error": answer}
    return {"ok": answer[0] == 0, "returncode": answer[0], "output": answer[1] + answer[2]}


def ask_nvidia_smi(smi: str, arguments: list[str]) -> tuple[int, str, str] | str:
    """nvidia-smi's exit status, stdout and stderr, bounded in time and size; what went wrong where it did not
    answer (a hung driver, a flood)."""
    try:
        returncode, stdout, stderr = run_bounded([smi, *arguments], NVIDIA_SMI_TIMEOUT_S, NVIDIA_SMI_MAX_BYTES)
    except OSError as error:
        return f"`nvidia-smi` did not answer ({inert(str(error))})"
    if returncode is None:
        return (f"`nvidia-smi` did not answer within {NVIDIA_SMI_TIMEOUT_S} s in at most "
                f"{NVIDIA_SMI_MAX_BYTES >> 20} MiB (stopped): check the driver with `nvidia-smi`")
    return returncode, stdout, stderr


def host_mig_devices(gpus: list[HostGpu]) -> dict[str, list[str]] | None:
    """The MIG devices `nvidia-smi -L` lists per GPU index, asked only where a GPU is in MIG mode; None where that
    listing failed (or was not needed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not any(gpu.mig_mode == "Enabled" for gpu in gpus):
        return None
    answer = ask_nvidia_smi(smi, ["-L"])
    if isinstance(answer, str) or answer[0] != 0:
        return None
    return parse_nvidia_smi_list(answer[1])["mig_devices"]


def run_bounded(command: list[str], timeout_s: float, limit: int) -> tuple[int | None, str, str]:
    """A command's exit status, stdout and stderr (text, undecodable bytes replaced); the status is None when it
    ran past timeout_s or said more than limit bytes, and was killed (a tool that floods or never ends)."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None  # both piped
    pipes = (process.stdout, process.stderr)
    said = {pipe.fileno(): bytearray() for pipe in pipes}
    deadline = time.monotonic() + timeout_s
    bounded = True
    with selectors.DefaultSelector() as selector:
        for stream in said:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map() and bounded:
            left = deadline - time.monotonic()
            bounded = left > 0
            for key, _ in selector.select(max(left, 0)) if bounded else []:
                piece = os.read(key.fd, 1 << 16)
                if not piece:
                    selector.unregister(key.fd)
                said[key.fd] += piece
                bounded = bounded and len(said[key.fd]) <= limit
    try:
        returncode = process.wait(max(deadline - time.monotonic(), 0)) if bounded else None
    except subprocess.TimeoutExpired:
        returncode = None
    if returncode is None:
        process.kill()
        process.wait()
    for pipe in pipes:
        pipe.close()
    stdout, stderr = (bytes(text).decode(errors="replace") for text in said.values())
    return returncode, stdout, stderr


def engine_findings(specs: list[ImageSpec], images_dir: Path | None = None) -> list[Finding]:
    try:
        client = engine.client(timeout=engine.PING_TIMEOUT_S)
    except InputError as error:
        return [Finding("engine", "fail", str(error.problems[0].message))] + arch_findings(
            specs, platform.machine(), emulated_machines())
    info = engine.daemon_info(client)
    findings = [Finding("engine", "ok", f"Docker {info.get('ServerVersion', '?')} ({info.get('OSType', '?')}/"
                                        f"{info.get('Architecture', '?')})")]
    findings += arch_findings(specs, str(info.get("Architecture") or platform.machine()), emulated_machines())
    findings += base_findings(specs, images_dir, lambda reference: _engine_image_id(client, reference))
    gpu_rows = [spec.tag for spec in specs if spec.is_gpu]
    if gpu_rows:
        findings.append(gpu_access_finding(engine.gpu_access(client)))
    root = Path(info.get("DockerRootDir") or "")
    if root.is_dir():
        to_build = [spec for spec in specs if engine.inspect_image(client, local_name(spec)) is None]
        findings.append(disk_finding(shutil.disk_usage(root).free, to_build))
        findings.append(gzip_finding(shutil.which("unpigz", path=DAEMON_PATH)))
    else:
        findings.append(Finding("disk", "warn", f"the engine's data root {root} is not on this machine: "
                                                "its free space was not checked"))
    client.close()
    return findings


def _engine_image_id(client, reference: str) -> str | None:
    inspected = engine.inspect_image(client, reference)
    return inspected["Id"] if inspected else None


def tool_findings() -> list[Finding]:
    if shutil.which("skopeo") is None:
        return [Finding("skopeo", "warn", "not installed: build and test work, publish, prune, nightly and "
                                          "`catalog --check-registry` need it (apt-get install skopeo)")]
    return [Finding("skopeo", "ok", "installed, for publishing")]


def gpu_findings(specs: list[ImageSpec]) -> list[Finding]:
    if not any(spec.is_gpu for spec in specs):
        return []
    gpus = host_gpus()
    if gpus is None:
        return [Finding("host gpus", "warn", "no NVIDIA driver on this host (no nvidia-smi): GPU rows can be built and "
                                             f"statically checked here; run {command('test --gpus all')} on a GPU host")]
    if isinstance(gpus, str):
        cause = driver_start_failure({"nvidia_smi_error": {"output": gpus}})
        return [Finding("host gpus", "fail", f"{gpus}: {cause or 'check the driver with `nvidia-smi`'}")]
    findings = [Finding("host gpus", "ok", "; ".join(f"{gpu.name} (sm_{gpu.capability[0]}{gpu.capability[1]})"
                                                     for gpu in gpus) + f", driver {gpus[0].driver}")]
    findings += [finding for finding in [compute_mode_finding(gpus), mig_finding(gpus, host_mig_devices(gpus)),
                                         cdi_spec_finding(host_cdi_specs(), gpus[0].driver), health_finding()] if finding]
    return findings + [finding for spec in specs for finding in row_findings(spec, gpus, specs)]


def diagnose(specs: list[ImageSpec], images_dir: Path | None = None,
             sources: wheels.WheelSources | None = None) -> list[Finding]:
    """Every finding for the rows: the engine and its bases, the wheels, the tools, the GPUs."""
    return (engine_findings(specs, images_dir) + wheel_findings(specs, sources or wheels.WheelSources()) + tool_findings()
            + gpu_findings(specs))

