"""The rows a command takes when it names none. `build`, `images` and `nightly` take the rows this host can build and
run (its engine's machine; the GPU rows only where the engine can give containers GPUs); `publish` takes the rows
whose image now tagged has a verification that lets it be published. Each says in one line which rows it leaves and
why, and a selector still takes exactly what it names. The decisions are pure functions; the engine is asked once."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from ..model import ImageSpec, InputError, Problem
from ..peers import engine
from ..project import Project
from ..verify import emulation


def for_machine(specs: Sequence[ImageSpec], machine: str) -> list[ImageSpec]:
    """The rows whose images are for this machine (`uname -m` or an OCI architecture; every row when unknown)."""
    own = emulation.oci_architecture(machine)
    return [spec for spec in specs if spec.platform.split("/")[1] == own] if own else list(specs)


def host_rows(every: Sequence[ImageSpec], machine: str, gpu_runtime: bool) -> tuple[list[ImageSpec], list[str]]:
    """(the rows for an engine on machine, with or without a GPU runtime; one line per reason for leaving rows out)."""
    specs = for_machine(every, machine)
    lines = []
    if len(specs) < len(every):
        others = ", ".join(spec.tag for spec in every if spec not in specs)
        lines.append(f"taking the rows for this engine's machine ({machine}); another machine's images build and verify "
                     f"here only under emulation, about {emulation.SLOWDOWN}x slower: name them to take them ({others})")
    if gpu_runtime:
        return specs, lines
    cpu_rows = [spec for spec in specs if not spec.is_gpu]
    gpu_rows = [spec.tag for spec in specs if spec.is_gpu]
    if gpu_rows:
        lines.append(f"no NVIDIA runtime on this Docker engine: taking the CPU rows "
                     f"({', '.join(s.tag for s in cpu_rows) or 'none'}), leaving the GPU rows ({', '.join(gpu_rows)}): "
                     "name them to take them anyway")
    return cpu_rows, lines


def default_rows(project: Project, docker_client) -> list[ImageSpec]:
    """host_rows for this project's matrix and engine, saying what it leaves on stderr."""
    every = project.load().specs
    machine = str(engine.daemon_info(docker_client).get("Architecture") or "")
    specs, lines = host_rows(every, machine, engine.has_gpu_runtime(docker_client))
    for line in lines:
        print(line, file=sys.stderr)
    if not specs:
        raise InputError([Problem("SELECTOR", 0, "no row of the matrix is for this engine (its machine and GPUs): "
                                                 "name the rows to take")])
    return specs


def publishable_rows(every: Sequence[ImageSpec], refusals: dict[str, str | None]) -> tuple[list[ImageSpec], dict[str, str]]:
    """(the rows publish takes by default, {tag: why} of those it leaves). refusals: tag -> why its image may not be
    published (publisher.verification_refusal), None where it may. A row of a multi-arch tag goes with all of its
    machines or none: that tag names every machine's image."""
    left = {spec.tag: why for spec in every if (why := refusals.get(spec.tag)) is not None}
    siblings: dict[str, list[ImageSpec]] = {}
    for spec in every:
        siblings.setdefault(spec.index_tag or spec.tag, []).append(spec)
    for members in siblings.values():
        unready = [spec.tag for spec in members if spec.tag in left]
        for spec in members:
            if unready and spec.tag not in left:
                left[spec.tag] = f"its tag also names {', '.join(unready)}, which is not ready"
    return [spec for spec in every if spec.tag not in left], left


def leaving_line(taken: Sequence[ImageSpec], left: dict[str, str]) -> str:
    """publish's one line on the rows it leaves, and why ("" when it takes every row)."""
    if not left:
        return ""
    return (f"publishing the verified rows ({', '.join(spec.tag for spec in taken) or 'none'}), leaving {len(left)} "
            f"(name a row to take it anyway): {leaving_reasons(left)}")


def leaving_reasons(left: dict[str, str]) -> str:
    return "; ".join(f"{tag}: {short_reason(why)}" for tag, why in left.items())


def short_reason(why: str) -> str:
    """A refusal's cause without its remedy where the cause says it all (no image, never verified)."""
    return why.split(": ", 1)[0] if why.startswith(("no image", "never verified")) else why
