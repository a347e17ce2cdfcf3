"""Verifying an arm64 image on an x86_64 engine, under qemu-user emulation: a stand-in CPU identity.

PyPI's aarch64 torch wheels carry oneDNN, whose xbyak_aarch64 reads each CPU's MIDR_EL1 from
/sys/devices/system/cpu/cpu*/regs/identification/midr_el1 at `import torch`. An x86_64 host's sysfs has no such file,
and under Debian 12's qemu-user-static 7.2 the import then dies with SIGSEGV (docs/benchmarks-log.md). The verification
container of such an image gets, read-only over /sys/devices/system/cpu, a folder naming a Neoverse N1 for every CPU,
and qemu emulates that core (QEMU_CPU); `import torch` then works and reports the row exactly. The report says the CPU
identity was a stand-in.

Under emulation every process of the image runs about SLOWDOWN times slower, so every time bound of that verification
(the main probe's kill timeout unless --timeout names one, the side probes', the check suite's, and the probe's own,
through its --slowdown) is multiplied by it, and the report says so. On an engine whose machine is the image's own (a
Grace host, an arm64 runner) nothing of this applies.
"""
from __future__ import annotations

from pathlib import Path

import docker.types

from ..files import atomic_write

CPU_SYSFS = "/sys/devices/system/cpu"
# MIDR_EL1 of an Arm Neoverse N1 r3p1 (implementer 0x41 Arm, part 0xd0c): a core oneDNN knows, with no SVE.
STANDIN_MIDR_EL1 = "0x00000000413fd0c1"
# The core qemu-user emulates for the image's processes (it reads QEMU_CPU from their environment): the one the stand-in
# names. qemu's default, "max", shows SVE with 512-bit vectors, which no Grace-class core has (Neoverse V2: 128 bits);
# inductor then compiles its CPU kernels for 256-bit SVE, code that assumes registers of exactly that width, and
# Debian 12's g++ 12.2 cannot compile them against a precompiled header (an internal compiler error, natively too:
# docs/benchmarks-log.md).
STANDIN_QEMU_CPU = "neoverse-n1"
STANDIN_FOLDER = "emulated-cpu-sysfs"  # under the image's own reports folder, beside facts.json
# The engine's /info names its machine as `uname -m` does; an image's config names its machine as OCI (GOARCH) does.
OCI_ARCHITECTURE = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "amd64": "amd64"}
NEEDS_STANDIN = "arm64"  # the machine whose torch wheels read MIDR_EL1 at import
# How much slower qemu-user runs the image than the host runs its own machine's, measured on this project's 2-core
# x86_64 machine (docs/benchmarks-log.md, "arm64 (Grace) rows under emulation"): `import torch` about 40 s against 4 s,
# the row's cold build 2392 s against 240 s.
SLOWDOWN = 10


def oci_architecture(machine: str) -> str:
    """x86_64 -> amd64, aarch64 -> arm64; a name it does not know is kept as it is."""
    return OCI_ARCHITECTURE.get(machine, machine)


def needs_cpu_standin(image_architecture: str, engine_architecture: str) -> bool:
    """Only an arm64 image on an engine of another, known machine: that engine runs it under emulation. An unknown
    engine machine changes nothing, so a native host never gets the stand-in."""
    image, host = oci_architecture(image_architecture), oci_architecture(engine_architecture)
    return image == NEEDS_STANDIN and bool(host) and host != image


def standin_cpus(image_architecture: str, engine_info: dict) -> int:
    """How many CPUs the stand-in describes (the engine's own count, which qemu-user passes on to the image's
    processes); 0 where the image needs no stand-in."""
    if not needs_cpu_standin(image_architecture, str(engine_info.get("Architecture") or "")):
        return 0
    count = engine_info.get("NCPU")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1


def slowdown(cpus: int) -> int:
    """The factor a verification's time bounds are multiplied by: SLOWDOWN where the engine emulates the image (it
    gets a stand-in CPU identity of `cpus` CPUs), 1 where it runs the image's machine itself."""
    return SLOWDOWN if cpus > 0 else 1


def standin_files(cpus: int) -> dict[str, str]:
    """The stand-in folder's files, by path inside it: each CPU's MIDR_EL1, and the CPU lists that sysconf and
    os.cpu_count() read from the same folder (the mount hides the host's)."""
    cpu_list = "0" if cpus == 1 else f"0-{cpus - 1}"
    files = {name: f"{cpu_list}\n" for name in ("online", "possible", "present")}
    for cpu in range(cpus):
        files[f"cpu{cpu}/regs/identification/midr_el1"] = f"{STANDIN_MIDR_EL1}\n"
    return files


def write_standin(folder: Path, cpus: int, root: Path) -> None:
    """The stand-in folder, written anew (following no link below root, the tool's reports folder)."""
    for relative, content in standin_files(cpus).items():
        atomic_write(folder / relative, content, root=root)


def cpu_environment(cpus: int) -> dict[str, str]:
    """The verification container's environment for the CPU model: nothing natively, the stand-in's core under
    emulation."""
    return {"QEMU_CPU": STANDIN_QEMU_CPU} if cpus > 0 else {}


def standin_mount(folder: Path) -> docker.types.Mount:
    """Read-only: the image's processes may read the stand-in, never change what the next run mounts."""
    return docker.types.Mount(CPU_SYSFS, str(folder.resolve()), type="bind", read_only=True)


def cpu_mounts(cpus: int, report_dir: Path, root: Path) -> list[docker.types.Mount]:
    """The verification container's mounts for the CPU identity: none natively, the stand-in under emulation."""
    if cpus <= 0:
        return []
    folder = report_dir / STANDIN_FOLDER
    write_standin(folder, cpus, root)
    return [standin_mount(folder)]


def cpu_identity_note(cpus: int) -> dict:
    """What facts.json and verify.json say of the CPU identity the image saw, so that a reader knows."""
    if cpus <= 0:
        return {"cpu_identity": "the engine's own CPUs"}
    return {"cpu_identity": "stand-in", "emulated": True, "midr_el1": STANDIN_MIDR_EL1, "cpus": cpus,
            "qemu_cpu": STANDIN_QEMU_CPU, "slowdown": slowdown(cpus),
            "why": f"an arm64 image under emulation on this engine: {CPU_SYSFS} was a read-only stand-in naming a "
                   "Neoverse N1 for every CPU (oneDNN reads MIDR_EL1 there at import torch), not the host's CPUs, and "
                   f"qemu emulated that core (QEMU_CPU={STANDIN_QEMU_CPU}); "
                   f"every time bound of the verification was multiplied by {slowdown(cpus)} (qemu-user's slowdown)"}
