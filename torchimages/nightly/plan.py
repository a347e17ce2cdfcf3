"""Scale-out: split the rows into N shards of about equal build time, for a CI matrix of runners.

Each row lands in exactly one shard, a row built for several machines with all its per-arch images: publish writes
the row's tag as an OCI index over every machine's image, and only in a run that has them all. Rows are weighed by their last real build time in reports/build-report.json
(a row never built weighs the mean of those of its kind (CPU or CUDA, runtime or devel) that were, else a default
for its kind, and its shard names it as estimated so; with no build history at all, every row weighs 1), then dealt heaviest first to the lightest
shard. The same rows and report always give the same plan, and `plan --format json` can be handed to
`nightly --shard i/n --plan FILE` so that every runner uses the plan the planning job made.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..build.builder import BUILD_REPORT
from ..files import brief, read_json_document
from ..invocation import command
from ..model import ImageSpec, InputError, Problem
from ..publish.catalog import require_folder
from ..reporting import Shape, require_schema

# Up to 18 digits: any count that long is refused by check_shard_count with the real maximum, and int() of a
# longer run of digits is slow or refused by Python itself.
SHARD_PATTERN = re.compile(r"([0-9]{1,18})/([0-9]{1,18})")
# What a row never built weighs where no row of its kind was built either: about what each kind takes on a 2-core
# runner from warm bases (a CPU runtime row 150 to 220 s; a CUDA row installs gigabytes of wheels, a devel row more).
KIND_SECONDS = {("cpu", "runtime"): 240.0, ("cpu", "devel"): 480.0, ("cuda", "runtime"): 900.0,
                ("cuda", "devel"): 1800.0}


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int
    tags: tuple[str, ...]  # in matrix order
    estimated_seconds: float | None  # None when no row has a past build time
    # The shard's rows never built: weighed by their kind (KIND_SECONDS), not by a build of their own.
    estimated_by_kind: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3)."""
    match = SHARD_PATTERN.fullmatch(text or "")
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise InputError([Problem("--shard", 0, f"--shard {brief(text)} must be i/n with 1 <= i <= n, e.g. 2/3")])
    return int(match.group(1)), int(match.group(2))


def check_shard_count(count: int, rows: int) -> None:
    """Refuse a count that cannot make shards of rows: a shard beyond the row count could only be empty (and a huge count
    would only allocate empty shards)."""
    if count < 1:
        raise InputError([Problem("--shards", 0, f"--shards must be at least 1, got {count}")])
    if count > rows:
        raise InputError([Problem("--shards", 0, f"{count} shards for {rows} selected rows: use at most {rows} shards "
                                                 "(N of --shards N, n of --shard i/n); more could only be empty")])


def past_durations(reports_dir: Path) -> dict[str, float]:
    """tag -> seconds of its last real build (skipped and failed builds say nothing about build time). A file where
    the reports folder belongs is refused: planning without the history would deal unbalanced shards silently."""
    require_folder(reports_dir, "the reports folder (--reports DIR), whose past build times plan reads")
    durations = {tag: entry.get("last_build_duration", 0.0) for tag, entry in BUILD_REPORT.read(reports_dir).items()}
    return {tag: seconds for tag, seconds in durations.items() if seconds > 0}


def together(specs: list[ImageSpec]) -> list[tuple[str, ...]]:
    """The tags that must share a shard, in matrix order: a multi-arch row's per-arch images (one index is written
    from all of them, by one publish run), and every other row on its own."""
    by_row: dict[str, list[str]] = {}
    for spec in specs:
        by_row.setdefault(spec.index_tag or spec.tag, []).append(spec.tag)
    return [tuple(tags) for tags in by_row.values()]


def kind(spec: ImageSpec) -> tuple[str, str]:
    return ("cuda" if spec.is_gpu else "cpu", "devel" if spec.flavor == "devel" else "runtime")


def kind_estimates(specs: list[ImageSpec], durations: dict[str, float]) -> dict[str, float]:
    """tag -> what each row never built weighs: the mean past build time of the rows of its kind, else its kind's
    default. A CUDA row is never weighed by a CPU row's build."""
    measured: dict[tuple[str, str], list[float]] = {}
    for spec in specs:
        if spec.tag in durations:
            measured.setdefault(kind(spec), []).append(durations[spec.tag])
    return {spec.tag: (sum(measured[kind(spec)]) / len(measured[kind(spec)]) if kind(spec) in measured
                       else KIND_SECONDS.get(kind(spec), max(KIND_SECONDS.values())))
            for spec in specs if spec.tag not in durations}


def balance(tags: list[str], durations: dict[str, float], count: int,
            units: list[tuple[str, ...]] | None = None, estimates: dict[str, float] | None = None) -> list[Shard]:
    """Longest-processing-time-first: heaviest unit (a row, or a multi-arch row's images together; default: each tag)
    to the least loaded shard (ties: lower shard, matrix order). A tag without a past build weighs its estimate
    (kind_estimates), else the mean of the others."""
    units = units or [(tag,) for tag in tags]
    known = [durations[tag] for tag in tags if tag in durations]
    default = sum(known) / len(known) if known else 1.0
    guesses = (estimates or {}) if known else {}  # no history at all: every row weighs the same, estimated as nothing
    weight = {unit: sum(durations.get(tag, guesses.get(tag, default)) for tag in unit) for unit in units}
    order = {tag: position for position, tag in enumerate(tags)}
    loads = [0.0] * count
    members: list[list[str]] = [[] for _ in range(count)]
    for unit in sorted(units, key=lambda u: (-weight[u], order[u[0]])):
        lightest = min(range(count), key=lambda index: (loads[index], index))
        loads[lightest] += weight[unit]
        members[lightest].extend(unit)
    return [Shard(index + 1, count, tuple(sorted(members[index], key=lambda tag: order[tag])),
                  round(loads[index], 1) if known else None,
                  tuple(tag for tag in sorted(members[index], key=lambda tag: order[tag]) if known and tag not in durations))
            for index in range(count)]


def make_plan(specs: list[ImageSpec], reports_dir: Path, count: int) -> list[Shard]:
    units = together(specs)
    check_shard_count(count, len(units))  # a multi-arch row is one row: more shards than rows could only be empty
    durations = past_durations(reports_dir)
    return balance([spec.tag for spec in specs], durations, count, units, kind_estimates(specs, durations))


PLAN_SCHEMA = 1


def plan_document(shards: list[Shard]) -> dict:
    return {"schema": PLAN_SCHEMA,
            "shards": [{**asdict(shard), "shard": shard.name, "tags": list(shard.tags)} for shard in shards]}


def github_matrix(shards: list[Shard]) -> str:
    """One line for $GITHUB_OUTPUT: a strategy matrix with one entry per non-empty shard."""
    include = [{"shard": shard.name, "tags": " ".join(shard.tags), "estimated_seconds": shard.estimated_seconds}
               for shard in shards if shard.tags]
    return json.dumps({"include": include}, separators=(",", ":"))


@dataclass(frozen=True)
class PlannedShard:
    """One shard of a plan file, as `plan --format json` writes it (the parts `nightly --plan` reads)."""

    shard: str
    tags: list[str]


@dataclass(frozen=True)
class PlanFile:
    shards: list[PlannedShard]


def shard_from_plan_file(path: Path, index: int, count: int, specs: list[ImageSpec]) -> list[ImageSpec]:
    """The rows a plan file (from `plan --format json`) gives shard index/count; it must cover specs exactly."""
    check_shard_count(count, len(specs))
    fix = f"make it again with {command(f'plan --shards {count} --format json')}"
    document = read_json_document(path, fix)
    require_schema(document, PLAN_SCHEMA, path, f"a plan from {command('plan --format json')}", fix)
    shape = Shape("plan")
    shape.document(document, PlanFile)
    shape.raise_if_wrong(path, fix)
    shards = {entry["shard"]: entry["tags"] for entry in document["shards"]}
    planned = [tag for tags in shards.values() for tag in tags]
    by_tag = {spec.tag: spec for spec in specs}
    if sorted(planned) != sorted(by_tag) or len(shards) != count:
        raise InputError([Problem(str(path), 0, f"--plan {path} was made for other rows or another shard count than "
                                                f"these {len(specs)} rows in {count} shards: {fix}")])
    return [by_tag[tag] for tag in shards.get(f"{index}/{count}", [])]
