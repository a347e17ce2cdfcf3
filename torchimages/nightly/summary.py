"""What a nightly run did, as reports/nightly-summary.json (this module's Summary) and Markdown for a CI step summary.
A `nightly --shard` run writes one per shard; `report merge` (merge.py) reads them back and joins them."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..build.lock import BaseChange
from ..files import append_text, atomic_write, atomic_write_json, brief, check_appendable
from ..invocation import command
from ..project import EXIT_FAILED, EXIT_OK
from ..reporting import (
    DIGEST,
    DIGEST_RULE,
    Shape,
    human_size,
    known_fields,
    markdown_cell,
    markdown_code,
    require_schema,
)

SCHEMA = 1
SUMMARY_JSON = "nightly-summary.json"
SUMMARY_MARKDOWN = "nightly-summary.md"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"  # GitHub Actions' file for a step's Markdown summary
REGISTRY_ROW = "(registry)"  # the row a failure belongs to when it is the registry's, not one image's


@dataclass(frozen=True)
class Failure:
    tag: str
    stage: str  # render | build | verify | publish | prune
    error: str


@dataclass(frozen=True)
class Published:
    tag: str
    pinned: str
    digest: str


@dataclass(frozen=True)
class SizeChange:
    tag: str
    before: int | None
    after: int


@dataclass
class Summary:
    """What one nightly run (or shard) did; the JSON form is this dataclass."""

    registry: str
    shard: str
    rows: list[str]
    started_at: str
    duration_s: float = 0.0
    render: str = "not checked"
    bases_changed: list[BaseChange] = field(default_factory=list)
    bases_unresolved: dict[str, str] = field(default_factory=dict)
    built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # build skipped: inputs unchanged
    verified: list[str] = field(default_factory=list)  # verified (passed) in this run
    already_verified: list[str] = field(default_factory=list)
    published: list[Published] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)  # already published
    failed: list[Failure] = field(default_factory=list)
    size_changes: list[SizeChange] = field(default_factory=list)
    new_tags: list[str] = field(default_factory=list)
    moved_tags: list[str] = field(default_factory=list)
    removed_tags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.failed else EXIT_OK

    @property
    def nothing_to_do(self) -> bool:
        return not (self.built or self.verified or self.published or self.failed or self.removed_tags
                    or self.bases_changed)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, **asdict(self), "exit_code": self.exit_code, "nothing_to_do": self.nothing_to_do}

    @classmethod
    def from_json(cls, data, path: Path, tags: set[str], fix: str) -> Summary:
        """The summary a `nightly` run wrote to path, every row it names one of tags (the matrix's); an InputError
        names each part of the wrong shape and each unknown row, and says how to fix it."""
        require_schema(data, SCHEMA, path, f"a summary of {command('nightly')}", fix)
        shape = Shape("summary")
        if shape.document(data, cls):
            for part, tag in named_rows(data):
                if tag not in tags and not (part == "failed" and tag == REGISTRY_ROW):
                    shape.wrong((part,), f"names row {brief(tag)}, which is not a tag of the matrix")
            for index, item in enumerate(data.get("published", [])):  # it reaches the summary's pull lines
                if not DIGEST.fullmatch(item["digest"]):
                    shape.wrong(("published", index, "digest"), f"must be {DIGEST_RULE}, not {brief(item['digest'])}")
        shape.raise_if_wrong(path, fix)
        parts = known_fields(cls, data)
        items = {name: [item(**known_fields(item, entry)) for entry in parts.get(name, [])]
                 for name, item in SUMMARY_ITEMS.items()}
        items["bases_changed"] = [replace(change, rows=tuple(change.rows)) for change in items["bases_changed"]]
        return cls(**{**parts, **items})

    def fail(self, tag: str, stage: str, error: str) -> None:
        self.failed.append(Failure(tag, stage, error))


# The parts of a summary that are lists of objects, with the type of each object.
SUMMARY_ITEMS = {"failed": Failure, "published": Published, "size_changes": SizeChange, "bases_changed": BaseChange}


def named_rows(data: dict) -> list[tuple[str, str]]:
    """(part, row) for every row a summary of the right shape names: its rows, and the rows each result lists."""
    named = [(part, tag) for part in ("rows", "built", "skipped", "verified", "already_verified", "unchanged")
             for tag in data.get(part, [])]
    return named + [(part, item["tag"]) for part in ("published", "failed", "size_changes") for item in data.get(part, [])]


# ---------------------------------------------------------------------------------------------------- merging, Markdown

def merge_summaries(parts: list[Summary]) -> Summary:
    """One summary of several shards' runs (which ran side by side: the duration is the longest)."""
    merged = Summary(registry=parts[0].registry, shard=f"{len(parts)} shards merged",
                     rows=sorted(tag for part in parts for tag in part.rows),
                     started_at=min(part.started_at for part in parts),
                     duration_s=max(part.duration_s for part in parts))
    renders = sorted({part.render for part in parts})
    merged.render = "; ".join(renders)
    changed: dict[str, BaseChange] = {}
    for part in parts:
        for change in part.bases_changed:
            known = changed.get(change.image, change)
            changed[change.image] = replace(known, rows=tuple(sorted(set(known.rows) | set(change.rows))))
        merged.bases_unresolved.update(part.bases_unresolved)
        for name in ("built", "skipped", "verified", "already_verified", "unchanged", "new_tags", "moved_tags",
                     "removed_tags", "notes", "published", "failed", "size_changes"):
            getattr(merged, name).extend(getattr(part, name))
    merged.bases_changed = [changed[image] for image in sorted(changed)]
    merged.notes = sorted(set(merged.notes))
    return merged


def markdown(summary: Summary) -> str:
    """The summary as a GitHub step summary (readable as plain text too). Every value is escaped or quoted as code:
    a summary may come from an uploaded shard, and nothing in it may add links or break a table."""
    title = f"# Nightly images: {len(summary.rows)} rows" + (f" ({markdown_cell(summary.shard)})" if summary.shard else "")
    lines = [title, "", (f"Registry {markdown_code(summary.registry)}; started {markdown_cell(summary.started_at)}; "
                         f"took {summary.duration_s:.1f} s."), ""]
    if summary.nothing_to_do:
        lines += [f"**Nothing to do**: all {len(summary.rows)} rows are unchanged, verified and already published.", ""]
    counts = [
        ("built", summary.built), ("build skipped (unchanged)", summary.skipped), ("verified", summary.verified),
        ("already verified", summary.already_verified), ("published", [p.tag for p in summary.published]),
        ("already published", summary.unchanged), ("failed", sorted({f.tag for f in summary.failed})),
    ]
    lines += ["| | rows | which |", "|---|---|---|"]
    lines += [f"| {label} | {len(tags)} | {', '.join(map(markdown_code, tags))} |" for label, tags in counts]
    if summary.failed:
        lines += ["", "## Failures", ""]
        lines += [f"- {markdown_code(f.tag)} ({markdown_cell(f.stage)}): {markdown_cell(f.error)}"
                  for f in summary.failed]
    if summary.published:
        lines += ["", "## Published", "", "| row | pinned tag | digest |", "|---|---|---|"]
        lines += [f"| {markdown_code(p.tag)} | {markdown_code(p.pinned)} | {markdown_code(p.digest)} |"
                  for p in summary.published]
    if summary.size_changes:
        lines += ["", "## Size changes against the last catalog", "", "| row | before | after | change |", "|---|---|---|---|"]
        lines += [_size_row(change) for change in summary.size_changes]
    for heading, tags in (("New tags", summary.new_tags), ("Moved floating tags", summary.moved_tags),
                          ("Removed tags", summary.removed_tags)):
        if tags:
            lines += ["", f"## {heading}", "", ", ".join(map(markdown_code, sorted(tags)))]
    if summary.bases_changed or summary.bases_unresolved:
        lines += ["", "## Base images", ""]
        lines += [f"- {markdown_code(c.image)} moved {markdown_cell(c.before or '(new)')} -> "
                  f"{markdown_cell(c.after)}: rebuilds {markdown_cell(', '.join(c.rows))}"
                  for c in summary.bases_changed]
        lines += [f"- {markdown_code(image)} unresolved: {markdown_cell(why)}"
                  for image, why in sorted(summary.bases_unresolved.items())]
    if summary.notes:
        lines += ["", "## Notes", ""] + [f"- {markdown_cell(note)}" for note in summary.notes]
    lines += ["", f"Render check: {markdown_cell(summary.render)}."]
    return "\n".join(lines) + "\n"


def _size_row(change: SizeChange) -> str:
    before, after = change.before, change.after
    delta = "new" if before is None else f"{'+' if after >= before else '-'}{human_size(abs(after - before))}"
    return (f"| {markdown_code(change.tag)} | {human_size(before) if before is not None else '-'} | "
            f"{human_size(after)} | {delta} |")


def step_summary() -> Path | None:
    """The CI step summary file named by the environment, if any."""
    return Path(os.environ[STEP_SUMMARY_ENV]) if os.environ.get(STEP_SUMMARY_ENV) else None


def check_step_summary() -> None:
    """Refuse a step summary that cannot be written (a pipe, a device, a missing folder) before a run's work."""
    path = step_summary()
    if path:
        check_appendable(path, STEP_SUMMARY_ENV)


def write_summary(reports_dir: Path, summary: Summary) -> str:
    """Write reports/nightly-summary.{json,md}; add the Markdown to the CI step summary when there is one."""
    text = markdown(summary)
    atomic_write_json(reports_dir / SUMMARY_JSON, summary.to_json())
    atomic_write(reports_dir / SUMMARY_MARKDOWN, text)
    path = step_summary()
    if path:
        append_text(path, text, STEP_SUMMARY_ENV)
    return text
