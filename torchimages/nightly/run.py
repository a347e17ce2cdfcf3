"""The nightly rebuild: refresh base pins, check the render, build (skipping unchanged rows), verify, publish what
passed, prune old dated tags, and summarise (Markdown for a CI step summary, and JSON). (`report merge`, in merge.py,
joins the results of the shards a CI matrix ran.)

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

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import docker.errors

from ..build import lock, render
from ..build.bases_lock import read_lock, write_lock
from ..build.builder import Builder, BuildOptions, base_reference, cache_name, local_name
from ..build.builder import Progress as BuildProgress
from ..build.builder import write_report as write_build_report
from ..invocation import command
from ..matrix.load import Matrix
from ..model import ImageSpec, InputError
from ..peers import engine
from ..peers.registry import RegistryClient, RegistryError
from ..project import Project
from ..publish import multiarch, prune, publisher
from ..publish.catalog import Catalog, CatalogEntry, catalog_file, load_catalog
from ..redaction import redact
from ..reporting import utc_timestamp
from ..security import freshness, promise
from ..verify import Progress as VerifyProgress
from ..verify import VerifyOptions, plan_all, verify_images
from ..verify.reports import read_verify_report, verify_report_path
from . import why
from .summary import REGISTRY_ROW, Published, SizeChange, Summary


@dataclass(frozen=True)
class NightlyOptions:
    build: BuildOptions
    publish: publisher.PublishOptions
    retention: int  # dated tags kept per row
    gpus: str | None = None  # for verification (None: all for GPU rows, none for CPU rows)
    shard: str = ""  # "i/n" when this run is one shard of a CI matrix, for the summary


class Display(Protocol):
    """Where build and verification progress goes (the command line shows it on the console)."""

    def building(self, tags: list[str]) -> AbstractContextManager[BuildProgress]: ...
    def verifying(self) -> AbstractContextManager[VerifyProgress]: ...


class Nightly:
    """One nightly run over specs (rows of matrix): every stage, each row's failure recorded and the others going on."""

    def __init__(self, project: Project, matrix: Matrix, specs: list[ImageSpec], options: NightlyOptions,
                 display: Display, log: Callable[[str], None]):
        self.project = project
        self.matrix = matrix
        self.specs = specs
        self.options = options
        self.publishing = options.publish
        self.display = display
        self.log = log
        self.registry = RegistryClient(self.publishing.registry, self.publishing.access, self.publishing.retry, log)
        self.summary = Summary(self.publishing.registry.name, options.shard, [spec.tag for spec in specs], utc_timestamp())
        self.behind: dict[str, freshness.RowSecurity] = {}  # rows due for their OS's security fixes

    def run(self) -> Summary:
        started = time.monotonic()
        catalog_path = catalog_file(self.publishing.catalog_dir)
        before = load_catalog(catalog_path)
        if self.specs and self.render_is_current():
            client = engine.client()
            self.refresh_lock(client)
            self.rerender_for_moved_bases()
            current = self.published_already(client, before)
            due = self.security_due(current, before)
            current = [spec for spec in current if spec.tag not in due]
            changed = [spec for spec in self.specs if spec not in current]
            buildable = self.build(client, self.prepare_engine(client, changed, before), due) if changed else []
            passed = self.verify(client, buildable)
            if self.publish(client, passed) or current:
                self.prune()
            self.summary.notes += self.over_promise(dt.date.today())
            self.summary.size_changes = size_changes(before, load_catalog(catalog_path),
                                                     self.summary.rows)
        self.summary.duration_s = round(time.monotonic() - started, 1)
        return self.summary

    def render_is_current(self) -> bool:
        stale = render.stale_paths(self.project.images, self.project.rendered(self.matrix))
        if not stale:
            self.summary.render = f"{self.project.images} is up to date"
            return True
        self.summary.render = (f"{self.project.images} is stale ({len(stale)} files differ from the matrix, e.g. "
                               f"{stale[0]}): run {command('render')} and commit it; nothing was built")
        for tag in self.summary.rows:
            self.summary.fail(tag, "render", self.summary.render)
        return False

    def refresh_lock(self, client) -> None:
        path = self.project.lock_file
        current = read_lock(path)
        try:
            # No pull: a fresh runner pulls a base only for the rows it builds (prepare_engine).
            refreshed = lock.refresh(lock.Resolver(client, pull=False, log=self.log), self.specs, current,
                                           everything=False)
        except docker.errors.APIError as error:
            self.summary.notes.append(f"base refresh failed, building on the bases the engine has: {redact(str(error))}")
            return
        if refreshed.bases != current:
            write_lock(path, refreshed.bases)
        self.summary.bases_changed = [change for change in refreshed.changes if change.before]
        self.summary.bases_unresolved = refreshed.unresolved

    def rerender_for_moved_bases(self) -> None:
        """A moved base pin changes the FROM of the rows on it: render them now, so exactly those rebuild."""
        changed = render.write_rendered(self.project.images, self.project.rendered(self.matrix))
        if changed:
            self.summary.render += f"; re-rendered {len(changed)} files for moved base pins (commit them with the lock)"

    def published_already(self, client, catalog: Catalog) -> list[ImageSpec]:
        """The rows whose current inputs are published and verified, decided from the catalog and the registry alone
        (an empty engine decides the same): nothing is done for them."""
        builder = Builder(client, self.options.build)
        key = self.publishing.signing_key
        current = []
        grouped = multiarch.groups(self.specs)
        for spec in self.specs:
            try:
                state = why.read_row_state(builder, spec, catalog, self.publishing.registry.name,
                                               key.public.fingerprint if key else None, self.registry,
                                               in_group=(spec.index_tag or spec.tag) in grouped)
            except (InputError, RegistryError) as error:
                self.log(f"{spec.tag}: not taken as published ({error}); running it")
                continue
            reasons = why.publish_reasons(state)
            if reasons:
                self.log(f"{spec.tag}: runs: {'; '.join(reasons)}")
            else:
                current.append(spec)
        return current

    def security_due(self, current: list[ImageSpec], catalog: Catalog) -> dict[str, str]:
        """The published rows whose OS has security fixes they lack (their SBOM in the catalog against the security
        index): tag -> the refresh token their rebuild takes. The others stay skipped, and the summary says so."""
        due: dict[str, str] = {}
        checker = self.publishing.security
        for spec in current if checker else []:
            assert checker is not None
            row = checker.check_published(spec.tag, spec.os, self.publishing.catalog_dir / catalog.images[spec.tag].sbom)
            if row.error:
                self.summary.notes.append(f"{spec.tag}: its security fixes were not looked up ({row.error})")
            elif row.fixable:
                due[spec.tag], self.behind[spec.tag] = freshness.refresh_token(row.fixable), row
                self.summary.notes.append(f"{spec.tag}: rebuilt for OS security fixes ({row.source}), its venv layers "
                                          f"reused: {freshness.fixes_line(row)}")
        kept = [spec for spec in current if spec.tag not in due]
        if kept:
            self.summary.skipped += [spec.tag for spec in kept]
            self.summary.already_verified += [spec.tag for spec in kept]
            self.summary.unchanged += [spec.tag for spec in kept]
            self.summary.notes.append(
                f"published already with today's inputs (the catalog's input hash is this run's and the registry's "
                f"tags name the catalog's digest), so nothing was pulled, built or verified: "
                f"{', '.join(spec.tag for spec in kept)}")
        return due

    def over_promise(self, today: dt.date) -> list[str]:
        """The rows due for security fixes that this run did not publish, past the patch promise (promise.py)."""
        return promise.over_promise(self.behind, {published.tag for published in self.summary.published}, today)

    def prepare_engine(self, client, specs: list[ImageSpec], catalog: Catalog) -> list[ImageSpec]:
        """Make what building specs needs present on the engine: their pinned bases, and (on a runner that lacks a
        row's image) the row's last published image for its layers. Returns the specs that can be built."""
        ready = []
        for spec in specs:
            try:
                self.pull_base(client, spec)
                ready.append(spec)
            except (docker.errors.APIError, InputError) as error:
                self.summary.fail(spec.tag, "build", f"could not pull its base: {redact(str(error))}")
        first_flavors = {spec.matrix_line: spec for spec in reversed(ready)}.values()
        for spec in first_flavors:  # later flavors share the first one's fresh layers (see Builder.build_all)
            self.pull_last_published(client, spec, catalog.images.get(spec.tag))
        return ready

    def pull_base(self, client, spec: ImageSpec) -> None:
        reference = base_reference(spec, self.project.images)
        if "@sha256:" in reference and not _has_image(client, reference):
            self.log(f"{spec.tag}: pulling its base {reference}")
            client.images.pull(reference)

    def pull_last_published(self, client, spec: ImageSpec, entry: CatalogEntry | None) -> None:
        if entry is None or entry.repository != self.publishing.registry.name or _has_image(client, local_name(spec)):
            return
        self.log(f"{spec.tag}: copying its last published image {entry.pull_digest()} in for its layers")
        try:
            self.registry.pull(entry.digest, cache_name(spec), self.publishing.daemon_host)
        except RegistryError as error:
            self.summary.notes.append(f"{spec.tag}: built without the layers of its last published image ({error})")

    def build(self, client, specs: list[ImageSpec], security_refresh: dict[str, str]) -> list[ImageSpec]:
        options = dataclasses.replace(self.options.build, security_refresh=security_refresh)
        try:
            with self.display.building([spec.tag for spec in specs]) as progress:
                results = Builder(client, options, progress).build_all(specs)
        finally:
            _remove_images(client, [cache_name(spec) for spec in specs])
        write_build_report(self.project.reports, results)
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
        options = VerifyOptions(reports_dir=self.project.reports, gpus=self.options.gpus,
                                             matrix_specs=tuple(self.matrix.specs), jobs=self.options.build.jobs)
        passed, to_verify = [], []
        for spec in specs:
            if self.passed_already(client, spec):
                self.summary.already_verified.append(spec.tag)
                passed.append(spec)
                continue
            try:
                plan_all(client, [spec], options, VerifyProgress())
                to_verify.append(spec)
            except InputError as error:
                self.summary.fail(spec.tag, "verify", str(error))
        with self.display.verifying() as progress:
            results = verify_images(client, to_verify, options, progress) if to_verify else []
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
        path = verify_report_path(self.project.reports, spec.tag)
        image = engine.inspect_image(client, local_name(spec))
        return publisher.verification_refusal(spec, image, read_verify_report(path), path) is None

    def publish(self, client, specs: list[ImageSpec]) -> bool:
        """Publish specs; True when at least one row is on the registry now (then pruning may follow)."""
        if not specs:
            return False
        results = publisher.Publisher(client, self.publishing, self.log).publish_all(specs)
        publisher.write_publish_report(self.project.reports, results)
        for result in results:
            if result.status == "published":
                self.summary.published.append(Published(result.tag, result.pinned, result.digest))
                self.summary.new_tags += result.created
                self.summary.moved_tags += result.moved
                if result.message and result.message not in self.summary.notes:
                    self.summary.notes.append(result.message)
            elif result.status == "unchanged":
                self.summary.unchanged.append(result.tag)
                if result.tag in self.summary.built:  # same inputs, same image: nothing was pushed
                    self.summary.notes.append(f"{result.tag}: rebuilt, same digest {result.digest}: nothing published")
            else:
                self.summary.fail(result.tag, "publish", f"{result.status}: {result.message}")
        return any(result.status in ("published", "unchanged") for result in results)

    def prune(self) -> None:
        try:
            pruned = prune.prune(self.registry, self.specs, self.matrix.specs, self.options.retention,
                                         self.publishing.catalog_dir, self.project.images, self.log)
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


def size_changes(before: Catalog, after: Catalog, tags: list[str]) -> list[SizeChange]:
    """Rows whose published digest changed in this run, with their sizes before and after."""
    changes = []
    for tag in tags:
        old, new = before.images.get(tag), after.images.get(tag)
        if new is not None and (old is None or old.digest != new.digest):
            changes.append(SizeChange(tag, old.size if old else None, new.size))
    return changes
