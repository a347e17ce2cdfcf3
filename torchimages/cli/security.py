"""`build.py security`: which OS packages of the published rows (or of any image) already have a security fix."""
from __future__ import annotations

import json

from rich.table import Table

from ..files import read_json_document
from ..matrix.load import load_compat
from ..peers import engine
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..publish.catalog import catalog_file, load_catalog
from ..security import freshness, sbom
from .commands import add_command
from .console import console, log
from .options import add_catalog_argument, add_selectors, catalog_dir


def cmd_security(project: Project, args) -> int:
    compat = load_compat(project.compat)
    checker = freshness.Checker(compat, str(project.compat), args.mirror, log)
    if args.image:
        rows = [image_security(checker, compat, args.image)]
    else:
        rows = published_security(checker, project, args)
    if args.format == "json":
        print(json.dumps({"rows": [row.to_json(freshness.utc_now().date()) for row in rows]}, indent=2))
    else:
        print_table(rows)
    return EXIT_FAILED if any(row.fixable or row.error for row in rows) else EXIT_OK


def published_security(checker: freshness.Checker, project: Project, args) -> list[freshness.RowSecurity]:
    """Each selected row's published digest, judged from its SBOM in the catalog (no engine, no pull)."""
    specs = project.select(args.selectors)
    folder = catalog_dir(project, args)
    catalog = load_catalog(catalog_file(folder))
    rows = []
    for spec in specs:
        entry = catalog.images.get(spec.tag)
        if entry is None:
            rows.append(freshness.RowSecurity(spec.tag, spec.os, error="not in the catalog: publish it first"))
            continue
        path = folder / entry.sbom
        document = read_json_document(path, "delete it: publish writes it again")
        installed = freshness.sbom_packages(document, str(path))
        rows.append(checker.check(f"{spec.tag} ({entry.digest[:19]})", spec.os, installed))
    return rows


def image_security(checker: freshness.Checker, compat: dict, reference: str) -> freshness.RowSecurity:
    """Any image the engine has or can pull: its package lists are read in a container started from it."""
    inventory = sbom.collect_inventory(engine.client(), reference)
    installed = [freshness.Installed(name, version, arch) for name, version, arch in inventory.debs]
    if not installed:
        return freshness.RowSecurity(reference, "", error="no dpkg packages in the image: no security index "
                                                               "to compare with")
    return checker.check(reference, freshness.os_for_release(compat, inventory.os_release), installed)


def print_table(rows: list[freshness.RowSecurity]) -> None:
    for row in rows:
        if row.error:
            print(f"{row.subject}: error: {row.error}")
            continue
        age = freshness.fix_age(row.fixable, freshness.utc_now().date())
        oldest = f"; the oldest fix it lacks is from {age['oldest_missing_fix']}, {age['fix_age_days']} days ago" \
            if age["oldest_missing_fix"] else ""
        print(f"{row.subject}: {len(row.fixable) or 'no'} fixable OS packages ({row.source}, {row.signature}){oldest}")
        if not row.fixable:
            continue
        table = Table(box=None, pad_edge=False)
        for column in ("package", "installed", "fixed", "since", "CVEs"):
            table.add_column(column, overflow="fold")
        for item in row.fixable:
            table.add_row(item.package, item.installed, item.fixed, item.since or "-", " ".join(item.cves) or "-")
        console().print(table)


def register(commands) -> None:
    checking = add_command(commands, "security")
    add_selectors(checking, default="every published row")
    checking.add_argument("--image", metavar="REF", help="judge this image instead of the catalog's rows")
    checking.add_argument("--format", choices=("table", "json"), default="table")
    checking.add_argument("--mirror", metavar="URL|DIR",
                          help="the security archive's root: a mirror, or a folder holding a saved index "
                               "(default: compat.yaml's os.<name>.security.url)")
    add_catalog_argument(checking)
    checking.set_defaults(handler=cmd_security, writes=lambda project, args: [])
