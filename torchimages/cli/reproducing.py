"""`rebuild REF`: build a published digest again from its signed provenance and say whether it is the same
(trust/rebuild.py; docs/reproducible.md)."""
from __future__ import annotations

from pathlib import Path

from ..invocation import command
from ..peers import engine
from ..peers.registry import RegistryClient, RetryPolicy
from ..project import EXIT_FAILED, EXIT_OK, Project
from ..trust.rebuild import reproduce
from ..trust.signing import load_public_key
from .commands import add_command
from .console import log
from .options import access_settings, add_access_arguments, integer
from .verifying import image_reference


def cmd_rebuild(project: Project, args) -> int:
    keys = [load_public_key(path) for path in args.key]
    registry, reference = image_reference(args.reference)
    client = RegistryClient(registry, access_settings(args).access(registry), RetryPolicy(retries=args.retries), log)
    wheelhouse = args.wheelhouse or project.matrix.parent / "wheelhouse"
    debs = args.debs or project.matrix.parent / "debs"
    comparison = reproduce(engine.client(), client, keys, reference, args.reference, project.load().specs,
                           project.images, wheelhouse, debs, project.reports / "rebuild", args.check, args.force)
    print("\n".join(comparison.lines))
    return EXIT_OK if comparison.reproduced else EXIT_FAILED


def register(commands) -> None:
    rebuilding = add_command(commands, "rebuild")
    rebuilding.add_argument("reference", metavar="REF", help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<hex>")
    rebuilding.add_argument("--key", type=Path, action="append", required=True, metavar="KEY.pub",
                            help="the public key the provenance must be signed with (repeat it to trust several)")
    rebuilding.add_argument("--force", action="store_true",
                            help="build again where an earlier rebuild of the same provenance (the same row, commit, "
                                 "wheels and .debs) is still on the engine; by default REF is compared with that")
    rebuilding.add_argument("--check", action="store_true",
                            help="where a layer differs, also name the first file in it that differs (path, size, "
                                 "mode, owner, time, content hash)")
    rebuilding.add_argument("--wheelhouse", type=Path, metavar="DIR",
                            help=f"where the recorded wheels are, as {command('wheels --dest DIR')} keeps them, checked "
                                 "by their sha256 (default: the project's wheelhouse/)")
    rebuilding.add_argument("--debs", type=Path, metavar="DIR",
                            help=f"where the recorded OS packages are, as {command('debs --dest DIR')} keeps them, "
                                 "checked by their sha256 (default: the project's debs/)")
    rebuilding.add_argument("--retries", type=integer, default=RetryPolicy.retries,
                            help="tries again after a transient registry error (default: %(default)s)")
    add_access_arguments(rebuilding)
    rebuilding.set_defaults(handler=cmd_rebuild, writes=lambda project, args: [project.reports])
