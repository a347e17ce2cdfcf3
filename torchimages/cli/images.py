"""Commands over the matrix and its images: list, render, wheels, build, images (the main job), test, doctor."""
from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

from rich.table import Table
from rich.text import Text

from .. import verify
from ..build import builder, debs, doctor, render, wheels
from ..checks import checklist
from ..files import atomic_write
from ..invocation import command
from ..model import ImageSpec, InputError, Problem
from ..peers import engine
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..reporting import human_size
from ..verify import emulation
from ..verify.reuse import reuse_line
from .commands import add_command
from .console import console, errors, log
from .display import DOCTOR_STYLE, ConsoleDisplay, ConsoleProgress, build_summary, checks_table, failure_lines
from .options import add_build_arguments, add_selectors, add_source_arguments, build_options, integer, writes_reports
from .rows import default_rows


def cmd_list(project: Project, args) -> int:
    specs = project.select(args.selectors)
    rows = [_list_row(spec) for spec in specs]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    table = Table(title=f"{len(rows)} images from {project.matrix}")
    for column in rows[0]:
        table.add_column(column, no_wrap=column in ("tag", "base_image"))
    for row in rows:
        table.add_row(*(str(value) for value in row.values()))
    console().print(table)
    return EXIT_OK


def _list_row(spec: ImageSpec) -> dict:
    return {
        "tag": spec.tag, "torch": spec.torch, "cuda": spec.cuda or "cpu", "cudnn": spec.cudnn or "-",
        "python": spec.python, "os": spec.os, "flavor": spec.flavor, "base_image": spec.base_image,
        "min_driver": spec.min_driver or "-", "arch_list": ";".join(spec.arch_list) or "-",
    }


def cmd_render(project: Project, args) -> int:
    rendered = project.rendered(project.load())
    if args.check:
        stale = render.stale_paths(project.images, rendered)
        if stale:
            print(f"{project.images} is stale; run {command('render')} and commit the result:", file=sys.stderr)
            for rel in stale:
                print(f"  {project.images / rel}", file=sys.stderr)
            return EXIT_FAILED
        print(f"{project.images} is up to date ({len(rendered)} files)")
        return EXIT_OK
    changed = render.write_rendered(project.images, rendered)
    print(f"rendered {len(rendered)} files into {project.images}: {len(changed)} changed")
    for rel in changed:
        print(f"  {rel}")
    return EXIT_OK


def cmd_wheels(project: Project, args) -> int:
    specs = project.select(args.selectors)
    fetched = wheels.fetch_wheels(specs, args.dest, args.pip_index_url, args.extra_index_url, log)
    for folder in fetched:
        print(f"{folder.dest}: {folder.files} files, {human_size(folder.total_bytes)}; fetched {folder.new_files} "
              f"({human_size(folder.new_bytes)}) this time")
    return EXIT_OK


def cmd_debs(project: Project, args) -> int:
    """Keep the .debs each selected row's engine image records (debs.py), checked by sha256, for `build --debs`."""
    client = engine.client()
    for spec in project.select(args.selectors):
        image = builder.local_name(spec)
        if engine.inspect_image(client, image) is None:
            raise InputError([Problem(spec.tag, 0, f"the local image {image} (a name on this engine, not pushed "
                                                   f"anywhere) is not on the engine: build it first "
                                                   f"({command(f'build {spec.tag}')})")])
        pins = debs.image_pins(client.api, image)
        if not pins:
            raise InputError([Problem(spec.tag, 0, f"{image} records no .debs (built before they were recorded, or "
                                                   f"not an apt row): build it again with --force")])
        fetched = debs.keep(client, image, spec.tag, pins, args.dest)
        print(f"{spec.tag}: {len(pins)} .debs in {args.dest} (fetched {fetched} this time); "
              f"{debs.manifest_path(args.dest, spec.tag)}")
    return EXIT_OK


def cmd_build(project: Project, args) -> int:
    options = build_options(project, args)  # bad flags refused before the engine is asked for the default rows
    specs = project.select(args.selectors) if args.selectors else default_rows(project, engine.client())
    results = run_builds(specs, options)
    path = builder.write_report(project.reports, results)
    show_build_results(results)
    print(f"report: {path}")
    return EXIT_FAILED if any(r.status in ("failed", "cancelled") for r in results) else EXIT_OK


def cmd_test(project: Project, args) -> int:
    selection = verify.parse_selection(args.only, args.skip)
    specs = project.select(args.selectors)
    options = verify.VerifyOptions(reports_dir=project.reports, gpus=args.gpus, shm_size=args.shm_size, image=args.image,
                            timeout=args.timeout, matrix_specs=tuple(project.load().specs), jobs=args.jobs,
                            selection=selection, force=args.force)
    docker_client = engine.client()
    with ConsoleProgress(errors()) as progress:
        results = verify.verify_images(docker_client, specs, options, progress)
    out = console()
    for result in results:
        out.print(checks_table(result))
        if result.reused_from:
            out.print(reuse_line(result), markup=False, highlight=False)
        if not selection.full:
            out.print(f"{result.tag}: {verify.selective_note(result)}", markup=False, highlight=False)
    if args.image:
        # Kept apart from the row's own verification (reports/<tag>/verify.json), which publish reads.
        [result] = results
        out.print(f"reports of {args.image}: {result.report_dir}/ (verify.json, junit.xml, verify-summary.md); the "
                  f"row's own verification in {project.reports / result.tag} is left as it was",
                  markup=False, highlight=False)
    else:
        out.print(f"reports: {project.reports}/<tag>/verify.json, junit.xml; summary: "
                  f"{project.reports / 'verify-summary.md'}", markup=False, highlight=False)
    return EXIT_OK if all(result.passed for result in results) else EXIT_FAILED


def run_builds(specs: list[ImageSpec], options: builder.BuildOptions) -> list[builder.BuildResult]:
    if options.wheelhouse is not None:
        wheels.check_wheelhouse(specs, options.wheelhouse)  # refused before building: it never falls back to an index
    with ConsoleDisplay(errors()).building([spec.tag for spec in specs]) as progress:
        building = builder.Builder(engine.client(), options, progress)
        try:
            return building.build_all(specs)
        except KeyboardInterrupt:
            line = building.interrupted_line()
            if line:
                errors().print(line, markup=False, highlight=False, soft_wrap=True)
            raise


def show_build_results(results: list[builder.BuildResult]) -> None:
    console().print(build_summary(results))
    stderr = errors()
    for line in failure_lines(results, stderr.is_terminal):
        stderr.print(line, style="red" if not line.startswith(" ") else None, highlight=False, soft_wrap=True)


def cmd_images(project: Project, args) -> int:
    """The main job: fetch missing wheels, build (skipping what is unchanged), verify what was built."""
    docker_client = engine.client()
    options = build_options(project, args)  # bad flags refused before the engine is asked for the default rows
    specs = project.select(args.selectors) if args.selectors else default_rows(project, docker_client)
    if args.wheelhouse:
        missing = wheels.uncovered_rows(specs, args.wheelhouse)
        if missing:
            wheels.fetch_wheels(missing, args.wheelhouse, args.pip_index_url, args.extra_index_url, log)
    results = run_builds(specs, options)
    builder.write_report(project.reports, results)
    show_build_results(results)
    ready = [spec for spec, result in zip(specs, results, strict=False) if result.status in ("built", "skipped")]
    checking = verify.VerifyOptions(reports_dir=project.reports, matrix_specs=tuple(project.load().specs),
                                    jobs=args.jobs, force=args.force)
    with ConsoleProgress(errors()) as progress:
        verified = verify.verify_images(docker_client, ready, checking, progress) if ready else []
    for outcome in verified:
        console().print(checks_table(outcome))
        if outcome.reused_from:
            console().print(reuse_line(outcome), markup=False, highlight=False)
    print(f"reports: {project.reports}/<tag>/ (build.log, verify.json, junit.xml), {project.reports / 'verify-summary.md'}")
    all_built = len(ready) == len(specs)
    return EXIT_OK if all_built and all(outcome.passed for outcome in verified) else EXIT_FAILED


DOCTOR_LOG_WIDTH = 100  # doctor's lines where stdout is no terminal


def cmd_doctor(project: Project, args) -> int:
    """What this host can do with the selected rows, before a long build or pull."""
    for name in ("wheelhouse", "ca_bundle"):
        path = getattr(args, name)
        if path is not None and not path.exists():
            raise InputError([Problem(str(path), 0, f"--{name.replace('_', '-')} {path} does not exist")])
    sources = wheels.WheelSources(args.wheelhouse, args.pip_index_url, args.extra_index_url, args.ca_bundle)
    findings = doctor.diagnose(project.select(args.selectors), project.images, sources)
    failed = any(finding.status == "fail" for finding in findings)
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(finding) for finding in findings], indent=2))
        return EXIT_FAILED if failed else EXIT_OK
    if not sys.stdout.isatty():
        # A log or a pipe: a line per finding, wrapped, not a table as wide as the longest detail (trial 2, #24).
        for finding in findings:
            print(textwrap.fill(finding.detail, DOCTOR_LOG_WIDTH, initial_indent=f"{finding.status:<4}  "
                                f"{finding.subject}: ", subsequent_indent=" " * 6, break_long_words=False,
                                break_on_hyphens=False))
        return EXIT_FAILED if failed else EXIT_OK
    table = Table(title="what this host can do")
    for column in ("", "subject", "detail"):
        table.add_column(column, no_wrap=column != "detail")
    for finding in findings:
        table.add_row(Text(finding.status, DOCTOR_STYLE[finding.status]), finding.subject, finding.detail)
    console().print(table)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_gpu_record(project: Project, args) -> int:
    """The GPU side on this host, judged by the real checks, as docs/gpu-validation.md's record line; every raw fact
    kept in one file, a simulation-lane host (tests/gpu_hosts) that replays the run (verify/record.py decides)."""
    from datetime import date

    import yaml

    from ..verify import record

    specs = project.select([args.tag])
    if len(specs) != 1:
        raise InputError([Problem(args.tag, 0, f"{args.tag} names {len(specs)} rows: name one tag")])
    [spec] = specs
    if args.facts:
        facts, source, where = record.read_gpu_facts(args.facts), f"facts {args.facts.name}", str(args.facts)
    elif args.image:
        facts, source = record.image_gpu_facts(engine.client(), spec, args.image), args.image
        where = args.image
    else:
        facts, source, where = record.host_gpu_facts(), "host Python (no Docker)", sys.executable
    today = date.today().isoformat()
    result, scenario = record.gpu_record(today, spec, source, where, facts, project.load().specs)
    for name, check in result.checks.items():
        print(f"{name}: {check['status']}: {check['message']}", file=sys.stderr)
    if scenario is not None:
        path = project.reports / "gpu-record" / f"{today}-{record.host_name(facts)}-{spec.tag}.yaml"
        # libyaml's writer where this host has it: the pure-Python one takes seconds per thousand GPUs
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        atomic_write(path, yaml.dump(scenario, Dumper=dumper, sort_keys=False, width=120), root=project.reports)
        print(f"every raw fact, as a simulation-lane host: {path} (copy it to tests/gpu_hosts/ to replay this run)",
              file=sys.stderr)
    else:
        print("these facts hold no raw host answers (saved by an older probe): no lane host written; save them again "
              "with `probe.py --gpu-only`", file=sys.stderr)
    print(result.line)
    return EXIT_OK if result.passed else EXIT_FAILED


HOST_ROWS = "the rows for the engine's machine: every one where the engine has GPUs, else the CPU rows"


def register(commands) -> None:
    """list, render, wheels, build, images, test: the matrix, its images and their verification."""
    listing = add_command(commands, "list")
    add_selectors(listing)
    listing.add_argument("--format", choices=("table", "json"), default="table")
    listing.set_defaults(handler=cmd_list)

    rendering = add_command(commands, "render")
    rendering.add_argument("--check", action="store_true", help="exit 1 listing stale files, write nothing")
    rendering.set_defaults(handler=cmd_render, writes=lambda project, args: [] if args.check else [project.images])

    fetching = add_command(commands, "wheels")
    add_selectors(fetching, required=True)
    fetching.add_argument("--dest", type=Path, required=True, help="wheelhouse folder")
    add_source_arguments(fetching)
    fetching.set_defaults(handler=cmd_wheels, writes=lambda project, args: [args.dest])

    keeping = add_command(commands, "debs", description="For each row's image on the engine: downloads every .deb its apt steps recorded (with apt, in a "
                    "container of the image: its own sources), checks each by sha256 and writes DIR/<tag>.debs.json. "
                    "`build --debs DIR` and `rebuild --debs DIR` install exactly these. Exit 0; 1: the mirror no "
                    "longer serves a version; 2: no image, no record, or a file with another hash.")
    add_selectors(keeping, required=True)
    keeping.add_argument("--dest", type=Path, required=True, metavar="DIR", help="where the .debs go")
    keeping.set_defaults(handler=cmd_debs, writes=lambda project, args: [args.dest])

    building = add_command(commands, "build")
    add_selectors(building, default=HOST_ROWS)
    add_build_arguments(building)
    building.set_defaults(handler=cmd_build, writes=writes_reports)

    main_job = add_command(commands, "images")
    add_selectors(main_job, default=HOST_ROWS)
    add_build_arguments(main_job, force_help="rebuild even when the inputs are unchanged, and verify again even where "
                                             "the image's last verification passed")
    main_job.set_defaults(handler=cmd_images, writes=lambda project, args: [project.reports, *filter(None, [args.wheelhouse])])
    testing = add_command(commands, "test", description="Exit 0: every selected check (all by default) passed or was skipped with a reason; 1: a check "
                    "failed; 2: bad input (unknown tag or check, missing image, GPUs requested from an engine without "
                    "NVIDIA runtime). Checks: "
                    f"{checklist.help_text()}.")
    add_selectors(testing)
    testing.add_argument("--image", metavar="REF",
                         help="check this image (e.g. an official pytorch/pytorch one) against the one selected row")
    testing.add_argument("--gpus", metavar="all|none|N|device=0,1",
                         help="GPUs for the container (default: all for GPU rows, none for CPU rows)")
    testing.add_argument("--shm-size", metavar="SIZE", help="the container's /dev/shm (default: the row's shm_size)")
    testing.add_argument("--jobs", "-j", type=integer, default=2,
                         help="images verified at once where no GPU is given; with GPUs one at a time, since the GPU "
                              "checks measure them (default: %(default)s)")
    testing.add_argument("--timeout", type=integer, metavar="S",
                         help=f"seconds for the in-container probe (default {verify.RUNTIME_TIMEOUT_S}, devel "
                              f"{verify.DEVEL_TIMEOUT_S}; {emulation.SLOWDOWN} times that where the engine emulates "
                              "the image's machine)")
    testing.add_argument("--only", action="append", metavar="CHECK[,CHECK]",
                         help="run only these checks (repeatable or comma-separated), the others reported skipped: "
                              "to re-run a failing check quickly; never enough to publish")
    testing.add_argument("--force", action="store_true",
                         help="run the checks again where the last verification of the same image id, the same way, "
                              "passed (kept by default)")
    testing.add_argument("--skip", action="append", metavar="CHECK[,CHECK]",
                         help="run every check but these (repeatable or comma-separated), reported skipped; not with "
                              "--only; never enough to publish")
    testing.set_defaults(handler=cmd_test, writes=writes_reports)

    checking = add_command(commands, "doctor", description="Exit 0: the rows can be built (and, on a GPU host, run) here, perhaps with warnings; 1: something "
                    "will fail, with the fix.")
    add_selectors(checking)
    checking.add_argument("--format", choices=("table", "json"), default="table",
                          help="table: a table on a terminal, a wrapped line per finding elsewhere; json: the findings")
    checking.add_argument("--wheelhouse", type=Path, metavar="DIR",
                          help="the wheelhouse the build would be given: does it hold each row's wheels? (default: "
                               "probe the rows' indexes from this host, each within "
                               f"{wheels.INDEX_PROBE_TIMEOUT_S:g} s)")
    add_source_arguments(checking)
    checking.add_argument("--ca-bundle", type=Path, metavar="FILE",
                          help="the CA bundle the build would be given (a TLS-intercepting proxy's): the probes trust "
                               "it, beside the CAs the build's pip trusts")
    checking.set_defaults(handler=cmd_doctor)
    recording = add_command(commands, "gpu-record")
    recording.add_argument("tag", help="the row whose expectations apply (driver floor, arch list, cuDNN)")
    source = recording.add_mutually_exclusive_group()
    source.add_argument("--image", metavar="REF", help="run the GPU side in a container of this image (Docker, every "
                                                      "GPU); default: this Python's own torch, no Docker")
    source.add_argument("--facts", type=Path, metavar="FILE", help="judge saved `probe.py --gpu-only` facts")
    recording.set_defaults(handler=cmd_gpu_record, writes=writes_reports)
