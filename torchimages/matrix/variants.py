"""One variant of matrix.yaml: merged with the defaults, checked against compat.yaml, and turned into ImageSpecs (one
per machine and flavor it builds). Every problem of the row is reported with the line that wrote the value, and a row
with any problem gives no spec."""
from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass

from ..files import brief
from ..invocation import command
from ..model import PYPI, ImageSpec, User, parse_size
from ..yamlsource import LineDict

VARIANT_KEYS = (
    "torch", "cuda", "cudnn", "python", "os", "flavors", "torchvision", "arch_list", "user",
    "shm_size", "size_budget", "deprecated", "allow_unlisted", "aliases", "base", "arch",
)
BASE_KINDS = ("os", "nvidia")
REQUIRED_KEYS = ("torch", "cuda", "python", "os", "flavors")
VERSION_PATTERNS = {
    "torch": (r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", "X.Y.Z, e.g. 2.14.0"),
    "torchvision": (r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", "X.Y.Z, e.g. 0.29.0"),
    "python": (r"3\.[0-9]{1,3}", "X.Y in quotes, e.g. \"3.12\""),
    "cuda": (r"cpu|[0-9]{1,3}\.[0-9]{1,3}", "X.Y in quotes (e.g. \"13.0\") or cpu"),
}
ALIAS_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MAX_NOTE_LENGTH = 200


def check_keys(mapping: LineDict, allowed, where: str, report) -> set[str]:
    """Report unknown keys; return the known keys they were probably meant to be."""
    suggested = set()
    for key in mapping:
        if key not in allowed:
            guess = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{guess[0]}'?" if guess else "allowed: " + ", ".join(allowed)
            report(mapping.line_of(key), f"unknown key {brief(key)} in {where}: {hint}")
            suggested.update(guess)
    return suggested


class _Row:
    """A variant merged with the defaults, remembering where each value was written."""

    def __init__(self, variant: LineDict, defaults: LineDict):
        self.variant = variant
        self.defaults = defaults

    def get(self, key, fallback=None):
        if key in self.variant:
            return self.variant[key]
        return self.defaults.get(key, fallback)

    def line(self, key) -> int:
        if key in self.variant:
            return self.variant.line_of(key)
        if key in self.defaults:
            return self.defaults.line_of(key)
        return self.variant.line


@dataclass(frozen=True)
class _Settings:
    """What a row asks for beyond its versions: checked whether or not its versions are valid."""

    flavors: list[str]
    arches: list[str]
    allow_unlisted: bool
    user: User | None
    shm_size: str
    size_budget: str | None
    deprecated: str | None
    aliases: dict[str, list[str]]


class _Failures(list):
    """A row's problems as (line, message); called as fail(key, message), true once anything failed."""

    def __init__(self, row: _Row):
        super().__init__()
        self.row = row

    def __call__(self, key: str, message: str) -> None:
        self.append((self.row.line(key), message))


def resolve_variant(variant: LineDict, defaults: LineDict, compat: dict, repository: str, report) -> list[ImageSpec]:
    misspelt = check_keys(variant, VARIANT_KEYS, "variant", report)
    row = _Row(variant, defaults)
    fail = _Failures(row)
    settings = _settings(row, compat, fail)
    specs = _specs(row, defaults, settings, compat, repository, fail) if _check_versions(row, misspelt, fail) else []
    for line, message in fail:
        report(line, message)
    return [] if fail else specs


def _settings(row: _Row, compat: dict, fail) -> _Settings:
    allow_unlisted = row.get("allow_unlisted", False)
    if not isinstance(allow_unlisted, bool):
        fail("allow_unlisted", "'allow_unlisted' must be true or false")
        allow_unlisted = False
    flavors = _flavors(row, tuple(compat["flavors"]), fail)
    return _Settings(
        flavors=flavors, arches=_arches(row, compat["architectures"], fail), allow_unlisted=allow_unlisted,
        user=_user(row, compat["reserved_users"], fail),
        shm_size=_size(row, "shm_size", "8g", fail) or "8g", size_budget=_size(row, "size_budget", None, fail),
        deprecated=_deprecated(row, fail), aliases=_aliases(row, flavors, fail),
    )


def _check_versions(row: _Row, misspelt: set[str], fail) -> bool:
    """Required keys present and versions well-formed: the compatibility checks need both."""
    ok = True
    for key in REQUIRED_KEYS:
        if row.get(key) is None and key not in misspelt:
            fail(key, f"missing required key '{key}' (set it in the variant or in defaults)")
            ok = False
    for key, (pattern, example) in VERSION_PATTERNS.items():
        value = row.get(key)
        if value is not None and not (isinstance(value, str) and re.fullmatch(pattern, value, re.ASCII)):
            fail(key, f"'{key}' must be {example}, got {brief(value)}")
            ok = False
    if row.get("os") is not None and not isinstance(row.get("os"), str):
        fail("os", f"'os' must be a name such as ubuntu24.04 or debian12, got {brief(row.get('os'))}")
        ok = False
    return ok and all(row.get(key) is not None for key in REQUIRED_KEYS)


def _specs(row: _Row, defaults: LineDict, settings: _Settings, compat: dict, repository: str, fail) -> list[ImageSpec]:
    torch, cuda, python, os_name = row.get("torch"), row.get("cuda"), row.get("python"), row.get("os")
    is_gpu = cuda != "cpu"
    allow_unlisted, flavors = settings.allow_unlisted, settings.flavors
    os_facts = compat["os"].get(os_name)
    if os_facts is None:
        fail("os", f"unknown os {brief(os_name)}: known {', '.join(compat['os'])} (add it to compat.yaml)")
    torch_facts = compat["torch"].get(torch)
    if torch_facts is None and not allow_unlisted:
        fail("torch", f"unknown torch {torch}: known {', '.join(compat['torch'])}; add it to "
                      "compat.yaml with its source, or set allow_unlisted: true")
    cuda_facts = compat["cuda"].get(cuda) if is_gpu else None
    if is_gpu and cuda_facts is None:
        fail("cuda", f"unknown CUDA {cuda}: known {', '.join(compat['cuda'])} or cpu; add its patch level and "
                     "minimum driver to compat.yaml")
    wheel = _wheel_facts(row, torch, cuda, torch_facts, allow_unlisted or (is_gpu and cuda_facts is None), fail)
    cudnn = _cudnn(row, is_gpu, wheel, allow_unlisted, fail)
    _check_python(row, python, torch_facts, allow_unlisted, fail)
    base_kind = _base_kind(row, is_gpu, cuda, os_name, cuda_facts, fail)
    toolkit = _toolkit(row, flavors, compat, torch, cuda, wheel, cuda_facts, fail) if is_gpu else {}
    torchvision = _torchvision(row, torch_facts, allow_unlisted, fail)
    if torch_facts is not None and not torch_facts.get("numpy"):
        fail("torch", f"compat.yaml pins no NumPy for torch {torch}, and every image installs one: add "
                      f"`numpy: \"X.Y.Z\"` under it, or run {command(f'compat refresh {torch}')}")
    # Each machine's wheels are their own build: its arch list (and any pin that differs) is under `by_arch:`.
    wheels = {arch: _arch_wheel(row, wheel, arch, torch, cuda, is_gpu and not allow_unlisted, fail)
              for arch in settings.arches}
    arch_lists = {arch: _arch_list(row, wheels[arch], is_gpu, compat["compute_capabilities"], fail)
                  for arch in settings.arches}
    if fail:
        return []
    cuda_facts = cuda_facts or {}  # a GPU row's, known by now; a CPU row has none
    python_from_os = os_facts["python"] == python
    family = compat["families"][os_facts["family"]]
    os_packages = _os_packages(family, python, python_from_os)
    # Rows on another OS than defaults.os get an OS suffix: the well-known names stay on the default OS.
    # A matrix without defaults.os names no default, so no row has one.
    default_os = defaults.get("os")
    os_suffix = "" if default_os in (None, os_name) else f"-{os_name}"
    specs = []
    for arch, flavor in itertools.product(settings.arches, flavors):
        arch_facts, wheel, arch_list = compat["architectures"][arch], wheels[arch], arch_lists[arch]
        base, remove_from_base = _base_image(compat, base_kind, os_facts, os_name, cuda, cuda_facts, arch_facts)
        flavor_facts = compat["flavors"][flavor]
        with_toolkit = is_gpu and flavor_facts.get("cuda_toolkit", False)
        prefix = f"{torch}-cuda{cuda}-cudnn{cudnn}" if is_gpu else f"{torch}-cpu"
        index_tag = f"{prefix}-{flavor}{os_suffix}"
        specs.append(ImageSpec(
            tag=index_tag + arch_facts.get("tag_suffix", ""), index_tag=index_tag,
            platform=arch_facts.get("platform", "linux/amd64"), torch=torch, cuda=cuda if is_gpu else None, cudnn=cudnn,
            python=python, os=os_name, flavor=flavor, base_image=base, wheel_index=wheel.get("wheel_index", "cpu"),
            python_from_os=python_from_os, torchvision=torchvision,
            numpy=(torch_facts or {}).get("numpy"), glibc=str(os_facts["glibc"]), index_url=_index_url(wheel),
            os_family=os_facts["family"], arch=arch, **os_packages,
            os_release=str(os_facts.get("os_release", os_name)), package_caches=tuple(family.get("caches") or ()),
            flavor_packages=tuple((family.get("names") or {}).get(name, name)
                                  for name in flavor_facts.get("packages") or ()),
            builds_extensions=bool(flavor_facts.get("builds_extensions")),
            cuda_toolkit=toolkit.get("version") if with_toolkit else None,
            cuda_toolkit_packages=tuple(toolkit.get("packages", ())) if with_toolkit else (),
            cuda_home=toolkit.get("home") if with_toolkit else None, remove_from_base=remove_from_base,
            cuda_full=cuda_facts["full"] if is_gpu else None, cudnn_version=wheel.get("cudnn"),
            nccl_version=wheel.get("nccl"), min_driver=cuda_facts["min_driver"] if is_gpu else None,
            driver_floor=str(cuda_facts["driver_floor"]) if is_gpu else None,
            arch_list=arch_list, user=settings.user, shm_size=settings.shm_size, size_budget=settings.size_budget,
            deprecated=settings.deprecated,
            aliases=tuple(alias + arch_facts.get("tag_suffix", "") for alias in settings.aliases.get(flavor, ())),
            repository=repository, matrix_line=row.variant.line,
        ))
    return specs

def _index_url(wheel: dict) -> str:
    return PYPI if wheel.get("pypi") else f"https://download.pytorch.org/whl/{wheel.get('wheel_index', 'cpu')}"


def _base_kind(row: _Row, is_gpu: bool, cuda: str, os_name: str, cuda_facts, fail) -> str:
    kind = row.get("base", "os")
    if kind not in BASE_KINDS:
        fail("base", f"'base' must be one of {', '.join(BASE_KINDS)}, got {brief(kind)}")
        return "os"
    if kind == "nvidia" and not is_gpu:
        fail("base", "CPU variants start from the OS image: remove 'base: nvidia'")
    elif kind == "nvidia" and cuda_facts and os_name not in cuda_facts["nvidia_os"]:
        fail("base", f"nvidia/cuda has no {cuda} images for {os_name}: use one of "
                     f"{', '.join(cuda_facts['nvidia_os'])}, or drop 'base: nvidia' to start from the OS image")
    return kind


def _base_image(compat: dict, kind: str, os_facts: dict, os_name: str, cuda: str, cuda_facts,
                arch_facts: dict) -> tuple[str, tuple[str, ...]]:
    """The image FROM uses, and the files of it that the wheels replace."""
    if kind == "os":
        return arch_facts.get("image_prefix", "") + os_facts["image"], ()
    facts = compat["bases"][kind]
    values = {"cuda": cuda, "cuda_full": cuda_facts["full"], "os": os_name, "cuda_target": arch_facts["cuda_target"]}
    return facts["image"].format(**values), tuple(path.format(**values) for path in facts.get("remove", ()))


def _toolkit(row: _Row, flavors: list[str], compat: dict, torch: str, cuda: str, wheel: dict, cuda_facts,
             fail) -> dict:
    """The cuda-toolkit wheels a devel flavor installs: the version torch itself pins, so nvcc equals its CUDA."""
    if not any(compat["flavors"][f].get("cuda_toolkit") for f in flavors) or cuda_facts is None:
        return {}
    version, home = wheel.get("toolkit"), cuda_facts.get("home")
    packages = compat["cuda_toolkit"].get(version)
    if not (version and home and packages):
        fail("flavors", f"devel images take nvcc from the cuda-toolkit wheels torch {torch} pins for CUDA {cuda}, "
                        "but compat.yaml lacks them (`toolkit:` under the torch release, `home:` under "
                        "the CUDA version, the version under `cuda_toolkit:`): add them from the wheels' METADATA, "
                        "or build only the runtime flavor")
        return {}
    return {"version": version, "home": home, "packages": packages}


def _os_packages(family: dict, python: str, python_from_os: bool) -> dict[str, tuple[str, ...]]:
    """The OS packages of each Dockerfile stage, named as the OS's family names them. `tools`: what the templates'
    own commands need that a family's base images may lack (find, useradd on Rocky): in the stage every other one
    starts from."""
    def named(key: str) -> tuple[str, ...]:
        return tuple(name.format(python=python) for name in family.get(key, ()))

    own_python = python_from_os
    return {
        "python_packages": named("certificates") + named("tools") + (named("python") if own_python else ()),
        "venv_packages": named("python_venv") if own_python else (),
        "download_packages": () if own_python else named("certificates") + named("download"),
        "system_packages": named("compiler") + (named("python_dev") if own_python else ()),
    }


def _arches(row: _Row, architectures: dict, fail) -> list[str]:
    """The machines a row is built for: `arch: aarch64`, or a list (`[x86_64, aarch64]`: one tag, a manifest list)."""
    arch = row.get("arch", "x86_64")
    arches = arch if isinstance(arch, list) else [arch]
    if not arches or not all(isinstance(a, str) and a in architectures for a in arches) or len(set(arches)) < len(arches):
        fail("arch", f"'arch' must be one of {', '.join(architectures)} (the machines compat.yaml describes) or a "
                     f"list of them, each once, e.g. [x86_64, aarch64]; got {brief(arch)}")
        return ["x86_64"]
    return arches


def _arch_wheel(row: _Row, wheel: dict, arch: str, torch: str, cuda: str, needs_facts: bool, fail) -> dict:
    """A build's facts on one machine: the x86_64 wheel's, with what that machine's own wheel says over them. A GPU
    build not read on that machine has no arch list to trust (aarch64's differs), unless the row sets one."""
    own = (wheel.get("by_arch") or {}).get(arch)
    if own is None and arch != "x86_64" and needs_facts and row.get("arch_list") is None:
        fail("arch", f"compat.yaml has no facts read from torch {torch}'s {arch} wheels for CUDA {cuda} (`by_arch:` "
                     f"under the build): run {command(f'compat refresh {torch}')}, or drop {arch} from 'arch'")
    return {**wheel, **(own or {})}


def _flavors(row: _Row, known: tuple[str, ...], fail) -> list[str]:
    flavors = row.get("flavors")
    if flavors is None:  # already reported as missing (or misspelt)
        return []
    if not isinstance(flavors, list) or not flavors:
        fail("flavors", f"'flavors' must be a non-empty list drawn from {', '.join(known)}")
        return []
    unknown = [f for f in flavors if f not in known]
    for name in unknown:
        guess = difflib.get_close_matches(str(name), known, n=1)
        hint = f"did you mean '{guess[0]}'?" if guess else f"use {' or '.join(known)}"
        fail("flavors", f"unknown flavor {brief(name)}: {hint}")
    if len({str(f) for f in flavors}) != len(flavors):
        fail("flavors", "a flavor is listed twice: list each once")
    return [f for f in flavors if f in known]


def _wheel_facts(row: _Row, torch: str, cuda: str, torch_facts, allow_unlisted: bool, fail) -> dict:
    if cuda == "cpu":
        if torch_facts is not None and not torch_facts.get("cpu"):
            fail("cuda", f"compat.yaml lists no CPU build of torch {torch} (none read from a wheel): "
                         f"read it where its +cpu wheels are, "
                         f"{command(f'compat refresh {torch} --index-url https://download.pytorch.org/whl/cpu')}, or "
                         "pick a release that lists cpu")
        return {"wheel_index": "cpu"}
    listed = (torch_facts or {}).get("cuda", {}).get(cuda)
    if listed is not None:
        return listed
    if not allow_unlisted and torch_facts is not None:
        known = ", ".join(torch_facts.get("cuda", {})) or "none"
        fail("cuda", f"compat.yaml has no CUDA {cuda} build of torch {torch} (it lists: {known}, cpu): "
                     f"pick one of those; if the build exists on another index, read it with "
                     f"{command(f'compat refresh {torch} --index-url URL')}, or set allow_unlisted: true for a "
                     "custom index")
    return {"wheel_index": "cu" + cuda.replace(".", "")}


def _cudnn(row: _Row, is_gpu: bool, wheel: dict, allow_unlisted: bool, fail) -> int | None:
    cudnn = row.get("cudnn")
    if not is_gpu:
        if cudnn is not None:
            fail("cudnn", "CPU variants have no cuDNN: remove 'cudnn'")
        return None
    if isinstance(cudnn, bool) or not isinstance(cudnn, int):
        fail("cudnn", f"'cudnn' must be the cuDNN major version as a number (e.g. 9), got {brief(cudnn)}")
        return None
    pinned = wheel.get("cudnn")
    if pinned and int(pinned.split(".")[0]) != cudnn and not allow_unlisted:
        fail("cudnn", f"these torch wheels pin cuDNN {pinned}, so cudnn must be {pinned.split('.')[0]}, not {cudnn}")
    return cudnn


def _check_python(row: _Row, python: str, torch_facts, allow_unlisted: bool, fail) -> None:
    if torch_facts is None or allow_unlisted:
        return
    low, high = torch_facts["python"]["min"], torch_facts["python"]["max"]
    as_tuple = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731
    if not as_tuple(low) <= as_tuple(python) <= as_tuple(high):
        fail("python", f"torch wheels are published for Python {low} to {high}, not {python}")


def _torchvision(row: _Row, torch_facts, allow_unlisted: bool, fail) -> str | None:
    torchvision = row.get("torchvision")
    if torchvision is None or torch_facts is None or allow_unlisted:
        return torchvision
    paired = torch_facts.get("torchvision")
    if paired is None:
        torch = row.get("torch")
        fail("torchvision", f"no torchvision is paired with torch {torch} in compat.yaml (none on the index took it "
                            f"when it was read): drop torchvision from the row, or run "
                            f"{command(f'compat refresh {torch}')} once one is released")
    elif not torchvision.startswith(paired + "."):
        fail("torchvision", f"torchvision {torchvision} is not the release paired with this torch (use {paired}.x)")
    return torchvision


def _arch_list(row: _Row, wheel: dict, is_gpu: bool, capabilities: list[str], fail) -> tuple[str, ...]:
    """The compute capabilities a GPU row's torch is built for: from the wheel's facts unless the row says."""
    arch_list = row.get("arch_list")
    if arch_list is not None and not is_gpu:
        fail("arch_list", "CPU variants have no CUDA arch list: remove 'arch_list'")
        return ()
    if not is_gpu:
        return ()
    if arch_list is None:
        arch_list = wheel.get("arch_list")
        if not arch_list:
            if not fail:  # an unknown torch or CUDA, already reported, has no facts to take one from
                fail("arch_list", "the compatibility data has no arch list for this build: set 'arch_list' to what "
                                  "torch.cuda.get_arch_list() reports, e.g. [\"8.0\", \"9.0\"]")
            return ()
    example = f"e.g. [\"8.0\", \"9.0+PTX\"], from {', '.join(capabilities)}"
    if not isinstance(arch_list, list) or not arch_list:
        fail("arch_list", f"'arch_list' must be a non-empty list of compute capabilities in quotes, {example}")
        return ()
    unknown = [a for a in arch_list if not (isinstance(a, str) and a.removesuffix("+PTX") in capabilities)]
    if unknown:
        fail("arch_list", f"not a CUDA compute capability: {', '.join(brief(a) for a in unknown)}; use {example}")
        return ()
    return tuple(arch_list)


FIRST_USER_UID, LAST_USER_UID = 1000, 59999  # Debian's and Ubuntu's range for ordinary users (adduser.conf)


def _user(row: _Row, reserved: list[str], fail) -> User | None:
    """The user images run as: an ordinary account, never root or a system user the OS already has."""
    user = row.get("user")
    if user is None:
        return None
    if not isinstance(user, dict) or set(user) != {"name", "uid"}:
        fail("user", "'user' must be a mapping with 'name' and 'uid', e.g. {name: torch, uid: 1000}")
        return None
    name, uid = user["name"], user["uid"]
    problems = []
    if not isinstance(name, str) or not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", name):
        problems.append(f"user name {brief(name)} is not a valid Linux user name (lower case, e.g. torch)")
    elif name in reserved:
        problems.append(f"user name '{name}' is a system account: images run as an ordinary user, e.g. torch")
    if isinstance(uid, bool) or not isinstance(uid, int) or not FIRST_USER_UID <= uid <= LAST_USER_UID:
        problems.append(f"user uid must be an ordinary user's uid from {FIRST_USER_UID} to {LAST_USER_UID} "
                        f"(e.g. 1000), got {brief(uid)}")
    for message in problems:
        fail("user", message)
    return None if problems else User(name, uid)


def _size(row: _Row, key: str, fallback: str | None, fail) -> str | None:
    value = row.get(key)
    if value is None:
        return fallback
    try:
        parse_size(str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else "")
    except ValueError:
        fail(key, f"'{key}' must be a size above zero such as 8g or 512m, got {brief(value)}")
        return fallback
    return str(value)


def _deprecated(row: _Row, fail) -> str | None:
    """true, or a one-line note saying what to use instead: it reaches the Dockerfile header and the catalog."""
    value = row.get("deprecated")
    if value is None or value is False:
        return None
    if value is True:
        return "deprecated"
    if not isinstance(value, str) or not value.isprintable() or not 0 < len(value) <= MAX_NOTE_LENGTH:
        fail("deprecated", f"'deprecated' must be true or a one-line message of at most {MAX_NOTE_LENGTH} "
                           f"characters saying what to use instead, got {brief(value)}")
        return None
    return value


def _aliases(row: _Row, flavors: list[str], fail) -> dict[str, list[str]]:
    aliases = row.get("aliases")
    if aliases is None:
        return {}
    if not isinstance(aliases, dict):
        fail("aliases", "'aliases' must map a flavor to a list of tags, e.g. {runtime: [latest]}")
        return {}
    result = {}
    for flavor, names in aliases.items():
        if flavor not in flavors:
            fail("aliases", f"alias for flavor {brief(flavor)}, which this variant does not build ({', '.join(flavors)})")
            continue
        if not isinstance(names, list) or not all(isinstance(n, str) and ALIAS_PATTERN.fullmatch(n) for n in names):
            fail("aliases", f"aliases for {brief(flavor)} must be a list of valid tag names, e.g. [latest]")
            continue
        result[flavor] = list(names)
    return result
