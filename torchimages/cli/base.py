"""base: make an offline base image on the engine where no registry can be reached (build/offline_base.py)."""
from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from ..build import offline_base
from ..model import InputError, PeerError, Problem
from ..peers import engine
from ..project import EXIT_OK
from .commands import add_command
from .console import log

LOG_TAIL_LINES = 15


def cmd_base(args) -> int:
    base = offline_base.parse_base(args.name, args.mirror, args.security_mirror)
    refused = offline_base.refusal(base, os.geteuid(), offline_base.program)
    if refused:
        raise InputError([Problem("torchimages base", 0, refused)])
    client = engine.client()  # before minutes of debootstrap: an engine that is not there is said now
    present = engine.inspect_image(client, base.name)
    if present is not None and not args.force:
        # Made again, it is a new image id: every row built on it would be built again.
        print(f"{base.name} is on the engine already (image {present['Id'][:19]}): nothing made; --force makes it "
              "again (and every row on it is then built again)")
        return EXIT_OK
    work = Path(tempfile.mkdtemp(prefix="torchimages-base-", dir=args.work))
    run_log = work / "base.log"
    run = logged(run_log)
    try:
        tarball = work / f"{base.file_stem}.tar"
        log(f"debootstrapping {base.name} from {base.mirror} (a few minutes; log {run_log})")
        offline_base.make_tarball(base, tarball, run)
        log(f"importing {base.name} into the engine")
        offline_base.import_base(client.api, tarball, base, engine.where(), run, work)
        image = engine.inspect_image(client, base.name)
        if image is None:
            raise PeerError(f"the Docker engine at {engine.where()} imported {base.name} and then had no such image")
    except BaseException:
        # The log stays for the cause (its last lines are in the error); the root filesystem and tar go.
        offline_base.remove_tree(work / f"{base.file_stem}.rootfs")
        (work / f"{base.file_stem}.tar").unlink(missing_ok=True)
        raise
    offline_base.remove_tree(work)
    print(f"{base.name}: image {image['Id']} ({base.distro} {base.suite} from {base.mirror}; apt follows "
          f"{base.suite}-updates and {base.suite}-security ({base.security_mirror}); no cached .debs or package "
          "lists): builds that name it take it now")
    return EXIT_OK


def logged(path: Path):
    """run(command) for offline_base: output to the log, a PeerError (exit 1) with its last lines when it fails."""
    def run(command: list[str]) -> None:
        with open(path, "ab") as output:
            output.write(f"$ {shlex.join(command)}\n".encode())
            output.flush()
            returncode = subprocess.run(command, check=False, stdin=subprocess.DEVNULL, stdout=output,
                                        stderr=subprocess.STDOUT,
                                        env={**os.environ, "PATH": offline_base.SBIN_PATH}).returncode
        if returncode != 0:
            tail = " | ".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
            raise PeerError(f"`{shlex.join(command[:3])} …` failed with status {returncode} (log {path}): {tail}")
    return run


def register(commands) -> None:
    making = add_command(commands, "base", description="Where no registry can be reached: debootstrap a Debian base "
                         "from a Debian mirror and import it into the engine under NAME, with the release's updates "
                         "and security suites in its apt sources (publish's security gate needs them) and no cached "
                         ".debs (they would make every build a new image id). Needs root and debootstrap. Exit 0: "
                         "imported; 1: debootstrap, the mirror or the engine failed; 2: bad input, not root, or no "
                         "debootstrap.")
    making.add_argument("name", metavar="NAME", help="the base the matrix builds FROM: debian:bookworm, "
                                                     "arm64v8/debian:bookworm (another machine's, under qemu)")
    making.add_argument("--mirror", metavar="URL", help=f"the Debian archive (default: {offline_base.MIRRORS['debian']})")
    making.add_argument("--security-mirror", metavar="URL",
                        help=f"its security archive (default: {offline_base.SECURITY_MIRRORS['debian']})")
    making.add_argument("--work", type=Path, metavar="DIR",
                        help="where the root filesystem is made, about 400 MB (default: the system's temporary folder)")
    making.add_argument("--force", action="store_true", help="make it even where the engine has an image of that name")
    # No project: a base belongs to the engine, and an installed user makes it before (or without) one.
    making.set_defaults(handler=cmd_base, makes_project=True)
