"""Files in and out: bounded, checked reads of what people and CI jobs hand us; atomic writes; paths kept inside
their folders."""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path, PurePosixPath

from .model import InputError, Problem

MAX_INPUT_BYTES = 16 * 2**20  # no matrix, lock, report or catalog comes near this; /dev/zero would never end


def read_text(path: Path, fix: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A regular file's UTF-8 text, or an InputError naming the file and `fix` (see read_bytes)."""
    data = read_bytes(path, fix, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise InputError([Problem(str(path), line, f"not UTF-8 text (byte {error.start}): {fix}")]) from None


def read_bytes(path: Path, fix: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """A regular file's bytes, or an InputError naming the file and `fix`. FIFOs, devices and folders are
    refused before they are opened (reading them can hang or never end), and so is anything over `limit`."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise InputError([Problem(str(path), 0, f"{kind} where a file belongs: {fix}")])
    try:
        with open(path, "rb") as stream:
            data = stream.read(limit + 1)
    except OSError as error:
        raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    if len(data) > limit:
        raise InputError([Problem(str(path), 0, f"larger than {limit // 2**20} MiB, which no such file needs: {fix}")])
    return data


_REQUIRED = object()


def read_json_document(path: Path, fix: str, default=_REQUIRED):
    """Parse a JSON file; a missing file gives `default` when one is given, anything unreadable or malformed an
    InputError naming the file, the line and `fix`."""
    if default is not _REQUIRED and not os.path.lexists(path):
        return default
    text = read_text(path, fix)
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError([Problem(str(path), 0, f"nested too deeply to be one of ours: {fix}")]) from None
    except ValueError as error:  # JSONDecodeError, and numbers too long to convert
        line = getattr(error, "lineno", 0)
        raise InputError([Problem(str(path), line, f"not valid JSON ({getattr(error, 'msg', error)}): {fix}")]) from None


def inside(folder: Path, relative: str, where: str) -> Path:
    """folder/relative, refusing a relative path from data that would land outside folder (../x, /etc/x)."""
    parts = PurePosixPath(str(relative)).parts
    if not parts or PurePosixPath(str(relative)).is_absolute() or any(p in ("..", ".") for p in parts) or "\\" in str(relative):
        raise InputError([Problem(where, 0, f"path {brief(relative)} must be a plain relative path inside {folder} "
                                            "(no '..', no leading '/'): fix or remove that entry")])
    return folder.joinpath(*parts)


def brief(value, limit: int = 60) -> str:
    """A value quoted for a message, cut short: messages never repeat megabytes of hostile input."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def atomic_write(path: Path, content: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, document) -> None:
    atomic_write(path, json.dumps(document, indent=2, sort_keys=True) + "\n")
