"""compat.yaml read for a round trip (compat refresh and the release watch rewrite it): its comments and order kept
as people wrote them, and every way it can be damaged (a syntax error, a duplicate key, a release block of the wrong
shape) one `file:line` problem, exit 2.
"""
from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ..files import brief, read_text
from ..model import InputError, Problem


def round_trip_yaml() -> YAML:
    yaml = YAML()  # round-trip: compat.yaml's comments and order stay as people wrote them
    yaml.width = 120
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.preserve_quotes = True
    return yaml


def load_compat_file(yaml: YAML, path: Path):
    """compat.yaml as ruamel reads it for a round trip; an InputError naming the file and line where it cannot be
    read, or where a release block is not of the shape compare() reads."""
    text = read_text(path, "restore it with `git checkout`")  # a FIFO or /dev/zero refused, not read for ever
    try:
        document = yaml.load(text)
    except MarkedYAMLError as error:  # a syntax error, a duplicate key: ruamel says where
        mark = error.problem_mark or error.context_mark
        raise InputError([Problem(str(path), mark.line + 1 if mark else 0,
                                  f"{brief(error.problem or error.context or 'cannot be read', 200)}: fix it, or "
                                  "restore it with `git checkout`")]) from None
    except (YAMLError, ValueError, RecursionError) as error:
        raise InputError([Problem(str(path), 0, f"cannot read it ({brief(str(error), 200)}): restore it with "
                                                "`git checkout`")]) from None
    if not isinstance(document, dict) or not isinstance(document.get("torch"), dict):
        raise InputError([Problem(str(path), 0, "needs a `torch:` mapping of releases: restore it with "
                                                "`git checkout`")])
    problems = release_shape_problems(path, document["torch"])
    if problems:
        raise InputError(problems)
    return document


# The fields of a release block that hold mappings (`python: {min:, max:}`, `cuda: {"13.0": {...}}`).
MAPPING_FIELDS = ("python", "cuda")


def release_shape_problems(path: Path, releases: dict) -> list[Problem]:
    """Each release block that is not a mapping, or whose mapping fields are not, as `file:line` problems (the line
    ruamel read it at): compare() reads them as mappings."""
    def line_of(parent, key) -> int:
        try:
            return parent.lc.key(key)[0] + 1
        except (AttributeError, KeyError, TypeError):
            return 0

    problems = []
    for torch, block in releases.items():
        if not isinstance(block, dict):
            problems.append(Problem(str(path), line_of(releases, torch), f"release {brief(torch)} is not a mapping "
                                                                         "of its facts"))
            continue
        for name in MAPPING_FIELDS:
            if name in block and not isinstance(block[name], dict | None):
                problems.append(Problem(str(path), line_of(block, name),
                                        f"release {brief(torch)}: {name}: is {brief(block[name])}, not a mapping "
                                        f"(e.g. python: {{min: \"3.10\", max: \"3.14\"}})"))
        builds = block.get("cuda")
        for cuda, facts in (builds.items() if isinstance(builds, dict) else ()):
            if not isinstance(facts, dict):
                problems.append(Problem(str(path), line_of(builds, cuda),
                                        f"release {brief(torch)}: cuda {brief(cuda)} is not a mapping of its facts"))
    return problems
