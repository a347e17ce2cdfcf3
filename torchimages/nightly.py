"""The nightly rebuild: refresh base pins, check the render, build (skipping unchanged rows), verify, publish what
passed, prune old dated tags, and summarise (Markdown for a CI step summary, and JSON). `report merge` joins the
results of the shards a CI matrix ran.

Every stage reuses what the last run left: unchanged rows are not rebuilt, an image whose last verification passed
for its exact id is not verified again, and a digest already published is not pushed again. So a second run with
nothing new does nothing, quickly, and says so.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import docker.errors

from . import builder as build_stage
from . import catalog as catalog_stage
from . import engine
from . import lock as lock_stage
from . import matrix as matrix_stage
from . import plan as plan_stage
from . import publish as publish_stage
from . import render as render_stage
from . import verify as verify_stage
from .buildargs import add_build_arguments, run_builds
from .display import stderr_console
from .files import atomic_write, atomic_write_json, read_json
from .lockfile import LOCK_NAME
from .model import ImageSpec, InputError, Problem
from .project import EXIT_FAILED, EXIT_OK, Project, add_selectors
from .registry import RegistryClient, RegistryError
from .reporting import markdown_cell, utc_timestamp

SUMMARY_JSON = "nightly-summary.json"
SUMMARY_MARKDOWN = "nightly-summary.md"
REGISTRY_ROW = "(registry)"


@dataclass
class Failure:
    tag: str
    stage: str  # render | build | verify | publish | prune
    error: str


@dataclass
class Summary:
    """What one nightly run (or shard) did; the JSON form is this dataclass."""

    registry: str
    shard: str
    rows: list[str]
    started_at: str
    duration_s: float = 0.0
    render: str = "not checked"
    bases_changed: list[dict] = field(default_factory=list)  # lock.BaseChange as dicts
    bases_unresolved: dict[str, str] = field(default_factory=dict)
    built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # build skipped: inputs unchanged
    verified: list[str] = field(default_factory=list)  # verified (passed) in this run
    already_verified: list[str] = field(default_factory=list)
    published: list[dict] = field(default_factory=list)  # tag, pinned, digest
    unchanged: list[str] = field(default_factory=list)  # already published
    failed: list[dict] = field(default_factory=list)  # Failure as dicts
    size_changes: list[dict] = field(default_factory=list)  # tag, before, after (bytes; before None when new)
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
        return {**asdict(self), "exit_code": self.exit_code, "nothing_to_do": self.nothing_to_do}

    @classmethod
    def from_json(cls, data: dict) -> Summary:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def fail(self, tag: str, stage: str, error: str) -> None:
        self.failed.append(asdict(Failure(tag, stage, error)))


# ---------------------------------------------------------------------------------------------------- pure parts

def size_changes(before: catalog_stage.Catalog, after: catalog_stage.Catalog, tags: list[str]) -> list[dict]:
    """Rows whose published digest changed in this run, with their sizes before and after."""
    changes = []
    for tag in tags:
        old, new = before.images.get(tag), after.images.get(tag)
        if new is not None and (old is None or old.digest != new.digest):
            changes.append({"tag": tag, "before": old.size if old else None, "after": new.size})
    return changes


def merge_summaries(parts: list[Summary]) -> Summary:
    """One summary of several shards' runs (which ran side by side: the duration is the longest)."""
    merged = Summary(registry=parts[0].registry, shard=f"{len(parts)} shards merged",
                     rows=sorted(tag for part in parts for tag in part.rows),
                     started_at=min(part.started_at for part in parts),
                     duration_s=max(part.duration_s for part in parts))
    renders = sorted({part.render for part in parts})
    merged.render = "; ".join(renders)
    changed: dict[str, dict] = {}
    for part in parts:
        for change in part.bases_changed:
            known = changed.setdefault(change["image"], {**change, "rows": []})
            known["rows"] = sorted(set(known["rows"]) | set(change["rows"]))
        merged.bases_unresolved.update(part.bases_unresolved)
        for name in ("built", "skipped", "verified", "already_verified", "unchanged", "new_tags", "moved_tags",
                     "removed_tags", "notes", "published", "failed", "size_changes"):
            getattr(merged, name).extend(getattr(part, name))
    merged.bases_changed = [changed[image] for image in sorted(changed)]
    merged.notes = sorted(set(merged.notes))
    return merged


def markdown(summary: Summary) -> str:
    """The summary as a GitHub step summary (readable as plain text too)."""
    title = f"# Nightly images: {len(summary.rows)} rows" + (f" ({summary.shard})" if summary.shard else "")
    lines = [title, "", f"Registry `{summary.registry}`; started {summary.started_at}; took {summary.duration_s:.1f} s.", ""]
    if summary.nothing_to_do:
        lines += [f"**Nothing to do**: all {len(summary.rows)} rows are unchanged, verified and already published.", ""]
    counts = [
        ("built", summary.built), ("build skipped (unchanged)", summary.skipped), ("verified", summary.verified),
        ("already verified", summary.already_verified), ("published", [p["tag"] for p in summary.published]),
        ("already published", summary.unchanged), ("failed", sorted({f["tag"] for f in summary.failed})),
    ]
    lines += ["| | rows | which |", "|---|---|---|"]
    lines += [f"| {label} | {len(tags)} | {', '.join(f'`{t}`' for t in tags)} |" for label, tags in counts]
    if summary.failed:
        lines += ["", "## Failures", ""]
        lines += [f"- `{f['tag']}` ({f['stage']}): {markdown_cell(f['error'])}" for f in summary.failed]
    if summary.published:
        lines += ["", "## Published", "", "| row | pinned tag | digest |", "|---|---|---|"]
        lines += [f"| `{p['tag']}` | `{p['pinned']}` | `{p['digest']}` |" for p in summary.published]
    if summary.size_changes:
        lines += ["", "## Size changes against the last catalog", "", "| row | before | after | change |", "|---|---|---|---|"]
        lines += [_size_row(change) for change in summary.size_changes]
    for heading, tags in (("New tags", summary.new_tags), ("Moved floating tags", summary.moved_tags),
                          ("Removed tags", summary.removed_tags)):
        if tags:
            lines += ["", f"## {heading}", "", ", ".join(f"`{tag}`" for tag in sorted(tags))]
    if summary.bases_changed or summary.bases_unresolved:
        lines += ["", "## Base images", ""]
        lines += [f"- `{c['image']}` moved {c['before'] or '(new)'} -> {c['after']}: rebuilds {', '.join(c['rows'])}"
                  for c in summary.bases_changed]
        lines += [f"- `{image}` unresolved: {markdown_cell(why)}" for image, why in sorted(summary.bases_unresolved.items())]
    if summary.notes:
        lines += ["", "## Notes", ""] + [f"- {markdown_cell(note)}" for note in summary.notes]
    lines += ["", f"Render check: {summary.render}."]
    return "\n".join(lines) + "\n"


def _size_row(change: dict) -> str:
    before, after = change["before"], change["after"]
    delta = "new" if before is None else f"{(after - before) / 1e6:+.1f} MB"
    return (f"| `{change['tag']}` | {catalog_stage.human_size(before) if before is not None else '-'} | "
            f"{catalog_stage.human_size(after)} | {delta} |")


# ------------------------------------------------------------------------------------------------------- the run

def shard_rows(project: Project, specs: list[ImageSpec], args) -> list[ImageSpec]:
    if not args.shard:
        if args.plan:
            raise InputError([Problem("--plan", 0, "--plan gives shards their rows: use it with --shard i/n")])
        return specs
    index, count = plan_stage.parse_shard(args.shard)
    if args.plan:
        return plan_stage.shard_from_plan_file(args.plan, index, count, specs)
    chosen = set(plan_stage.make_plan(specs, project.reports, count)[index - 1].tags)
    return [spec for spec in specs if spec.tag in chosen]


class Nightly:
    def __init__(self, project: Project, args, log):
        self.project = project
        self.args = args
        self.log = log
        self.options = publish_stage.publish_options(project, args)
        self.retention = publish_stage.parse_retention(args.retention)
        self.matrix = project.load()
        selected = matrix_stage.select(self.matrix.specs, args.selectors, str(project.matrix))
        self.specs = shard_rows(project, selected, args)
        self.summary = Summary(self.options.registry.name, args.shard or "", [spec.tag for spec in self.specs],
                               utc_timestamp())

    def run(self) -> Summary:
        started = time.monotonic()
        catalog_path = catalog_stage.catalog_file(self.options.catalog_dir)
        before = catalog_stage.load_catalog(catalog_path)
        if self.specs and self.render_is_current():
            client = engine.client()
            self.refresh_lock(client)
            self.rerender_for_moved_bases()
            buildable = self.build()
            passed = self.verify(client, buildable)
            if self.publish(client, passed):
                self.prune()
            self.summary.size_changes = size_changes(before, catalog_stage.load_catalog(catalog_path),
                                                     self.summary.rows)
        self.summary.duration_s = round(time.monotonic() - started, 1)
        return self.summary

    def render_is_current(self) -> bool:
        stale = render_stage.stale_paths(self.project.images, self.project.rendered(self.matrix))
        if not stale:
            self.summary.render = f"{self.project.images} is up to date"
            return True
        self.summary.render = (f"{self.project.images} is stale ({len(stale)} files differ from the matrix, e.g. "
                               f"{stale[0]}): run `python build.py render` and commit it; nothing was built")
        for tag in self.summary.rows:
            self.summary.fail(tag, "render", self.summary.render)
        return False

    def refresh_lock(self, client) -> None:
        path = lock_stage.lock_path(self.project)
        current = lock_stage.read_lock(path)
        try:
            refreshed = lock_stage.refresh(lock_stage.Resolver(client, pull=True, log=self.log), self.specs, current,
                                           everything=False)
        except docker.errors.APIError as error:
            self.summary.notes.append(f"base refresh failed, building on the bases the engine has: {error}")
            return
        if refreshed.bases != current:
            lock_stage.write_lock(path, refreshed.bases)
        self.summary.bases_changed = [asdict(change) for change in refreshed.changes if change.before]
        self.summary.bases_unresolved = refreshed.unresolved

    def rerender_for_moved_bases(self) -> None:
        """A moved base pin changes the FROM of the rows on it: render them now, so exactly those rebuild."""
        changed = render_stage.write_rendered(self.project.images, self.project.rendered(self.matrix))
        if changed:
            self.summary.render += f"; re-rendered {len(changed)} files for moved base pins (commit them with the lock)"

    def build(self) -> list[ImageSpec]:
        results = run_builds(self.project, self.specs, self.args)
        build_stage.write_report(self.project.reports, results)
        by_tag = {result.tag: result for result in results}
        for spec in self.specs:
            result = by_tag[spec.tag]
            if result.status == "built":
                self.summary.built.append(spec.tag)
            elif result.status == "skipped":
                self.summary.skipped.append(spec.tag)
            else:
                self.summary.fail(spec.tag, "build", f"{result.status}: {result.error.splitlines()[0] if result.error else ''}"
                                                     f" (log: {result.log})")
        return [spec for spec in self.specs if by_tag[spec.tag].status in ("built", "skipped")]

    def verify(self, client, specs: list[ImageSpec]) -> list[ImageSpec]:
        """Verify the images whose last verification was not a pass for their exact id; return those that passed."""
        options = verify_stage.VerifyOptions(reports_dir=self.project.reports, gpus=self.args.gpus,
                                             matrix_specs=tuple(self.matrix.specs))
        passed, to_verify = [], []
        for spec in specs:
            if self.passed_already(client, spec):
                self.summary.already_verified.append(spec.tag)
                passed.append(spec)
                continue
            try:
                verify_stage.plan_all(client, [spec], options, verify_stage.Progress())
                to_verify.append(spec)
            except InputError as error:
                self.summary.fail(spec.tag, "verify", str(error))
        with verify_stage.ConsoleProgress(stderr_console()) as progress:
            results = verify_stage.verify_images(client, to_verify, options, progress) if to_verify else []
        for result in results:
            if result.passed:
                self.summary.verified.append(result.tag)
                passed.append(next(spec for spec in specs if spec.tag == result.tag))
            else:
                failed = [name for name, check in result.checks.items() if check["status"] == "failed"]
                self.summary.fail(result.tag, "verify", f"checks failed: {', '.join(failed)} "
                                                        f"(see {result.report_dir / 'verify.json'})")
        return [spec for spec in specs if spec in passed]

    def passed_already(self, client, spec: ImageSpec) -> bool:
        """Whether the last verification passed for exactly this image (so publish would take it as it is)."""
        path = publish_stage.verify_report_path(self.project.reports, spec.tag)
        image = client.api.inspect_image(build_stage.local_name(spec))
        return publish_stage.verification_refusal(spec, image, publish_stage.read_verify_report(path), path) is None

    def publish(self, client, specs: list[ImageSpec]) -> bool:
        """Publish specs; True when at least one row is on the registry now (then pruning may follow)."""
        if not specs:
            return False
        results = publish_stage.Publisher(client, self.options, self.log).publish_all(specs)
        publish_stage.write_publish_report(self.project.reports, results)
        for result in results:
            if result.status == "published":
                self.summary.published.append({"tag": result.tag, "pinned": result.pinned, "digest": result.digest})
                self.summary.new_tags += result.created
                self.summary.moved_tags += result.moved
                if result.message and result.message not in self.summary.notes:
                    self.summary.notes.append(result.message)
            elif result.status == "unchanged":
                self.summary.unchanged.append(result.tag)
            else:
                self.summary.fail(result.tag, "publish", f"{result.status}: {result.message}")
        return any(result.status in ("published", "unchanged") for result in results)

    def prune(self) -> None:
        registry = RegistryClient(self.options.registry, self.options.retry, self.log)
        try:
            pruned = publish_stage.prune(registry, self.summary.rows, self.retention, self.options.catalog_dir,
                                         self.project.images, self.log)
        except RegistryError as error:
            self.summary.fail(REGISTRY_ROW, "prune", str(error))
            return
        self.summary.removed_tags = pruned.removed


def write_summary(reports_dir: Path, summary: Summary) -> str:
    """Write reports/nightly-summary.{json,md}; add the Markdown to the CI step summary when there is one."""
    text = markdown(summary)
    atomic_write_json(reports_dir / SUMMARY_JSON, summary.to_json())
    atomic_write(reports_dir / SUMMARY_MARKDOWN, text)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as output:
            output.write(text)
    return text


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_nightly(project: Project, args) -> int:
    summary = Nightly(project, args, log).run()
    print(write_summary(project.reports, summary), end="")
    if summary.nothing_to_do:
        print(f"nothing to do: {len(summary.rows)} rows unchanged, verified and published already "
              f"({summary.duration_s:.1f} s)")
    return summary.exit_code


# ------------------------------------------------------------------------------------------------------ report merge

def merge_reports(project: Project, shard_dirs: list[Path], catalog_dir: Path) -> Summary:
    """Join the shards' results into project's reports, catalog and lock file; return the merged summary.

    Each shard dir holds what a `nightly --shard` runner uploaded: reports/, catalog/ and bases.lock.json. A shard
    speaks only for its own rows (the rows of its summary), whatever older entries its files carry.
    """
    missing = [folder for folder in shard_dirs if not (folder / "reports" / SUMMARY_JSON).is_file()]
    if missing:
        raise InputError([Problem(str(folder), 0, f"not a shard's results: it must hold reports/{SUMMARY_JSON} (and "
                                                  "catalog/, bases.lock.json) as `nightly --shard` wrote them")
                          for folder in missing])
    parts = {folder: Summary.from_json(read_json(folder / "reports" / SUMMARY_JSON)) for folder in shard_dirs}
    _check_disjoint(parts)
    specs = project.load().specs
    catalog = catalog_stage.load_catalog(catalog_stage.catalog_file(catalog_dir))
    lock_path = lock_stage.lock_path(project)
    bases = lock_stage.read_lock(lock_path)
    shard_locks = [folder / LOCK_NAME for folder in shard_dirs if (folder / LOCK_NAME).is_file()]
    for folder, part in parts.items():
        rows = set(part.rows)
        for name in ("build-report.json", publish_stage.PUBLISH_REPORT):
            _merge_row_report(folder / "reports" / name, project.reports / name, rows)
        for tag in sorted(rows):
            if (folder / "reports" / tag).is_dir():
                shutil.copytree(folder / "reports" / tag, project.reports / tag, dirs_exist_ok=True)
        _take_catalog_rows(catalog, folder / "catalog", catalog_dir, rows)
        shard_bases = lock_stage.read_lock(folder / LOCK_NAME)
        bases.update({spec.base_image: shard_bases[spec.base_image] for spec in specs
                      if spec.tag in rows and spec.base_image in shard_bases})
    catalog_stage.save(catalog, catalog_dir, project.images)
    if shard_locks:
        lock_stage.write_lock(lock_path, bases)
    return merge_summaries(list(parts.values()))


def _check_disjoint(parts: dict[Path, Summary]) -> None:
    owner: dict[str, Path] = {}
    problems = []
    for folder, part in parts.items():
        for tag in part.rows:
            if tag in owner:
                problems.append(Problem(str(folder), 0, f"row {tag} was also run by {owner[tag]}: shards must not "
                                                        "overlap (make them from one `plan`)"))
            owner.setdefault(tag, folder)
    if problems:
        raise InputError(problems)


def _merge_row_report(source: Path, target: Path, rows: set[str]) -> None:
    """Copy the entries of rows from a shard's {"images": [...]} report into the merged one."""
    taken = [entry for entry in read_json(source, {"images": []})["images"] if entry["tag"] in rows]
    if not taken:
        return
    entries = {entry["tag"]: entry for entry in read_json(target, {"images": []})["images"]}
    entries.update({entry["tag"]: entry for entry in taken})
    atomic_write_json(target, {"images": [entries[tag] for tag in sorted(entries)]})


def _take_catalog_rows(catalog: catalog_stage.Catalog, shard_catalog_dir: Path, catalog_dir: Path,
                       rows: set[str]) -> None:
    shard_catalog = catalog_stage.load_catalog(catalog_stage.catalog_file(shard_catalog_dir))
    for tag in sorted(rows & set(shard_catalog.images)):
        entry = shard_catalog.images[tag]
        for pinned in entry.pinned:
            source = shard_catalog_dir / pinned.sbom
            if source.is_file():
                (catalog_dir / pinned.sbom).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, catalog_dir / pinned.sbom)
        catalog.images[tag] = entry


def cmd_report_merge(project: Project, args) -> int:
    summary = merge_reports(project, args.shard_dirs, catalog_stage.catalog_dir(project, args))
    print(write_summary(project.reports, summary), end="")
    return summary.exit_code


# ------------------------------------------------------------------------------------------------------------- CLI

def add_commands(commands) -> None:
    nightly = commands.add_parser(
        "nightly", help="lock, render check, build, verify, publish what passed, prune, summarise",
        description="Exit 0: every row is built, verified and published (or already was); 1: a row failed "
                    "(the others are still published); 2: bad input.")
    add_selectors(nightly)
    nightly.add_argument("--shard", metavar="i/n", help="run only shard i of n (see `plan`)")
    nightly.add_argument("--plan", type=Path, metavar="FILE",
                         help="take the shard's rows from this `plan --format json` output instead of planning again")
    nightly.add_argument("--retention", type=int, default=7, metavar="N",
                         help="dated tags to keep per row (default: %(default)s)")
    nightly.add_argument("--gpus", metavar="all|none|N|device=0,1",
                         help="GPUs for verification (default: all for GPU rows, none for CPU rows)")
    publish_stage.add_publish_arguments(nightly)
    add_build_arguments(nightly)
    nightly.set_defaults(handler=cmd_nightly)

    report = commands.add_parser("report", help="work with reports: `report merge` joins CI shards' results")
    actions = report.add_subparsers(dest="report_command", required=True, metavar="ACTION")
    merging = actions.add_parser("merge", help="merge shards' reports, catalogs and lock files, and their summaries")
    merging.add_argument("shard_dirs", nargs="+", type=Path, metavar="DIR",
                         help="a shard's results: the reports/, catalog/ and bases.lock.json it uploaded")
    catalog_stage.add_catalog_argument(merging)
    merging.set_defaults(handler=cmd_report_merge)
