"""init: a new project (matrix.yaml, compat.yaml, .gitignore, a CI workflow, a README section, its images rendered)
that `render`, `list`, `doctor` and `images` work in at once. Its templates are the package's until the project has a templates/ folder.

The workflow installs the very toolkit init ran with, never a bare name from a package index (anyone may claim a free
name there, and then runs code in every workflow that installs it): from git at its commit where pip installed it so
(PEP 610's direct_url.json), else from its wheel, which init writes into .torchimages/ and the workflow checks by its
sha256; its dependencies at the versions init ran with, from .torchimages/constraints.txt."""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import io
import json
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..build.render import MARKER, write_rendered
from ..files import atomic_write, check_destinations, read_text
from ..model import InputError, Problem
from ..project import DEFAULT_TEMPLATES, EXIT_OK, MATRIX_NAME, PACKAGE, Project
from .commands import add_command

STARTER = PACKAGE / "starter"
README_SECTION = STARTER / "README-section.md"
WORKFLOW = ".github/workflows/images.yml"
# Where each starter file goes in the new project. Package data holds no dot-files (`gitignore`), and the workflow
# sits flat there (a template: init fills in the toolkit it pins).
WRITES = {
    MATRIX_NAME: STARTER / MATRIX_NAME,
    "compat.yaml": STARTER / "compat.yaml",
    ".gitignore": STARTER / "gitignore",
}
README = "README.md"
# The toolkit's pin, committed with the project: its wheel (unless it came from git) and its dependencies' versions.
TOOLKIT = ".torchimages"
CONSTRAINTS = f"{TOOLKIT}/constraints.txt"
# The package's files a wheel holds: its modules and pyproject.toml's package-data globs (tests/test_package.py holds
# this to the wheel setuptools builds). Anything else in a checkout's package folder (an editor's backup) stays out.
WHEEL_FILES = ("*.py", "*.ini", "*.j2", "*.sh", "*.yaml", "*.yml", "*.md", "gitignore", "*.json")
# The dist-info files a wheel carries over from the installed metadata; RECORD and WHEEL are written anew, and what
# the installer added (INSTALLER, REQUESTED, direct_url.json) is not the package's.
DIST_INFO_FILES = ("METADATA", "entry_points.txt", "top_level.txt", "licenses/*")
# Every file in the wheel has this time: the same toolkit gives the same bytes, so the same sha256 (zip's epoch).
WHEEL_TIME = (1980, 1, 1, 0, 0, 0)
COMMIT = re.compile(r"[0-9a-f]{40}", re.ASCII)


def register(commands) -> None:
    parser = add_command(commands, "init", description="Write a new project into DIR. Its Dockerfile templates are the package's own until DIR has a "
                    "templates/ folder (--templates copies them there to edit): a project's templates/ wins.")
    parser.add_argument("folder", nargs="?", type=Path, default=Path("."), metavar="DIR",
                        help="the project's folder, made if missing (default: the current folder)")
    parser.add_argument("--templates", dest="copy_templates", action="store_true",
                        help="also copy the package's templates into DIR/templates, to edit them")
    parser.add_argument("--force", action="store_true", help="write the files that are missing, keep those there")
    parser.set_defaults(handler=cmd_init, makes_project=True)


def cmd_init(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    toolkit = pinned_toolkit()
    writes: dict[str, bytes] = {**{name: source.read_bytes() for name, source in WRITES.items()},
                                WORKFLOW: toolkit.workflow().encode(), **toolkit.files,
                                **(template_files() if args.copy_templates else {})}
    # A link counts as there: init overwrites nothing, a link's target included.
    present = [name for name in writes if os.path.lexists(folder / name)]
    if present and not args.force:
        raise InputError([Problem(str(folder), 0, f"holds {', '.join(present)} already: init writes a new project "
                                                  "and overwrites nothing (--force writes only the missing files)")])
    renders = MATRIX_NAME not in present  # --force beside a matrix of the project's own: its images are render's
    # Every destination checked, and the README read, before the first write: a refusal leaves the folder as it was.
    destinations = [folder / name for name in writes if name not in present] + [folder / README]
    if renders:
        destinations.append(Project.at(folder).images / MARKER)
    check_folder(folder)
    check_destinations(destinations, folder)
    readme = readme_with_section(folder / README)
    for name, content in writes.items():
        if name not in present:
            atomic_write(folder / name, content, root=folder)
    if readme is not None:
        atomic_write(folder / README, readme, root=folder)
    if not renders:
        print(f"{folder}: the missing files written; next: torchimages render")
        return EXIT_OK
    print(f"{folder}: a new project, its images rendered into {render_images(folder)}; next: cd {folder} && "
          "torchimages list && torchimages images")
    return EXIT_OK


def check_folder(folder: Path) -> None:
    """The project's folder itself may be a link (the user named it), or missing; a file there is refused."""
    if os.path.lexists(folder) and not folder.is_dir():
        raise InputError([Problem(str(folder), 0, "a file where the project's folder belongs: name a folder, or move "
                                                  "the file away")])


def render_images(folder: Path) -> Path:
    """The new project's images/, rendered now: `images` builds at once, and the workflow's render check passes on
    the first commit."""
    project = Project.at(folder)
    write_rendered(project.images, project.rendered(project.load()))
    return project.images


def template_files() -> dict[str, bytes]:
    return {f"templates/{path.relative_to(DEFAULT_TEMPLATES).as_posix()}": path.read_bytes()
            for path in sorted(DEFAULT_TEMPLATES.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


def readme_with_section(readme: Path) -> str | None:
    """The project's README saying how its images are made: a new README, or the section added to the one there
    (None when it has it). Only a plain UTF-8 file of the project is read: a link would copy a file from elsewhere
    into the project, a FIFO would never end."""
    section = README_SECTION.read_text()
    fix = ("init adds its section only to a plain UTF-8 README.md of the project: replace it with such a file, or "
           "move it away")
    current = read_text(readme, fix, follow_links=False) if os.path.lexists(readme) else \
        f"# {readme.resolve().parent.name}\n"
    return None if section.strip() in current else current.rstrip("\n") + "\n" + section


@dataclass(frozen=True)
class Toolkit:
    """How the project's CI installs the toolkit init ran with: the install step's shell lines, the files under
    .torchimages/ they read, and a few words on where it comes from."""

    install: list[str]
    files: dict[str, bytes]
    source: str

    def workflow(self) -> str:
        """The starter workflow with this toolkit's install step in every job, on the Python init ran with (the
        versions pinned are this Python's)."""
        step = "\n".join(f"          {line}" for line in self.install)
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        text = (STARTER / "images.yml").read_text()
        return text.replace("@INSTALL@", step).replace("@PYTHON@", python).replace("@SOURCE@", self.source)


def pinned_toolkit() -> Toolkit:
    """The running toolkit, pinned: its git commit where pip installed it from git, else its own wheel (built from the
    files that run, so an editable install or a checkout is pinned as it is), and its dependencies' versions."""
    try:
        dist = importlib.metadata.distribution("torchimages")
    except importlib.metadata.PackageNotFoundError:
        raise InputError([Problem(str(PACKAGE), 0, "init pins the toolkit it runs in the project's CI workflow, and "
                                                   "this one has no installed metadata: install it (pip install "
                                                   "--editable . in a checkout), then run init again")]) from None
    constraints = constraints_text(dist)
    installs = f"pip install --constraint {CONSTRAINTS}"
    requirement = git_requirement(dist.metadata["Name"], direct_url(dist)) if runs_from(dist) else None
    if requirement is not None:
        return Toolkit([f'{installs} "{requirement}"'], {CONSTRAINTS: constraints.encode()},
                       f"{requirement.split(' @ ', 1)[1]}, from git at that commit")
    name, wheel = toolkit_wheel(dist)
    path = f"{TOOLKIT}/{name}"
    digest = hashlib.sha256(wheel).hexdigest()
    return Toolkit([f'echo "{digest}  {path}" | sha256sum --check --strict -', f"{installs} ./{path}"],
                   {path: wheel, CONSTRAINTS: constraints.encode()}, f"its wheel {path}, checked by its sha256")


def direct_url(dist: importlib.metadata.Distribution) -> dict:
    """PEP 610's record of where pip installed the toolkit from ({} when it has none or it does not parse)."""
    try:
        recorded = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


def runs_from(dist: importlib.metadata.Distribution) -> bool:
    """Whether dist's own files are the package running now: not a checkout's build.py beside an install elsewhere,
    nor an editable install (whose files are the checkout's, at whatever commit it stands)."""
    installed = Path(str(dist.locate_file("torchimages/__init__.py")))
    return installed.is_file() and installed.resolve() == (PACKAGE / "__init__.py").resolve()


def git_requirement(name: str, recorded: dict) -> str | None:
    """`NAME @ git+URL@COMMIT` for a toolkit pip installed from git (PEP 610 vcs_info with its full commit id), else
    None. Credentials pip kept in the URL stay out of the workflow: only ssh's conventional user `git` is kept."""
    vcs = recorded.get("vcs_info")
    url = recorded.get("url")
    if not isinstance(vcs, dict) or vcs.get("vcs") != "git" or not isinstance(url, str) or \
            not COMMIT.fullmatch(str(vcs.get("commit_id", ""))):
        return None
    parts = urlsplit(url)
    if parts.password or (parts.username and parts.username != "git"):
        parts = parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else ""))
    subdirectory = recorded.get("subdirectory")
    tail = f"#subdirectory={subdirectory}" if isinstance(subdirectory, str) and subdirectory else ""
    return f"{name} @ git+{urlunsplit(parts)}@{vcs['commit_id']}{tail}"


def constraints_text(dist: importlib.metadata.Distribution) -> str:
    """Every package the toolkit needs on this Python, with what it requires in turn, at the version installed
    here: `pip install --constraint` takes exactly these, so a release of any of them cannot change CI."""
    pins = pinned_dependencies(dist)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    header = (f"# The versions torchimages {dist.version} ran with when `torchimages init` wrote this file (Python "
              f"{python}):\n# the CI workflow installs exactly these. A newer toolkit: see the workflow's comment.\n")
    return header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def pinned_dependencies(dist: importlib.metadata.Distribution) -> dict[str, str]:
    """{name: installed version} over the requirements' closure, markers judged on this Python with the extras each
    requirement names. One not installed here is left out: pip resolves it as it would without constraints."""
    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [(dist, frozenset[str]())]
    while pending:
        current, extras = pending.pop()
        for text in current.requires or []:
            requirement = Requirement(text)
            if requirement.marker and not any(requirement.marker.evaluate({"extra": extra})
                                              for extra in (extras or {""})):
                continue
            key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
            if key in seen:
                continue
            seen.add(key)
            try:
                needed = importlib.metadata.distribution(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                continue
            pins[key[0]] = needed.version
            pending.append((needed, key[1]))
    pins.pop(canonicalize_name(dist.metadata["Name"]), None)
    return pins


def toolkit_wheel(dist: importlib.metadata.Distribution) -> tuple[str, bytes]:
    """The running toolkit as a wheel (its file name and bytes): the package's files as they are on disk, its
    installed metadata, every entry sorted and dated alike, so the same toolkit always gives the same bytes."""
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"], flags=re.ASCII).lower()
    info = f"{name}-{dist.version}.dist-info"
    entries: dict[str, tuple[bytes, int]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and any(fnmatch(path.name, glob) for glob in WHEEL_FILES):
            executable = os.access(path, os.X_OK)
            entries[f"{PACKAGE.name}/{path.relative_to(PACKAGE).as_posix()}"] = (path.read_bytes(),
                                                                              0o755 if executable else 0o644)
    for file in dist.files or []:  # the installed dist-info folder, whatever spelling of the name it has
        inside = "/".join(file.parts[1:]) if len(file.parts) > 1 and file.parts[0].endswith(".dist-info") else ""
        if inside and any(fnmatch(inside, glob) for glob in DIST_INFO_FILES):
            entries[f"{info}/{inside}"] = (file.read_binary(), 0o644)
    # Metadata without a RECORD to list it: a checkout's torchimages.egg-info (setuptools leaves one beside the
    # package in an editable install, and Python finds it first from the checkout), whose METADATA is PKG-INFO.
    for inside, spellings in (("METADATA", ("METADATA", "PKG-INFO")), ("entry_points.txt", ("entry_points.txt",)),
                              ("top_level.txt", ("top_level.txt",))):
        text = next((found for spelling in spellings if (found := dist.read_text(spelling)) is not None), None)
        if f"{info}/{inside}" not in entries and text is not None:
            entries[f"{info}/{inside}"] = (text.encode(), 0o644)
    entries[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: torchimages init\nRoot-Is-Purelib: true\n"
                                b"Tag: py3-none-any\n", 0o644)
    entries = dict(sorted(entries.items()))
    record = "".join(f"{path},sha256={_urlsafe_sha256(data)},{len(data)}\n" for path, (data, _) in entries.items())
    entries[f"{info}/RECORD"] = ((record + f"{info}/RECORD,,\n").encode(), 0o644)
    wheel = _zipped(entries)
    return f"{name}-{dist.version}-py3-none-any.whl", wheel


def _urlsafe_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _zipped(entries: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, (data, mode) in entries.items():
            member = zipfile.ZipInfo(path, WHEEL_TIME)
            member.create_system = 3  # Unix: the mode below is read
            member.external_attr = (0o100000 | mode) << 16
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, data, compresslevel=9)
    return buffer.getvalue()
