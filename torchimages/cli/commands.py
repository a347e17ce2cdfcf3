"""The command table: every top-level command, the group module that registers it, and its one line of help. Only the
chosen command's group is imported (as pip's commands_dict does): `torchimages --help` lists the commands from here
alone, without the Docker SDK, cryptography or any stage."""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path

from ..checks import checklist


@dataclass(frozen=True)
class Command:
    group: str  # the module under torchimages/cli/ whose register() adds it (with the rest of its group)
    summary: str
    in_project: bool = True  # works on a project (init makes one: --project means nothing to it)


PROJECT_HELP = "the project folder (default: the nearest folder holding matrix.yaml, from here upwards)"


COMMANDS = {
    "init": Command("init", "make a new project: matrix.yaml (a CPU and a CUDA row), compat.yaml, .gitignore, a CI "
                            "workflow", in_project=False),
    "list": Command("images", "print every tag with its versions"),
    "render": Command("images", "write images/<tag>/Dockerfile from the matrix"),
    "wheels": Command("images", "fetch the wheels rows install, for offline builds"),
    "debs": Command("images", "keep the OS packages (.debs) rows installed, for offline builds that reproduce them"),
    "build": Command("images", "build images on the Docker engine"),
    "images": Command("images", "the main job: build and verify (CPU rows on hosts without GPUs)"),
    "test": Command("images", f"verify images inside containers ({', '.join(checklist.NAMES)})"),
    "doctor": Command("images", "what this host can do with the rows: engine, base images, wheels (index or "
                                "wheelhouse), GPU runtime, disk, skopeo, driver and arch fit"),
    "startup-set": Command("startup", "what a cold start of a row's image reads before its first op, per layer (the "
                                      "set a lazy pull fetches first)"),
    "gpu-record": Command("images", "on a GPU host: run the GPU side, judge it with the GPU checks, print the record "
                                    "line of docs/gpu-validation.md and keep every raw fact as a simulation-lane host "
                                    "under REPORTS/gpu-record/ (exit 1 when a GPU check failed, 2 for another torch "
                                    "build)"),
    "base": Command("base", "where no registry is reachable: make a Debian base on the engine with debootstrap "
                            "(security suite in its sources, no cached .debs)"),
    "lock": Command("publishing", "pin every base image to a digest in bases.lock.json"),
    "publish": Command("publishing", "push verified images: pinned, floating and alias tags"),
    "prune": Command("publishing", "delete dated tags beyond the newest N of each row"),
    "catalog": Command("publishing", "print the published images (and regenerate images/README.md)"),
    "verify-image": Command("verifying", "is it ours, and did it pass? (signature, attestations and verification "
                                         "reports, as cosign and a policy check them)"),
    "rebuild": Command("reproducing", "build a published digest again from its signed provenance, offline, and "
                                      "compare"),
    "watch": Command("nightly", "release watch: a torch on the index newer than the matrix's -> facts, proposed rows, "
                                "render"),
    "why": Command("nightly", "why the nightly would build, verify or publish a row again (or leave it alone)"),
    "plan": Command("nightly", "split the rows into shards of similar build time (a CI matrix)"),
    "nightly": Command("nightly", "lock, render check, build, verify, publish what passed, prune, summarise"),
    "report": Command("nightly", "work with reports: `report merge` joins CI shards' results"),
    "compat": Command("compat", "compatibility facts (compat.yaml beside the matrix, or --compat)"),
    "security": Command("security", "OS packages with a security fix the image lacks (no scanner database needed)"),
    "scan": Command("security", "scan a published digest with Trivy, offline, applying only the VEX its publisher's "
                                "key signed about it"),
}


def add_command(commands: argparse._SubParsersAction, name: str, **settings) -> argparse.ArgumentParser:
    """A group's register() adds each of its commands through here: the help line is the table's."""
    parser = commands.add_parser(name, help=COMMANDS[name].summary, **settings)
    if COMMANDS[name].in_project:
        project_flag(parser)
    return parser


def project_flag(parser: argparse.ArgumentParser) -> None:
    """--project after the command as well as before it (`torchimages list --project DIR`): absent here, it leaves the
    one before the command alone."""
    parser.add_argument("--project", type=Path, metavar="DIR", default=argparse.SUPPRESS, help=PROJECT_HELP)


def groups() -> list[str]:
    return list(dict.fromkeys(command.group for command in COMMANDS.values()))


def register(commands: argparse._SubParsersAction, chosen: str | None, everything: bool = False) -> None:
    """Every command: the chosen one's group in full (its flags, its handler), the others as their help line only;
    every group in full with everything (the docs' tests read every command's flags)."""
    full = set(groups()) if everything else {COMMANDS[chosen].group} if chosen in COMMANDS else set()
    for group in full:
        importlib.import_module(f"{__package__}.{group}").register(commands)
    for name, command in COMMANDS.items():
        if command.group not in full:
            commands.add_parser(name, help=command.summary)
