"""`build.py rebuild REF`: build a published digest again from what its signed provenance claims, and compare.

The provenance is read only once a key verified it (referrers.gather_both, as verify-image does). It names the
row, the commit of the row's Dockerfile (the image's revision label, reproducible.py) and every wheel by sha256. The
rebuild takes that commit's files from a worktree of this checkout, serves exactly the recorded wheels (found by
name, checked by hash), builds without the cache and offline (the wheels are served, pip reads no index), and
compares its image with the published one: layer by layer (diff ids), then, with --check, file by file in the first
layer that differs. Nothing is built from an input that does not match its claim.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from ..build.builder import Builder, BuildOptions, BuildResult
from ..build.context import wheel_dir
from ..build.debs import PinnedDeb, check_files, pins_from_json
from ..build.reproducible import ChunkReader
from ..build.wheel_record import file_sha256
from ..files import atomic_write_json, brief
from ..invocation import command
from ..model import ImageSpec, InputError, Problem, TorchImagesError
from ..peers import engine
from ..peers.registry import Manifest, RegistryClient
from ..reporting import as_object
from .attestations import PROVENANCE_PREDICATE
from .keys import PublicKey
from .layer_diff import FileEntry, first_differing_file, first_differing_layer, layer_entries
from .referrers import gather_both

REBUILT_SUFFIX = "-rebuilt"  # the rebuilt image's repository: the row's, so that no local image of the row is replaced


@dataclass(frozen=True)
class Claim:
    """What a verified provenance says an image was built from."""
    tag: str
    commit: str
    wheels: dict[str, str]  # file name -> sha256
    debs: list[PinnedDeb]  # the OS packages each apt step installed
    engine: str = ""  # the Docker engine's version that published it ("" where the provenance does not say)


@dataclass(frozen=True)
class Comparison:
    reproduced: bool
    lines: list[str]


def claim_of(provenance: object, reference: str) -> Claim:
    """The row, commit and wheels of a provenance predicate; a provenance without them, or of another shape than
    publish writes, is refused (exit 2). Wheel names become paths (links in rebuild's wheelhouse): one that is not a
    plain file name is no wheel publish recorded."""
    definition = as_object(as_object(provenance).get("buildDefinition"))
    tag = as_object(definition.get("externalParameters")).get("tag")
    listed = definition.get("resolvedDependencies")
    dependencies = [d for d in (listed if isinstance(listed, list) else []) if isinstance(d, dict)]
    commits = [commit for d in dependencies if isinstance(commit := as_object(d.get("digest")).get("gitCommit"), str)]
    wheels = [(d.get("name"), as_object(d.get("digest")).get("sha256")) for d in dependencies
              if str(d.get("uri", "")).startswith("pkg:pypi/")]
    if not isinstance(tag, str) or not tag:
        raise _refused(reference, f"its provenance names no matrix row: it was not made by {command('publish')}")
    if not commits:
        raise _refused(reference, "its provenance names no commit (it was built from uncommitted files): it cannot "
                                  "be rebuilt from a checkout")
    for name, sha256 in wheels:
        if not _plain_file_name(name) or not isinstance(sha256, str):
            raise _refused(reference, f"its provenance names wheel {brief(name)} (sha256 {brief(sha256)}): not a "
                                      f"file name and a hash as {command('publish')} writes them")
    debs = pins_from_json([{"step": as_object(d.get("annotations")).get("step"), "filename": d.get("name"),
                            "sha256": as_object(d.get("digest")).get("sha256")}
                           for d in dependencies if str(d.get("uri", "")).startswith("pkg:deb/")],
                          reference, f"its provenance's OS packages are not as {command('publish')} writes them")
    versions = as_object(as_object(as_object(provenance).get("runDetails")).get("builder")).get("version")
    publisher = as_object(versions).get("docker")
    return Claim(tag, commits[0], {str(name): str(sha256) for name, sha256 in wheels}, debs,
                 publisher if isinstance(publisher, str) else "")


def _plain_file_name(name: object) -> bool:
    """A name that is a file in one folder: no folder part (`a/b.whl`, `/etc/x`), not `..`, one printable line."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and name.isprintable())


def verified_claim(client: RegistryClient, keys: list[PublicKey], manifest: Manifest, reference: str) -> Claim:
    evidence = gather_both(client, keys, manifest.digest, [PROVENANCE_PREDICATE])
    provenance = evidence.latest(PROVENANCE_PREDICATE)
    if evidence.problems or provenance is None:
        raise _refused(reference, f"{(evidence.problems or ['no provenance'])[0]}: rebuild reads only a provenance "
                                  "the --key signed")
    return claim_of(provenance, reference)


def _refused(reference: str, why: str) -> InputError:
    return InputError([Problem(reference, 0, why)])


def checkout_root(images: Path, commit: str, reference: str) -> Path:
    """The top of the git checkout holding images/, which must hold the commit."""
    root = _git(images, "rev-parse", "--show-toplevel")
    if root is None:
        raise _refused(reference, f"{images} is in no git checkout: rebuild takes commit {commit}'s files from one")
    if _git(images, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        raise _refused(reference, f"commit {commit} is not in the checkout at {root}: `git fetch` the branch that "
                                  "holds it, then rebuild")
    return Path(root)


@contextmanager
def worktree(root: Path, commit: str) -> Iterator[Path]:
    """The commit's files in a worktree of their own, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="torchimages-rebuild-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--quiet", str(tree), commit],
                       check=True, capture_output=True, timeout=600)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True, timeout=600)


def claimed_wheelhouse(claim: Claim, found: Path, into: Path, spec: ImageSpec, reference: str) -> Path:
    """A wheelhouse of exactly the claimed wheels (links to found's), each checked by its sha256."""
    row = wheel_dir(into, spec)
    row.mkdir(parents=True)
    for name, sha256 in sorted(claim.wheels.items()):
        source = wheel_dir(found, spec) / name
        if not source.is_file():
            raise _refused(reference, f"wheel {name} is not in {source.parent}: "
                                      f"{command(f'wheels {claim.tag} --dest {found}')} fetches the row's wheels")
        if file_sha256(source) != sha256:
            raise _refused(reference, f"wheel {source} is not the one the provenance names (sha256 {sha256}): "
                                      "fetch that wheel again")
        os.symlink(source.resolve(), row / name)
    return into


def rebuild_options(images: Path, reports: Path, wheelhouse: Path, claim: Claim, debs: Path) -> BuildOptions:
    """Without the cache, from the claimed wheels and, where the provenance names them, the claimed .debs alone."""
    return BuildOptions(images_dir=images, reports_dir=reports, no_cache=True, force=True, wheelhouse=wheelhouse,
                        debs_dir=debs if claim.debs else None, pinned_debs={claim.tag: claim.debs} if claim.debs else {})


def check_claimed_debs(claim: Claim, debs: Path, reference: str) -> None:
    """Each claimed .deb in the folder, with its sha256 (`build.py debs` keeps them, as `wheels` keeps wheels)."""
    try:
        check_files(debs, claim.debs, f"{command(f'debs {claim.tag} --dest {debs}')} keeps a row's .debs")
    except InputError as error:
        raise _refused(reference, str(error)) from None


REBUILD_RECORD = "rebuild.json"  # beside the rebuild's build log: the claim it built and the image it made


def rebuilt_spec(spec: ImageSpec) -> ImageSpec:
    return dataclasses.replace(spec, repository=spec.repository + REBUILT_SUFFIX)


def build(client: docker.DockerClient, spec: ImageSpec, options: BuildOptions) -> BuildResult:
    [result] = Builder(client, options).build_all([spec])
    return result


def claim_key(claim: Claim, base_id: str) -> str:
    """What a rebuild's image is made from: the claim (row, commit, wheels, .debs) and the engine's base image."""
    made_from = {"tag": claim.tag, "commit": claim.commit, "wheels": claim.wheels, "base": base_id,
                 "debs": sorted((deb.step, deb.filename, deb.sha256) for deb in claim.debs)}
    return hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()


def earlier_rebuild(docker_client: docker.DockerClient, record: Path, key: str, name: str) -> str | None:
    """The image an earlier rebuild of the same claim made, where the engine still holds it under its name: another
    digest claiming the same provenance (a republish, or a copy someone altered) is compared with it, not built again
    (minutes without the cache, the same image: the build is reproducible)."""
    try:
        earlier = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(earlier, dict) or earlier.get("claim") != key:
        return None
    present = engine.inspect_image(docker_client, name)
    return present["Id"] if present and present["Id"] == earlier.get("image_id") else None


def reproduce(docker_client: docker.DockerClient, registry: RegistryClient, keys: list[PublicKey], reference: str,
              named: str, specs: list[ImageSpec], images: Path, wheelhouse: Path, debs: Path, reports: Path,
              check: bool, force: bool = False) -> Comparison:
    """Verify, rebuild and compare (see the module's doc): reference is REF's tag or digest, named REF as given.
    force: build again where an earlier rebuild of the same claim is on the engine (earlier_rebuild)."""
    manifest = registry.manifest(reference)
    claim = verified_claim(registry, keys, manifest, named)
    spec = next((spec for spec in specs if spec.tag == claim.tag), None)
    if spec is None:
        raise _refused(named, f"row {claim.tag} is not in the matrix: rebuild with the matrix that has it")
    root = checkout_root(images, claim.commit, named)
    check_claimed_debs(claim, debs, named)
    ours = rebuilt_spec(spec)
    name = f"{ours.repository}:{ours.tag}"
    base = engine.inspect_image(docker_client, spec.base_image)
    key, record = claim_key(claim, base["Id"] if base else ""), reports / claim.tag / REBUILD_RECORD
    with tempfile.TemporaryDirectory(prefix="torchimages-rebuild-wheels-") as folder:
        # The claimed inputs are checked either way: a rebuild that could not be done again says so now.
        served = claimed_wheelhouse(claim, wheelhouse, Path(folder), spec, named)
        image_id = None if force else earlier_rebuild(docker_client, record, key, name)
        if image_id is None:
            with worktree(root, claim.commit) as tree:
                result = build(docker_client, ours, rebuild_options(tree / images.resolve().relative_to(root), reports,
                                                                    served, claim, debs))
            if result.status != "built":
                raise RebuildFailed(f"the rebuild of {claim.tag} failed: {result.error}")
            image_id = result.image_id
            atomic_write_json(record, {"claim": key, "image_id": image_id}, root=reports)
            reused = []
        else:
            reused = [f"compared with {name} ({image_id[:19]}), which an earlier rebuild made from the same "
                      "provenance: not built again (--force builds it again)"]
    comparison = compared(docker_client, registry, manifest, image_id, name, check)
    comparison = Comparison(comparison.reproduced, [*reused, *comparison.lines])
    note = engine_note(claim.engine, engine.daemon_info(docker_client).get("ServerVersion", ""))
    return comparison if comparison.reproduced or not note else Comparison(False, [*comparison.lines, note])


def engine_note(published_by: str, rebuilt_by: str) -> str:
    """Why layers of the same files can differ: Docker 23 changed the tar headers its builder writes (moby#44083: the
    mode's file-type bits; no user and group names looked up on the build host). bench/engine_versions_bench.py."""
    releases = [engine.docker_version({"ServerVersion": version}) for version in (published_by, rebuilt_by)]
    if releases[0] is None or releases[1] is None or (releases[0] < (23, 0)) == (releases[1] < (23, 0)):
        return ""
    return (f"note: published by Docker {published_by}, rebuilt with Docker {rebuilt_by}: engines before and after "
            "Docker 23 write other tar headers for the same files; rebuild on an engine of the publisher's family "
            "(docs/reproducible.md)")


def compared(docker_client: docker.DockerClient, registry: RegistryClient, manifest: Manifest, image_id: str,
             rebuilt: str, check: bool) -> Comparison:
    image = docker_client.api.inspect_image(image_id)
    published = registry.image_config(manifest.digest)
    ours_layers, their_layers = image["RootFS"]["Layers"], published["rootfs"]["diff_ids"]
    index = first_differing_layer(ours_layers, their_layers)
    labels = differing_keys(image["Config"].get("Labels") or {}, (published.get("config") or {}).get("Labels") or {})
    if image_id == manifest.config_digest or (index is None and not labels and manifest.compression() == "zstd"
                                              and image["Created"] == published.get("created")):
        return Comparison(True, [f"reproduced {manifest.digest} (rebuilt as {rebuilt}, image {image_id})"])
    if index is None:
        return Comparison(False, [f"differs: every layer is the same, the image config is not (labels: "
                                  f"{', '.join(labels) or 'the same'}); rebuilt as {rebuilt}"])
    lines = [f"differs: layer {index + 1} of {len(their_layers)}: ours {_at(ours_layers, index)}, published "
             f"{_at(their_layers, index)} (rebuilt as {rebuilt})"]
    if check and index < min(len(ours_layers), len(their_layers)):
        difference = published_file_difference(docker_client, registry, manifest, rebuilt, ours_layers[index],
                                               their_layers[index])
        lines.append(f"first differing file: {difference}")
    return Comparison(False, lines)


def published_file_difference(docker_client: docker.DockerClient, registry: RegistryClient, manifest: Manifest,
                              rebuilt: str, ours: str, theirs: str) -> str:
    """The first differing file of two layers: the published image is copied into the engine to be read."""
    published = f"{rebuilt}-published"
    registry.pull(manifest.digest, published, os.environ.get("DOCKER_HOST"))
    try:
        return first_differing_file_between(docker_client.api, rebuilt, published, ours, theirs)
    finally:
        remove_image(docker_client, published)


def differing_keys(ours: dict, theirs: dict) -> list[str]:
    return sorted(key for key in set(ours) | set(theirs) if ours.get(key) != theirs.get(key))


def _at(layers: list[str], index: int) -> str:
    return layers[index] if index < len(layers) else "(none)"


class RebuildFailed(TorchImagesError):
    pass


def layer_of(api: docker.APIClient, image: str, diff_id: str) -> list[FileEntry]:
    """The entries of the layer with this diff id, read from the engine's `docker save` stream of image: a layer is
    <id>/layer.tar (Docker 20.10) or blobs/sha256/<diff id> (the OCI layout of Docker 25 and later)."""
    with tarfile.open(fileobj=ChunkReader(api.get_image(image)), mode="r|") as archive:
        for member in archive:
            if member.isfile() and (member.name.endswith("/layer.tar")
                                    or member.name == f"blobs/sha256/{diff_id.removeprefix('sha256:')}"):
                hashing = _HashingReader(archive.extractfile(member))
                entries = list(layer_entries(hashing))  # type: ignore[arg-type]
                if hashing.finish() == diff_id:
                    return entries
    return []


def first_differing_file_between(api: docker.APIClient, ours: str, theirs: str, ours_id: str, theirs_id: str) -> str:
    found = first_differing_file(iter(layer_of(api, ours, ours_id)), iter(layer_of(api, theirs, theirs_id)))
    return found or "no file differs (the tars differ in their order or headers only)"


class _HashingReader:
    """A reader that hashes what passes through it (a layer tar's sha256 is its diff id)."""

    def __init__(self, source):
        self.source, self.digest = source, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.source.read(size)
        self.digest.update(chunk)
        return chunk

    def finish(self) -> str:
        while chunk := self.source.read(1 << 20):  # what the tar reader left: the end-of-archive blocks
            self.digest.update(chunk)
        return f"sha256:{self.digest.hexdigest()}"


def remove_image(client: docker.DockerClient, name: str) -> None:
    try:
        client.images.remove(name, force=True)
    except docker.errors.DockerException:
        pass  # already gone: nothing of ours is left


def _git(folder: Path, *arguments: str) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        return subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
