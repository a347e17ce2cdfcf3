"""Commands on the registry side: lock (pin the bases), publish, prune, catalog (verify-image: verifying.py)."""
from __future__ import annotations

import datetime as dt
import json
import sys
from collections import Counter

from ..build import lock
from ..build.bases_lock import read_lock, write_lock
from ..build.builder import local_name
from ..files import atomic_write
from ..invocation import command
from ..model import ImageSpec, InputError, Problem
from ..peers import engine
from ..peers.registry import RegistryClient, RegistryError, RetryPolicy
from ..peers.registry_address import parse_registry
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..publish import catalog_page, prune, publisher
from ..publish.catalog import (
    README_NAME,
    catalog_file,
    current_page,
    key_file_problems,
    load_catalog,
    registry_mismatches,
    require_folder,
)
from ..publish.lazy import LAZY_SUFFIX
from ..security import sbom, vex
from ..trust import referrers
from ..verify.reports import read_verify_report, verify_report_path
from .commands import add_command
from .console import log
from .options import (
    access_settings,
    add_access_arguments,
    add_catalog_argument,
    add_publish_arguments,
    add_registry_arguments,
    add_selectors,
    catalog_dir,
    integer,
    publish_options,
    writes_catalog,
)
from .rows import leaving_line, leaving_reasons, publishable_rows


def cmd_lock(project: Project, args) -> int:
    specs = project.select(args.selectors)
    path = project.lock_file
    current = read_lock(path)
    resolver = lock.Resolver(engine.client(), pull=not args.check, log=log)
    result = lock.refresh(resolver, specs, current, everything=not args.selectors)
    for image in sorted({spec.base_image for spec in specs}):
        base = result.bases.get(image)
        if base is None or image in result.unresolved:
            print(f"unresolved  {image}: {result.unresolved.get(image, 'not pinned')}")
        else:
            print(f"{base.source:11} {image} -> {base.pin}" + (f"  ({base.note})" if base.note else ""))
    for change in result.changes:
        print(f"{'new' if not change.before else 'moved'}: {change.image} {change.before or '-'} -> {change.after}; "
              f"rows on it: {', '.join(change.rows)}")
    if args.check:
        stale = bool(result.changes) or set(result.bases) != set(current)
        print(f"{path} is {'stale: run ' + command('lock') if stale else 'up to date'}")
        return EXIT_FAILED if stale or result.unresolved else EXIT_OK
    write_lock(path, result.bases)
    print(f"wrote {path} ({len(result.bases)} bases, {len(result.changes)} changed)")
    return EXIT_FAILED if result.unresolved else EXIT_OK


def cmd_publish(project: Project, args) -> int:
    options = publish_options(project, args)
    sbom.refuse_expired(options.allowlist, dt.date.today())
    vex.preflight(options.allowlist, dt.date.today())
    client = engine.client()
    specs = project.select(args.selectors) if args.selectors else verified_rows(project, client)
    results = publisher.Publisher(client, options, log).publish_all(specs)
    print_results(results, options.registry.name)
    if options.signing_key is None and any(result.status in ("published", "unchanged") for result in results):
        print("unsigned: no --signing-key (or $TORCHIMAGES_SIGNING_KEY) was given, so nothing carries a signature or "
              "attestations; clusters that require them will refuse these images")
    path = publisher.write_publish_report(project.reports, results)
    counts = Counter(result.status for result in results)
    print(f"{', '.join(f'{n} {status}' for status, n in sorted(counts.items()))}; report: {path}")
    return EXIT_FAILED if counts["failed"] or counts["refused"] else EXIT_OK


def verified_rows(project: Project, client) -> list[ImageSpec]:
    """publish's rows when it names none: those whose image now tagged may be published on its verification (as
    publish itself decides), saying which it leaves; bad input when that leaves none."""
    every = project.load().specs
    refusals = {}
    for spec in every:
        path = verify_report_path(project.reports, spec.tag)
        try:
            refusals[spec.tag] = publisher.verification_refusal(
                spec, engine.inspect_image(client, local_name(spec)), read_verify_report(path), path)
        except InputError as error:  # a damaged report leaves its own row only
            refusals[spec.tag] = "; ".join(problem.message for problem in error.problems)
    taken, left = publishable_rows(every, refusals)
    if not taken:
        raise InputError([Problem("SELECTOR", 0, f"no row is verified for publishing ({leaving_reasons(left)}): verify "
                                                 f"them first ({command('images')}), or name the rows to publish")])
    line = leaving_line(taken, left)
    if line:
        print(line, file=sys.stderr)
    return taken


def print_results(results: list[publisher.PublishResult], repository: str) -> None:
    for result in results:
        if result.status in ("published", "unchanged"):
            written = result.created + result.moved
            tags = f"; tags written: {', '.join(written)}" if written else ""
            signed = f"; {referrers.signing_statuses(result.signing)}; signed with key {result.signing['key'][:19]}..." \
                if result.signing else ""
            lazy = f"; eStargz variant {repository}:{result.pinned}{LAZY_SUFFIX} = {result.lazy}" if result.lazy else ""
            print(f"{result.status:9} {result.tag}: {repository}:{result.pinned} = {result.digest}{tags}{signed}{lazy}")
        else:
            print(f"{result.status:9} {result.tag}: {result.message}")


def cmd_prune(project: Project, args) -> int:
    specs = project.select(args.selectors)
    address = parse_registry(args.registry)
    registry = RegistryClient(address, access_settings(args).access(address), RetryPolicy(retries=args.retries), log)
    try:
        registry.ping()
        result = prune.prune(registry, specs, project.load().specs, args.retention,
                                     catalog_dir(project, args), project.images, log)
    except RegistryError as error:
        print(f"error: {error}; nothing pruned from the catalog", file=sys.stderr)
        return EXIT_FAILED
    print(f"pruned {len(result.removed)} dated tags, keeping the {args.retention} newest of each row"
          + (": " + ", ".join(result.removed) if result.removed else ""))
    return EXIT_OK


def cmd_catalog(project: Project, args) -> int:
    folder = catalog_dir(project, args)
    catalog = load_catalog(catalog_file(folder))
    if args.check_registry:
        mismatches = registry_mismatches(catalog, access_settings(args), log)
        for problem in mismatches:
            print(problem, file=sys.stderr)
        print(f"{len(catalog.images)} catalog entries checked against the registry: "
              f"{'all match' if not mismatches else f'{len(mismatches)} problems'}")
        return EXIT_FAILED if mismatches else EXIT_OK
    page = catalog_page.readme(catalog, catalog_page.sbom_prefix(folder, project.images),
                               catalog_page.root_prefix(folder, project.images))
    readme_path = project.images / README_NAME
    require_folder(project.images, "the images folder (--images DIR)")
    current = current_page(readme_path)
    if args.check:
        # A consumer verifies with the key file the page links to: one holding another key than its name is refused.
        key_problems = key_file_problems(folder)
        for problem in key_problems:
            print(f"error: {problem}", file=sys.stderr)
        if current != page:
            print(f"{readme_path} is stale; run {command('catalog')} and commit it", file=sys.stderr)
            return EXIT_FAILED
        print(f"{readme_path} is up to date")
        return EXIT_FAILED if key_problems else EXIT_OK
    if args.format == "json":
        print(json.dumps(catalog.to_json(), indent=2, sort_keys=True))
    else:
        print(page, end="")
    if current != page:
        atomic_write(readme_path, page)
        print(f"wrote {readme_path}", file=sys.stderr)
    return EXIT_OK


def register(commands) -> None:
    locking = add_command(commands, "lock")
    add_selectors(locking, default="the bases of every row")
    locking.add_argument("--check", action="store_true", help="exit 1 if a base moved since the lock; write nothing")
    locking.set_defaults(handler=cmd_lock,
                         writes=lambda project, args: [] if args.check else [project.lock_file.parent])

    publishing = add_command(commands, "publish")
    add_selectors(publishing, default="the rows whose image now tagged passed its verification")
    add_publish_arguments(publishing)
    publishing.set_defaults(handler=cmd_publish,
                            writes=lambda project, args: [project.reports, *writes_catalog(project, args)])

    pruning = add_command(commands, "prune")
    add_selectors(pruning)
    pruning.add_argument("--retention", type=integer, required=True, metavar="N", help="dated tags to keep per row")
    add_registry_arguments(pruning)
    pruning.set_defaults(handler=cmd_prune, writes=writes_catalog)

    cataloging = add_command(commands, "catalog")
    cataloging.add_argument("--format", choices=("markdown", "json"), default="markdown")
    cataloging.add_argument("--check", action="store_true", help="exit 1 if images/README.md is stale; write nothing")
    cataloging.add_argument("--check-registry", action="store_true",
                            help="exit 1 unless every catalog tag resolves to the catalog's digest on its registry")
    add_access_arguments(cataloging)
    add_catalog_argument(cataloging)
    cataloging.set_defaults(handler=cmd_catalog, writes=lambda project, args: [] if args.check or args.check_registry
                            else [project.images])
