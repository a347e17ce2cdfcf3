"""Flag groups several commands share, and their translation into the typed options the stages take."""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from ..build import builder, debs
from ..build.bases_lock import read_lock
from ..build.context import CA_BUNDLE_FIX
from ..files import read_bytes
from ..invocation import command
from ..matrix.load import load_compat
from ..model import PROXY_ARGS, InputError, Problem
from ..peers.registry import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    RegistryClient,
    RegistryError,
    RetryPolicy,
    publish_cache_folder,
)
from ..peers.registry_access import DEFAULT_CERTS_D, AccessSettings
from ..peers.registry_address import parse_registry
from ..project import Project
from ..publish import catalog
from ..publish.lazy import LAZY_FORMATS, LAZY_SUFFIX
from ..publish.publisher import ALLOWLIST_NAME, PublishOptions
from ..security import freshness, sbom, trivy
from ..trust import keys, signing
from ..trust.referrers import SIGNATURE_FORMATS
from .console import log


def integer(text: str) -> int:
    """An integer flag in ASCII digits only: int() also takes other scripts' digits (a full-width '\uff13'), '_' and
    spaces, which validation must not (argparse names this type, `invalid integer value`, when it raises)."""
    if not re.fullmatch(r"-?[0-9]+", text, re.ASCII):
        raise ValueError(text)
    return int(text)


def add_selectors(parser: argparse.ArgumentParser, required: bool = False, default: str = "every row") -> None:
    """The SELECTOR arguments every stage command takes: tags or shell globs."""
    parser.add_argument("selectors", nargs="+" if required else "*", metavar="SELECTOR",
                        help="tags or globs, e.g. '2.14.1-*-runtime'" + ("" if required else f" (default: {default})"))


# -------------------------------------------------------------------------------------------------------- building

def add_build_arguments(parser: argparse.ArgumentParser,
                        force_help: str = "rebuild even when the inputs are unchanged") -> None:
    parser.add_argument("--jobs", "-j", type=integer, default=2, help="parallel builds (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true",
                        help="take no layer from earlier builds (a row's flavors still share the layers this run makes)")
    parser.add_argument("--pull", action="store_true", help="refresh base images from their registry")
    parser.add_argument("--force", action="store_true", help=force_help)
    parser.add_argument("--fail-fast", action="store_true", help="stop all builds at the first failure")
    parser.add_argument("--prune-build-stages", action="store_true",
                        help="remove the build stages' images after the run (kept by default: a rebuild takes them "
                             "from the cache; about 13 MB per row, 285 MB per CUDA devel row)")
    add_source_arguments(parser)
    parser.add_argument("--wheelhouse", type=Path, help=f"install from wheels fetched by {command('wheels')} (offline)")
    parser.add_argument("--ca-bundle", type=Path, help="CA bundle for a TLS-intercepting proxy (kept out of the image)")
    parser.add_argument("--debs", type=Path, metavar="DIR",
                        help=f"install exactly the OS packages {command('debs')} kept in DIR, offline (each checked by "
                             "sha256; build with --no-cache so that no apt step comes from the cache)")
    parser.add_argument("--inputs-server", choices=builder.INPUTS_SERVERS,
                        help="where the server the build fetches its wheels from runs: on this host's loopback, or in "
                             "a container on the engine, for a remote engine or Docker Desktop's (default: loopback "
                             "when DOCKER_HOST is on this host, else container)")
    parser.add_argument("--builder", choices=builder.BUILDERS, default="classic",
                        help="the engine's builder: its classic one, or its BuildKit (faster, and no second copy of "
                             "the layers on disk; the venv layers are the same bits with either, the OS layers are "
                             "not) (default: %(default)s)")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pip-index-url", help="package index (mirror); credentials in it stay out of the image")
    parser.add_argument("--extra-index-url", help="extra package index (default: https://pypi.org/simple)")


def build_options(project: Project, args: argparse.Namespace) -> builder.BuildOptions:
    for name in ("wheelhouse", "ca_bundle"):
        path = getattr(args, name)
        if path is not None and not path.exists():
            raise InputError([Problem(str(path), 0, f"--{name.replace('_', '-')} {path} does not exist")])
    if args.ca_bundle is not None:
        read_bytes(args.ca_bundle, CA_BUNDLE_FIX)  # a FIFO or /dev/zero: refused now, not in a build
    inputs_server = args.inputs_server or builder.default_inputs_server()
    return builder.BuildOptions(
        images_dir=project.images, reports_dir=project.reports, jobs=args.jobs, no_cache=args.no_cache,
        pull=args.pull, force=args.force, fail_fast=args.fail_fast, prune_build_stages=args.prune_build_stages,
        wheelhouse=args.wheelhouse,
        pip_index_url=args.pip_index_url, extra_index_url=args.extra_index_url, ca_bundle=args.ca_bundle,
        proxies={k: v for k, v in os.environ.items() if k in PROXY_ARGS},
        inputs_server=inputs_server, builder=args.builder,
        debs_dir=args.debs, pinned_debs=pinned_debs(project, args, inputs_server),
    )


def pinned_debs(project: Project, args: argparse.Namespace, inputs_server: str) -> dict[str, list]:
    """--debs: every selected row's kept .debs, each there with its recorded sha256, before anything is built."""
    folder = getattr(args, "debs", None)
    if folder is None:
        return {}
    if not folder.is_dir():
        raise InputError([Problem(str(folder), 0, f"--debs names a folder {command('debs ROW --dest DIR')} "
                                                  "filled")])
    if inputs_server != "loopback":
        raise InputError([Problem("--debs", 0, "pinned .debs are served from this host's loopback: build with "
                                               "`--inputs-server loopback` on an engine of this host")])
    return {spec.tag: debs.load_pinned(folder, spec.tag) for spec in project.select(args.selectors)}


# ------------------------------------------------------------------------------------------------------ registries

def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry-ca", type=Path, metavar="FILE",
                        help="trust this CA for the registry's TLS certificate (besides <certs.d>/HOST:PORT/ca.crt)")
    parser.add_argument("--certs-d", type=Path, default=DEFAULT_CERTS_D, metavar="DIR",
                        help="Docker's per-registry CA folders: DIR/HOST:PORT/ca.crt (default: %(default)s)")
    parser.add_argument("--insecure-registry", action="store_true",
                        help="allow plain HTTP and unverified TLS (always allowed for a loopback registry without a CA)")


def access_settings(args: argparse.Namespace) -> AccessSettings:
    return AccessSettings(certs_d=args.certs_d, ca_file=args.registry_ca, insecure=args.insecure_registry)


Answer = TypeVar("Answer")


def ask_registry(args: argparse.Namespace, registry, reference: str,
                 ask: Callable[[RegistryClient], Answer | None]) -> Answer | None:
    """ask(a client of registry, with the command's access flags and retries) for what REF names (verify-image, scan);
    None after one line on stderr where the registry failed or has no such image (the command exits 1)."""
    client = RegistryClient(registry, access_settings(args).access(registry), RetryPolicy(retries=args.retries), log)
    try:
        found = ask(client)
    except RegistryError as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    if found is None:
        print(f"error: {registry.name} has no image {reference}", file=sys.stderr)
    return found


def add_catalog_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", type=Path, metavar="DIR",
                        help="folder of catalog.json and the SBOMs (default: catalog/ beside the images folder)")


def catalog_dir(project: Project, args: argparse.Namespace) -> Path:
    return args.catalog or catalog.default_dir(project)


# What each command writes (its `writes` default): main() holds these folders for the run, one run at a time.

def writes_reports(project: Project, args: argparse.Namespace) -> list[Path]:
    return [project.reports]


def writes_catalog(project: Project, args: argparse.Namespace) -> list[Path]:
    """The catalog and the page made from it, images/README.md."""
    return [catalog_dir(project, args), project.images]


def writes_everything(project: Project, args: argparse.Namespace) -> list[Path]:
    """Reports, catalog, images/README.md and bases.lock.json (in the matrix's folder)."""
    return [project.reports, *writes_catalog(project, args), project.lock_file.parent]


def add_registry_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", required=True, metavar="HOST[:PORT]/REPO",
                        help="where to publish, e.g. 127.0.0.1:5000/ml/pytorch")
    parser.add_argument("--retries", type=integer, default=RetryPolicy.retries,
                        help="tries again after a transient registry error, backing off 1 s, 2 s, 4 s... "
                             "(default: %(default)s)")
    add_access_arguments(parser)
    add_catalog_argument(parser)


def add_publish_arguments(parser: argparse.ArgumentParser) -> None:
    add_registry_arguments(parser)
    parser.add_argument("--date", help="date in new pinned tags, YYYYMMDD (default: today, UTC)")
    parser.add_argument("--allowlist", type=Path,
                        help=f"vulnerability allowlist (default: {ALLOWLIST_NAME} beside the matrix)")
    parser.add_argument("--compression", choices=COMPRESSIONS, default=DEFAULT_COMPRESSION,
                        help="layer compression of pushed images: gzip, which every client pulls (default), or zstd, "
                             "smaller and faster to unpack, for clients that read it: containerd 1.5+, Docker 23+ "
                             "(Docker 20.10 cannot pull it)")
    parser.add_argument("--lazy", choices=LAZY_FORMATS,
                        help="also push a lazily pullable variant of each image under its pinned tag + "
                             f"{LAZY_SUFFIX} (eStargz layers, prefetching the start-up set `startup-set` measured), "
                             "signed and attested as the image; any engine still pulls it as plain gzip")
    parser.add_argument("--signing-key", metavar="FILE|env://VAR|pkcs11:URI",
                        help=f"sign each published digest and attach its SBOM, provenance and verification report "
                             f"(cosign's format): a `cosign generate-key-pair` key or a PKCS#8 PEM ECDSA P-256 key, "
                             f"password in {signing.PASSWORD_VARIABLE}, or a key on a PKCS#11 token "
                             f"(pkcs11:token=NAME;object=LABEL?module-path=MODULE, PIN in COSIGN_PKCS11_PIN) "
                             f"(default: ${signing.KEY_VARIABLE})")
    parser.add_argument("--signature-format", choices=SIGNATURE_FORMATS, default="both",
                        help="how each digest is signed and attested: classic (cosign's .sig/.att tags: cosign 2.x, "
                             "podman, CRI-O), bundle (Sigstore bundles in OCI referrers: cosign v3, Kyverno's "
                             "ImageValidatingPolicy, Trivy), or both, the same statements in each (default)")
    parser.add_argument("--require-signing", action="store_true",
                        help="refuse to publish without a signing key (as `signing: required` in the matrix does)")
    parser.add_argument("--security-mirror", metavar="URL|DIR",
                        help="the OS's security archive the gate compares each image with: a mirror, or a folder "
                             "holding a saved index (default: compat.yaml's os.<name>.security.url)")
    add_scanner_db_argument(parser)


def add_scanner_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scanner-db", type=Path, metavar="DIR",
                        help="the vulnerability database the installed scanner reads, offline (it never downloads "
                             "one): for trivy, a folder holding the team's mirrored trivy.db and metadata.json (or "
                             "their db/ folder); for grype, its database cache folder; without one the scanner is not "
                             f"run, and the gate says so (default: ${trivy.SCANNER_DB_VARIABLE})")


def scanner_db(args: argparse.Namespace) -> Path | None:
    """--scanner-db, else $TORCHIMAGES_SCANNER_DB, checked before anything runs: a folder trivy (where installed)
    finds its database in, or an InputError naming what is missing (exit 2). None: no database given."""
    given, source = getattr(args, "scanner_db", None), "--scanner-db"
    if given is None and os.environ.get(trivy.SCANNER_DB_VARIABLE):
        given, source = Path(os.environ[trivy.SCANNER_DB_VARIABLE]), f"${trivy.SCANNER_DB_VARIABLE}"
    if given is None:
        return None
    try:
        if trivy.find_trivy():
            trivy.database_folder(given)
        elif not given.is_dir():
            raise InputError([Problem(str(given), 0, f"no such folder: {trivy.DB_FIX}")])
    except InputError as error:
        raise InputError([Problem(problem.file, problem.line, f"{problem.message} (the {source} given)")
                          for problem in error.problems]) from None
    return given


def publish_options(project: Project, args: argparse.Namespace) -> PublishOptions:
    allowlist_path = args.allowlist or project.matrix.parent / ALLOWLIST_NAME
    if args.allowlist and not os.path.lexists(args.allowlist):  # what is there but not a file: the reader says what
        raise InputError([Problem(str(args.allowlist), 0, f"--allowlist {args.allowlist} does not exist")])
    registry = parse_registry(args.registry)
    key = signing_key(project, args)
    return PublishOptions(
        registry=registry, access=access_settings(args).access(registry), reports_dir=project.reports,
        catalog_dir=catalog_dir(project, args), images_dir=project.images,
        date=parse_date(args.date) if args.date else datetime.now(timezone.utc).strftime("%Y%m%d"),
        retry=RetryPolicy(retries=args.retries), allowlist=sbom.load_allowlist(allowlist_path),
        daemon_host=os.environ.get("DOCKER_HOST"), compression=args.compression, signing_key=key,
        signature_format=args.signature_format, lazy=getattr(args, "lazy", None),
        security=freshness.Checker(load_compat(project.compat), str(project.compat), args.security_mirror, log),
        push_cache=publish_cache_folder(os.environ), base_pins=read_lock(project.lock_file),
        scanner_db=scanner_db(args),
    )


def signing_key(project: Project, args: argparse.Namespace) -> keys.SigningKey | None:
    """The key publish signs with (read and decrypted before anything is pushed), or None to publish unsigned; an
    InputError when signing is required (--require-signing, or `signing: required` in the matrix) and no key is
    given."""
    source = args.signing_key or os.environ.get(signing.KEY_VARIABLE)
    if source:
        return signing.load_signing_key(source)
    if args.require_signing or project.load().signing == "required":
        why = "--require-signing" if args.require_signing else f"{project.matrix} says `signing: required`"
        raise InputError([Problem("--signing-key", 0, f"{why}, and no key was given: pass --signing-key FILE (or set "
                                                      f"{signing.KEY_VARIABLE}; password in "
                                                      f"{signing.PASSWORD_VARIABLE}); nothing was published")])
    return None


def parse_date(text: str) -> str:
    try:
        valid = bool(re.fullmatch(r"[0-9]{8}", text, re.ASCII)) and bool(datetime.strptime(text, "%Y%m%d"))
    except ValueError:
        valid = False
    if not valid:
        raise InputError([Problem("--date", 0, f"--date {text!r} must be a date written YYYYMMDD, e.g. 20260131")])
    return text
