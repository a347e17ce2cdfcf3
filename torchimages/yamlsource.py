"""YAML loading that remembers line numbers, so every input error can name its line."""
from __future__ import annotations

from pathlib import Path

import yaml

from .model import InputError, Problem


class LineDict(dict):
    """A mapping that knows its own line and the line of each key."""

    line: int = 0
    key_lines: dict

    def line_of(self, key) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    line: int = 0
    item_lines: list


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that keeps lines, keeps version-like numbers as written, and rejects duplicate keys."""

    duplicate_keys: list

    def construct_mapping(self, node, deep=False):
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in mapping:
                self.duplicate_keys.append((key, key_node.start_mark.line + 1))
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    def construct_sequence(self, node, deep=False):
        sequence = LineList(self.construct_object(child, deep=True) for child in node.value)
        sequence.line = node.start_mark.line + 1
        sequence.item_lines = [child.start_mark.line + 1 for child in node.value]
        return sequence

    def construct_version_like_float(self, node):
        # `python: 3.10` must stay "3.10", not become 3.1.
        return self.construct_scalar(node)


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_sequence)
_LineLoader.add_constructor("tag:yaml.org,2002:float", _LineLoader.construct_version_like_float)


def load_yaml(path: Path):
    """Parse a YAML file; any syntax error or duplicate key becomes an InputError naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError([Problem(str(path), 0, f"cannot read file: {error.strerror}")]) from None
    loader = _LineLoader(text)
    loader.duplicate_keys = []
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        reason = getattr(error, "problem", None) or str(error)
        raise InputError([Problem(str(path), line, f"invalid YAML: {reason}; fix the syntax")]) from None
    finally:
        loader.dispose()
    problems = [
        Problem(str(path), line, f"duplicate key '{key}': each key may appear once per mapping")
        for key, line in loader.duplicate_keys
    ]
    if problems:
        raise InputError(problems)
    return document
