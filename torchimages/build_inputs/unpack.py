"""One venv layer as a tar stream, unpacked on the host from the wheels a build step planned: what pip would write.

The build step (install_layer.py) plans with pip inside the image, as before; the build-input server then unpacks the
planned wheels here, natively, and the step extracts the stream with the image's own `tar`. On an emulated machine
(an arm64 image built on x86_64) only tar's copying runs under qemu, not pip. The files are those pip 23 writes for
`pip install --no-deps --no-compile` into the venv: the wheel's files by its scheme (`.data/` folders included),
console and GUI scripts with the image's pip's own template and the venv's interpreter, `#!python` scripts rewritten, INSTALLER,
REQUESTED for what was asked for by name, and RECORD as pip writes it (the wheel's rows kept, new files hashed,
sorted, CSV with CRLF). Every entry has the layer's owner, mode g=u and one file time; directories are written only
where the layer adds to them, so that a folder an earlier layer made and this one leaves alone is not copied up."""
from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import io
import posixpath
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..model import TorchImagesError

COPY_CHUNK = 1 << 20
SCHEMES = ("purelib", "platlib", "scripts", "data", "headers")  # a wheel's .data/ folders, as pip knows them
PROJECT_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?", re.ASCII)  # PEP 508


@dataclass(frozen=True)
class Venv:
    """Where one layer's wheels go in the image, and with what owner and file time."""

    root: str  # /opt/venv
    site: str  # its site-packages
    interpreter: str  # the scripts' shebang, as the venv's pip names it
    python: str  # "3.11": headers go to include/site/pythonX.Y/<name>
    script_template: str  # the image's own pip's (distlib's ScriptMaker.script_template): it changed across versions
    uid: int
    gid: int
    time: int

    def scheme_folder(self, scheme: str, distribution: str) -> str:
        return {"purelib": self.site, "platlib": self.site, "scripts": posixpath.join(self.root, "bin"),
                "data": self.root,
                "headers": posixpath.join(self.root, "include", "site", f"python{self.python}", distribution)}[scheme]

    @property
    def roots(self) -> tuple[str, ...]:
        """The folders that exist before any layer: above them nothing is written, they themselves only if added to."""
        return self.site, posixpath.join(self.root, "bin"), posixpath.join(self.root, "include"), self.root


@dataclass(frozen=True)
class LayerWheel:
    path: Path
    requested: bool  # asked for by name: pip marks it REQUESTED


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class LayerTar:
    """A tar stream of one layer's entries; each file's folders are written before it, once, up to the venv's roots."""

    def __init__(self, out: IO[bytes], venv: Venv):
        self.venv = venv
        self.out = _Gate(out)
        # copybufsize is TarFile's own argument, which typeshed's stream-mode overloads leave out.
        self.tar = tarfile.open(fileobj=self.out, mode="w|", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                                bufsize=COPY_CHUNK, copybufsize=COPY_CHUNK)
        self.folders: set[str] = set()

    def close(self) -> None:
        self.tar.close()

    def abandon(self) -> None:
        """Nothing more reaches out, the tar's end least of all (tarfile's stream writes it when collected)."""
        self.out.shut = True

    def _info(self, path: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type, info.mode, info.size = kind, mode, size
        info.uid, info.gid, info.uname, info.gname, info.mtime = self.venv.uid, self.venv.gid, "", "", self.venv.time
        return info

    def _folders_of(self, path: str) -> None:
        parent = posixpath.dirname(path)
        if parent in self.folders or parent in ("", "/"):
            return
        if parent not in self.venv.roots:
            self._folders_of(parent)
        self.folders.add(parent)
        self.tar.addfile(self._info(parent, tarfile.DIRTYPE, 0o775))

    def add(self, path: str, stream: IO[bytes], size: int, executable: bool) -> None:
        self._folders_of(path)
        self.tar.addfile(self._info(path, tarfile.REGTYPE, 0o775 if executable else 0o664, size), stream)


class _Gate:
    """out, until shut."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.shut = out, False

    def write(self, data: bytes) -> int:
        return len(data) if self.shut else self.out.write(data)


class WheelError(TorchImagesError):
    """A wheel the layer cannot be written from (named, with why): refused before any byte is sent."""


@dataclass(frozen=True)
class ReadWheel:
    """What a wheel's own files say, read before the stream starts, so that a bad wheel is refused, not cut short."""

    wheel: LayerWheel
    dist_info: str
    distribution: str
    rows: dict[str, list[str]]  # its RECORD, by path
    scripts: tuple[tuple[str, bytes], ...]  # the console and GUI scripts pip would write


def read_wheels(wheels: Iterable[LayerWheel], venv: Venv) -> list[ReadWheel]:
    return [_read(wheel, venv) for wheel in wheels]


def _read(wheel: LayerWheel, venv: Venv) -> ReadWheel:
    try:
        with zipfile.ZipFile(wheel.path) as archive:
            dist_info = next(name.split("/")[0] for name in archive.namelist()
                             if name.count("/") == 1 and name.endswith(".dist-info/WHEEL"))
            distribution = _metadata_name(archive.read(posixpath.join(dist_info, "METADATA")))
            record = archive.read(posixpath.join(dist_info, "RECORD")).decode()
            rows = {row[0]: row for row in csv.reader(io.StringIO(record)) if row}
            _check_members(archive, dist_info, distribution)
            return ReadWheel(wheel, dist_info, distribution, rows, tuple(_scripts(archive, dist_info, venv)))
    except (OSError, zipfile.BadZipFile, StopIteration, KeyError, UnicodeDecodeError, csv.Error, configparser.Error,
            zlib.error, EOFError, NotImplementedError) as error:
        raise WheelError(f"{wheel.path.name}: not a wheel pip could install ({type(error).__name__}: {error})") from None
    except WheelError as error:
        raise WheelError(f"{wheel.path.name}: {error}") from None


def _check_members(archive: zipfile.ZipFile, dist_info: str, distribution: str) -> None:
    """The whole wheel's names, before a byte of its layer is sent: every member stays in its scheme folder (no
    absolute path, no '..': the image's tar would write it anywhere, /etc included), every .data/ folder is a scheme
    pip knows, and the project's name makes a folder name. The members' CRCs are checked as they are unpacked (a
    check before the stream inflated every wheel twice: 22 s of a CUDA row's build, issue 58); a damaged member ends
    the stream without its last chunk (server.py), which the step refuses."""
    if not PROJECT_NAME.fullmatch(distribution):
        raise WheelError(f"its METADATA names the project {distribution[:60]!r}, not a project name")
    data = dist_info[: -len(".dist-info")] + ".data/"
    for member in archive.infolist():
        if member.is_dir():  # never written: each file's folders are made from its own path
            continue
        name = member.filename
        if name.startswith(data):
            scheme, _, name = name[len(data):].partition("/")
            if scheme not in SCHEMES:
                raise WheelError(f"{member.filename[:120]!r}: {scheme[:60]!r} is not a scheme folder pip knows "
                                 f"({', '.join(SCHEMES)})")
        if not _plain_relative(name):
            raise WheelError(f"member {member.filename[:120]!r} would be written outside its folder")


def _plain_relative(path: str) -> bool:
    """A path below its folder: not absolute, no '..', '.' or empty part, no backslash (a Windows separator)."""
    parts = path.split("/")
    return bool(path) and "\\" not in path and not any(part in ("", ".", "..") for part in parts)


def unpack(wheels: Iterable[ReadWheel], venv: Venv, out: IO[bytes]) -> None:
    """Write the layer of these wheels to out, in the order given. A damaged member (its CRC, its deflate stream) is a
    WheelError naming the wheel and member, and the tar then has no end: what was written is never a whole layer."""
    layer = LayerTar(out, venv)
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel.wheel.path) as archive:
                _install(archive, wheel, venv, layer)
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:
            layer.abandon()
            raise WheelError(f"{wheel.wheel.path.name}: {error} (a damaged wheel)") from None
        except BaseException:
            layer.abandon()
            raise
    layer.close()


def _install(archive: zipfile.ZipFile, wheel: ReadWheel, venv: Venv, layer: LayerTar) -> None:
    data = wheel.dist_info[: -len(".dist-info")] + ".data/"
    old_record = posixpath.join(wheel.dist_info, "RECORD")
    record: list[tuple[str, str, str]] = []

    def installed(path: str) -> str:
        return posixpath.relpath(path, venv.site)

    def add(path: str, body: bytes, executable: bool) -> None:
        layer.add(path, io.BytesIO(body), len(body), executable)
        record.append((installed(path), record_hash(body), str(len(body))))

    for member in archive.infolist():
        if member.is_dir() or member.filename == old_record:
            continue
        target = _target(member.filename, data, wheel.distribution, venv)
        mode = member.external_attr >> 16
        executable = bool(mode and stat.S_ISREG(mode) and mode & 0o111)  # pip's rule
        if posixpath.dirname(target) == venv.scheme_folder("scripts", "") and _names_python(archive, member):
            add(target, _shebang(venv, archive.read(member)), executable)  # pip names the venv's interpreter
            continue
        if "__pycache__" not in member.filename.split("/")[:-1]:  # bytecode a wheel ships: the image has none
            with archive.open(member) as stream:
                layer.add(target, stream, member.file_size, executable)
        old = wheel.rows.get(member.filename)
        record.append((installed(target), *(old[1:3] if old else ("", ""))))
    for name, body in wheel.scripts:
        add(posixpath.join(venv.scheme_folder("scripts", ""), name), body, True)
    add(posixpath.join(venv.site, wheel.dist_info, "INSTALLER"), b"pip\n", False)
    if wheel.wheel.requested:
        add(posixpath.join(venv.site, wheel.dist_info, "REQUESTED"), b"", False)
    record.append((installed(posixpath.join(venv.site, old_record)), "", ""))
    text = io.StringIO()
    csv.writer(text).writerows(sorted(record))  # pip's RECORD: sorted rows, the csv module's CRLF
    body = text.getvalue().encode()
    layer.add(posixpath.join(venv.site, old_record), io.BytesIO(body), len(body), False)


def _metadata_name(metadata: bytes) -> str:
    """The project's name as its METADATA spells it (pip's headers folder is named so)."""
    return next(line[5:].strip() for line in metadata.decode("utf-8", "replace").splitlines()
                if line.startswith("Name:"))


def _target(name: str, data: str, distribution: str, venv: Venv) -> str:
    if not name.startswith(data):
        return posixpath.join(venv.site, name)
    scheme, _, rest = name[len(data):].partition("/")
    return posixpath.join(venv.scheme_folder(scheme, distribution), rest)


def _names_python(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> bool:
    with archive.open(member) as stream:
        return stream.read(len(b"#!python")) == b"#!python"


def _shebang(venv: Venv, script: bytes) -> bytes:
    return b"#!" + venv.interpreter.encode() + b"\n" + script.split(b"\n", 1)[1]


def _scripts(archive: zipfile.ZipFile, dist_info: str, venv: Venv) -> Iterator[tuple[str, bytes]]:
    """The console and GUI scripts of entry_points.txt, as pip's ScriptMaker writes them."""
    if posixpath.join(dist_info, "entry_points.txt") not in archive.namelist():
        return
    text = archive.read(posixpath.join(dist_info, "entry_points.txt")).decode()
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    parser.read_string(text)
    for section in ("console_scripts", "gui_scripts"):
        for name, value in (parser.items(section) if parser.has_section(section) else []):
            if "/" in name or not _plain_relative(name):
                raise WheelError(f"{dist_info}/entry_points.txt: script name {name[:60]!r} is not a file name")
            module, _, attr = value.split("[", 1)[0].partition(":")  # module:attr [extras]
            module, attr = module.strip(), attr.strip()
            if not all(part.isidentifier() for part in (*module.split("."), *attr.split("."))):
                raise WheelError(f"{dist_info}/entry_points.txt: {name} = {value} is no module:function")
            body = venv.script_template % {"module": module, "import_name": attr.split(".")[0], "func": attr}
            yield name, b"#!" + venv.interpreter.encode() + b"\n" + body.encode()
