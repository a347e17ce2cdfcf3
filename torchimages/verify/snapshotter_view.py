"""The image's /usr and /opt as a lazy-pull snapshotter's mount reads them: a copy on a loop device whose read-ahead is
the snapshotter's (issue 58).

A start-up set is what is in the page cache after a start (`mincore`): what the start read and what the kernel read
ahead around it, and how far it reads ahead is the disk's setting. A page fault in a mapped library reads the disk's
whole read-ahead window around it: 8 MiB on this project's VMs (`/sys/block/vda/queue/read_ahead_kb` = 8192), where
stargz-snapshotter's FUSE mount reads ahead at most 128 KiB (its fs/fs.go sets no MaxReadAhead,
containerd/stargz-snapshotter 7cf47cba; go-fuse then takes the kernel's default, capped at VM_READAHEAD_PAGES = 128
KiB: fuse/api.go, hanwen/go-fuse 5104b2cb). Measured on the engine's own disk, the set is what that disk fetched,
not what a lazy pull must.

So the folders that hold nearly all of an image's bytes (the OS's /usr, the venv under /opt) are copied out of a
container of the image onto an ext4 file system on a loop device of their own, with the snapshotter's read-ahead,
mounted read-only and cold, and bound over the same paths in the measuring container. Needs root on the engine's own
host (losetup, mount) and free disk for one copy of those folders; everything is removed afterwards.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker

from ..build.reproducible import ChunkReader
from ..model import InputError, PeerError, Problem

SNAPSHOTTER_READAHEAD_KIB = 128
COPIED = ("usr", "opt")  # the OS's libraries and Python, the venv: every file a start reads but a few in /etc
COMMAND_TIMEOUT_S = 120
OPTION = "--readahead-kib"


def usable(where: str) -> list[Problem]:
    """Why a loop copy cannot be made for the engine at `where` (empty: it can)."""
    if not where.startswith("unix://"):
        return [Problem(OPTION, 0, f"the engine at {where} is not on this host: its containers cannot bind a loop "
                                   f"device made here; run on the engine's host, or leave out {OPTION}")]
    if os.geteuid() != 0:
        return [Problem(OPTION, 0, f"a loop device and its mount need root: run as root, or leave out {OPTION}")]
    missing = [tool for tool in ("losetup", "mkfs.ext4", "mount", "umount") if not shutil.which(tool)]
    if missing:
        return [Problem(OPTION, 0, f"{', '.join(missing)} not found: install util-linux and e2fsprogs, or leave out "
                                   f"{OPTION}")]
    return []


@contextlib.contextmanager
def loop_copy(docker_client: docker.DockerClient, image: str, readahead_kib: int, work: Path) -> Iterator[dict]:
    """Binds for the measuring container ({host folder: {bind, mode}}): the image's COPIED folders, read-only, on a
    loop device that reads ahead readahead_kib KiB, its page cache empty. Removed when the block ends."""
    api = docker_client.api
    size = int(api.inspect_image(image)["Size"])
    name = f"snapshotter-view-{uuid.uuid4().hex[:8]}"
    backing, mount_point = work / f"{name}.ext4", work / name
    device = None
    mounted = False
    try:
        with open(backing, "wb") as file:  # sparse: only what the copy writes takes disk
            file.truncate(size + size // 8 + (256 << 20))
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard", str(backing)])
        device = _run(["losetup", "--find", "--show", str(backing)]).strip()
        Path(f"/sys/block/{Path(device).name}/queue/read_ahead_kb").write_text(f"{readahead_kib}\n")
        mount_point.mkdir()
        _run(["mount", device, str(mount_point)])
        mounted = True
        _copy_folders(api, image, mount_point)
        # Mounted again, read-only: the copy's own writes leave no page of it in the cache.
        _run(["umount", str(mount_point)])
        mounted = False
        _run(["mount", "-o", "ro", device, str(mount_point)])
        mounted = True
        yield {str(mount_point / folder): {"bind": f"/{folder}", "mode": "ro"} for folder in COPIED
               if (mount_point / folder).is_dir()}
    finally:
        if mounted:
            subprocess.run(["umount", str(mount_point)], capture_output=True, check=False, timeout=COMMAND_TIMEOUT_S)
        if device:
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False, timeout=COMMAND_TIMEOUT_S)
        with contextlib.suppress(OSError):
            mount_point.rmdir()
        backing.unlink(missing_ok=True)


def _copy_folders(api: docker.APIClient, image: str, destination: Path) -> None:
    """COPIED, from `docker export` of a container of the image (what the container sees, whiteouts applied), with
    their owners, modes and links; tarfile's "tar" filter refuses a member that would land outside the copy."""
    container = api.create_container(image, ["true"], entrypoint=[], network_disabled=True)
    try:
        with tarfile.open(fileobj=ChunkReader(api.export(container)), mode="r|") as archive:
            for member in archive:
                if member.name.lstrip("./").split("/", 1)[0] not in COPIED:
                    continue
                try:
                    archive.extract(member, destination, numeric_owner=True, filter="tar")
                except tarfile.FilterError:
                    continue
    except (tarfile.TarError, OSError) as error:
        raise PeerError(f"the engine's export of {image} could not be copied onto the loop device: {error}") from None
    finally:
        api.remove_container(container, force=True)


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PeerError(f"`{command[0]}` did not finish within {COMMAND_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise InputError([Problem(OPTION, 0, f"`{' '.join(command[:2])}` failed: {done.stderr.strip()[-300:]}; run "
                                             f"as root on a host that has loop devices, or leave out {OPTION}")])
    return done.stdout
