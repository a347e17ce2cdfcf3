"""`report merge`: join the results of the shards a CI matrix ran (each a `nightly --shard` run's reports/, catalog/
and bases.lock.json) into one reports folder, catalog and lock file, and one summary.

A shard speaks only for its own rows, and everything every shard uploaded is read and checked before the first write:
damaged or hostile results (links, pipes, rows of another shard, paths leaving the catalog) change nothing.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..build.bases_lock import LOCK_NAME, LockedBase, read_lock, write_lock
from ..build.builder import BUILD_REPORT
from ..files import brief, check_destinations, copy_file, inside, read_json_document
from ..model import ImageSpec, InputError, Problem
from ..project import Project
from ..publish import catalog_page
from ..publish.catalog import Catalog, CatalogEntry, catalog_file, load_catalog, require_folder
from ..publish.publisher import PUBLISH_REPORT
from ..reporting import RowReport
from .summary import SUMMARY_JSON, Summary, merge_summaries

SHARD_FIX = ("merge the results exactly as the shard's `nightly --shard` run uploaded them, or run that shard again "
             "and merge its new results")
ROW_REPORTS = (BUILD_REPORT, PUBLISH_REPORT)


@dataclass
class ShardResults:
    """What one `nightly --shard` runner uploaded, read and checked before anything is merged."""

    folder: Path
    summary: Summary
    reports: dict[RowReport, dict[str, dict]]  # tag -> entry in each row report, the shard's own rows only
    row_files: list[str]  # regular files under reports/<row>/, relative to reports/
    catalog: dict[str, CatalogEntry]  # the shard's own rows only
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
    own_bases = {shard.folder: _own_bases(shard, specs) for shard in shards}
    _check_bases_agree(shards, own_bases)
    require_folder(project.reports, "the reports folder (--reports DIR)")
    require_folder(project.images, "the images folder (--images DIR)")
    catalog_path = catalog_file(catalog_dir)
    catalog = load_catalog(catalog_path)
    lock_path = project.lock_file
    bases = read_lock(lock_path)
    reports = {report: report.read(project.reports) for report in ROW_REPORTS}
    row_files = [(shard.folder / "reports" / relative, project.reports / relative)
                 for shard in shards for relative in shard.row_files]  # names read from disk, under checked row folders
    sboms = [(shard.folder / "catalog" / sbom, inside(catalog_dir, sbom, str(catalog_path)))
             for shard in shards for sbom in shard.sboms]
    check_destinations([target for _, target in row_files], project.reports)
    check_destinations([target for _, target in sboms], catalog_dir)
    for copies, root in ((row_files, project.reports), (sboms, catalog_dir)):
        for source, target in copies:
            copy_file(source, target, root, SHARD_FIX)
    for shard in shards:
        for report, entries in shard.reports.items():
            reports[report].update(entries)
        catalog.images.update(shard.catalog)
        bases.update(own_bases[shard.folder])
    for report, entries in reports.items():
        if any(shard.reports[report] for shard in shards):
            report.write(project.reports, entries)
    catalog_page.save(catalog, catalog_dir, project.images)
    if any(shard.has_lock for shard in shards):
        write_lock(lock_path, bases)
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
    _check_one_registry(shards)
    return shards


def read_shard(folder: Path, tags: set[str]) -> ShardResults:
    summary_path = folder / "reports" / SUMMARY_JSON
    if not os.path.lexists(summary_path):
        raise InputError([Problem(str(folder), 0, f"not a shard's results: it must hold reports/{SUMMARY_JSON} (and "
                                                  "catalog/, bases.lock.json) as `nightly --shard` wrote them")])
    summary = Summary.from_json(read_json_document(summary_path, SHARD_FIX), summary_path, tags, SHARD_FIX)
    rows = set(summary.rows)
    problems: list[Problem] = []
    reports = {report: {tag: entry for tag, entry in _read_noting(report.read, folder / "reports", {}, problems).items()
                        if tag in rows}
               for report in ROW_REPORTS}
    catalog_path = catalog_file(folder / "catalog")
    shard_catalog = _read_noting(load_catalog, catalog_path, Catalog(), problems)
    entries = {tag: entry for tag, entry in shard_catalog.images.items() if tag in rows}
    sboms = [pinned.sbom for entry in entries.values() for pinned in entry.pinned
             if _is_regular_file(inside(folder / "catalog", pinned.sbom, str(catalog_path)), problems)]
    bases = _read_noting(read_lock, folder / LOCK_NAME, {}, problems)
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


def _own_bases(shard: ShardResults, specs: list[ImageSpec]) -> dict[str, LockedBase]:
    """The pins of the bases the shard's own rows build on: a shard speaks for nothing else."""
    rows = set(shard.summary.rows)
    return {spec.base_image: shard.bases[spec.base_image] for spec in specs
            if spec.tag in rows and spec.base_image in shard.bases}


def _check_bases_agree(shards: list[ShardResults], own_bases: dict[Path, dict[str, LockedBase]]) -> None:
    """Shards that pinned one base to different digests built on different bits: neither pin may win silently."""
    first: dict[str, tuple[Path, LockedBase]] = {}
    problems = []
    for shard in shards:
        for image, base in own_bases[shard.folder].items():
            other, known = first.setdefault(image, (shard.folder, base))
            if known.pin != base.pin:
                problems.append(Problem(str(shard.folder / LOCK_NAME), 0, (
                    f"pins base {brief(image)} to {brief(base.pin, 80)}, but {other / LOCK_NAME} pins it to "
                    f"{brief(known.pin, 80)}: the shards built on different bits of one base; run them again from one "
                    "bases.lock.json (commit it first), or merge each shard's results on its own")))
    if problems:
        raise InputError(problems)


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


def _check_one_registry(shards: list[ShardResults]) -> None:
    """Shards of one nightly publish to one registry: the merged summary names it, and must not name the first
    shard's while another shard's rows went elsewhere."""
    first = shards[0]
    problems = [Problem(str(shard.folder / "reports" / SUMMARY_JSON), 0,
                        f"published to {brief(shard.summary.registry, 80)}, but {first.folder} published to "
                        f"{brief(first.summary.registry, 80)}: merge the results of one registry's nightly together")
                for shard in shards[1:] if shard.summary.registry != first.summary.registry]
    if problems:
        raise InputError(problems)
