"""Messages name the command as the user ran it (torchimages/invocation.py): `torchimages ...` for the installed
command, `python build.py ...` in a clone, and `make engine` only where the tool's source checkout has that target.
Also the small front-door promises: --version, --project after the command, a did-you-mean for a misspelt command
or tag, no `file:0:`, and help that names no file a pipx user lacks nor an issue number. Engine-free."""
from __future__ import annotations

import ast
import re

import pytest

from torchimages import invocation
from torchimages.cli import build_parser, main
from torchimages.model import Problem

from .conftest import FIXTURE_PROJECT, ROOT, run_cli, run_cli_in_process

PACKAGE = ROOT / "torchimages"
# A command only a clone has: build.py, or make (a Makefile's target).
CLONE_ONLY = re.compile(r"build\.py|`make |make engine", re.ASCII)
# String constants that may spell them, each with its reason.
ALLOWED = {
    ("torchimages/invocation.py", "*"): "the one place that words these commands",
    ("torchimages/build/render.py", "MARKER_TEXT"): "the rendered folder's mark, unchanged so that render knows its own",
    ("torchimages/build/render.py", "GENERATED_HEADER"): "the rendered Dockerfiles' header, a file format",
    ("torchimages/build/render.py", "GENERATED_BY"): "recognises files generated before, by either name",
    ("torchimages/templates/Dockerfile.j2", "*"): "the rendered Dockerfiles' header (GENERATED_HEADER)",
}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of docstring nodes: they speak to a reader of the source, not to a user."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def allowed_constants(tree: ast.Module, relative: str) -> set[int]:
    """The string constants assigned at module level to a name ALLOWED names for this file."""
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and (relative, target.id) in ALLOWED
                                                for target in node.targets):
            found |= {id(child) for child in ast.walk(node) if isinstance(child, ast.Constant)}
    return found


def clone_only_strings() -> list[str]:
    """Every string literal (f-strings' parts included) in the package that names a clone-only command."""
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        relative = path.relative_to(ROOT).as_posix()
        if not path.is_file() or "__pycache__" in path.parts or (relative, "*") in ALLOWED:
            continue
        if path.suffix != ".py":
            text = path.read_bytes().decode(errors="replace")
            found += [f"{relative}: {line.strip()}" for line in text.splitlines() if CLONE_ONLY.search(line)]
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = docstrings(tree) | allowed_constants(tree, relative)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in skip:
                value = node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
                if CLONE_ONLY.search(value):
                    found.append(f"{relative}:{node.lineno}: {value!r}")
    return found


def test_no_message_names_a_command_only_a_clone_has():
    """A pipx user has neither build.py nor the Makefile: every message names the command through invocation.py."""
    assert clone_only_strings() == []


def test_the_scan_finds_what_it_looks_for():
    """The scan's parts see an f-string's literal part and pass a docstring by."""
    tree = ast.parse('"""Run `build.py test`."""\nx = f"run `python build.py test {tag}`"\n')
    constants = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in docstrings(tree)]
    assert [node.value for node in constants if CLONE_ONLY.search(node.value)] == ["run `python build.py test "]


def help_texts() -> list[str]:
    """Every help line, description and epilog of every command, as the clone's build.py words them."""
    texts = []
    with invocation.running_as(invocation.CLONE):
        pending = [build_parser(everything=True)]
        while pending:
            parser = pending.pop()
            texts += [parser.description or "", parser.epilog or ""]
            for action in parser._actions:
                texts.append(action.help or "")
                texts += [choice.help or "" for choice in getattr(action, "_choices_actions", [])]
                pending += list((getattr(action, "choices", None) or {}).values()) if action.dest == "command" or \
                    action.dest.endswith("_command") else []
    return texts


def test_help_names_no_readme_and_no_issue():
    """A pipx user has no README.md beside the package, and an issue number means nothing to them."""
    texts = help_texts()
    assert len(texts) > 100
    assert [text for text in texts if "README.md" in text and "images/README.md" not in text] == []
    assert [text for text in texts if re.search(r"\bissues? [0-9]+", text, re.ASCII)] == []


def run_as(program: str, *args: str) -> tuple[int, str, str]:
    """main() in this process under the given name: its exit code, stdout and stderr."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            code = main(list(args), program=program)
        except SystemExit as stop:  # argparse's --help
            code = stop.code if isinstance(stop.code, int) else 1
    return code, stdout.getvalue(), stderr.getvalue()


def test_help_names_the_command_as_it_was_run():
    code, clone, _ = run_as(invocation.CLONE, "build", "--help")
    clone = " ".join(clone.split())  # as one line: argparse wraps the help
    assert code == 0 and "usage: python build.py build" in clone and "fetched by `python build.py wheels`" in clone
    code, installed, _ = run_as(invocation.INSTALLED, "build", "--help")
    installed = " ".join(installed.split())
    assert code == 0 and "usage: torchimages build" in installed and "fetched by `torchimages wheels`" in installed
    assert "build.py" not in installed
    code, top, _ = run_as(invocation.INSTALLED, "--help")
    assert code == 0 and invocation.DOCS in " ".join(top.split()) and "See README" not in top


def test_an_error_names_the_command_as_it_was_run():
    """The same mistake, run as the installed command and as a clone's build.py: each names its own command."""
    args = ("--project", str(FIXTURE_PROJECT), "list", "2.13.0-cpu-runtme")
    installed_code, _, installed = run_as(invocation.INSTALLED, *args)
    clone_code, _, clone = run_as(invocation.CLONE, *args)
    assert installed_code == clone_code == 2
    assert "`torchimages list`" in installed and "build.py" not in installed
    assert "`python build.py list`" in clone
    assert invocation._program is None  # main() leaves no name behind


def test_a_misspelt_tag_gets_the_nearest_one_and_how_to_list_them_in_one_line():
    result = run_cli_in_process("--project", str(FIXTURE_PROJECT), "list", "2.13.0-cpu-runtme", check_exit=2)
    assert result.stderr.strip().splitlines() == [
        f"error: {FIXTURE_PROJECT / 'matrix.yaml'}: selector '2.13.0-cpu-runtme' matches no tag: did you mean "
        f"'2.13.0-cpu-runtime'? (`python build.py list` prints the 9 tags)"]
    nothing = run_cli_in_process("--project", str(FIXTURE_PROJECT), "list", "zzz", check_exit=2)
    assert nothing.stderr.strip().endswith("matches no tag: `python build.py list` prints the 9 tags")


@pytest.mark.parametrize("word, line", [
    ("imagse", "error: unknown command 'imagse': did you mean 'images'?"),
    ("zzzzz", "error: unknown command 'zzzzz': `python build.py --help` lists the commands"),
])
def test_a_misspelt_command_gets_one_line_and_exit_2(word, line):
    result = run_cli_in_process("--project", str(FIXTURE_PROJECT), word, "x", check_exit=2)
    assert result.stderr.strip().splitlines() == [line]


def test_version_prints_the_version():
    result = run_cli("--version", check_exit=0)
    assert re.fullmatch(r"torchimages [0-9]+\.[0-9]+\.[0-9]+\S*\n", result.stdout, re.ASCII), result.stdout
    assert result.stdout.split()[1] == invocation.source_version()


def test_project_is_taken_after_the_command_too():
    before = run_cli_in_process("--project", str(FIXTURE_PROJECT), "list", "--format", "json", check_exit=0)
    after = run_cli_in_process("list", "--format", "json", "--project", str(FIXTURE_PROJECT), check_exit=0)
    assert after.stdout == before.stdout and "2.13.0-cpu-runtime" in after.stdout
    nested = run_cli_in_process("compat", "refresh", "--check", "--project", str(FIXTURE_PROJECT / "nowhere"),
                                check_exit=2)
    assert f"--project {FIXTURE_PROJECT / 'nowhere'} holds no matrix.yaml" in nested.stderr


def test_a_problem_without_a_line_has_no_zero():
    assert str(Problem("DOCKER_HOST", 0, "no Docker engine answers")) == "DOCKER_HOST: no Docker engine answers"
    assert str(Problem("matrix.yaml", 3, "bad")) == "matrix.yaml:3: bad"
    assert str(Problem("", 0, "unknown command")) == "unknown command"


def test_make_engine_is_offered_only_beside_a_makefile_with_that_target(tmp_path, monkeypatch):
    """The clone's Makefile starts the engine; an installed package has none, and gets a remedy that exists for it."""
    checkout = tmp_path.resolve()
    monkeypatch.setattr(invocation, "CHECKOUT", checkout)
    monkeypatch.chdir(checkout)
    assert "`make" not in invocation.start_engine() and invocation.EXPORT_DOCKER_HOST in invocation.start_engine()
    assert "docs/building.md" in invocation.offline_base() and "`make" not in invocation.offline_base()
    assert invocation.install_skopeo() == "`apt-get install skopeo`"
    (checkout / "Makefile").write_text("test:\n\tpytest\n")  # a Makefile, but not the tool's
    assert invocation.make_engine() is None
    (checkout / "Makefile").write_text("test:\n\tpytest\n\nengine: setup\n\tpython -m devtools.localengine up\n")
    assert invocation.start_engine().startswith("start one with `make engine` (then `source .engine/env`)")
    elsewhere = checkout / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert invocation.make_engine() == f"`make -C {checkout} engine` (then `source {checkout}/.engine/env`)"
