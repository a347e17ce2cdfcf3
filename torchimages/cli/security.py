"""`security`: which OS packages of the published rows (or of any image) already have a security fix. `scan`: a
published digest through the real scanner, offline, with only the VEX its publisher's key signed
(publish/scan.py)."""
from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from ..files import read_json_document
from ..matrix.load import load_compat
from ..model import InputError, Problem
from ..peers import engine
from ..peers.registry import RetryPolicy
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..publish.catalog import catalog_file, load_catalog
from ..publish.publisher import ALLOWLIST_NAME
from ..security import freshness, sbom
from .commands import add_command
from .console import console, log
from .options import (
    add_access_arguments,
    add_catalog_argument,
    add_scanner_db_argument,
    add_selectors,
    ask_registry,
    catalog_dir,
    integer,
    scanner_db,
)


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


def cmd_scan(project: Project, args) -> int:
    import datetime as dt

    from ..publish import scan
    from ..publish.verify_image import host_platform, image_reference
    from ..trust.signing import load_public_key

    keys = [load_public_key(path) for path in args.key]
    registry, reference = image_reference(args.reference)
    db = scanner_db(args)
    if db is None:
        raise InputError([Problem("--scanner-db", 0, "scan needs the team's vulnerability database: --scanner-db DIR "
                                                     "or $TORCHIMAGES_SCANNER_DB (docs/security.md, \"Scanning "
                                                     "offline\")")])
    allowlist = args.allowlist or project.matrix.parent / ALLOWLIST_NAME
    fail_on = sbom.load_allowlist(allowlist).fail_on if allowlist.exists() or args.allowlist else scan.DEFAULT_FAIL_ON
    outcome = ask_registry(args, registry, reference, lambda client: scan.scan_published(
        client, keys, reference, args.platform or host_platform(), db, fail_on, args.vex_out))
    if outcome is None:
        return EXIT_FAILED
    today = dt.date.today()
    if args.format == "json":
        print(json.dumps(scan_json(outcome, today), indent=2, sort_keys=True))
    else:
        print_scan(outcome, ", ".join(key.fingerprint for key in keys), today)
    return EXIT_OK if outcome.passed else EXIT_FAILED


def _age(published: str, today) -> str:
    import datetime as dt
    try:
        return f"published {published}, {(today - dt.date.fromisoformat(published)).days} days ago"
    except ValueError:
        return "publication date unknown"


def print_scan(outcome, fingerprint: str, today) -> None:
    from ..security.vex import VEX_PREDICATE

    evidence, report = outcome.subject.evidence, outcome.report
    formats = evidence.formats.get(VEX_PREDICATE)
    print(outcome.scanned)
    print(f"  signature: {'verified, signs ' + ', '.join(evidence.signed_as) if outcome.signed else 'NOT VERIFIED'} "
          f"(key {fingerprint})")
    if outcome.vex_document is not None:
        print(f"  OpenVEX: {len(outcome.vex_document['statements'])} signed statement(s) in force"
              + (f" [{', '.join(formats)}]" if formats else "") + ", handed to the scanner")
    else:
        print("  OpenVEX: none signed by this key in force for this digest: the scanner suppresses nothing")
    for line in outcome.ignored_vex:
        print(f"  ignored: {line}")
    for problem in evidence.problems:
        print(f"  problem: {problem}")
    print(f"  trivy ({report.os or 'no OS found'}): {len(report.findings)} finding(s) left, {len(report.suppressed)} "
          "suppressed by the signed VEX")
    for finding in report.findings:
        fix = f"fixed in {finding.fixed}" if finding.fixed else "no fix yet"
        print(f"    {finding}: {fix}, {_age(report.published.get(finding.id, ''), today)}")
    for finding in report.suppressed:
        print(f"    suppressed: {finding}")
    blocking = outcome.blocking
    if not outcome.signed:
        print(f"NOT PASSED: {outcome.scanned} is not signed by this key")
    elif blocking:
        print(f"NOT PASSED: {len(blocking)} fixable {'/'.join(outcome.fail_on)} finding(s) no signed statement "
              "explains")
    else:
        print(f"passed: no unexplained fixable {'/'.join(outcome.fail_on)} finding")


def scan_json(outcome, today) -> dict:
    report = outcome.report

    def finding(item, suppressed: bool = False) -> dict:
        return {"id": item.id, "package": item.package, "version": item.version, "severity": item.severity,
                "fixed": item.fixed, "published": report.published.get(item.id, ""), "suppressed": suppressed}

    return {"scanned": outcome.scanned, "signed_as": outcome.subject.evidence.signed_as,
            "vex_statements": len(outcome.vex_document["statements"]) if outcome.vex_document else 0,
            "ignored_vex": outcome.ignored_vex, "problems": outcome.subject.evidence.problems, "os": report.os,
            "findings": [finding(item) for item in report.findings]
            + [finding(item, True) for item in report.suppressed],
            "blocking": [str(item) for item in outcome.blocking], "fail_on": list(outcome.fail_on),
            "passed": outcome.passed, "date": today.isoformat()}


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

    scanning = add_command(commands, "scan")
    scanning.add_argument("reference", metavar="REF", help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<hex>")
    scanning.add_argument("--key", type=Path, action="append", required=True, metavar="KEY.pub",
                          help="the publisher's public key (catalog/keys/<fingerprint>.pub); repeat it to trust "
                               "several: only a VEX one of them signed about the digest is applied")
    add_scanner_db_argument(scanning)
    scanning.add_argument("--scanner", choices=("trivy",), default="trivy",
                          help="the scanner run (Grype: the recipe in docs/security.md)")
    scanning.add_argument("--platform", metavar="OS/ARCH",
                          help="of a multi-arch tag, the platform's image (default: this machine's)")
    scanning.add_argument("--allowlist", type=Path,
                          help=f"whose fail_on severities block (default: {ALLOWLIST_NAME} beside the matrix, else "
                               "CRITICAL and HIGH); its entries suppress nothing here: only signed VEX does")
    scanning.add_argument("--vex-out", type=Path, metavar="FILE",
                          help="also keep the verified VEX handed to the scanner in FILE")
    scanning.add_argument("--format", choices=("text", "json"), default="text")
    scanning.add_argument("--retries", type=integer, default=RetryPolicy.retries,
                          help="tries again after a transient registry error (default: %(default)s)")
    add_access_arguments(scanning)
    scanning.set_defaults(handler=cmd_scan, writes=lambda project, args: [args.vex_out.parent] if args.vex_out else [])
