"""Build options from the command line, shared by `build`, `images` and `nightly`."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import builder as build_stage
from . import engine
from .display import LiveProgress, PlainProgress, stderr_console
from .model import ImageSpec, InputError, Problem
from .project import Project


def run_builds(project: Project, specs: list[ImageSpec], args) -> list[build_stage.BuildResult]:
    options = build_options(project, args)
    docker_client = engine.client()
    err = stderr_console()
    if err.is_terminal:
        with LiveProgress(err, [spec.tag for spec in specs]) as progress:
            return build_stage.Builder(docker_client, options, progress).build_all(specs)
    return build_stage.Builder(docker_client, options, PlainProgress(err)).build_all(specs)


def build_options(project: Project, args) -> build_stage.BuildOptions:
    for name in ("wheelhouse", "ca_bundle"):
        path = getattr(args, name)
        if path is not None and not path.exists():
            raise InputError([Problem(str(path), 0, f"--{name.replace('_', '-')} {path} does not exist")])
    if args.jobs < 1:
        raise InputError([Problem("--jobs", 0, "--jobs must be at least 1")])
    return build_stage.BuildOptions(
        images_dir=project.images, reports_dir=project.reports, jobs=args.jobs, no_cache=args.no_cache,
        pull=args.pull, force=args.force, fail_fast=args.fail_fast, keep_build_stages=args.keep_build_stages,
        wheelhouse=args.wheelhouse,
        pip_index_url=args.pip_index_url, extra_index_url=args.extra_index_url, ca_bundle=args.ca_bundle,
        proxies={k: v for k, v in os.environ.items() if k in build_stage.PROXY_ARGS},
    )


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel builds (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="build without the layer cache")
    parser.add_argument("--pull", action="store_true", help="refresh base images from their registry")
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    parser.add_argument("--fail-fast", action="store_true", help="stop all builds at the first failure")
    parser.add_argument("--keep-build-stages", action="store_true",
                        help="keep the build stages' images (faster rebuilds after a change; several GB per CUDA row)")
    add_source_arguments(parser)
    parser.add_argument("--wheelhouse", type=Path, help="install from wheels fetched by `build.py wheels` (offline)")
    parser.add_argument("--ca-bundle", type=Path, help="CA bundle for a TLS-intercepting proxy (kept out of the image)")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pip-index-url", help="package index (mirror); credentials in it stay out of the image")
    parser.add_argument("--extra-index-url", help="extra package index (default: https://pypi.org/simple)")
