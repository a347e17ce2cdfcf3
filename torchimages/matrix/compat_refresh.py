"""Compatibility facts read from the package index itself: per torch build, what its wheel says.

The index is PEP 691 (PyPI's JSON simple API, a mirror, a local index) or a wheelhouse (package_index.py). No wheel
is downloaded whole: METADATA, torch/version.py and libtorch_python.so (which holds the arch list
`torch.cuda.get_arch_list()` reports) are read from inside the remote zip with HTTP range requests. Facts from the wheel are compared with compat.yaml: what it lacks
is added, with its source; what disagrees is reported with both values and changed only when asked."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version
from pypi_simple import DistributionPackage
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedSeq
from ruamel.yaml.error import CommentMark
from ruamel.yaml.scalarstring import DoubleQuotedScalarString
from ruamel.yaml.tokens import CommentToken

from ..files import atomic_write, brief, read_text, remove_file
from ..model import PYPI, InputError, Problem
from ..peers.package_index import Index, open_index, unreadable, why_unreadable
from ..yamlsource import load_yaml
from .compat_file import load_compat_file, round_trip_yaml
from .load import compat_shape_problems

# The wheel a build's facts are read from: every build has one for this interpreter and machine.
READ_PYTHON, READ_PLATFORM = "cp311", "x86_64"
# nvidia-* and cuda-toolkit pins -> compat.yaml keys (nvidia-cudnn-cu13 -> cudnn).
PINNED = {"nvidia-cudnn": "cudnn", "nvidia-nccl": "nccl", "nvidia-cusparselt": "cusparselt",
          "nvidia-nvshmem": "nvshmem", "cuda-toolkit": "toolkit"}
TORCHVISION_CANDIDATES = 12  # torchvision releases read, newest first, looking for the newest that takes a torch
ARCH_STRING = re.compile(rb"\x00((?:sm|compute)_[0-9]{2,3}(?: (?:sm|compute)_[0-9]{2,3})*)\x00")
# What an index or a wheel says is checked for its shape before it is used or written anywhere.
SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
CUDA_VERSION = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}", re.ASCII)
LOCAL_BUILD = re.compile(r"[a-z0-9]{1,16}", re.ASCII)
PINNED_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){0,5}(\.post[0-9]{1,4})?", re.ASCII)
SPECIFIER = re.compile(r"[0-9a-z.,~=<>!*+]{0,100}", re.ASCII)
# Where a build PyPI lacks is published (a refresh names it for a fact it could not read).
PYTORCH_INDEX = "https://download.pytorch.org/whl/"
VERSION_LINE = re.compile(r"^(__version__|cuda)(?:: [^=]+)? = '([^']*)'", re.MULTILINE)


@dataclass(frozen=True)
class Source:
    """Where a fact was read: the index, the wheel's file name, its sha256 and upload date."""

    index: str
    file: str
    sha256: str
    uploaded: str

    def to_yaml(self) -> dict:
        return {"index": self.index, "file": self.file, "sha256": self.sha256, "uploaded": self.uploaded}


@dataclass(frozen=True)
class BuildFacts:
    """One torch build (cu130, cpu), as its wheel says."""

    torch: str
    build: str  # the local version: cu130, cpu
    cuda: str | None  # "13.0"; None for CPU builds
    on_pypi_plain: bool  # the index names it by the plain version (PyPI's one build per release)
    python_min: str
    pins: dict[str, str]  # compat.yaml key -> pinned version (cudnn, nccl, ..., toolkit)
    triton: str  # triton's specifier, e.g. ~=3.8.0
    arch_list: tuple[str, ...]  # empty for CPU builds, or when the wheel does not say
    source: Source
    machine: str = READ_PLATFORM  # the wheel's machine: other machines' builds differ in their arch list


@dataclass(frozen=True)
class ReleaseFacts:
    torch: str
    python_max: str  # the newest CPython a wheel is published for
    torchvision: str | None  # the newest torchvision release whose torch requirement admits this torch
    torchvision_source: Source | None
    builds: tuple[BuildFacts, ...]
    # Torch pins no NumPy, but every image installs one: the newest final release on the same index, written for a
    # release compat.yaml does not pin one for yet (after that, `numpy:` is the project's choice).
    numpy: str | None = None
    numpy_source: Source | None = None
    # Read from a wheelhouse (the wheels a row needed, not the release): python_max is the newest there, kept only
    # for a release compat.yaml does not list yet, never held against it.
    python_max_partial: bool = False
    # The same CUDA builds read from the other machines' wheels (aarch64 for Grace): their arch list is their own
    # (PyPI's aarch64 cu13 wheels: no sm_75, sm_110 added), recorded under the build's `by_arch:`.
    arch_builds: tuple[BuildFacts, ...] = ()


@dataclass(frozen=True)
class Difference:
    torch: str
    where: str  # "python.min", "cuda 13.0 cudnn"
    compat: object
    index: object
    source: str  # the wheel file the index value was read from


@dataclass
class Refresh:
    """What a refresh found: facts added to compat.yaml, and facts that disagree with it."""

    releases: list[ReleaseFacts] = field(default_factory=list)
    added: list[Difference] = field(default_factory=list)
    disagreements: list[Difference] = field(default_factory=list)
    not_on_index: list[str] = field(default_factory=list)  # releases compat.yaml lists that the index lacks: kept
    unread: list[str] = field(default_factory=list)  # builds compat.yaml claims that no wheel read confirms: kept


# Pure: wheel contents -> facts.

def arch_list(libtorch_python: bytes) -> tuple[str, ...]:
    """The arch list compiled into torch (its CUDA_ARCH_FLAGS string, what get_arch_list() reports):
    sm_90 -> 9.0, and compute_120 (PTX) marks 12.0 as 12.0+PTX. Empty when the library holds no single list."""
    found = set(ARCH_STRING.findall(libtorch_python))
    if len(found) != 1:
        return ()
    entries: dict[str, str] = {}
    for flag in found.pop().decode().split():
        kind, number = flag.split("_")
        capability = f"{number[:-1]}.{number[-1]}"
        entries[capability] = f"{capability}+PTX" if kind == "compute" else entries.get(capability, capability)
    return tuple(entries[c] for c in sorted(entries, key=lambda c: tuple(map(int, c.split(".")))))


# torch's METADATA names a few dozen requirements, torchvision's a handful: a thousand is none of theirs, and each
# costs a parse (600,000 of them took seconds per wheel).
MAX_REQUIREMENTS = 1000


def requirements(metadata: str) -> list[Requirement]:
    """The Requires-Dist lines of a METADATA, parsed; a ValueError past MAX_REQUIREMENTS, before parsing them."""
    lines = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    if len(lines) > MAX_REQUIREMENTS:
        raise ValueError(f"it lists {len(lines)} requirements, more than any torch or torchvision wheel "
                         f"({MAX_REQUIREMENTS} at most)")
    return [Requirement(line.split(":", 1)[1].strip()) for line in lines]


def metadata_facts(metadata: str) -> tuple[str, dict[str, str], str]:
    """Requires-Python's minimum, the pins compat.yaml keeps, and triton's specifier, from a wheel's METADATA."""
    python_min, pins, triton = "", {}, ""
    for line in metadata.splitlines():
        if line.startswith("Requires-Python:"):
            python_min = _python_floor(line.split(":", 1)[1])
    for requirement in requirements(metadata):
        if requirement.name == "triton" and SPECIFIER.fullmatch(str(requirement.specifier)):
            triton = str(requirement.specifier)
        key = next((key for prefix, key in PINNED.items() if requirement.name.startswith(prefix)), None)
        exact = [spec.version for spec in requirement.specifier
                 if spec.operator == "==" and PINNED_VERSION.fullmatch(spec.version)]
        if key and exact:
            pins[key] = exact[0]
    return python_min, pins, triton


def _python_floor(requires_python: str) -> str:
    """The X.Y a Requires-Python's >= admits first ("" when it names none, or is not a specifier)."""
    try:
        floors = [spec.version for spec in SpecifierSet(requires_python.strip()) if spec.operator == ">="]
    except InvalidSpecifier:
        return ""
    return ".".join(floors[0].split(".")[:2]) if floors and re.fullmatch(r"[0-9]+(\.[0-9]+)*", floors[0]) else ""


def version_facts(version_py: str) -> tuple[str, str | None]:
    """torch/version.py -> (local version: cu130 or cpu, CUDA version or None)."""
    values = dict(VERSION_LINE.findall(version_py))
    local = Version(values.get("__version__", "0")).local or "cpu"
    return local, values.get("cuda") or None


def accepts_torch(metadata: str, torch: str) -> bool:
    """Whether a torchvision wheel's torch requirement (==2.14.0, >=2.14.0; local versions aside) admits torch."""
    for requirement in requirements(metadata):
        if requirement.name == "torch":
            specifier = SpecifierSet(",".join(f"{s.operator}{_base_version(s.version)}" for s in requirement.specifier))
            return specifier.contains(torch)
    return False


def python_max(filenames: list[str]) -> str:
    """The newest CPython (not free-threaded) any of a release's wheels is for: cp314 -> 3.14."""
    minors = [int(tag.interpreter[3:]) for name in filenames for tag in _tags(name)
              if re.fullmatch(r"cp3[0-9]{1,2}", tag.interpreter) and not tag.abi.endswith("t")]
    return f"3.{max(minors)}" if minors else ""


def _tags(filename: str):
    try:
        return parse_wheel_filename(filename)[3]
    except InvalidWheelFilename:
        return frozenset()


# Reading a release's facts through an index.

def read_release(index: Index, torch: str, machines: tuple[str, ...] = ()) -> ReleaseFacts | None:
    """Every build of one torch release the index has, read from the x86_64 cp311 wheel of each, and its CUDA builds
    for each of the other `machines` (compat.yaml's architectures) from their cp311 wheel."""
    wheels = [p for p in index.packages("torch") if _base_version(p.version) == torch]
    if not wheels:
        return None
    builds = [_read_build(index, torch, package) for package in _readable(wheels)]
    arch_builds = [build for machine in machines if machine != READ_PLATFORM
                   for build in (_read_build(index, torch, package, machine) for package in _readable(wheels, machine))
                   if build.cuda is not None]
    torchvision, torchvision_source = _torchvision_for(index, torch)
    numpy, numpy_source = _newest_numpy(index)
    return ReleaseFacts(torch, python_max([p.filename for p in wheels]), torchvision, torchvision_source,
                        tuple(builds), numpy, numpy_source, python_max_partial=not index.whole_release,
                        arch_builds=tuple(arch_builds))


def newest_release(index: Index) -> str | None:
    """The newest final torch release the index has (a yanked one is no release: PEP 592)."""
    versions = {Version(_base_version(p.version)) for p in index.packages("torch") if p.version and not p.is_yanked}
    finals = [v for v in versions if not v.is_prerelease and not v.is_devrelease and not v.epoch]
    return str(max(finals)) if finals else None


def _base_version(version: str | None) -> str:
    return Version(version).public if version else ""


def _readable(wheels: list[DistributionPackage], machine: str = READ_PLATFORM) -> list[DistributionPackage]:
    """One wheel per release and build (local version): the one for READ_PYTHON on Linux `machine`."""
    chosen: dict[str, DistributionPackage] = {}
    for package in wheels:
        tags = _tags(package.filename)
        if package.version and any(t.interpreter in (READ_PYTHON, "py3") and t.platform.startswith("manylinux") and
               t.platform.endswith(machine) for t in tags):
            chosen.setdefault(package.version, package)
    return list(chosen.values())


def _source(index: Index, package: DistributionPackage) -> Source:
    """Where a fact was read; a sha256 that is not one (another shape, text with lines in it) is refused."""
    sha256 = package.digests.get("sha256")
    if not isinstance(sha256, str) or not SHA256.fullmatch(sha256):
        raise unreadable(index.url, f"{package.filename}: its sha256 {brief(sha256)} is not 64 lower-case hex "
                                    "digits: the index cannot be the source of a fact")
    uploaded = package.upload_time.date().isoformat() if package.upload_time else ""
    return Source(index.url, package.filename, sha256, uploaded)


def _read_build(index: Index, torch: str, package: DistributionPackage, machine: str = READ_PLATFORM) -> BuildFacts:
    source = _source(index, package)
    members = index.read_members(package, lambda name: name in ("torch/version.py", "torch/lib/libtorch_python.so")
                                 or name.endswith(".dist-info/METADATA"))
    try:
        metadata = next((v.decode() for k, v in members.items() if k.endswith("METADATA")), "")
        local, cuda = version_facts(members.get("torch/version.py", b"").decode())
        python_min, pins, triton = metadata_facts(metadata)
    except (ValueError, RecursionError) as error:  # not UTF-8; a requirement, version or specifier that is none
        raise unreadable(package.url, f"its METADATA or torch/version.py is not a torch wheel's: "
                                      f"{why_unreadable(error)}") from None
    if not LOCAL_BUILD.fullmatch(local) or (cuda is not None and not CUDA_VERSION.fullmatch(cuda)):
        raise unreadable(package.url, f"its torch/version.py says build {brief(local)}, CUDA {brief(cuda)}: a build "
                                      "is letters and digits (cu130, cpu), a CUDA version X.Y")
    arches = arch_list(members.get("torch/lib/libtorch_python.so", b"")) if cuda else ()
    return BuildFacts(torch, local, cuda, not Version(package.version or torch).local, python_min, pins, triton, arches,
                      source, machine)


def _torchvision_for(index: Index, torch: str) -> tuple[str | None, Source | None]:
    releases: dict[Version, DistributionPackage] = {}
    for package in _readable(index.packages("torchvision")):
        version = Version(_base_version(package.version))
        if not package.is_yanked and not version.epoch:  # a yanked torchvision is no release to pair (PEP 592)
            releases.setdefault(version, package)
    for version in sorted(releases, reverse=True)[:TORCHVISION_CANDIDATES]:
        package = releases[version]
        members = index.read_members(package, lambda name: name.endswith(".dist-info/METADATA"))
        try:
            accepted = any(accepts_torch(m.decode(), torch) for m in members.values())
        except (ValueError, RecursionError) as error:
            raise unreadable(package.url, f"its METADATA is not a wheel's: {why_unreadable(error)}") from None
        if accepted:
            return str(version), _source(index, package)
    return None, None


def _newest_numpy(index: Index) -> tuple[str | None, Source | None]:
    """The newest final NumPy with a wheel for the Python and machine torch's wheels are read for (not yanked)."""
    releases = {Version(package.version): package for package in _readable(index.packages("numpy"))
                if package.version and not package.is_yanked}
    finals = [version for version in releases
              if not version.is_prerelease and not version.is_devrelease and not version.epoch]
    if not finals:
        return None, None
    newest = max(finals)
    return str(newest), _source(index, releases[newest])


# Compare and write.

def compare(release: ReleaseFacts, known: dict | None) -> tuple[dict, list[Difference], list[Difference]]:
    """compat.yaml's block for a release, updated with what the index adds; what it adds; where it disagrees (kept
    as compat.yaml has it: the caller decides). A block the index contradicts is never changed here."""
    block = dict(known or {})
    added: list[Difference] = []
    disagree: list[Difference] = []

    def merge(target: dict, key: str, value, where: str, source: Source | None) -> None:
        if value in (None, "", ()):
            return
        value = list(value) if isinstance(value, tuple) else value
        if key not in target:
            target[key] = value
            added.append(Difference(release.torch, where, None, value, source.file if source else ""))
        elif target[key] != value:
            disagree.append(Difference(release.torch, where, target[key], value, source.file if source else ""))

    def record(target: dict, key: str, source: Source, where: str) -> None:
        """The source a fact was read from. The same file with other bytes is a disagreement: the recorded
        source stays until the caller corrects it."""
        before = target.get(key) or {}
        if before.get("file") == source.file and before.get("sha256") and before["sha256"] != source.sha256:
            disagree.append(Difference(release.torch, f"{where} sha256", before["sha256"], source.sha256, source.file))
            return
        target[key] = source.to_yaml()

    first = release.builds[0].source if release.builds else None
    python = dict(block.get("python") or {})
    merge(python, "min", min((b.python_min for b in release.builds), default="", key=_python_key), "python.min", first)
    if not (release.python_max_partial and "max" in python):
        merge(python, "max", release.python_max, "python.max", first)
    block["python"] = python
    paired = ".".join(release.torchvision.split(".")[:2]) if release.torchvision else None
    merge(block, "torchvision", paired, "torchvision", release.torchvision_source)
    if release.torchvision_source:
        record(block, "torchvision_source", release.torchvision_source, "torchvision")
    if "numpy" not in block and release.numpy_source:  # a pin already there is the project's choice: kept
        merge(block, "numpy", release.numpy, "numpy", release.numpy_source)
        record(block, "numpy_source", release.numpy_source, "numpy")
    cuda = {version: dict(facts) for version, facts in (block.get("cuda") or {}).items()}
    for build in release.builds:
        if build.cuda is None:
            merge(block, "cpu", True, "cpu", build.source)
            record(block, "cpu_source", build.source, "cpu")
            continue
        facts = cuda.setdefault(build.cuda, {})
        merge(facts, "wheel_index", build.build, f"cuda {build.cuda} wheel_index", build.source)
        if build.on_pypi_plain:
            merge(facts, "pypi", True, f"cuda {build.cuda} pypi", build.source)
        for key, version in build.pins.items():
            merge(facts, key, version, f"cuda {build.cuda} {key}", build.source)
        merge(facts, "triton", build.triton, f"cuda {build.cuda} triton", build.source)
        merge(facts, "arch_list", build.arch_list, f"cuda {build.cuda} arch_list", build.source)
        record(facts, "source", build.source, f"cuda {build.cuda}")
    for build in release.arch_builds:
        if build.cuda not in cuda:  # a build only another machine has: no row can name it without its x86_64 facts
            continue
        facts = cuda[build.cuda]
        by_arch = {machine: dict(values) for machine, values in (facts.get("by_arch") or {}).items()}
        own = by_arch.setdefault(build.machine, {})
        where = f"cuda {build.cuda} {build.machine}"
        merge(own, "arch_list", build.arch_list, f"{where} arch_list", build.source)
        for key, version in build.pins.items():  # only the pins that differ from the x86_64 wheel's
            if facts.get(key) != version or key in own:
                merge(own, key, version, f"{where} {key}", build.source)
        record(own, "source", build.source, where)
        facts["by_arch"] = by_arch
    block["cuda"] = cuda
    return block, added, disagree


def unread(release: ReleaseFacts, block: dict) -> list[str]:
    """The builds a release's compat.yaml block claims that this read of the index did not confirm from a wheel:
    typed from release pages, or read once from another index. They are kept; a refresh names them."""
    read = {build.cuda for build in release.builds}
    found = []
    for cuda, facts in (block.get("cuda") or {}).items():
        if cuda not in read:
            local = (facts or {}).get("wheel_index") or "cu" + str(cuda).replace(".", "")
            sourced = "read from another index (source:)" if (facts or {}).get("source") else "not read from a wheel"
            found.append(f"torch {release.torch} cuda {cuda}: the index has no {local} build; compat.yaml's facts "
                         f"for it are {sourced} (read them with --index-url {PYTORCH_INDEX}{local})")
    if block.get("cpu") and None not in read:
        sourced = "read from another index (cpu_source:)" if block.get("cpu_source") else "not read from a wheel"
        found.append(f"torch {release.torch} cpu: the index has no +cpu build; compat.yaml's cpu: true is {sourced} "
                     f"(read it with --index-url {PYTORCH_INDEX}cpu)")
    return found


def _python_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")) if version else (99,)


def corrected(block: dict, differences: list[Difference]) -> dict:
    """A block with the index's values where they disagree (`--correct`: each one is reported)."""
    for difference in differences:
        if difference.where.endswith(" sha256"):
            where = difference.where.removesuffix(" sha256")
            target = _build_block(block, where.split(" ")[1:]) if where.startswith("cuda ") else block
            key = "source" if where.startswith("cuda ") else f"{where}_source"
            target[key] = {**target[key], "sha256": difference.index}
        elif difference.where.startswith("python."):
            block["python"][difference.where.split(".")[1]] = difference.index
        elif difference.where.startswith("cuda "):
            *path, key = difference.where.split(" ")[1:]
            _build_block(block, path)[key] = difference.index
        else:
            block[difference.where] = difference.index
    return block


def _build_block(block: dict, path: list[str]) -> dict:
    """A build's facts by its place in a Difference: [cuda] or [cuda, machine] (its `by_arch:` entry)."""
    facts = block["cuda"][path[0]]
    return facts["by_arch"][path[1]] if len(path) > 1 else facts


@dataclass(frozen=True)
class RefreshOptions:
    compat_file: Path
    index_url: str = PYPI
    versions: tuple[str, ...] = ()  # empty: every release compat.yaml lists that the index has
    write: bool = True  # False: --check, compare only
    correct: bool = False  # replace disagreeing values with the index's (each reported)


def refresh(options: RefreshOptions, index: Index | None = None) -> Refresh:
    """Read the releases' facts from the index, compare them with compat.yaml, and (unless checking) write what
    they add, each build with its source; disagreements change compat.yaml only with `correct`."""
    index = index or open_index(options.index_url)
    yaml = round_trip_yaml()
    document = load_compat_file(yaml, options.compat_file)
    torch_section = document["torch"]
    result = Refresh()
    for torch in options.versions or tuple(torch_section):
        release = read_release(index, torch, tuple(document.get("architectures") or ()))
        if release is None:
            if options.versions:
                raise InputError([Problem(index.url, 0, f"the index has no torch {brief(torch)} wheels: "
                                                                "name a release it has")])
            result.not_on_index.append(torch)
            continue
        result.releases.append(release)
        block, added, disagree = compare(release, plain(torch_section.get(torch)))
        if "numpy" not in block:
            added += _carried_numpy(torch_section, torch, block)
        result.added += added
        result.disagreements += disagree
        result.unread += unread(release, block)
        if options.correct:
            block = corrected(block, disagree)
        _update(torch_section, torch, block, index.url)
    if options.write and result.releases:
        _dump(yaml, document, options.compat_file)
    return result


def _carried_numpy(torch_section, torch: str, block: dict) -> list[Difference]:
    """An index without NumPy (a wheelhouse, a torch-only mirror): the newest release's pin is carried over, so no
    image installs NumPy unpinned."""
    pinned = [(Version(str(other)), facts["numpy"]) for other, facts in torch_section.items()
              if other != torch and re.fullmatch(r"[0-9]+(\.[0-9]+)*", str(other)) and isinstance(facts, dict)
              and facts.get("numpy")]
    if not pinned:
        return []
    other, numpy = max(pinned)
    block["numpy"] = str(numpy)
    return [Difference(torch, "numpy", None, str(numpy), f"torch {other}'s pin (the index has no NumPy)")]


def plain(node: Any) -> Any:
    if node is None:
        return None
    if isinstance(node, dict):
        return {key: plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [plain(value) for value in node]
    return node


def _update(section, torch: str, block: dict, index_url: str) -> None:
    """Merge into the round-trip node, so existing keys keep their comments; a new release goes first, and the
    comment above the section's first release moves down with it."""
    if torch in section:
        _merge_node(section[torch], block)
        return
    previous_first = next(iter(section), None)
    above = section.ca.comment[1] if section.ca.comment else None
    section.insert(0, DoubleQuotedScalarString(torch), quoted(block))
    note = CommentToken(f"# Read from {index_url} by `torchimages compat refresh`: each build's source is its wheel.\n",
                        CommentMark(2))
    if previous_first is not None and above:
        section.ca.items[previous_first] = [None, [CommentToken("\n", CommentMark(0)), *above], None, None]
    section.ca.comment = [None, [note]]


def _merge_node(node, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(node.get(key), dict):
            _merge_node(node[key], value)
        elif node.get(key) != value:
            node[key] = quoted(value)


def quoted(value):
    """Versions in double quotes, as compat.yaml writes them ("3.11" is not the number 3.11)."""
    if isinstance(value, str):
        return DoubleQuotedScalarString(value)
    if isinstance(value, dict):
        return {quoted(key) if re.fullmatch(r"[0-9.]+", key) else key: quoted(item) for key, item in value.items()}
    if isinstance(value, list):
        sequence = CommentedSeq(quoted(item) for item in value)
        sequence.fa.set_flow_style()
        return sequence
    return value


def _dump(yaml: YAML, document, path: Path) -> None:
    """Rewrite only the `torch:` section: the others (hand-kept flow lists among them) stay byte for byte."""
    stream = StringIO()
    yaml.dump({"torch": document["torch"]}, stream)
    text = read_text(path, "restore it with `git checkout`")
    heading = re.search(r"^torch:", text, re.MULTILINE)
    if heading is None:  # a flow mapping, `"torch":`: no section of lines to rewrite
        raise InputError([Problem(str(path), 0, "its `torch:` section must start a line of its own (block style), "
                                                "as compat.yaml writes it: restore it with `git checkout`")])
    start = heading.start()
    following = re.compile(r"^[^\s#]", re.MULTILINE | re.ASCII).search(text, start + 1)
    end = following.start() if following else len(text)
    section = text[start:end]
    blank_lines_after = section[len(section.rstrip("\n")):]
    new_text = text[:start] + stream.getvalue().rstrip("\n") + blank_lines_after + text[end:]
    _check_shape(new_text, path)
    atomic_write(path, new_text)


def _check_shape(text: str, path: Path) -> None:
    """What is written is a compat.yaml every command reads: a release block the wheels could not fill (no Python
    range read, say) is refused, naming it, and the file stays as it was."""
    candidate = path.with_name(f".{path.name}.refreshed")
    atomic_write(candidate, text)  # a link there is replaced, never written through (its folder is locked)
    try:
        problems = compat_shape_problems(load_yaml(candidate, "compat refresh wrote it"))
    finally:
        remove_file(candidate, path.parent)
    if problems:
        raise InputError([Problem(str(path), line, f"not written: what the index gave leaves {message}")
                          for line, message in problems])
