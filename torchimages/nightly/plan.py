"""Scale-out: split the rows into N shards of about equal build time, for a CI matrix of runners.

Each row lands in exactly one shard, a row built for several machines with all its per-arch images: publish writes
the row's tag as an OCI index over every machine's image, and only in a run that has them all. Rows are weighed by their last real build time in reports/build-report.json
(rows never built weigh the mean of those that were, or 1 when none were), then dealt heaviest first to the lightest
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


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int
    tags: tuple[str, ...]  # in matrix order
    estimated_seconds: float | None  # None when no row has a past build time

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


def balance(tags: list[str], durations: dict[str, float], count: int,
            units: list[tuple[str, ...]] | None = None) -> list[Shard]:
    """Longest-processing-time-first: heaviest unit (a row, or a multi-arch row's images together; default: each tag)
    to the least loaded shard (ties: lower shard, matrix order)."""
    units = units or [(tag,) for tag in tags]
    known = [durations[tag] for tag in tags if tag in durations]
    default = sum(known) / len(known) if known else 1.0
    weight = {unit: sum(durations.get(tag, default) for tag in unit) for unit in units}
    order = {tag: position for position, tag in enumerate(tags)}
    loads = [0.0] * count
    members: list[list[str]] = [[] for _ in range(count)]
    for unit in sorted(units, key=lambda u: (-weight[u], order[u[0]])):
        lightest = min(range(count), key=lambda index: (loads[index], index))
        loads[lightest] += weight[unit]
        members[lightest].extend(unit)
    return [Shard(index + 1, count, tuple(sorted(members[index], key=lambda tag: order[tag])), round(loads[index], 1) if known else None)
            for index in range(count)]


def make_plan(specs: list[ImageSpec], reports_dir: Path, count: int) -> list[Shard]:
    units = together(specs)
    check_shard_count(count, len(units))  # a multi-arch row is one row: more shards than rows could only be empty
    return balance([spec.tag for spec in specs], past_durations(reports_dir), count, units)


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
