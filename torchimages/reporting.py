"""Small pieces every report and document shares: UTC timestamps, Markdown that data cannot break, and the shape
checks of the JSON documents people edit and CI jobs upload (lock, catalog, reports, plans, shard results)."""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from .files import atomic_write_json, brief, read_json_document, read_text
from .model import InputError, Problem

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # registry digests and image ids alike
DIGEST_RULE = "'sha256:' followed by 64 lower-case hex digits"
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # Docker's grammar of a tag
MAX_NUMBER = 2**53  # sizes, seconds and counts stay far below; above it JSON numbers lose precision anyway
MAX_NESTING = 16  # none of our documents nests deeper; much deeper ones exhaust Python's recursion when written back
MAX_SHOWN = 20  # problems listed one by one; a document wrong in thousands of places gets a count after these


def human_size(size: float) -> str:
    """Binary units, as Docker reads sizes (--shm-size 8g is 8 GiB) and as size budgets are written: 6.9 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def utc_timestamp(moment: datetime | None = None) -> str:
    """2026-11-21T20:42:56Z: the one timestamp format of reports, labels and the catalog."""
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------------- Markdown

# Characters that start emphasis, code, links, images, HTML, headings, quotes or strikethrough, and the table's pipe.
_MARKDOWN_ACTIVE = re.compile(r"([\\`*_\[\]<>|#~])")


def markdown_cell(text) -> str:
    """Text on one line with Markdown's active characters escaped, so that data can neither break a table nor add
    links, images, HTML or formatting to the page."""
    return _MARKDOWN_ACTIVE.sub(r"\\\1", " ".join(str(text).split()))


def markdown_code(text) -> str:
    """Text as inline code on one line. Backslashes do not escape inside code, so the fence is one backtick longer
    than any run of backticks in the text; pipes are escaped because tables split rows on them even inside code."""
    line = " ".join(str(text).split()).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", line)), default=0) + 1)
    padding = " " if not line or line[0] == "`" or line[-1] == "`" else ""
    return f"{fence}{padding}{line}{padding}{fence}"


def markdown_link(label: str, target: str) -> str:
    """A link to a relative path from data, percent-encoded: it cannot end the link early, add another one, or
    become a URL with a scheme (javascript:, https:)."""
    return f"[{markdown_cell(label)}]({quote(target, safe='/')})"


# ---------------------------------------------------------------------------------------------- document shapes

@dataclass(frozen=True)
class Wrong:
    """One thing wrong in a document: where (its keys from the top) and what."""

    keys: tuple[str | int, ...]
    message: str


@dataclass
class Shape:
    """Checks a parsed JSON document against the types of the dataclasses it holds, collecting every problem so
    that all are reported at once. Types understood: dataclasses, str, int and float (non-negative, at most
    MAX_NUMBER), bool, X | None, list[X], tuple[X, ...], dict[str, X], and bare dict/list for free-form parts."""

    label: str  # what the document is, for messages: "lock", "catalog"
    wrongs: list[Wrong] = field(default_factory=list)

    def wrong(self, keys, message: str) -> None:
        self.wrongs.append(Wrong(tuple(keys), message))

    def document(self, value, expected) -> bool:
        """Whether a whole document fits `expected`; first, that it nests no deeper than any of ours."""
        if nesting(value) > MAX_NESTING:
            self.wrong((), f"nests deeper than {MAX_NESTING} levels, which no {self.label} does")
            return False
        return self.fits(value, expected)

    def fits(self, value, expected, keys=()) -> bool:
        """Whether value has the type `expected`; what does not fit is recorded."""
        before = len(self.wrongs)
        self._check(value, expected, tuple(keys))
        return len(self.wrongs) == before

    def raise_if_wrong(self, path: Path, fix: str) -> None:
        """An InputError naming path, the line of each problem (found by its keys) and how to fix it."""
        if not self.wrongs:
            return
        try:
            text = read_text(path, fix)
        except InputError:
            text = ""  # gone since it was read: the problems still stand, without lines
        problems = [Problem(str(path), line_of(text, wrong.keys), f"{spell(wrong.keys)} {wrong.message}: {fix}")
                    for wrong in self.wrongs[:MAX_SHOWN]]
        if len(self.wrongs) > MAX_SHOWN:
            problems.append(Problem(str(path), 0, f"and {len(self.wrongs) - MAX_SHOWN} more problems: {fix}"))
        raise InputError(problems)

    def _check(self, value, expected, keys: tuple) -> None:
        origin, arguments = typing.get_origin(expected), typing.get_args(expected)
        if origin in (typing.Union, types.UnionType):
            if value is not None or type(None) not in arguments:
                self._check(value, next(a for a in arguments if a is not type(None)), keys)
        elif isinstance(expected, type) and dataclasses.is_dataclass(expected):
            self._check_fields(value, expected, keys)
        elif origin is dict:
            if self._is(value, dict, keys):
                for key, item in value.items():
                    self._check(item, arguments[1], (*keys, key))
        elif origin in (list, tuple):
            if self._is(value, list, keys):
                for index, item in enumerate(value):
                    self._check(item, arguments[0], (*keys, index))
        else:
            self._is(value, expected, keys)

    def _is(self, value, expected: type, keys: tuple) -> bool:
        if expected is int:
            fits = type(value) is int and 0 <= value <= MAX_NUMBER
        elif expected is float:  # NaN and infinity fail the comparison too
            fits = type(value) in (int, float) and 0 <= value <= MAX_NUMBER
        else:
            fits = type(value) is expected
        if not fits:
            self.wrong(keys, f"must be {_expected_kind(expected)}, not {_found_kind(value)}")
        return fits

    def _check_fields(self, value, cls: type, keys: tuple) -> None:
        if not isinstance(value, dict):
            self.wrong(keys, f"must be an object with the {self.label}'s fields, not {_found_kind(value)}")
            return
        for item in dataclasses.fields(cls):
            if item.name in value:
                self._check(value[item.name], _field_types(cls)[item.name], (*keys, item.name))
            elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
                self.wrong(keys, f"does not have the {self.label}'s fields ({item.name!r} is missing)")


@functools.cache
def _field_types(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _expected_kind(expected: type) -> str:
    return {str: "a string", bool: "true or false", dict: "an object", list: "a list",
            int: f"a whole number from 0 to {MAX_NUMBER}", float: f"a number from 0 to {MAX_NUMBER}"}[expected]


def _found_kind(value) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else json.dumps(value) if isinstance(value, bool) else brief(value)


def as_object(value: object) -> dict:
    """A JSON value that should be an object, as one: a document from a peer or a file (a signed predicate, the
    probe's facts) may hold anything where an object belongs, and reading it then finds nothing rather than failing."""
    return value if isinstance(value, dict) else {}


def known_fields(cls: type, data: dict) -> dict:
    """The fields of the dataclass cls that data has: documents may carry more (newer fields, derived ones such as a
    summary's exit_code), which the type leaves out."""
    names = {item.name for item in dataclasses.fields(cls)}
    return {name: value for name, value in data.items() if name in names}


def nesting(value) -> int:
    """How deeply lists and objects nest in value, counted without recursion (the value may be deeper than
    Python's recursion allows); stops counting past MAX_NESTING."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_NESTING:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def spell(keys: tuple) -> str:
    """('bases', 'debian:bookworm', 'digest') -> bases['debian:bookworm'].digest; () -> the document."""
    if not keys:
        return "the document"
    text = str(keys[0]) if isinstance(keys[0], str) and keys[0].isidentifier() else f"[{brief(keys[0])}]"
    for key in keys[1:]:
        text += f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{brief(key)}]"
    return text


def line_of(text: str, keys: tuple) -> int:
    """The line where a document's keys appear one after the other (an entry's name, then its field): a pointer
    for messages, found without a second parse; line 1 when they cannot be found."""
    position = 0
    for key in (key for key in keys if isinstance(key, str)):
        found = text.find(json.dumps(key, ensure_ascii=False), position)
        if found < 0:
            break
        position = found
    return text.count("\n", 0, position) + 1


def require_schema(document, schema: int, path: Path, what: str, fix: str) -> None:
    """Refuse a document that is not an object with "schema": schema (another tool's file, or a newer format)."""
    if isinstance(document, dict) and document.get("schema") == schema:
        return
    found = ("it has no schema" if isinstance(document, dict) and "schema" not in document
             else f"its schema is {_found_kind(document.get('schema'))}" if isinstance(document, dict)
             else f"it is {_found_kind(document)}")
    raise InputError([Problem(str(path), 1, f"not {what} of schema {schema} ({found}): {fix}")])


# ------------------------------------------------------------------------------------------------ row reports

@dataclass(frozen=True)
class RowReport:
    """A report of one entry per row, reports/<name> = {"schema": N, "images": [entry, ...]} (build, publish): each run
    updates its rows' entries and keeps the others."""

    name: str  # its file name in the reports folder
    entry: type  # the dataclass an entry is: it has at least these fields, with these types
    label: str  # what it is, for messages: "build report"
    fix: str  # what to do about a damaged one
    schema: int = 1

    def read(self, reports_dir: Path) -> dict[str, dict]:
        """tag -> entry, empty when there is no report yet; a damaged one is an InputError naming the fix."""
        path = reports_dir / self.name
        document = read_json_document(path, self.fix, default=None)
        if document is None:
            return {}
        require_schema(document, self.schema, path, f"a {self.label}", self.fix)
        shape = Shape(self.label)
        if shape.document(document, dict):
            shape.fits(document.get("images"), list[self.entry], ("images",))  # type: ignore[name-defined]
        shape.raise_if_wrong(path, self.fix)
        return {item["tag"]: item for item in document["images"]}

    def write(self, reports_dir: Path, entries: dict[str, dict]) -> Path:
        path = reports_dir / self.name
        atomic_write_json(path, {"schema": self.schema, "images": [entries[tag] for tag in sorted(entries)]})
        return path
