#!/usr/bin/env python3
"""Cold start and republish (issue 20), today's layout against the new one, side by side in one run; Markdown for
docs/benchmarks-log.md.

For one row (default the CPU runtime row; `--row 2.14.1-cuda13.0-cudnn9-runtime` for the CUDA one):
1. Build the row cold (`--no-cache`) twice: with the Dockerfile committed at `--baseline` (today's layout: one venv
   layer) and with images/<tag>/Dockerfile of this checkout (the venv in layers ordered by how rarely they change);
   against the floor, `pip install` of the same wheelhouse into an empty venv on the host.
2. Publish each with the product's own push (registry.RegistryClient.push: skopeo, gzip, private blob-info cache,
   digests precomputed) into a repository of its own on the engine's registry: seconds, compressed bytes.
3. A torch-only change: the same wheelhouse with one file added to the torch wheel; rebuild both (from the build
   cache, as a nightly does), publish again into the same repositories: the bytes that upload (blobs the registry
   log shows PUT, else the manifest's blobs the repository did not hold), against the whole image's.
4. The new layout also as zstd (`--compression zstd`), into a third repository.
5. Pull, with every image of the run removed first (the engine holds the Debian base only) and the page cache
   dropped before each pull: `docker pull` (the engine's own client) of each layout, then the first `import torch` in
   a container of it (container start included); containerd's `ctr images pull` of each layout in gzip and of the new
   one in zstd, each into a namespace of its own, removed (and its content collected) afterwards, split into its
   fetch and its unpack (ctr does one after the other). Docker 20.10 is also asked to pull the zstd image: it is
   expected to fail, and the message is printed.
6. unpigz (doctor's host advice): the engine restarted with MOBY_DISABLE_PIGZ=1 and CONTAINERD_DISABLE_PIGZ=1 (Go's
   gzip, as on a host without pigz), the new layout's gzip pulled again with both clients, the engine restarted as
   it was.

Needs the project's engine (`make engine`, `source .engine/env`; it installs pigz), the row's wheelhouse
(`build.py wheels ROW --dest wheelhouse`), root for dropping the page cache.
Leaves nothing behind: its images, repositories' tags and containerd namespaces are removed at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import docker.errors

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools import localengine  # noqa: E402
from torchimages.build.builder import local_name  # noqa: E402
from torchimages.build.context import wheel_dir  # noqa: E402
from torchimages.build.wheels import requirements  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402
from torchimages.peers import engine  # noqa: E402
from torchimages.peers.registry import RegistryClient, RetryPolicy  # noqa: E402
from torchimages.peers.registry_access import registry_access  # noqa: E402
from torchimages.peers.registry_address import Registry  # noqa: E402

LAYOUTS = ("today", "new")
# dockerd (moby pkg/archive) and containerd (archive/compression) each use unpigz when on their PATH, unless told not to.
PIGZ_SWITCHES = ("MOBY_DISABLE_PIGZ", "CONTAINERD_DISABLE_PIGZ")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


# ------------------------------------------------------------------------------------------------------- builds

def baseline_images(ref: str, tag: str, folder: Path) -> Path:
    """An images folder holding the row's Dockerfile (and entrypoint) as committed at ref."""
    row = folder / "images" / tag
    row.mkdir(parents=True)
    for name in ("Dockerfile", "entrypoint.sh"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:images/{tag}/{name}"], capture_output=True,
                               check=True)
        (row / name).write_bytes(shown.stdout)
    (row / "entrypoint.sh").chmod(0o755)
    return folder / "images"


def build(tag: str, images: Path, wheelhouse: Path, reports: Path, name: str, client, *,
          cold: bool) -> tuple[str, float]:
    """Build the row from images/<tag>/ with build.py (what CI runs), without the layer cache when cold, tag it
    `name`; (image id, seconds)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "build.py"), "--images", str(images), "--reports", str(reports),
                           "build", tag, "--wheelhouse", str(wheelhouse), "--force", *(["--no-cache"] if cold else [])],
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"build of {tag} from {images} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    spec = next(iter(select(load_matrix(ROOT / "matrix.yaml").specs, [tag])))
    image = client.images.get(local_name(spec))
    repository, _, label = name.rpartition(":")
    image.tag(repository, label)
    return image.id, seconds


def pip_floor(tag: str, wheelhouse: Path, folder: Path) -> float:
    """Seconds for the floor of the row's build: `pip install` of its wheels from the wheelhouse into an empty venv
    on the host (what the build's packages stage does, without Docker)."""
    spec = next(iter(select(load_matrix(ROOT / "matrix.yaml").specs, [tag])))
    venv = folder / "floor-venv"
    subprocess.run([f"python{spec.python}", "-m", "venv", str(venv)], check=True)
    drop_page_cache()
    started = time.perf_counter()
    subprocess.run([str(venv / "bin" / "pip"), "install", "--no-cache-dir", "--disable-pip-version-check", "--quiet",
                    "--no-index", "--find-links", str(wheel_dir(wheelhouse, spec)), *requirements(spec)], check=True)
    seconds = time.perf_counter() - started
    shutil.rmtree(venv)
    return seconds


def torch_changed(wheelhouse: Path, folder: Path) -> Path:
    """The wheelhouse with one file added to the torch wheel (a new torch build, nothing else changed)."""
    changed = folder / "wheelhouse-torch-changed"
    shutil.copytree(wheelhouse, changed, copy_function=os.link)
    for wheel in changed.rglob("torch-*.whl"):
        wheel.unlink()
        shutil.copy2(next(wheelhouse.rglob(wheel.name)), wheel)
        with zipfile.ZipFile(wheel, "a") as archive:
            archive.writestr("torch/_coldstart_bench_marker.py", f"BUILD = {uuid.uuid4().hex!r}\n")
    return changed


# ------------------------------------------------------------------------------------------------------ publish

def registry_log_uploads(since: int) -> set[str]:
    """Digests of the blobs PUT to the engine's registry after byte offset `since` of its log."""
    uploads = set()
    with open(localengine.REGISTRY_LOG, "rb") as handle:
        handle.seek(since)
        for line in handle.read().decode(errors="replace").splitlines():
            if '"PUT /v2/' in line and "/blobs/uploads/" in line and "digest=sha256%3A" in line:
                uploads.add("sha256:" + line.split("digest=sha256%3A", 1)[1][:64])
    return uploads


def manifest_blobs(client: RegistryClient, tag: str) -> dict[str, int]:
    document = json.loads(client.manifest(tag).body)
    return {part["digest"]: part["size"] for part in [document["config"], *document["layers"]]}


def publish(host: str, repository: str, image_id: str, tag: str, compression: str = "gzip") -> dict:
    registry = Registry(host, repository)
    client = RegistryClient(registry, registry_access(registry), RetryPolicy(retries=0), log)
    before = set()
    for old in client.tags():
        before |= set(manifest_blobs(client, old))
    log_offset = localengine.REGISTRY_LOG.stat().st_size if localengine.REGISTRY_LOG.exists() else None
    started = time.perf_counter()
    client.push(image_id, tag, os.environ.get("DOCKER_HOST"), compression)
    seconds = time.perf_counter() - started
    blobs = manifest_blobs(client, tag)
    if log_offset is not None:
        uploaded, how = registry_log_uploads(log_offset) & set(blobs), "registry log"
    else:
        uploaded, how = set(blobs) - before, "blobs the repository lacked"
    return {"seconds": round(seconds, 1), "image_bytes": sum(blobs.values()),
            "uploaded_bytes": sum(blobs[digest] for digest in uploaded), "uploaded_how": how,
            "layers": len(blobs) - 1, "largest_layer": max(blobs.values())}


# --------------------------------------------------------------------------------------------------------- pull

def remove_everything(client, references: list[str]) -> None:
    """Remove these images by id, every tag of them (removing one of several tags only untags), and untagged images
    (build stages) whose layers a pull could reuse."""
    for reference in references:
        with contextlib.suppress(docker.errors.APIError):  # already gone
            client.images.remove(client.images.get(reference).id, force=True)
    client.images.prune(filters={"dangling": True})


def drop_page_cache() -> None:
    """What a new node has: nothing of the image in memory (the registry's blobs are read from disk)."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as error:
        log(f"page cache not dropped ({error}): pulls may read the registry from memory")


def docker_pull(client, reference: str) -> dict:
    """`docker pull` through the engine's API, its error (the zstd case on Docker 20.10) kept; then the first
    `import torch` in a container of the image, container start included."""
    repository, _, tag = reference.rpartition(":")
    drop_page_cache()
    started = time.perf_counter()
    errors = [event.get("error") for event in client.api.pull(repository, tag=tag, stream=True, decode=True)
              if event.get("error")]
    pulled = time.perf_counter() - started
    if errors:
        return {"seconds": round(pulled, 1), "error": " ".join(errors[-1].split())[-300:]}
    image = client.images.get(reference)
    drop_page_cache()
    started = time.perf_counter()
    client.containers.run(image.id, ["python", "-c", "import torch"], remove=True)
    return {"seconds": round(pulled, 1), "first_import_torch_s": round(time.perf_counter() - started, 1),
}


def ctr(socket: str, namespace: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "--address", socket, "--namespace", namespace, *arguments], capture_output=True,
                          text=True, check=False)


def ctr_pull(socket: str, reference: str) -> dict:
    """`ctr images pull`: seconds in all, and its two parts, which ctr prints (it fetches every blob, then unpacks)."""
    namespace = f"coldstart-{uuid.uuid4().hex[:8]}"
    drop_page_cache()
    started = time.perf_counter()
    done = ctr(socket, namespace, "images", "pull", "--plain-http", reference)
    seconds = time.perf_counter() - started
    ctr(socket, namespace, "images", "rm", "--sync", reference)
    ctr(socket, "default", "namespaces", "remove", namespace)
    if done.returncode != 0:
        return {"seconds": round(seconds, 1), "error": done.stderr.strip()[-300:]}
    fetched = re.findall(r"elapsed: *([0-9.]+) *s", done.stdout)
    unpacked = re.search(r"done: *([0-9.]+)(ms|s)", done.stdout)
    parts = {}
    if fetched:
        parts["fetch_s"] = round(float(fetched[-1]), 1)
    if unpacked:
        parts["unpack_s"] = round(float(unpacked[1]) / (1000 if unpacked[2] == "ms" else 1), 1)
    return {"seconds": round(seconds, 1), **parts}


def engine_pigz() -> dict:
    """Whether the running engine decompresses gzip with unpigz: on its PATH, and not disabled in its environment."""
    pid = localengine.DOCKERD_PIDFILE.read_text().strip()
    environment = dict(entry.split("=", 1) for entry in
                       Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in entry)
    disabled = [name for name in PIGZ_SWITCHES if environment.get(name)]
    return {"unpigz": shutil.which("unpigz", path=environment.get("PATH")), "disabled_by": disabled}


@contextlib.contextmanager
def engine_without_pigz():
    """The engine restarted with unpigz switched off for dockerd and its containerd (their gzip is then Go's), and
    restarted as it was afterwards."""
    saved = {name: os.environ.get(name) for name in PIGZ_SWITCHES}

    def restart() -> None:
        localengine.stop_engine()
        localengine.ensure_engine()

    os.environ.update(dict.fromkeys(PIGZ_SWITCHES, "1"))
    try:
        restart()
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        restart()


# --------------------------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--row", default="2.13.0-cpu-runtime")
    parser.add_argument("--baseline", default="099bab1^", help="git ref whose committed Dockerfile is today's layout "
                                                              "(default: the last commit with one venv layer)")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--containerd-socket", default=str(localengine.EXEC_ROOT / "containerd" / "containerd.sock"))
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                        help="only these (`--layouts new` where today's figures are known and time is short)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    host = os.environ.get("TORCHIMAGES_REGISTRY")
    if not host or not os.environ.get("DOCKER_HOST"):
        raise SystemExit("run `make engine && source .engine/env` first")
    client = engine.client()
    token = uuid.uuid4().hex[:8]
    names = {layout: f"coldstart-{token}/{layout}" for layout in LAYOUTS}
    repositories = {"today": f"coldstart-{token}/today", "new": f"coldstart-{token}/new",
                    "new-zstd": f"coldstart-{token}/new-zstd"}
    results: dict = {"row": args.row, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                     "machine": f"{os.cpu_count()} cores, {platform.machine()}", "engine_gzip": engine_pigz()}
    local = []
    with tempfile.TemporaryDirectory(prefix="coldstart-") as scratch:
        folder = Path(scratch)
        images = {"today": baseline_images(args.baseline, args.row, folder / "today"), "new": ROOT / "images"}
        layouts = [layout for layout in LAYOUTS if layout in args.layouts]
        changed = torch_changed(args.wheelhouse, folder)
        try:
            log("floor: pip install of the wheelhouse into an empty venv on the host")
            results["floor: pip install into an empty venv, s"] = round(pip_floor(args.row, args.wheelhouse, folder), 1)
            for layout in layouts:
                for variant, wheelhouse in (("first", args.wheelhouse), ("torch-changed", changed)):
                    name = f"{names[layout]}:{variant}"
                    log(f"{layout}: building ({variant})")
                    image_id, seconds = build(args.row, images[layout], wheelhouse, folder / "reports", name, client,
                                              cold=variant == "first")
                    local.append(image_id)
                    size = client.images.get(image_id).attrs["Size"]
                    log(f"{layout}: publishing ({variant})")
                    pushed = publish(host, repositories[layout], image_id, variant)
                    results[f"{layout}/{variant}"] = {"build_s": round(seconds, 1), "size": size, **pushed}
                    log(f"{layout}/{variant}: {results[f'{layout}/{variant}']}")
                    if layout == "new" and variant == "torch-changed":
                        log("new: publishing as zstd")
                        results["new-zstd"] = publish(host, repositories["new-zstd"], image_id, "latest", "zstd")
            remove_everything(client, local)
            for layout in layouts:
                reference = f"{host}/{repositories[layout]}:torch-changed"
                log(f"{layout}: docker pull")
                results["images on the engine before the pulls"] = sorted(
                    tag for image in client.images.list() for tag in image.tags)
                results[f"{layout}/docker-pull"] = docker_pull(client, reference)
                remove_everything(client, [reference])
            pulled = [*layouts, "new-zstd"] if "new" in layouts else layouts
            if "new" in layouts:
                log("new (zstd): docker pull")
                results["new-zstd/docker-pull"] = docker_pull(client, f"{host}/{repositories['new-zstd']}:latest")
                remove_everything(client, [f"{host}/{repositories['new-zstd']}:latest"])
            if Path(args.containerd_socket).exists():
                for key in pulled:
                    reference = f"{host}/{repositories[key]}:" + ("latest" if key == "new-zstd" else "torch-changed")
                    log(f"{key}: ctr pull")
                    results[f"{key}/ctr-pull"] = ctr_pull(args.containerd_socket, reference)
            if "new" in layouts and results["engine_gzip"]["unpigz"] and not results["engine_gzip"]["disabled_by"]:
                reference = f"{host}/{repositories['new']}:torch-changed"
                with engine_without_pigz():
                    results["engine_gzip, restarted"] = engine_pigz()
                    log("new: docker pull and ctr pull with Go's gzip (unpigz switched off)")
                    results["new/docker-pull, no unpigz"] = docker_pull(client, reference)
                    remove_everything(client, [reference])
                    if Path(args.containerd_socket).exists():
                        results["new/ctr-pull, no unpigz"] = ctr_pull(args.containerd_socket, reference)
        finally:
            remove_everything(client, local)
            for repository in repositories.values():
                delete_repository(host, repository)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def delete_repository(host: str, repository: str) -> None:
    """Delete the run's manifests (the registry keeps blobs until its garbage collection)."""
    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    try:
        with urllib.request.urlopen(f"http://{host}/v2/{repository}/tags/list", timeout=10) as response:
            tags = json.loads(response.read()).get("tags") or []
        for tag in tags:
            request = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{tag}", method="HEAD",
                                             headers={"Accept": accept})
            with urllib.request.urlopen(request, timeout=10) as response:
                digest = response.headers["Docker-Content-Digest"]
            urllib.request.urlopen(urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{digest}",
                                                          method="DELETE"), timeout=10).close()
    except OSError as error:
        log(f"could not delete {repository}: {error}")


if __name__ == "__main__":
    sys.exit(main())
