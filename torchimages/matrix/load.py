"""Stage 1: matrix.yaml + compatibility data -> validated ImageSpecs (all problems reported at once). The file's
shape and its tags are checked here; each variant's values, against compat.yaml, in variants.py."""
from __future__ import annotations

import copy
import difflib
import functools
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from ..files import brief, read_text
from ..invocation import command
from ..model import ImageSpec, InputError, Problem
from ..peers.registry_address import parse_registry
from ..yamlsource import LineDict, LineList, load_yaml, parse_yaml
from .variants import VARIANT_KEYS, check_keys, resolve_variant

# The compatibility facts are the project's data, as its matrix is: read from beside the matrix unless named.
COMPAT_NAME = "compat.yaml"
DRIVER_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")  # 580, 525.60.13

TOP_LEVEL_KEYS = ("registry", "signing", "defaults", "variants")
# `signing: required`: publish and nightly refuse to run without a signing key (nothing is pushed unsigned).
SIGNING_POLICIES = ("optional", "required")
MAX_TAG_LENGTH = 128  # Docker's limit on a tag
MAX_NAME_LENGTH = 255  # ... and on a repository name
COMPAT_SECTIONS = ("torch", "cuda", "os", "families", "architectures", "cuda_toolkit", "bases", "flavors",
                   "compute_capabilities", "reserved_users")


@dataclass
class Matrix:
    path: Path
    repository: str
    specs: list[ImageSpec]
    signing: str = "optional"  # SIGNING_POLICIES


def compat_beside(matrix_path: Path) -> Path:
    """The compatibility data a matrix is checked against when none is named: the compat.yaml in its folder."""
    return matrix_path.with_name(COMPAT_NAME)


def load_matrix(path: Path, compat_path: Path | None = None) -> Matrix:
    """Load and validate a matrix against compat_path (default: beside it); raise InputError listing every problem."""
    document = load_yaml(path, "fix matrix.yaml, or restore it with `git checkout -- matrix.yaml`")
    compat = load_compat(compat_path or compat_beside(path))
    return validate_matrix(document, compat, str(path))


def load_compat(path: Path) -> dict:
    """compat.yaml, checked for the sections and shapes the matrix validation reads. Read each time (it may have
    changed), parsed once per content: every matrix load reads it, and its parse costs more than the rest of a
    matrix load. A copy, so no caller can change what the next one gets."""
    text = read_text(path, "fix it or restore it with `git checkout`, or name the project's facts with "
                           "`--compat PATH` (default: compat.yaml beside the matrix)")
    return copy.deepcopy(_checked_compat(text, str(path)))


@functools.lru_cache(maxsize=8)
def _checked_compat(text: str, path: str) -> dict:
    compat = parse_yaml(text, Path(path))
    problems = [Problem(path, line, message) for line, message in compat_shape_problems(compat)]
    if problems:
        raise InputError(problems)
    return compat


def compat_shape_problems(compat) -> list[tuple[int, str]]:
    """Where compat.yaml lacks a section, or a section or entry is not the mapping (or list) the code reads."""
    if not isinstance(compat, LineDict):
        return [(1, "compat.yaml must be a mapping with the sections " + ", ".join(COMPAT_SECTIONS))]
    problems = [(compat.line, f"missing section '{name}'") for name in COMPAT_SECTIONS if name not in compat]
    expected = {"compute_capabilities": list, "reserved_users": list}
    for name in COMPAT_SECTIONS:
        section = compat.get(name)
        if name in compat and not isinstance(section, expected.get(name, dict)):
            problems.append((compat.line_of(name), f"section '{name}' must be a "
                                                   f"{'list' if name in expected else 'mapping'}"))
    for name in ("torch", "cuda", "os", "flavors", "bases", "families", "architectures"):
        section = compat.get(name)
        if not isinstance(section, LineDict):
            continue
        for key, entry in section.items():
            if not isinstance(entry, dict):
                problems.append((section.line_of(key), f"{name} entry {brief(key)} must be a mapping"))
            elif name == "torch" and not _torch_facts_ok(entry):
                problems.append((section.line_of(key), f"torch {brief(key)} needs python: {{min:, max:}}, "
                                                       "torchvision: (when one is paired) and a cuda: mapping of "
                                                       "mappings"))
            elif name == "os" and not ({"python", "image", "glibc", "family"} <= set(entry)
                                       and entry["family"] in (compat.get("families") or {})):
                problems.append((section.line_of(key), f"os {brief(key)} needs python:, image:, glibc: and a "
                                                       "family: that `families` lists"))
            elif name == "cuda" and not _driver_facts_ok(entry):
                problems.append((section.line_of(key), f"CUDA {brief(key)} needs full:, min_driver: (the release's "
                                                       "GA driver) and driver_floor: (its major's minor-version-"
                                                       "compatibility floor, NVIDIA \"CUDA Compatibility\"), the "
                                                       "floor a version at or below min_driver"))
    return problems


def _driver_facts_ok(entry: dict) -> bool:
    """Both driver levels present as versions, the floor at or below the release's own driver."""
    if not {"full", "min_driver", "driver_floor"} <= set(entry):
        return False
    floor, ga = (str(entry[key]) for key in ("driver_floor", "min_driver"))
    if not (DRIVER_VERSION.fullmatch(floor) and DRIVER_VERSION.fullmatch(ga)):
        return False
    return tuple(map(int, floor.split("."))) <= tuple(map(int, ga.split(".")))


def _torch_facts_ok(entry: dict) -> bool:
    python, cuda = entry.get("python"), entry.get("cuda", {})
    return (isinstance(python, dict) and all(isinstance(python.get(k), str) for k in ("min", "max"))
            and isinstance(entry.get("torchvision", ""), str) and isinstance(cuda, dict)
            and all(isinstance(wheel, dict) for wheel in cuda.values()))


def validate_matrix(document, compat: dict, filename: str) -> Matrix:
    problems: list[Problem] = []

    def report(line: int, message: str) -> None:
        problems.append(Problem(filename, line, message))

    if not isinstance(document, LineDict):
        report(getattr(document, "line", 1), "the matrix must be a mapping with keys: " + ", ".join(TOP_LEVEL_KEYS))
        raise InputError(problems)
    check_keys(document, TOP_LEVEL_KEYS, "top-level", report)
    repository = _repository(document, report)
    defaults = document.get("defaults", LineDict())
    if not isinstance(defaults, LineDict):
        report(document.line_of("defaults"), "'defaults' must be a mapping of variant keys")
        defaults = LineDict()
    else:
        check_keys(defaults, VARIANT_KEYS, "defaults", report)
    variants = document.get("variants")
    if not isinstance(variants, LineList) or not variants:
        report(document.line_of("variants"), "'variants' must be a non-empty list of mappings")
        raise InputError(problems)

    specs: list[ImageSpec] = []
    for item, line in zip(variants, variants.item_lines, strict=False):
        if not isinstance(item, LineDict):
            report(line, "each variant must be a mapping (torch:, cuda:, python:, os:, flavors: ...)")
            continue
        specs.extend(resolve_variant(item, defaults, compat, repository, report))
    _check_tags(specs, repository, report)
    signing = document.get("signing", "optional")
    if signing not in SIGNING_POLICIES:
        report(document.line_of("signing"), f"'signing' must be one of {', '.join(SIGNING_POLICIES)}, not "
                                            f"{brief(signing)}: `required` makes publish refuse to run without a key")
    if problems:
        raise InputError(problems)
    return Matrix(Path(filename), repository, specs, signing)


def _repository(document: LineDict, report) -> str:
    """`registry:`, held to the same rules as --registry: it reaches every image's labels."""
    value = document.get("registry")
    if not isinstance(value, str) or not value:
        report(document.line_of("registry"), "'registry' must be a registry/repository string, e.g. "
                                             "registry.example.com/ml/pytorch")
        return ""
    try:
        return parse_registry(value, flag="registry").name
    except InputError as error:
        for problem in error.problems:
            report(document.line_of("registry"), problem.message)
        return ""


def _check_tags(specs: list[ImageSpec], repository: str, report) -> None:
    """Every tag and alias unique, and within Docker's limits for a tag and for repository:tag."""
    first_line: dict[str, int] = {}
    for spec in specs:
        for name in (spec.tag, *spec.aliases):
            if len(name) > MAX_TAG_LENGTH or len(f"{repository}:{name}") > MAX_NAME_LENGTH:
                report(spec.matrix_line, f"the tag {brief(name)} is longer than Docker allows ({MAX_TAG_LENGTH} characters, "
                                         f"{MAX_NAME_LENGTH} with the repository): use a shorter os name, alias or "
                                         "registry")
            if name in first_line:
                report(spec.matrix_line, f"two variants give the tag '{name}' (the other is at line "
                                         f"{first_line[name]}): change torch, cuda or flavors, or drop one; rows "
                                         "differing only by os need defaults.os, which gives the others a suffix")
            else:
                first_line[name] = spec.matrix_line


def nearest_tag(selector: str, specs: list[ImageSpec]) -> str:
    """A selector's did-you-mean from the matrix's tags, and how to list them all."""
    guess = difflib.get_close_matches(selector, [spec.tag for spec in specs], n=1)
    listing = f"{command('list')} prints the {len(specs)} tags"
    return f"did you mean {brief(guess[0])}? ({listing})" if guess else listing


def select(specs: list[ImageSpec], selectors: list[str], matrix_file: str = "matrix.yaml") -> list[ImageSpec]:
    """Tags or shell globs -> specs in matrix order; a selector matching nothing is an input error."""
    if not selectors:
        return list(specs)
    unmatched = [s for s in selectors if not any(fnmatchcase(spec.tag, s) for spec in specs)]
    if unmatched:
        # One line per selector, the nearest tag in it: output follows what was asked, not the matrix's size.
        raise InputError([Problem(matrix_file, 0, f"selector {brief(s)} matches no tag: {nearest_tag(s, specs)}")
                          for s in unmatched])
    return [spec for spec in specs if any(fnmatchcase(spec.tag, s) for s in selectors)]
