"""The nightly job and its CI shards: plan (split the rows), nightly (every stage, one shard or all), report merge."""
from __future__ import annotations

import json
from pathlib import Path

from ..build.builder import Builder
from ..model import PYPI, ImageSpec, InputError, Problem
from ..nightly import plan
from ..nightly.merge import merge_reports
from ..nightly.run import Nightly, NightlyOptions
from ..nightly.summary import check_step_summary, write_summary
from ..nightly.why import decision_document, explain, read_row_state
from ..peers import engine
from ..peers.registry import RegistryClient
from ..project import EXIT_OK, Project
from ..publish import multiarch
from ..publish.catalog import CatalogEntry, catalog_file, load_catalog
from ..security.freshness import fixes_line
from .commands import add_command, project_flag
from .console import errors, log
from .display import ConsoleDisplay
from .options import (
    add_build_arguments,
    add_catalog_argument,
    add_publish_arguments,
    add_selectors,
    build_options,
    catalog_dir,
    integer,
    publish_options,
    writes_everything,
)
from .rows import default_rows


def cmd_plan(project: Project, args) -> int:
    shards = plan.make_plan(project.select(args.selectors), project.reports, args.shards)
    print(plan.github_matrix(shards) if args.format == "github"
          else json.dumps(plan.plan_document(shards), indent=2))
    return EXIT_OK


def cmd_nightly(project: Project, args) -> int:
    check_step_summary()
    matrix = project.load()
    # A shard takes its rows from the plan (made where there may be no engine, over every row), never the host's;
    # those are asked of the engine once every flag is known to be good.
    named = bool(args.selectors or args.shard or args.plan)
    specs = shard_rows(project, project.select(args.selectors), args) if named else []
    options = NightlyOptions(build=build_options(project, args), publish=publish_options(project, args),
                             retention=args.retention, gpus=args.gpus, shard=args.shard or "")
    if not named:
        specs = default_rows(project, engine.client())
    summary = Nightly(project, matrix, specs, options, ConsoleDisplay(errors()), log).run()
    print(write_summary(project.reports, summary), end="")
    if summary.nothing_to_do:
        print(f"nothing to do: {len(summary.rows)} rows unchanged, verified and published already "
              f"({summary.duration_s:.1f} s)")
    return summary.exit_code


def shard_rows(project: Project, specs: list[ImageSpec], args) -> list[ImageSpec]:
    """The selected rows this run takes: all of them, or shard i/n's (planned now, or read from a plan file)."""
    if not args.shard:
        if args.plan:
            raise InputError([Problem("--plan", 0, "--plan gives shards their rows: use it with --shard i/n")])
        return specs
    index, count = plan.parse_shard(args.shard)
    if args.plan:
        return plan.shard_from_plan_file(args.plan, index, count, specs)
    chosen = set(plan.make_plan(specs, project.reports, count)[index - 1].tags)
    return [spec for spec in specs if spec.tag in chosen]


def cmd_report_merge(project: Project, args) -> int:
    check_step_summary()
    summary = merge_reports(project, args.shard_dirs, catalog_dir(project, args))
    print(write_summary(project.reports, summary), end="")
    return summary.exit_code


def cmd_why(project: Project, args) -> int:
    """The nightly's decision for each selected row, with its reasons: nothing, build, or verify and publish."""
    publishing = publish_options(project, args)
    builder = Builder(engine.client(), build_options(project, args))
    registry = None if args.offline else RegistryClient(publishing.registry, publishing.access, publishing.retry, log)
    catalog = load_catalog(catalog_file(publishing.catalog_dir))
    key = publishing.signing_key.public.fingerprint if publishing.signing_key else None
    checker = publishing.security

    def security_fixes(spec: ImageSpec, entry: CatalogEntry) -> tuple[str, str]:
        assert checker is not None
        row = checker.check_published(spec.tag, spec.os, publishing.catalog_dir / entry.sbom)
        return (fixes_line(row) if row.fixable and not row.error else ""), row.error

    specs = project.select(args.selectors)
    grouped = multiarch.groups(specs)  # as `publish` of the same selection groups them
    states = [read_row_state(builder, spec, catalog, publishing.registry.name, key,
                                     registry, security_fixes if checker and not args.offline else None,
                                     in_group=(spec.index_tag or spec.tag) in grouped)
              for spec in specs]
    if args.format == "json":
        print(json.dumps([decision_document(state) for state in states], indent=2))
    else:
        print("\n".join(explain(state) for state in states))
    return EXIT_OK


def cmd_watch(project: Project, args) -> int:
    from ..nightly import release_watch  # here: the index client costs every other command's start a quarter second

    options = release_watch.WatchOptions(project.matrix, project.compat, project.templates, project.images,
                                         project.reports, args.index_url)
    proposal = release_watch.watch(options)
    print(release_watch.markdown(proposal), end="")
    print(f"report: {project.reports / release_watch.REPORT_JSON}")
    return EXIT_OK


def register(commands) -> None:
    watching = add_command(commands, "watch", description="Reads the newest torch on the index; when it is newer than the matrix's newest, writes its facts "
                    "into compat.yaml, proposes rows shaped like the newest ones in matrix.yaml and renders them, for "
                    "review. Publishes nothing. Exit 0 (with or without a proposal), 2: bad input.")
    watching.add_argument("--index-url", default=PYPI, help="a PEP 691 package index (default: %(default)s)")
    watching.set_defaults(handler=cmd_watch, writes=lambda project, args: [
        project.images, project.reports, project.matrix.parent, project.compat.parent])

    why = add_command(commands, "why", description="Reads the catalog, the registry's tags, the engine's image and the build inputs, and prints the "
                    "nightly's decision for each row with its reasons (the inputs that changed, by name). Changes "
                    "nothing. Exit 0, 2: bad input.")
    add_selectors(why)
    add_publish_arguments(why)
    add_build_arguments(why)
    why.add_argument("--offline", action="store_true",
                     help="ask neither the registry whether the tags still match nor the OS's security pocket")
    why.add_argument("--format", choices=("text", "json"), default="text", help="(default: %(default)s)")
    why.set_defaults(handler=cmd_why)

    planning = add_command(commands, "plan")
    add_selectors(planning)
    planning.add_argument("--shards", type=integer, required=True, metavar="N", help="number of shards (runners)")
    planning.add_argument("--format", choices=("github", "json"), default="json",
                          help="github: one line {\"include\": [...]} for a strategy matrix; json: the full plan")
    planning.set_defaults(handler=cmd_plan)

    nightly = add_command(commands, "nightly", description="Exit 0: every row is built, verified and published (or already was); 1: a row failed "
                    "(the others are still published); 2: bad input.")
    add_selectors(nightly, default="the rows for the engine's machine: every one where the engine has GPUs, else the "
                                   "CPU rows; with --shard, the shard's of every row")
    nightly.add_argument("--shard", metavar="i/n", help="run only shard i of n (see `plan`)")
    nightly.add_argument("--plan", type=Path, metavar="FILE",
                         help="take the shard's rows from this `plan --format json` output instead of planning again")
    nightly.add_argument("--retention", type=integer, default=7, metavar="N",
                         help="dated tags to keep per row (default: %(default)s)")
    nightly.add_argument("--gpus", metavar="all|none|N|device=0,1",
                         help="GPUs for verification (default: all for GPU rows, none for CPU rows)")
    add_publish_arguments(nightly)
    add_build_arguments(nightly)
    nightly.set_defaults(handler=cmd_nightly, writes=writes_everything)

    report = add_command(commands, "report")
    actions = report.add_subparsers(dest="report_command", required=True, metavar="ACTION")
    merging = actions.add_parser("merge", help="merge shards' reports, catalogs and lock files, and their summaries")
    project_flag(merging)
    merging.add_argument("shard_dirs", nargs="+", type=Path, metavar="DIR",
                         help="a shard's results: the reports/, catalog/ and bases.lock.json it uploaded")
    add_catalog_argument(merging)
    merging.set_defaults(handler=cmd_report_merge, writes=writes_everything)
