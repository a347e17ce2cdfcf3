"""The nightly rebuild: refresh base pins, check the render, build (skipping unchanged rows), verify, publish what
passed, prune old dated tags, and summarise (Markdown for a CI step summary, and JSON). `report merge` joins the
results of the shards a CI matrix ran.

Every stage reuses what the last run left: unchanged rows are not rebuilt, an image whose last verification passed
for its exact id is not verified again, and a digest already published is not pushed again. So a second run with
nothing new does nothing, quickly, and says so.

That holds on a CI runner whose engine starts empty too: a row whose input hash (as the builder computes it from the
rendered files, the build inputs and the lock's base pin) is the one its catalog entry records, and whose tags the
registry still resolves to the catalog's digest, is published and verified already: nothing is pulled, built or
verified for it. A row that changed pulls its last published image first, so that its build takes that image's
layers instead of starting from nothing.
"""
from __future__ import annotations

import os
import shutil
import stat
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
from .buildargs import add_build_arguments, build_options, run_builds
from .display import ConsoleProgress, stderr_console
from .files import atomic_write, atomic_write_json, brief, inside, read_json_document
from .lockfile import LOCK_NAME, LockedBase
from .model import ImageSpec, InputError, Problem
from .project import EXIT_FAILED, EXIT_OK, Project, add_selectors
from .registry import RegistryClient, RegistryError
from .reporting import Shape, human_size, markdown_cell, markdown_code, utc_timestamp

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
    def from_json(cls, data, path: Path, tags: set[str]) -> Summary:
        """The summary a `nightly` run wrote to path, every row it names one of tags (the matrix's); an InputError
        names each part of the wrong shape and each unknown row."""
        shape = Shape("summary")
        # A list, not a generator, in all(): every part is checked, so that every problem is reported.
        if shape.document(data, cls) and all([shape.fits(data.get(name, []), list[item], (name,))
                                              for name, item in SUMMARY_ITEMS.items()]):
            for part, tag in named_rows(data):
                if tag not in tags and not (part == "failed" and tag == REGISTRY_ROW):
                    shape.wrong((part,), f"names row {brief(tag)}, which is not a tag of the matrix")
        shape.raise_if_wrong(path, SHARD_FIX)
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
    """The summary as a GitHub step summary (readable as plain text too). Every value is escaped or quoted as code:
    a summary may come from an uploaded shard, and nothing in it may add links or break a table."""
    title = f"# Nightly images: {len(summary.rows)} rows" + (f" ({markdown_cell(summary.shard)})" if summary.shard else "")
    lines = [title, "", f"Registry {markdown_code(summary.registry)}; started {markdown_cell(summary.started_at)}; "
                        f"took {summary.duration_s:.1f} s.", ""]
    if summary.nothing_to_do:
        lines += [f"**Nothing to do**: all {len(summary.rows)} rows are unchanged, verified and already published.", ""]
    counts = [
        ("built", summary.built), ("build skipped (unchanged)", summary.skipped), ("verified", summary.verified),
        ("already verified", summary.already_verified), ("published", [p["tag"] for p in summary.published]),
        ("already published", summary.unchanged), ("failed", sorted({f["tag"] for f in summary.failed})),
    ]
    lines += ["| | rows | which |", "|---|---|---|"]
    lines += [f"| {label} | {len(tags)} | {', '.join(map(markdown_code, tags))} |" for label, tags in counts]
    if summary.failed:
        lines += ["", "## Failures", ""]
        lines += [f"- {markdown_code(f['tag'])} ({markdown_cell(f['stage'])}): {markdown_cell(f['error'])}"
                  for f in summary.failed]
    if summary.published:
        lines += ["", "## Published", "", "| row | pinned tag | digest |", "|---|---|---|"]
        lines += [f"| {markdown_code(p['tag'])} | {markdown_code(p['pinned'])} | {markdown_code(p['digest'])} |"
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
        lines += [f"- {markdown_code(c['image'])} moved {markdown_cell(c['before'] or '(new)')} -> "
                  f"{markdown_cell(c['after'])}: rebuilds {markdown_cell(', '.join(c['rows']))}"
                  for c in summary.bases_changed]
        lines += [f"- {markdown_code(image)} unresolved: {markdown_cell(why)}"
                  for image, why in sorted(summary.bases_unresolved.items())]
    if summary.notes:
        lines += ["", "## Notes", ""] + [f"- {markdown_cell(note)}" for note in summary.notes]
    lines += ["", f"Render check: {markdown_cell(summary.render)}."]
    return "\n".join(lines) + "\n"


def _size_row(change: dict) -> str:
    before, after = change["before"], change["after"]
    delta = "new" if before is None else f"{(after - before) / 1e6:+.1f} MB"
    return (f"| {markdown_code(change['tag'])} | {human_size(before) if before is not None else '-'} | "
            f"{human_size(after)} | {delta} |")


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
        self.registry = RegistryClient(self.options.registry, self.options.access, self.options.retry, log)
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
            current = self.published_already(client, before)
            changed = [spec for spec in self.specs if spec not in current]
            buildable = self.build(client, self.prepare_engine(client, changed, before)) if changed else []
            passed = self.verify(client, buildable)
            if self.publish(client, passed) or current:
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
            # No pull: a fresh runner pulls a base only for the rows it builds (prepare_engine).
            refreshed = lock_stage.refresh(lock_stage.Resolver(client, pull=False, log=self.log), self.specs, current,
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

    def published_already(self, client, catalog: catalog_stage.Catalog) -> list[ImageSpec]:
        """The rows whose current inputs are published and verified, decided from the catalog and the registry alone
        (an empty engine decides the same): nothing is done for them."""
        builder = build_stage.Builder(client, build_options(self.project, self.args))
        current = []
        for spec in self.specs:
            entry = catalog.images.get(spec.tag)
            if entry is None or not entry.input_hash or self.args.force or self.args.no_cache:
                continue
            try:
                unchanged = (entry.repository == self.options.registry.name and catalog_stage.matches_spec(entry, spec)
                             and builder.input_hash(spec) == entry.input_hash)
                tags = [*entry.floating, entry.pinned[0].tag]
                if unchanged and self.registry.tag_digests(tags) == dict.fromkeys(tags, entry.digest):
                    current.append(spec)
            except (InputError, RegistryError) as error:
                self.log(f"{spec.tag}: not taken as published ({error}); running it")
        if current:
            self.summary.skipped += [spec.tag for spec in current]
            self.summary.already_verified += [spec.tag for spec in current]
            self.summary.unchanged += [spec.tag for spec in current]
            self.summary.notes.append(
                f"published already with today's inputs (the catalog's input hash is this run's and the registry's "
                f"tags name the catalog's digest), so nothing was pulled, built or verified: "
                f"{', '.join(spec.tag for spec in current)}")
        return current

    def prepare_engine(self, client, specs: list[ImageSpec], catalog: catalog_stage.Catalog) -> list[ImageSpec]:
        """Make what building specs needs present on the engine: their pinned bases, and (on a runner that lacks a
        row's image) the row's last published image for its layers. Returns the specs that can be built."""
        ready = []
        for spec in specs:
            try:
                self.pull_base(client, spec)
                ready.append(spec)
            except (docker.errors.APIError, InputError) as error:
                self.summary.fail(spec.tag, "build", f"could not pull its base: {error}")
        first_flavors = {spec.matrix_line: spec for spec in reversed(ready)}.values()
        for spec in first_flavors:  # later flavors share the first one's fresh layers (see Builder.build_all)
            self.pull_last_published(client, spec, catalog.images.get(spec.tag))
        return ready

    def pull_base(self, client, spec: ImageSpec) -> None:
        reference = build_stage.base_reference(spec, self.project.images)
        if "@sha256:" in reference and not _has_image(client, reference):
            self.log(f"{spec.tag}: pulling its base {reference}")
            client.images.pull(reference)

    def pull_last_published(self, client, spec: ImageSpec, entry: catalog_stage.CatalogEntry | None) -> None:
        if entry is None or entry.repository != self.options.registry.name or _has_image(client, build_stage.local_name(spec)):
            return
        self.log(f"{spec.tag}: copying its last published image {entry.pull_digest()} in for its layers")
        try:
            self.registry.pull(entry.digest, build_stage.cache_name(spec), self.options.daemon_host)
        except RegistryError as error:
            self.summary.notes.append(f"{spec.tag}: built without the layers of its last published image ({error})")

    def build(self, client, specs: list[ImageSpec]) -> list[ImageSpec]:
        try:
            results = run_builds(self.project, specs, self.args)
        finally:
            _remove_images(client, [build_stage.cache_name(spec) for spec in specs])
        build_stage.write_report(self.project.reports, results)
        by_tag = {result.tag: result for result in results}
        for spec in specs:
            result = by_tag[spec.tag]
            if result.status == "built":
                self.summary.built.append(spec.tag)
            elif result.status == "skipped":
                self.summary.skipped.append(spec.tag)
            else:
                self.summary.fail(spec.tag, "build", f"{result.status}: {result.error.splitlines()[0] if result.error else ''}"
                                                     f" (log: {result.log})")
        return [spec for spec in specs if by_tag[spec.tag].status in ("built", "skipped")]

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
        with ConsoleProgress(stderr_console()) as progress:
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
        try:
            pruned = publish_stage.prune(self.registry, self.summary.rows, self.retention, self.options.catalog_dir,
                                         self.project.images, self.log)
        except RegistryError as error:
            self.summary.fail(REGISTRY_ROW, "prune", str(error))
            return
        self.summary.removed_tags = pruned.removed


def _has_image(client, reference: str) -> bool:
    try:
        client.api.inspect_image(reference)
    except docker.errors.ImageNotFound:
        return False
    return True


def _remove_images(client, references: list[str]) -> None:
    for reference in references:
        try:
            client.api.remove_image(reference)
        except docker.errors.ImageNotFound:
            pass


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

SHARD_FIX = ("merge the results exactly as the shard's `nightly --shard` run uploaded them, or run that shard again "
             "and merge its new results")
ROW_REPORTS = {"build-report.json": build_stage.read_report,
               publish_stage.PUBLISH_REPORT: publish_stage.read_publish_report}


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


# The parts of a summary that are lists of objects, with the shape of each object.
SUMMARY_ITEMS = {"failed": Failure, "published": Published, "size_changes": SizeChange,
                 "bases_changed": lock_stage.BaseChange}


def named_rows(data: dict) -> list[tuple[str, str]]:
    """(part, row) for every row a summary of the right shape names: its rows, and the rows each result lists."""
    named = [(part, tag) for part in ("rows", "built", "skipped", "verified", "already_verified", "unchanged")
             for tag in data.get(part, [])]
    return named + [(part, item["tag"]) for part in ("published", "failed", "size_changes") for item in data.get(part, [])]


@dataclass
class ShardResults:
    """What one `nightly --shard` runner uploaded, read and checked before anything is merged."""

    folder: Path
    summary: Summary
    reports: dict[str, dict[str, dict]]  # report file name -> tag -> entry, the shard's own rows only
    row_files: list[str]  # regular files under reports/<row>/, relative to reports/
    catalog: dict[str, catalog_stage.CatalogEntry]  # the shard's own rows only
    sboms: list[str]  # their SBOM files the shard has, relative to catalog/
    bases: dict[str, LockedBase]
    has_lock: bool


def merge_reports(project: Project, shard_dirs: list[Path], catalog_dir: Path) -> Summary:
    """Join the shards' results into project's reports, catalog and lock file; return the merged summary.

    Each shard dir holds what a `nightly --shard` runner uploaded: reports/, catalog/ and bases.lock.json. A shard
    speaks only for its own rows (the rows of its summary, which must be tags of the matrix), whatever older entries
    its files carry. Everything is read and checked before the first write: bad results change nothing.
    """
    specs = project.load().specs
    shards = read_shards(shard_dirs, {spec.tag for spec in specs})
    catalog_stage.require_folder(project.reports, "the reports folder (--reports DIR)")
    catalog_stage.require_folder(project.images, "the images folder (--images DIR)")
    catalog_path = catalog_stage.catalog_file(catalog_dir)
    catalog = catalog_stage.load_catalog(catalog_path)
    lock_path = lock_stage.lock_path(project)
    bases = lock_stage.read_lock(lock_path)
    reports = {name: read(project.reports / name) for name, read in ROW_REPORTS.items()}
    for shard in shards:
        for name, entries in shard.reports.items():
            reports[name].update(entries)
        for relative in shard.row_files:  # names read from disk, under a row folder inside() checked
            _copy(shard.folder / "reports" / relative, project.reports / relative)
        for sbom in shard.sboms:
            _copy(shard.folder / "catalog" / sbom, inside(catalog_dir, sbom, str(catalog_path)))
        catalog.images.update(shard.catalog)
        rows = set(shard.summary.rows)
        bases.update({spec.base_image: shard.bases[spec.base_image] for spec in specs
                      if spec.tag in rows and spec.base_image in shard.bases})
    for name, entries in reports.items():
        if any(shard.reports[name] for shard in shards):
            atomic_write_json(project.reports / name, {"images": [entries[tag] for tag in sorted(entries)]})
    catalog_stage.save(catalog, catalog_dir, project.images)
    if any(shard.has_lock for shard in shards):
        lock_stage.write_lock(lock_path, bases)
    return merge_summaries([shard.summary for shard in shards])


def read_shards(shard_dirs: list[Path], tags: set[str]) -> list[ShardResults]:
    """Every shard's results, or one InputError with the problems of all of them."""
    shards, problems = [], []
    for folder in shard_dirs:
        try:
            shards.append(read_shard(folder, tags))
        except InputError as error:
            problems += error.problems
    if problems:
        raise InputError(problems)
    _check_disjoint(shards)
    return shards


def read_shard(folder: Path, tags: set[str]) -> ShardResults:
    summary_path = folder / "reports" / SUMMARY_JSON
    if not os.path.lexists(summary_path):
        raise InputError([Problem(str(folder), 0, f"not a shard's results: it must hold reports/{SUMMARY_JSON} (and "
                                                  "catalog/, bases.lock.json) as `nightly --shard` wrote them")])
    summary = Summary.from_json(read_json_document(summary_path, SHARD_FIX), summary_path, tags)
    rows = set(summary.rows)
    problems: list[Problem] = []
    reports = {name: {tag: entry for tag, entry in _read_noting(read, folder / "reports" / name, {}, problems).items()
                      if tag in rows}
               for name, read in ROW_REPORTS.items()}
    catalog_path = catalog_stage.catalog_file(folder / "catalog")
    shard_catalog = _read_noting(catalog_stage.load_catalog, catalog_path, catalog_stage.Catalog(), problems)
    entries = {tag: entry for tag, entry in shard_catalog.images.items() if tag in rows}
    sboms = [pinned.sbom for entry in entries.values() for pinned in entry.pinned
             if _is_regular_file(inside(folder / "catalog", pinned.sbom, str(catalog_path)), problems)]
    bases = _read_noting(lock_stage.read_lock, folder / LOCK_NAME, {}, problems)
    row_files = [file for row in sorted(rows) for file in _row_files(folder / "reports", row, problems)]
    if problems:
        raise InputError(problems)
    return ShardResults(folder, summary, reports, row_files, entries, sboms, bases, os.path.lexists(folder / LOCK_NAME))


def _read_noting(read, path: Path, nothing, problems: list[Problem]):
    """read(path), or nothing with its problems noted: one run reports every damaged file of a shard."""
    try:
        return read(path)
    except InputError as error:
        problems.extend(error.problems)
        return nothing


def _row_files(reports_dir: Path, row: str, problems: list[Problem]) -> list[str]:
    """The files under reports_dir/<row>/, relative to reports_dir. A link, pipe or device there is a problem:
    copying it could read far outside the shard's folder, or never end."""
    top = inside(reports_dir, row, str(reports_dir / SUMMARY_JSON))
    if not os.path.lexists(top):
        return []
    if not stat.S_ISDIR(top.lstat().st_mode):
        problems.append(Problem(str(top), 0, f"not a folder, as a row's reports are: {SHARD_FIX}"))
        return []
    files = []
    for folder, subfolders, names in os.walk(top):  # linked folders are listed, not entered: flagged below
        for path in (Path(folder) / name for name in subfolders + names):
            if not stat.S_ISDIR(path.lstat().st_mode) and _is_regular_file(path, problems):
                files.append(path.relative_to(reports_dir).as_posix())
    return files


def _is_regular_file(path: Path, problems: list[Problem]) -> bool:
    """Whether path is a regular file. Nothing there is simply not one; a link, pipe, device or folder there is also
    noted as a problem."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        problems.append(Problem(str(path), 0, f"not a regular file (a link, pipe, device or folder): {SHARD_FIX}"))
    return stat.S_ISREG(mode)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _check_disjoint(shards: list[ShardResults]) -> None:
    owner: dict[str, Path] = {}
    problems = []
    for shard in shards:
        for tag in shard.summary.rows:
            if tag in owner:
                problems.append(Problem(str(shard.folder), 0, f"row {tag} was also run by {owner[tag]}: shards must not "
                                                              "overlap (make them from one `plan`)"))
            owner.setdefault(tag, shard.folder)
    if problems:
        raise InputError(problems)


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
