"""The OS packages as inputs: which `.deb` files each apt step of an image installed, by sha256; keeping
them (`build.py debs`); and building from them offline (`build --debs DIR`, `rebuild --debs DIR`).

Each apt step (templates/os/apt.j2) downloads first, writes `<RECORD_DIR>/<step>.sha256` (`sha256sum` lines of the
files apt fetched, in file-name order) and then installs. The image carries its records, so the pins come with it
(the venv stage's record comes with the venv's own files). A build with pinned `.deb`s serves each step's files as a
flat apt repository on the build-input server and the step reads only it: the same resolution from the same files,
so the same layer. The files are checked against the record before anything is built, and the image's records
against the pins after it.
"""
from __future__ import annotations

import io
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import docker
import docker.errors
from debian.arfile import ArError
from debian.debfile import DebError, DebFile

from ..files import atomic_output, atomic_write_json, make_folder, read_json_document
from ..invocation import command
from ..model import InputError, PeerError, Problem
from ..reporting import require_schema
from .render import RECORD_DIR
from .wheel_record import file_sha256

DEBS_REPORT_SCHEMA = 1
MAX_RECORD_BYTES = 1 << 20  # a step's record is a line per package: kilobytes
MAX_DEB_BYTES = 8 << 30  # kept .debs are hashed only below this: the largest CUDA .deb is about 3 GB
SPARSE_SLACK_BYTES = 1 << 20  # a file system may keep a written file's tail in fewer blocks than its size
DEB_FILE = re.compile(r"^[a-z0-9][a-z0-9+.-]*_[A-Za-z0-9.+~%-]+_[a-z0-9-]+\.deb$", re.ASCII)
RECORD_LINE = re.compile(r"^([0-9a-f]{64})  (\S+)$", re.ASCII)
STEP = re.compile(r"^[a-z][a-z0-9-]{0,31}$", re.ASCII)
DOWNLOAD_TIMEOUT_S = 900


@dataclass(frozen=True)
class PinnedDeb:
    step: str  # the apt step that installed it (python, venv, system, flavor, security...)
    filename: str  # apt's own name for it: <name>_<version, its epoch's colon as %3a>_<arch>.deb
    sha256: str

    @property
    def name(self) -> str:
        return self.filename.split("_")[0]

    @property
    def version(self) -> str:
        return unquote(self.filename.split("_")[1])

    @property
    def arch(self) -> str:
        return self.filename[:-len(".deb")].split("_")[2]

    def purl(self, distro: str) -> str:
        return f"pkg:deb/{distro}/{self.name}@{self.version}?arch={self.arch}"

    def to_json(self) -> dict[str, str]:
        return {"step": self.step, "filename": self.filename, "sha256": self.sha256}


def parse_record(step: str, text: str, where: str) -> list[PinnedDeb]:
    """A step's record as the apt step wrote it: `<sha256>  <file>.deb` lines."""
    pins = []
    for number, line in enumerate(text.splitlines(), 1):
        match = RECORD_LINE.match(line)
        if not match or not DEB_FILE.match(match.group(2)):
            raise InputError([Problem(where, number, f"not a line of an apt step's record (`<sha256>  <file>.deb`): "
                                                     f"{line[:80]!r}")])
        pins.append(PinnedDeb(step, match.group(2), match.group(1)))
    return pins


def pins_from_json(items: object, where: str, fix: str) -> list[PinnedDeb]:
    """Pins as debs.json, a kept folder's manifest or a provenance lists them; another shape is an InputError."""
    if not isinstance(items, list) or not all(
            isinstance(item, dict) and isinstance(item.get("step"), str) and STEP.match(item["step"])
            and isinstance(item.get("filename"), str) and DEB_FILE.match(item["filename"])
            and isinstance(item.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", item["sha256"])
            for item in items):
        raise InputError([Problem(where, 0, f"not a list of pinned .debs (step, filename, sha256): {fix}")])
    return [PinnedDeb(item["step"], item["filename"], item["sha256"]) for item in items]


# ------------------------------------------------------------------------------------------- records in the image

def image_pins(api: docker.APIClient, image: str) -> list[PinnedDeb]:
    """The records an image carries ([] for an image built before them, or of a family without them)."""
    container = api.create_container(image, command=["true"], entrypoint=[])["Id"]
    try:
        try:
            stream, _ = api.get_archive(container, RECORD_DIR)
        except docker.errors.NotFound:
            return []
        archive = tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:")
        pins = []
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            step = Path(member.name).name.removesuffix(".sha256")
            if member.isfile() and member.name.endswith(".sha256") and STEP.match(step):
                data = archive.extractfile(member).read(MAX_RECORD_BYTES)  # type: ignore[union-attr]
                pins += parse_record(step, data.decode("ascii", "replace"), f"{image}:{RECORD_DIR}/{member.name}")
        return pins
    finally:
        api.remove_container(container, force=True)


def report_path(reports_dir: Path, tag: str) -> Path:
    return reports_dir / tag / "debs.json"


def write_report(reports_dir: Path, tag: str, pins: list[PinnedDeb]) -> None:
    """reports/<tag>/debs.json: what the build's apt steps installed (publish's provenance names them)."""
    atomic_write_json(report_path(reports_dir, tag),
                      {"schema": DEBS_REPORT_SCHEMA, "debs": [pin.to_json() for pin in pins]}, root=reports_dir)


def read_report(reports_dir: Path, tag: str) -> list[PinnedDeb]:
    path = report_path(reports_dir, tag)
    fix = f"delete it: {command(f'build {tag} --force')} writes it again"
    document = read_json_document(path, fix, default=None)
    if document is None:
        return []
    require_schema(document, DEBS_REPORT_SCHEMA, path, "a .deb record", fix)
    return pins_from_json(document.get("debs"), str(path), fix)


def check_built(tag: str, built: list[PinnedDeb], pinned: list[PinnedDeb]) -> None:
    """A build from pinned .debs whose image records other ones took a step from the cache (or from elsewhere)."""
    if sorted(built, key=_order) != sorted(pinned, key=_order):
        extra = sorted({pin.filename for pin in built} ^ {pin.filename for pin in pinned})
        raise InputError([Problem(tag, 0, f"the image's apt steps did not install the pinned .debs "
                                          f"({', '.join(extra[:3]) or 'another step'}...): a step came from the build "
                                          "cache; build with --no-cache")])


def _order(pin: PinnedDeb) -> tuple[str, str, str]:
    return pin.step, pin.filename, pin.sha256


# ------------------------------------------------------------------------------------------ a folder of kept .debs

def manifest_path(folder: Path, tag: str) -> Path:
    return folder / f"{tag}.debs.json"


def load_pinned(folder: Path, tag: str) -> list[PinnedDeb]:
    """The pins `build.py debs` kept for tag in folder, each file there and with its recorded hash (InputError)."""
    path = manifest_path(folder, tag)
    fix = f"run {command(f'debs {tag} --dest {folder}')} after a build of it"
    if not path.is_file():
        raise InputError([Problem(str(path), 0, f"no pinned .debs for {tag}: {fix}")])
    document = read_json_document(path, fix)
    require_schema(document, DEBS_REPORT_SCHEMA, path, "a list of pinned .debs", fix)
    pins = pins_from_json(document.get("debs"), str(path), fix)
    check_files(folder, pins, fix)
    return pins


def check_files(folder: Path, pins: list[PinnedDeb], fix: str) -> None:
    for pin in pins:
        path = folder / pin.filename
        if not path.is_file():
            raise InputError([Problem(str(path), 0, f"missing: the {pin.step} step installed it: {fix}")])
        if (why := not_a_download(path)) is not None:
            raise InputError([Problem(str(path), 0, f"{why}: not a .deb apt downloaded; {fix}")])
        found = file_sha256(path)
        if found != pin.sha256:
            raise InputError([Problem(str(path), 0, f"sha256 {found[:16]}..., the record says "
                                                    f"{pin.sha256[:16]}...: another file under its name; {fix}")])


def not_a_download(path: Path) -> str | None:
    """Why path cannot be a .deb as apt downloads it, from its size alone (before anything hashes it): larger than any
    .deb (a CUDA toolkit's largest is about 3 GB), or sparse (a download writes every byte it has)."""
    status = path.stat()
    if status.st_size > MAX_DEB_BYTES:
        return f"{status.st_size >> 30} GiB, more than any .deb ({MAX_DEB_BYTES >> 30} GiB)"
    if status.st_blocks * 512 + SPARSE_SLACK_BYTES < status.st_size:
        return "a sparse file"
    return None


def packages_index(folder: Path, pins: list[PinnedDeb]) -> bytes:
    """A flat apt repository's Packages file for these files: each one's control fields, name, size and sha256."""
    stanzas = []
    for pin in sorted(pins, key=_order):
        path = folder / pin.filename
        try:
            control = DebFile(str(path)).debcontrol()
        except (ArError, DebError, OSError, EOFError, ValueError) as error:
            raise InputError([Problem(str(path), 0, f"not a .deb apt can install ({error})")]) from None
        control["Filename"] = f"./{pin.filename}"
        control["Size"] = str(path.stat().st_size)
        control["SHA256"] = pin.sha256
        stanzas.append(control.dump())
    return "\n".join(stanzas).encode()


@contextmanager
def served(folder: Path, pins: list[PinnedDeb]) -> Iterator[dict[str, Path]]:
    """What the build-input server serves under /debs/: <step>/Packages and <step>/<file> for each step (a folder
    of its own per step, so that a step resolves among its own files only, as it did when it was recorded)."""
    with tempfile.TemporaryDirectory(prefix="torchimages-debs-") as scratch:
        files: dict[str, Path] = {}
        for step in sorted({pin.step for pin in pins}):
            mine = [pin for pin in pins if pin.step == step]
            index = Path(scratch) / f"{step}.Packages"
            index.write_bytes(packages_index(folder, mine))
            files[f"{step}/Packages"] = index
            files.update({f"{step}/{pin.filename}": folder / pin.filename for pin in mine})
        yield files


# --------------------------------------------------------------------------------------------- `build.py debs`

def keep(client: docker.DockerClient, image: str, tag: str, pins: list[PinnedDeb], dest: Path) -> int:
    """Download each pinned .deb with apt in a container of the image (its own sources), check it by sha256, put it
    into dest with the row's manifest; files already there with the right hash are kept. Returns how many came."""
    wanted = [pin for pin in pins if not _kept(dest / pin.filename, pin.sha256)]
    make_folder(dest, dest)
    if wanted:
        _download(client, image, wanted, dest)
        check_files(dest, wanted, f"the mirror of {image}'s apt sources serves another file: it changed")
    atomic_write_json(manifest_path(dest, tag),
                      {"schema": DEBS_REPORT_SCHEMA, "debs": [pin.to_json() for pin in sorted(pins, key=_order)]},
                      root=dest)
    return len(wanted)


def _kept(path: Path, sha256: str) -> bool:
    """A file of the folder itself with the pinned hash; a link under its name is replaced by the download, as a
    writer replaces every link, so that the folder holds its .debs and not pointers that can change after the check."""
    return path.is_file() and not path.is_symlink() and not_a_download(path) is None and file_sha256(path) == sha256


def _download(client: docker.DockerClient, image: str, pins: list[PinnedDeb], dest: Path) -> None:
    names = sorted({f"{pin.name}:{pin.arch}={pin.version}" if pin.arch != "all" else f"{pin.name}={pin.version}"
                    for pin in pins})
    script = "apt-get update -qq && mkdir -p /tmp/debs && cd /tmp/debs && apt-get download -qq \"$@\""
    container = client.containers.create(image, ["bash", "-c", script, "download", *names], entrypoint=[],
                                         user="0", network_mode="host")
    try:
        container.start()
        status = container.wait(timeout=DOWNLOAD_TIMEOUT_S)
        if status.get("StatusCode") != 0:
            tail = container.logs(tail=5).decode(errors="replace").strip()
            raise PeerError(f"apt in {image} could not download the pinned .debs (the mirror no longer has a "
                            f"version?): {tail[-400:]}")
        stream, _ = container.get_archive("/tmp/debs")
        with tempfile.TemporaryFile() as spool:
            for chunk in stream:
                spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r:") as archive:
                for member in archive.getmembers():
                    name = Path(member.name).name
                    source = archive.extractfile(member) if member.isfile() and DEB_FILE.match(name) else None
                    if source is not None:  # a temporary renamed into place: never written through a link
                        with atomic_output(dest / name, root=dest) as target:
                            shutil.copyfileobj(source, target)
    finally:
        container.remove(force=True)

