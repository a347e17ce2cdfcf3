"""YAML loading that remembers line numbers, so every input error can name its line; and that bounds what a
hostile file can cost (size, nesting, alias expansion) before anything reads its values."""
from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, SequenceNode

from .files import brief, read_text
from .model import InputError, Problem, TorchImagesError

MAX_DEPTH = 32  # a matrix nests four levels deep; compat.yaml six
MAX_NODES = 100_000  # after alias expansion: a "billion laughs" file is refused before any value is read
# What PyYAML's constructors raise on a value its tag cannot hold (`!!int abc`, `2026-02-30`, `!!bool maybe`,
# `!!set [a]`, a 5000-digit `!!int`), besides their own ConstructorError
CONSTRUCTOR_ERRORS = (ValueError, KeyError, AttributeError, TypeError, OverflowError, IndexError)


MERGE_TAG = "tag:yaml.org,2002:merge"


class LineDict(dict):
    """A mapping that knows its own line and the line of each key."""

    line: int = 0
    key_lines: dict

    def line_of(self, key) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    line: int = 0
    item_lines: list


class _Refused(TorchImagesError):
    """A bound exceeded or a value no constructor can build: one problem at a line. Not a ValueError, so that the
    constructors of enclosing nodes pass it through untouched."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


class _LineLoader(Composer, yaml.CSafeLoader):
    """SafeLoader that keeps lines, keeps version-like numbers as written, rejects duplicate and unhashable keys,
    and refuses documents nested or expanding past the bounds above. libyaml (which PyYAML's wheels bundle) reads the
    text into events, several times faster than PyYAML's own reader; PyYAML's composer, in Python, builds the nodes
    from them, so that the depth bound below holds before anything recurses."""

    duplicate_keys: list
    bad_keys: list
    depth: int = 0
    composed: int = 0  # nodes composed so far, aliases included: the bound holds before a huge file is composed whole

    def __init__(self, text: str):
        yaml.CSafeLoader.__init__(self, text)
        Composer.__init__(self)

    def compose_node(self, parent, index):
        self.depth += 1
        self.composed += 1
        try:
            if self.depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _Refused(line, f"nested more than {MAX_DEPTH} levels deep: flatten it")
            if self.composed > MAX_NODES:
                line = self.peek_event().start_mark.line + 1
                raise _Refused(line, f"holds more than {MAX_NODES} values: no such file needs that many")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except CONSTRUCTOR_ERRORS:
            raise _Refused(node.start_mark.line + 1, _unbuildable(node)) from None

    def construct_mapping(self, node, deep=False):
        written_here = {id(key_node) for key_node, _ in node.value if key_node.tag != MERGE_TAG}
        self.flatten_mapping(node)  # YAML merge keys (<<: *defaults): merged keys first, so this mapping's win
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        seen_here = set()
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, Hashable):
                self.bad_keys.append(line)
                continue
            if id(key_node) in written_here:
                if key in seen_here:
                    self.duplicate_keys.append((key, line))
                seen_here.add(key)
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = line
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


def _unbuildable(node) -> str:
    """Why a node's value cannot be built, for a person: its tag and (briefly) the value as written."""
    tag = node.tag.replace("tag:yaml.org,2002:", "!!")
    written = brief(node.value) if isinstance(node.value, str) else f"a {node.id}"
    kind = "date" if tag == "!!timestamp" else f"{tag} value"
    return f"{written} is not a valid {kind}: quote it to keep it as text, or write a valid one"


def expanded_size(node, sizes: dict | None = None) -> int:
    """How many nodes the document has once every alias is expanded (each shared node counted once per use)."""
    sizes = {} if sizes is None else sizes
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = MAX_NODES + 1  # a node that contains itself expands without end
    if isinstance(node, MappingNode):
        size = 1 + sum(expanded_size(key, sizes) + expanded_size(value, sizes) for key, value in node.value)
    elif isinstance(node, SequenceNode):
        size = 1 + sum(expanded_size(child, sizes) for child in node.value)
    else:
        size = 1
    sizes[id(node)] = min(size, MAX_NODES + 1)
    return sizes[id(node)]


def _document(loader: _LineLoader, node):
    """The document's value. The top node's constructor may be a generator PyYAML runs after construct_object has
    returned (`!!set`), outside the line it catches."""
    try:
        return loader.construct_document(node)
    except CONSTRUCTOR_ERRORS:
        raise _Refused(node.start_mark.line + 1, _unbuildable(node)) from None


def load_yaml(path: Path, fix: str = "fix the file"):
    """Parse a YAML file; a file that is not a readable UTF-8 regular file, a syntax error, a bound exceeded or a
    duplicate key becomes an InputError naming the line."""
    return parse_yaml(read_text(path, fix), path)


def parse_yaml(text: str, path: Path):
    """Parse YAML text read from path (which the problems name), as load_yaml does."""
    loader = None
    try:
        loader = _LineLoader(text)  # refuses characters YAML forbids (NUL, other control characters) right here
        loader.duplicate_keys, loader.bad_keys = [], []
        node = loader.get_single_node()
        if node is not None and expanded_size(node) > MAX_NODES:
            raise _Refused(1, f"expands to more than {MAX_NODES} values through its aliases: use fewer aliases")
        document = _document(loader, node) if node is not None else None
    except _Refused as error:
        raise InputError([Problem(str(path), error.line, error.message)]) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        position = getattr(error, "position", None)  # a forbidden character: libyaml's offset in the UTF-8 bytes
        line = mark.line + 1 if mark else text.encode()[:position].count(b"\n") + 1 if position is not None else 0
        line = min(line, text.count("\n") + 1)  # libyaml marks the end of a text without a last newline a line below
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError([Problem(str(path), line, f"invalid YAML: {reason}; fix the syntax")]) from None
    except RecursionError:
        raise InputError([Problem(str(path), 0, "nested too deeply: flatten it")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    problems = [Problem(str(path), line, "a key must be a plain value (a name or a number), not a list or a mapping")
                for line in loader.bad_keys]
    problems += [
        Problem(str(path), line, f"duplicate key {brief(key)}: each key may appear once per mapping")
        for key, line in loader.duplicate_keys
    ]
    if problems:
        raise InputError(problems)
    return document
