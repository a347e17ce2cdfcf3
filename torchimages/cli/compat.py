"""compat refresh: the compatibility facts of torch releases, read from the package index they are built from."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from ..model import PYPI
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..redaction import redact
from .commands import add_command, project_flag
from .console import console, errors

if TYPE_CHECKING:
    from ..matrix import compat_refresh


def cmd_compat_refresh(project: Project, args) -> int:
    from ..matrix import compat_refresh  # here: the index client costs every other command's start a quarter second

    options = compat_refresh.RefreshOptions(compat_file=project.compat, index_url=args.index_url,
                                            versions=tuple(args.versions), write=not args.check, correct=args.correct)
    result = compat_refresh.refresh(options)
    out = console()
    for release in result.releases:
        out.print(facts_table(release))
    for torch in result.not_on_index:
        out.print(f"torch {torch}: not on {redact(args.index_url)}; its facts are kept as compat.yaml has them, "
                  "unchecked")
    for line in result.unread:
        out.print(f"unread: {line}")
    for difference in result.added:
        out.print(f"{'missing' if args.check else 'added'}: torch {difference.torch} {difference.where} = "
                  f"{difference.index} (from {difference.source})")
    for difference in result.disagreements:
        action = "corrected" if args.correct and not args.check else "disagrees"
        errors().print(f"{action}: torch {difference.torch} {difference.where}: compat.yaml says {difference.compat}, "
                       f"the index says {difference.index} (read from {difference.source})")
    kept = result.disagreements and not (args.correct and not args.check)
    stale = bool(kept or (args.check and result.added))
    if not args.check:
        print(f"{project.compat}: {len(result.added)} facts added, {len(result.disagreements)} disagreeing"
              + (" (corrected)" if args.correct else " (kept: check them, then `--correct`)"))
    return EXIT_FAILED if stale else EXIT_OK


def facts_table(release: compat_refresh.ReleaseFacts) -> Table:
    table = Table(title=f"torch {release.torch}: Python to {release.python_max}, torchvision {release.torchvision}")
    for column in ("build", "CUDA", "Python", "pins", "triton", "arch list", "wheel"):
        table.add_column(column)
    for build in release.builds:
        pins = ", ".join(f"{key} {version}" for key, version in build.pins.items())
        table.add_row(build.build, build.cuda or "cpu", f">={build.python_min}", pins, build.triton,
                      " ".join(build.arch_list) or "-", f"{build.source.file} sha256:{build.source.sha256[:12]}")
    return table


def register(commands) -> None:
    compat = add_command(commands, "compat")
    actions = compat.add_subparsers(dest="compat_command", required=True, metavar="ACTION")
    refresh = actions.add_parser("refresh", help="read torch releases' facts from the package index into compat.yaml")
    project_flag(refresh)
    refresh.add_argument("versions", nargs="*", metavar="TORCH",
                         help="releases to read (default: every release compat.yaml lists that the index has)")
    refresh.add_argument("--check", action="store_true",
                         help="change nothing; exit 1 when compat.yaml lacks a fact or disagrees with the index")
    refresh.add_argument("--correct", action="store_true",
                         help="replace facts that disagree with the index's values (each is reported)")
    refresh.add_argument("--index-url", default=PYPI, help="a PEP 691 package index, or a folder of wheels (offline; "
                         "default: %(default)s)")
    # Two refreshes at once would each write compat.yaml from what it held before the other: one release lost.
    refresh.set_defaults(handler=cmd_compat_refresh,
                         writes=lambda project, args: [] if args.check else [project.compat.parent])
