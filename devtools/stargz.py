"""ctr-remote, the eStargz converter and TOC reader of Debian's `stargz-snapshotter` package, for the tests that check
torchimages/publish/estargz.py against it, and a private containerd for it to read blobs from.

The package (bookworm's 0.12.0: the Go estargz package that stargz-snapshotter's own snapshotter reads layers with)
is fetched with `apt-get download` through a private sources list and package lists, and unpacked under
.tools/stargz-snapshotter/, as devtools/cosign.py fetches cosign: the machine's apt setup is not touched.

ctr-remote reads nothing offline. Every subcommand that reads a blob (`images get-toc-digest [--dump-toc]`, `images
convert --estargz`, `images optimize`) takes it from a containerd's content store over containerd's socket
(cmd/ctr-remote/commands/get-toc-digest.go, v0.12.0: client.ContentStore().ReaderAt); without one it stops at
`failed to dial "...": context deadline exceeded`. So the checks start a containerd of their own (Debian's
`containerd`, which docker.io, and so `make engine`, installs): its root, state and sockets in a temporary folder,
no CRI and no unpacking (only its content store is used), stopped by its pid afterwards, in a second or two. The
engine's containerd is never used.

    python -m devtools.stargz     # prints the path of a working ctr-remote, installing it when needed
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devtools.cosign import TOOLS, unpack_debian_package

UNPACKED = TOOLS / "stargz-snapshotter"
BINARY = UNPACKED / "usr" / "bin" / "ctr-remote"
PACKAGE = "stargz-snapshotter"
# bookworm's build needs glibc 2.34 (the package's Depends), so it runs on Debian 12 and 13 alike.
SUITE = "bookworm"
NAMESPACE = "estargz-check"
# What a private containerd needs none of: the CRI (and its CNI set-up), tracing, and every snapshotter but `native`,
# which containerd's metadata store will not start without (an import with --no-unpack and a conversion only read and
# write the content store; no overlay mount is tried).
DISABLED_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.internal.v1.tracing",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.overlayfs", "io.containerd.snapshotter.v1.zfs")
START_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 120


def ctr_remote_path() -> Path | None:
    """A ctr-remote that runs: the one on PATH, else the one unpacked under .tools/."""
    for candidate in (shutil.which("ctr-remote"), BINARY):
        if candidate and Path(candidate).is_file() and _runs(Path(candidate)):
            return Path(candidate)
    return None


def ensure_ctr_remote() -> Path:
    found = ctr_remote_path()
    if found:
        return found
    unpack_debian_package(PACKAGE, SUITE, UNPACKED)
    if not _runs(BINARY):
        raise RuntimeError(f"{BINARY} was unpacked but does not run (`{BINARY} --version`)")
    return BINARY


def _runs(binary: Path) -> bool:
    try:
        return subprocess.run([str(binary), "--version"], capture_output=True, timeout=30,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def cannot_check() -> str | None:
    """Why the ctr-remote checks cannot run here (for a skip), or None."""
    if ctr_remote_path() is None:
        return "no ctr-remote: `python -m devtools.stargz` fetches Debian's stargz-snapshotter into .tools/"
    if shutil.which("containerd") is None:
        return "no containerd for ctr-remote to read blobs from (Debian's `containerd`, which `make engine` installs)"
    if os.geteuid() != 0:
        return "a private containerd runs as root"
    return None


@dataclass(frozen=True)
class Containerd:
    """A private containerd and the ctr-remote that talks to it."""

    address: str
    folder: Path
    binary: Path

    def ctr(self, *arguments: str, stdin: bytes | None = None) -> bytes:
        done = subprocess.run([str(self.binary), "--address", self.address, "--namespace", NAMESPACE, *arguments],
                              input=stdin, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ctr-remote {' '.join(arguments)}: exit {done.returncode}: "
                               f"{done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def hold(self, blob: bytes) -> str:
        """Put an eStargz blob in the content store as the layer of an image of its own, so that containerd's
        garbage collector keeps it (a blob `content ingest` adds is referenced by nothing once ctr's lease ends, and
        may be gone before the next command reads it); its digest."""
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        diff_id = "sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest()
        archive = self.folder / "held.oci.tar"
        archive.write_bytes(_oci_archive(blob, "application/vnd.oci.image.layer.v1.tar+gzip", diff_id))
        self.ctr("images", "import", "--no-unpack", "--base-name", f"estargz/held-{digest[7:19]}", str(archive))
        return digest

    def toc_digest(self, blob: bytes) -> str:
        """What `ctr-remote images get-toc-digest` reads out of blob: the sha256 of its TOC JSON."""
        return self.ctr("images", "get-toc-digest", self.hold(blob)).decode().strip()

    def dump_toc(self, blob: bytes) -> dict:
        """The TOC as ctr-remote parses it (`get-toc-digest --dump-toc`: Go's JTOC, marshalled again)."""
        return json.loads(self.ctr("images", "get-toc-digest", "--dump-toc", self.hold(blob)))

    def convert(self, layer: bytes, prefetch: Sequence[str] = ()) -> tuple[bytes, dict]:
        """layer (an uncompressed tar) as `ctr-remote images convert --oci --estargz` writes it, with prefetch as
        its record file (`--estargz-record-in`, the JSON lines `images optimize --record-out` writes): the blob and
        its descriptor in the converted manifest."""
        archive = self.folder / "source.oci.tar"
        archive.write_bytes(_oci_archive(layer, "application/vnd.oci.image.layer.v1.tar",
                                         "sha256:" + hashlib.sha256(layer).hexdigest()))
        record = self.folder / "record.json"
        record.write_text("".join(json.dumps({"path": path}) + "\n" for path in prefetch))
        self.ctr("images", "import", "--no-unpack", "--base-name", "estargz/source", str(archive))
        options = ["--estargz-record-in", str(record)] if prefetch else []
        if b"estargz/converted:latest" in self.ctr("images", "ls", "--quiet"):
            self.ctr("images", "rm", "estargz/converted:latest")  # a conversion writes its target afresh
        converted = self.ctr("images", "convert", "--oci", "--estargz", *options, "estargz/source:latest",
                             "estargz/converted:latest").decode().split()[-1]
        descriptor = json.loads(self.ctr("content", "get", converted))["layers"][0]
        return self.ctr("content", "get", descriptor["digest"]), descriptor


def _oci_archive(layer: bytes, media_type: str, diff_id: str) -> bytes:
    """A one-layer OCI image archive, tagged latest, as `ctr images import` reads it."""
    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": media_type, "digest": digest(layer), "size": len(layer)}]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": "latest"},
        "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
        files.update({f"blobs/sha256/{digest(blob)[7:]}": blob for blob in (layer, config, manifest)})
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


@contextmanager
def private_containerd() -> Iterator[Containerd]:
    """A containerd of its own (folder, sockets and all under /tmp: a unix socket's path is at most 108 bytes),
    stopped by its pid and removed when the block ends."""
    binary = ensure_ctr_remote()
    folder = Path(tempfile.mkdtemp(prefix="esgz-ctd-", dir="/tmp"))
    address = str(folder / "c.sock")
    disabled = ", ".join(json.dumps(name) for name in DISABLED_PLUGINS)
    (folder / "config.toml").write_text(
        f'version = 2\nroot = "{folder}/root"\nstate = "{folder}/state"\ndisabled_plugins = [{disabled}]\n'
        f'[grpc]\n  address = "{address}"\n[ttrpc]\n  address = "{folder}/t.sock"\n[debug]\n  address = ""\n'
        f'[metrics]\n  address = ""\n[plugins."io.containerd.internal.v1.opt"]\n  path = "{folder}/opt"\n')
    log = (folder / "containerd.log").open("wb")
    daemon = subprocess.Popen(["containerd", "--config", str(folder / "config.toml"), "--log-level", "warn"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        containerd = Containerd(address=address, folder=folder, binary=binary)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                containerd.ctr("version")
                break
            except (RuntimeError, subprocess.TimeoutExpired):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a private containerd did not start: "
                                       f"{(folder / 'containerd.log').read_text(errors='replace')[-2000:]}") from None
                time.sleep(0.2)
        yield containerd
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    try:
        print(ensure_ctr_remote())
    except (subprocess.CalledProcessError, StopIteration, RuntimeError, OSError) as error:
        print(f"ctr-remote: could not install it: {error}", file=sys.stderr)
        sys.exit(1)
