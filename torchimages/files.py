"""Files in and out: bounded, checked reads of what people and CI jobs hand us; atomic writes that follow no link below
the folder they write into; paths kept inside their folders; one run at a time per folder."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import signal
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .model import InputError, Problem
from .redaction import Secrets

MAX_INPUT_BYTES = 16 * 2**20  # no matrix, lock, report or catalog comes near this; /dev/zero would never end


def read_text(path: Path, fix: str, limit: int = MAX_INPUT_BYTES, follow_links: bool = True) -> str:
    """A regular file's UTF-8 text, or an InputError naming the file and `fix` (see read_bytes)."""
    data = read_bytes(path, fix, limit, follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise InputError([Problem(str(path), line, f"not UTF-8 text (byte {error.start}): {fix}")]) from None


def read_bytes(path: Path, fix: str, limit: int = MAX_INPUT_BYTES, follow_links: bool = True) -> bytes:
    """A regular file's bytes, or an InputError naming the file and `fix`. FIFOs, devices and folders are
    refused before they are opened (reading them can hang or never end), and so is anything over `limit`.
    follow_links=False reads only a file of the folder itself: a link (to a file anywhere) is refused too."""
    try:
        mode = (path.stat() if follow_links else path.lstat()).st_mode
    except OSError as error:
        raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    if not stat.S_ISREG(mode):
        raise InputError([Problem(str(path), 0, f"{_kind(mode)} where a file belongs: {fix}")])
    # Opened without waiting and checked again: what the name points to may have changed since the look above.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow_links else os.O_NOFOLLOW)
    try:
        handle = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise InputError([Problem(str(path), 0, f"a link where a file belongs: {fix}")]) from None
        raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    with os.fdopen(handle, "rb") as stream:
        opened = os.fstat(handle).st_mode
        if not stat.S_ISREG(opened):
            raise InputError([Problem(str(path), 0, f"{_kind(opened)} where a file belongs: {fix}")])
        try:
            data = stream.read(limit + 1)
        except OSError as error:
            raise InputError([Problem(str(path), 0, f"cannot read it ({error.strerror}): {fix}")]) from None
    if len(data) > limit:
        raise InputError([Problem(str(path), 0, f"larger than {limit // 2**20} MiB, which no such file needs: {fix}")])
    return data


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a link" if stat.S_ISLNK(mode) else "not a regular file"


def read_replaceable(path: Path, limit: int = MAX_INPUT_BYTES) -> bytes | None:
    """The bytes of a regular file the tool writes (to compare with what it would write), or None for anything a
    writer replaces instead: nothing, a link, a FIFO (opened without waiting), a device, a folder, a file over limit."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(handle).st_mode):  # before fdopen, which refuses a folder with an error
        os.close(handle)
        return None
    with os.fdopen(handle, "rb") as stream:
        data = stream.read(limit + 1)
    return data if len(data) <= limit else None


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


# -------------------------------------------------------------------------------------------------------------- writing
# Every file the tool writes goes through here. Below the folder a command was pointed at (its root: --reports,
# --images, --catalog, the matrix's folder), no link is followed: a link, or a file, where a folder belongs is refused
# with the path; a link, pipe or device where a file belongs is replaced, never written through. Files are written to
# a temporary beside them and renamed into place, so a reader sees the old file or the new one, never half of one.

LINK_FIX = "remove the link (what it points to stays as it is), or point the command at another folder"


def _link_problem(path: Path, root: Path) -> Problem:
    return Problem(str(path), 0, f"a link where a folder belongs: nothing below {root} is written through a link: "
                                 f"{LINK_FIX}")


def _file_problem(path: Path) -> Problem:
    return Problem(str(path), 0, "a file where a folder belongs: move the file away, or point the command at another "
                                 "folder")


def _folder_problem(path: Path) -> Problem:
    return Problem(str(path), 0, "a folder where a file belongs: move the folder away, or point the command at another "
                                 "folder")


def _below(path: Path, root: Path) -> tuple[str, ...]:
    """The parts of path below root (path must be root itself or inside it)."""
    return path.relative_to(root).parts


def destination_problems(path: Path, root: Path) -> list[Problem]:
    """What stops writing path below root, as the writers would find it: checked for a whole batch before the
    first write, so that bad destinations change nothing."""
    problems = folder_problems(path.parent, root)
    return problems or ([_folder_problem(path)] if path.is_dir() and not path.is_symlink() else [])


def folder_problems(folder: Path, root: Path) -> list[Problem]:
    """A link or a file where folder, or a folder between root and it, belongs (nothing yet is fine)."""
    current = root
    for part in _below(folder, root):
        current = current / part
        try:
            mode = current.lstat().st_mode
        except FileNotFoundError:
            return []
        if stat.S_ISLNK(mode):
            return [_link_problem(current, root)]
        if not stat.S_ISDIR(mode):
            return [_file_problem(current)]
    return []


def check_destinations(paths: list[Path], root: Path) -> None:
    problems = [problem for path in paths for problem in destination_problems(path, root)]
    if problems:
        raise InputError(list({str(problem): problem for problem in problems}.values()))


@contextmanager
def _folder(folder: Path, root: Path, create: bool = True) -> Iterator[int | None]:
    """A descriptor of folder, made where missing (None when create is False and it is missing). root itself may be a
    link (the user named it); every folder below it is opened without following links."""
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
        handle = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    except (FileExistsError, NotADirectoryError):
        raise InputError([_file_problem(root)]) from None
    current = root
    try:
        for part in _below(folder, root):
            current = current / part
            if create:
                try:
                    os.mkdir(part, dir_fd=handle)
                except FileExistsError:
                    pass
                except OSError as error:  # a read-only or full file system
                    raise _renamed(error, current) from None
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=handle)
            except FileNotFoundError:
                if create:
                    raise
                yield None
                return
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):  # with O_DIRECTORY, Linux says ENOTDIR for a link
                    link = stat.S_ISLNK(os.stat(part, dir_fd=handle, follow_symlinks=False).st_mode)
                    raise InputError([_link_problem(current, root) if link else _file_problem(current)]) from None
                raise _renamed(error, current) from None
            os.close(handle)
            handle = child
        yield handle
    finally:
        os.close(handle)


def _renamed(error: OSError, path: Path) -> OSError:
    """error as naming path: calls on directory descriptors name a bare file name, a temporary's or none."""
    return OSError(error.errno, error.strerror, str(path))


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        raise _renamed(error, path) from None


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait (milliseconds) until a file is in place or its temporary removed: an interrupted run
    leaves the old file or the new one, and no temporary beside them (which `render --check` would call stale)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _temporary(folder: int, name: str, mode: int) -> tuple[str, int]:
    temporary = f".{name}.{secrets.token_hex(4)}.tmp"
    return temporary, os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder)


def _put_in_place(folder: int, temporary: str, path: Path) -> None:
    try:
        os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    except IsADirectoryError:
        raise InputError([_folder_problem(path)]) from None


def atomic_write(path: Path, content: bytes | str, mode: int = 0o644, root: Path | None = None) -> None:
    """Write path in one step (temporary + rename), following no link below root (default: path's folder)."""
    data = content.encode() if isinstance(content, str) else content
    with _signals_deferred(), atomic_output(path, mode, root) as stream:
        stream.write(data)


@contextmanager
def atomic_output(path: Path, mode: int = 0o644, root: Path | None = None) -> Iterator[BinaryIO]:
    """A stream whose bytes become path when the block ends without an error, as atomic_write writes (temporary +
    rename, no link below root followed, a link at path replaced): for what is too large to hold in memory (a
    downloaded .deb). An error or Ctrl-C in the block leaves the old file and no temporary."""
    with _folder(path.parent, root or path.parent) as folder, _naming(path):
        assert folder is not None  # made where missing
        temporary, handle = _temporary(folder, path.name, mode)
        try:
            with os.fdopen(handle, "wb") as stream:
                os.fchmod(handle, mode)
                yield stream
                stream.flush()
                os.fsync(handle)
            with _signals_deferred():
                _put_in_place(folder, temporary, path)
        except BaseException:
            with _signals_deferred():
                os.unlink(temporary, dir_fd=folder)
            raise


def atomic_write_json(path: Path, document, root: Path | None = None) -> None:
    atomic_write(path, json.dumps(document, indent=2, sort_keys=True) + "\n", root=root)


@contextmanager
def open_new(path: Path, root: Path):
    """A new, empty text file at path for a log written as it grows (a build's log): whatever was there, a link
    included, is replaced, never truncated through."""
    with _folder(path.parent, root) as folder, _signals_deferred(), _naming(path):
        assert folder is not None  # made where missing
        temporary, handle = _temporary(folder, path.name, 0o644)
        try:
            _put_in_place(folder, temporary, path)
        except BaseException:
            os.close(handle)
            os.unlink(temporary, dir_fd=folder)
            raise
    with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as stream:
        yield stream


def make_folder(folder: Path, root: Path) -> None:
    """folder and the folders above it up to root, refusing a link or file where one of them belongs."""
    with _folder(folder, root):
        pass


def remove_file(path: Path, root: Path) -> None:
    """Remove path when it is there, following no link below root: a linked folder is refused, not entered."""
    with _folder(path.parent, root, create=False) as folder, _naming(path):
        if folder is None:
            return
        try:
            os.unlink(path.name, dir_fd=folder)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise InputError([_folder_problem(path)]) from None


def copy_file(source: Path, target: Path, root: Path, fix: str) -> None:
    """Copy a regular file (bounded, as every input) to target below root, as atomic_write writes."""
    atomic_write(target, read_bytes(source, fix), root=root)


# -------------------------------------------------------------------------------------------------------- paths from CI

def append_text(path: Path, text: str, what: str) -> None:
    """Append to a file named from outside (GITHUB_STEP_SUMMARY): a regular file or none yet, never a pipe or device
    (a FIFO with no reader would wait forever; it is opened without waiting and refused)."""
    fix = f"set {what} to a regular file in an existing folder, or unset it"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
    try:
        handle = os.open(path, flags, 0o644)
    except OSError as error:
        raise InputError([Problem(f"{what}={path}", 0, f"cannot write it ({error.strerror}): {fix}")]) from None
    with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as stream:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise InputError([Problem(f"{what}={path}", 0, f"not a regular file (a pipe, device or socket): {fix}")])
        stream.write(text)


def check_appendable(path: Path, what: str) -> None:
    """What append_text would refuse, checked before a run's work (without creating or opening anything)."""
    fix = f"set {what} to a regular file in an existing folder, or unset it"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise InputError([Problem(f"{what}={path}", 0, f"its folder {path.parent} does not exist: {fix}")
                              ]) from None
        return
    except OSError as error:
        raise InputError([Problem(f"{what}={path}", 0, f"cannot write it ({error.strerror}): {fix}")]) from None
    if not stat.S_ISREG(mode):
        raise InputError([Problem(f"{what}={path}", 0, f"not a regular file (a pipe, device, socket or folder): "
                                                        f"{fix}")])


# -------------------------------------------------------------------------------------------------------- one at a time

LOCK_WAIT_ENV = "TORCHIMAGES_LOCK_WAIT"


@contextmanager
def hold_folders(folders: list[Path], wait_s: float) -> Iterator[None]:
    """One run at a time in each folder a command writes (an exclusive flock on the folder itself, so nothing is
    left in it): a second run waits up to wait_s for the first, then gives up naming it. Folders are taken in one
    order, so two runs never each hold what the other waits for."""
    deadline = time.monotonic() + wait_s
    with ExitStack() as stack:
        for folder in sorted({folder.resolve() for folder in folders}):
            stack.enter_context(_holding(folder, deadline, wait_s))
        yield


@contextmanager
def _holding(folder: Path, deadline: float, wait_s: float) -> Iterator[None]:
    """folder, locked; made for the run when missing and removed again when the run left it empty (a run that
    writes nothing leaves nothing). A run that waited for a folder removed meanwhile takes the one there now."""
    while True:
        made = _make_folder(folder)
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _lock(handle, folder, deadline, wait_s)
        except BaseException:
            os.close(handle)
            raise
        if _same_folder(handle, folder):
            break
        os.close(handle)
    try:
        yield
    finally:
        try:
            for path in made:
                os.rmdir(path)
        except OSError:  # not empty: the run wrote there
            pass
        os.close(handle)


def _make_folder(folder: Path) -> list[Path]:
    """Make folder and the folders above it; the ones made now, deepest first."""
    missing, current = [], folder
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    if not current.is_dir():
        raise InputError([_file_problem(current)])
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _same_folder(handle: int, folder: Path) -> bool:
    try:
        now, held = folder.stat(), os.fstat(handle)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _lock(handle: int, folder: Path, deadline: float, wait_s: float) -> None:
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise InputError([Problem(str(folder), 0, f"another run writes here ({lock_holder(handle)}) and did "
                                                          f"not finish within {wait_s:g} s: let it finish, or set "
                                                          f"{LOCK_WAIT_ENV}=SECONDS to wait longer")]) from None
            time.sleep(0.05)


def lock_holder(handle: int) -> str:
    """Who holds the flock on handle's file, from /proc/locks: 'pid N: its command line', as far as this host shows."""
    info = os.fstat(handle)
    key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            holders = [line.split() for line in locks if key in line.split() and "->" not in line]
        pid = holders[0][holders[0].index(key) - 1]
        with open(f"/proc/{pid}/cmdline", "rb") as command:
            words = command.read(1 << 16).split(b"\0")
    except (OSError, IndexError):
        return "a process this host does not name"
    command_line = b" ".join(words).decode(errors="replace").strip()
    # Redacted whole, then cut: a cut through a login leaves a part that no longer looks like one.
    shown = Secrets.in_urls(*command_line.split()).redact(command_line)
    return f"pid {pid}: {brief(shown, 120)}"
