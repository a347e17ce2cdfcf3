"""What goes to the engine for one image, and the hash that decides whether to build it: the row's rendered files,
its served wheels, the index settings without logins, the CA bundle, the install code and the base's identity."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..build_inputs.layers import install_code_digest, layer_args
from ..files import read_bytes
from ..model import ImageSpec
from .reproducible import FILE_TIME, UNCOMMITTED, UNCOMMITTED_EPOCH, SourceDate

CA_BUNDLE_FIX = "--ca-bundle names the PEM file of the proxy's CA (a regular file)"


@dataclass(frozen=True)
class BuildOptions:
    images_dir: Path
    reports_dir: Path
    jobs: int = 1
    no_cache: bool = False
    pull: bool = False
    force: bool = False
    fail_fast: bool = False
    # Remove the untagged images of the build stages after the run. Kept by default: they are small (the venv stage,
    # a devel row's toolkit) and a rebuild takes them from the cache instead of running their apt and venv steps again.
    prune_build_stages: bool = False
    wheelhouse: Path | None = None
    pip_index_url: str | None = None
    extra_index_url: str | None = None
    ca_bundle: Path | None = None
    proxies: dict = field(default_factory=dict)
    # tag -> a token naming the OS security fixes a rebuild takes (the nightly's): the row is built even though its
    # inputs are unchanged, and only its OS security layer again (templates/os/<family>.j2 `security_upgrade`). Not
    # an input of the image's hash: the matrix row is the same, the published row stays current once it has them.
    security_refresh: dict = field(default_factory=dict)
    inputs_server: str = "loopback"  # one of builder.INPUTS_SERVERS: default_inputs_server() for the engine in use
    builder: str = "classic"  # one of builder.BUILDERS
    # tag -> the .debs its apt steps install, from debs_dir (deb_pins.load_pinned: present and checked by sha256)
    debs_dir: Path | None = None
    pinned_debs: dict = field(default_factory=dict)


def wheel_dir(wheelhouse: Path, spec: ImageSpec) -> Path:
    """Wheels for one row live in <wheelhouse>/<index>-py<python>/ (`build.py wheels` fills it); another machine's
    in <index>-py<python>-<arch>/, since one pip download is for one machine."""
    machine = "" if spec.arch == "x86_64" else f"-{spec.arch}"
    return wheelhouse / f"{spec.wheel_index}-py{spec.python}{machine}"


def index_settings(options: BuildOptions) -> dict[str, str]:
    """The index settings as the input hash sees them: without credentials."""
    return {name: without_credentials(url) for name, url in
            (("PIP_INDEX_URL", options.pip_index_url), ("PIP_EXTRA_INDEX_URL", options.extra_index_url)) if url}


def without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if parts.username or parts.password:
        return urlunsplit(parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")))
    return url


@dataclass(frozen=True)
class BuildContext:
    """What goes to the engine for one image, and the hash that decides whether to rebuild."""

    files: dict[str, Path]  # path in the context -> file on the host
    wheels: dict[str, Path]  # the row's wheelhouse (file name -> file), served to the build, not sent
    ca_bundle: str | None
    inputs: dict[str, str]  # each input by name -> what identifies it: the input hash is made of exactly these
    input_hash: str
    base_image_id: str  # the engine's base image, for the image's base label ("" when the build pulls it)
    layer_args: dict[str, str] = field(default_factory=dict)  # the venv layers' WHEELS_* build arguments
    # The row's commit and the date its image carries: read from git when the image is built (_build_one), not for
    # every skip decision.
    source: SourceDate = SourceDate(UNCOMMITTED, UNCOMMITTED_EPOCH)


def base_identity(reference: str, engine_image_id: str | None, locked_image_id: str | None) -> str | None:
    """What identifies the base's bits in the input hash, the same on every runner: a lock-pinned image@digest names
    them itself; a base pinned by image id only (local-only, built on the engine) is the engine's image id, or the
    lock's when the engine does not have it (a fresh runner). None when nothing identifies the base."""
    if "@sha256:" in reference:
        return reference
    return engine_image_id or locked_image_id


def build_context(spec: ImageSpec, options: BuildOptions, base_identity: str, base_image_id: str) -> BuildContext:
    folder = options.images_dir / spec.tag
    files = {path.name: path for path in sorted(folder.iterdir()) if path.is_file()}
    found = wheel_dir(options.wheelhouse, spec) if options.wheelhouse else None
    wheels = {p.name: p for p in sorted(found.iterdir()) if p.is_file()} if found and found.is_dir() else {}
    ca_bundle = read_bytes(options.ca_bundle, CA_BUNDLE_FIX).decode(errors="replace") if options.ca_bundle else None
    # Wheels are big and named by version: name + size identify them without reading gigabytes.
    sizes = {name: path.stat().st_size for name, path in wheels.items()}
    # Served wheels make pip ignore the indexes (no-index): then they are no input of the layers, and a changed
    # mirror URL rebuilds nothing but the labels.
    indexes = {} if wheels else index_settings(options)
    sources = json.dumps([indexes, ca_bundle or "", install_code_digest()]).encode()
    inputs = build_inputs(files, sizes, index_settings(options), ca_bundle, base_identity)
    return BuildContext(files, wheels, ca_bundle, inputs, input_hash(inputs), base_image_id,
                        layer_args(sizes, sources, spec.is_gpu))


def build_inputs(files: dict[str, Path], wheel_sizes: dict[str, int], indexes: dict[str, str], ca_bundle: str | None,
                 base_identity: str) -> dict[str, str]:
    """Every input of a build by name, with what identifies it: a context file's sha256, a served wheel's size, the
    index settings (logins removed), the CA bundle's and the install code's sha256, the base's identity. Kept with
    the build, so that `why` can name the inputs that changed."""
    inputs = {f"file {name}": _sha256(path.read_bytes()) for name, path in files.items()}
    inputs.update({f"wheel {name}": f"{size} bytes" for name, size in wheel_sizes.items()})
    inputs.update({f"index {name}": url for name, url in indexes.items()})
    if ca_bundle is not None:
        inputs["CA bundle"] = _sha256(ca_bundle.encode())
    inputs["install script"] = install_code_digest()
    inputs["base"] = base_identity
    return inputs


def input_hash(inputs: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def context_tar(context: BuildContext) -> io.BufferedRandom:
    stream = tempfile.TemporaryFile()
    # GNU, not Python's default PAX: BuildKit tells a tar context from a plain Dockerfile by reading the first
    # header from the first 512 bytes, and a PAX record (a file time with a fraction) is in the next block.
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, path in sorted(context.files.items()):
            archive.add(str(path), arcname=name, filter=_settled_member)
    stream.seek(0)
    return stream


def _settled_member(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A context file as COPY writes it into a layer, whatever the checkout did: one time, root's, 0644 or 0755."""
    member.mtime, member.uid, member.gid, member.uname, member.gname = FILE_TIME, 0, 0, "", ""
    member.mode = 0o755 if member.mode & 0o100 else 0o644
    return member


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


