"""The tests' own data rule (tests/project/README.md): the toolkit's tests run on the frozen fixture project in
tests/project/ (or on files a test writes itself), and only tests/test_project_data.py reads this repository's live
matrix.yaml, compat.yaml and the images/ rendered from them. A test that reads the live files fails the day the
release watch adds a torch release to them; this module finds such a test by reading the tests' source, before that
day comes.

What counts as reading the live data, found statically in each tests/**/*.py:
- a path built from the repository root (`ROOT`, or `Path(__file__)...parent.parent`) to matrix.yaml, compat.yaml or
  images (`ROOT / "matrix.yaml"`, `ROOT.joinpath(...)`, `f"{ROOT}/compat.yaml"`);
- the repository root given as a project (`Project.at(ROOT)`, `locate(ROOT, ...)`, `find_project(ROOT)`,
  `--project ROOT`);
- a command run through the tests' CLI helpers with neither `--matrix` nor `--project`: build.py (`run_cli`, the
  `cli` fixture) always works on this repository's project, and `run_cli_in_process` on the one around the current
  folder, this checkout unless the test moved (`monkeypatch.chdir`).

A few readers are deliberate, each named in ALLOWED with its reason."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LIVE_NAMES = frozenset({"matrix.yaml", "compat.yaml", "images"})
# Names a test module binds to the repository root (conftest.ROOT, torchimages.project.ROOT).
ROOT_NAMES = frozenset({"ROOT"})
# The tests' helpers that run a command as build.py would (conftest.py): their project unless a flag names another.
CLI_RUNNERS = frozenset({"run_cli", "run_cli_in_process", "cli"})
PROJECT_FLAGS = frozenset({"--matrix", "--project"})
# Runs that read no project: help, and `init`, which makes one.
PROJECTLESS = frozenset({"--help", "-h", "--version", "init"})
PROJECT_FINDERS = frozenset({"at", "locate", "find_project", "project_folder"})

# Module -> {top-level function or class -> why it reads the live data}; "*": the whole module.
ALLOWED: dict[str, dict[str, str]] = {
    "test_project_data.py": {"*": "the one module that checks this repository's own data"},
    "test_release_watch.py": {
        "test_the_proposal_passes_the_projects_checks_unedited":
            "runs the watch on a scratch copy of this repository, then test_project_data.py there: what a release's "
            "pull request would hold",
    },
    # The engine lane (pytest -m engine) builds, verifies and publishes this repository's real CPU and CUDA rows on
    # purpose, as CI does: it follows the live matrix, with the live compatibility data beside it.
    "conftest.py": {
        "with_live_compat": "engine lane: the live compat.yaml beside a matrix an engine test writes",
        "wheelhouse": "engine lane: the live CPU rows' wheels (session fixture)",
        "cuda_wheelhouse": "engine lane: the live CUDA rows' wheels (session fixture)",
        "local_names": "engine lane: the local image names of the live rows it built",
        "cpu_images": "engine lane: builds the live CPU rows (session fixture)",
    },
    "test_build.py": {"*": "engine lane (the whole module): builds the live CPU rows"},
    "test_build_inputs.py": {
        "test_secrets_never_reach_the_final_image": "engine lane: builds a live CPU row with a CA bundle and a token",
    },
    "test_catalog.py": {
        "test_check_registry_reports_tags_the_registry_does_not_have": "engine lane: `catalog --check-registry` "
            "against the engine's registry (it reads no row)",
    },
    "publish_fixtures.py": {"Workspace": "engine lane: test_publish's real_rows publishes the live CPU rows"},
    "test_reproducible_build.py": {"*": "engine lane (the whole module): rebuilds a live CPU row"},
    "test_verify.py": {
        "baseline": "engine lane: verifies the live CPU rows",
        "test_a_row_expecting_another_python_fails_identity": "engine lane: a broken image's matrix checked against "
            "the live compatibility data",
        "test_only_runs_just_that_check_and_skips_the_rest_naming_the_option": "engine lane: verifies a live CPU row",
        "test_too_little_shm_fails_shm_through_the_api": "engine lane: verifies a live CPU row",
        "test_gpus_all_without_nvidia_runtime_fails_at_once": "engine lane: verifies a live CPU row",
        "test_ctrl_c_removes_the_container": "engine lane: verifies the live CPU rows",
        "test_main_job_takes_the_cpu_rows_without_gpus_and_verifies_them": "engine lane: `build.py images` on the "
            "live rows",
    },
}


@dataclass(frozen=True)
class LiveUse:
    line: int
    scope: str  # the top-level function or class it is in ("" at module level)
    what: str

    def __str__(self) -> str:
        return f"{self.line}: {self.what}" + (f" (in {self.scope})" if self.scope else "")


def _is_file_path(node: ast.AST) -> bool:
    """`__file__` or `Path(__file__)` with any .resolve()/.absolute() after it."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {
            "resolve", "absolute"}:
        node = node.func.value
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Path":
        node = node.args[0] if node.args else node
    return isinstance(node, ast.Name) and node.id == "__file__"


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.roots = set(ROOT_NAMES)
        self.uses: list[LiveUse] = []
        self.scope = ""
        self.moves_folder = False  # the current top-level function calls monkeypatch.chdir / os.chdir
        self.literals: dict[str, ast.AST] = {}  # names bound to a tuple or list written out, module's then function's
        self.module_literals: dict[str, ast.AST] = {}
        self.words_of: set[str] = set()  # the function's *args: words of a command (its selectors), not its flags
        self.params: set[str] = set()  # the function's parameters: `cli` is conftest's fixture only when one

    def is_root(self, node: ast.AST) -> bool:
        """The repository root: a name bound to it, or tests/'s parent spelt out from __file__."""
        if isinstance(node, ast.Name):
            return node.id in self.roots
        if isinstance(node, ast.Attribute) and node.attr == "ROOT":  # torchimages.project.ROOT, conftest.ROOT
            return True
        if isinstance(node, ast.Attribute) and node.attr == "parent" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "parent":
            return _is_file_path(node.value.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resolve":
            return self.is_root(node.func.value)
        return False

    def add(self, node: ast.AST, what: str) -> None:
        self.uses.append(LiveUse(node.lineno, self.scope, what))

    # ---------------------------------------------------------------------------------------------------- scopes
    def visit_Module(self, node: ast.Module) -> None:
        for statement in node.body:  # names bound to the root first: a module uses them below its definitions
            if isinstance(statement, ast.Assign) and self.is_root(statement.value):
                self.roots |= {target.id for target in statement.targets if isinstance(target, ast.Name)}
        self.module_literals = _literals(node.body)
        self.literals = dict(self.module_literals)
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.scope = statement.name
                self.moves_folder = any(isinstance(inner, ast.Attribute) and inner.attr == "chdir"
                                        for inner in ast.walk(statement))
                self.literals = {**self.module_literals, **_literals(list(ast.walk(statement)))}
                arguments = getattr(statement, "args", None)
                self.words_of = {arguments.vararg.arg} if arguments and arguments.vararg else set()
                self.params = {arg.arg for arg in arguments.args} if arguments else set()
                self.generic_visit(statement)
                self.scope, self.moves_folder, self.words_of, self.params = "", False, set(), set()
                self.literals = dict(self.module_literals)
            else:
                self.visit(statement)

    # ----------------------------------------------------------------------------------------------------- paths
    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Div) and self.is_root(node.left) and isinstance(node.right, ast.Constant) \
                and str(node.right.value).split("/")[0] in LIVE_NAMES:
            self.add(node, f"the live {node.right.value} ({ast.unparse(node)})")
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        for value, after in pairwise(node.values):
            if isinstance(value, ast.FormattedValue) and self.is_root(value.value) and isinstance(after, ast.Constant) \
                    and str(after.value).lstrip("/").split("/")[0] in LIVE_NAMES:
                self.add(node, f"the live {str(after.value).lstrip('/')} ({ast.unparse(node)})")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = getattr(func, "id", getattr(func, "attr", ""))
        if name == "joinpath" and isinstance(func, ast.Attribute) and self.is_root(func.value) and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value) in LIVE_NAMES:
            self.add(node, f"the live {node.args[0].value} ({ast.unparse(node)})")
        if name in PROJECT_FINDERS and node.args and self.is_root(node.args[0]):
            self.add(node, f"this repository as a project ({ast.unparse(node)})")
        if isinstance(func, ast.Name) and name in CLI_RUNNERS and (name != "cli" or "cli" in self.params):
            self.check_cli_run(node, name)
        self.generic_visit(node)

    def visit_List(self, node: ast.List) -> None:
        """A command line of build.py's own (`[sys.executable, str(ROOT / "build.py"), ...]`): as run_cli's."""
        for index, element in enumerate(node.elts):
            path = element.args[0] if isinstance(element, ast.Call) and getattr(element.func, "id", "") == "str" \
                and element.args else element
            if isinstance(path, ast.BinOp) and self.is_root(path.left) and isinstance(path.right, ast.Constant) \
                    and path.right.value == "build.py":
                self.check_cli_run(node, "build.py", node.elts[index + 1:])
        self.generic_visit(node)

    def command_words(self, args: list[ast.AST]) -> list[ast.AST] | None:
        """args with each *NAME bound to a tuple or list written out replaced by its items; None when one is not
        known here (flags built by a helper, as a scratch project's are: not the live project's)."""
        words: list[ast.AST] = []
        for arg in args:
            if not isinstance(arg, ast.Starred):
                words.append(arg)
            elif isinstance(arg.value, ast.Name) and arg.value.id in self.words_of and words:
                continue  # a helper's *selectors after its command (a helper passing *args on whole: its callers')
            elif isinstance(arg.value, ast.Name) and isinstance(self.literals.get(arg.value.id), (ast.Tuple, ast.List)):
                words += self.literals[arg.value.id].elts
            else:
                return None
        return words

    def check_cli_run(self, node: ast.AST, runner: str, args: list[ast.AST] | None = None) -> None:
        args = self.command_words(node.args if args is None else args)
        if args is None:
            return
        words = [arg.value for arg in args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        for flag, value in pairwise(args):
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "str" and value.args:
                value = value.args[0]
            if isinstance(flag, ast.Constant) and flag.value == "--project" and self.is_root(value):
                self.add(node, f"--project at this repository ({ast.unparse(node)})")
        if PROJECT_FLAGS & set(words) or PROJECTLESS & set(words) or {"--compat", "compat"} <= set(words):
            return  # `compat refresh --compat FILE` reads that file alone
        if runner == "run_cli_in_process" and self.moves_folder:
            return  # run in a folder the test chose
        self.add(node, f"a command on the project it is run in, this repository's ({ast.unparse(node)[:100]})")


def _literals(statements: list[ast.AST]) -> dict[str, ast.AST]:
    """Names assigned a tuple or list written out, among statements."""
    return {target.id: statement.value for statement in statements if isinstance(statement, ast.Assign)
            and isinstance(statement.value, (ast.Tuple, ast.List)) for target in statement.targets
            if isinstance(target, ast.Name)}


def live_data_uses(source: str) -> list[LiveUse]:
    """Where source reads this repository's live project data (see the module docstring)."""
    scanner = _Scanner()
    scanner.visit(ast.parse(source))
    return sorted(scanner.uses, key=lambda use: use.line)


def unexplained(module: str, uses: list[LiveUse]) -> list[LiveUse]:
    allowed = ALLOWED.get(module, {})
    return [use for use in uses if "*" not in allowed and use.scope not in allowed]


def scanned_modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "project" not in path.relative_to(TESTS).parts[:1]
                  and "data" not in path.relative_to(TESTS).parts[:1])


@pytest.mark.parametrize("path", scanned_modules(), ids=lambda path: path.relative_to(TESTS).as_posix())
def test_no_test_reads_the_live_project_data(path):
    uses = unexplained(path.name, live_data_uses(path.read_text()))
    assert not uses, (f"{path.relative_to(TESTS.parent)} reads this repository's live project data, which a new "
                      "release changes: run on the fixture project (conftest.FIXTURE_PROJECT, copy_fixture_project, "
                      "the fixture_project fixture; or --project / --matrix naming it) or a file the test writes; "
                      "checks of the live data go in tests/test_project_data.py.\n"
                      + "\n".join(f"  line {use}" for use in uses))


def test_every_allowed_reader_still_reads_the_live_data():
    """An entry of ALLOWED whose reader has gone would let a new one in under its name: each must still be there."""
    stale = []
    for module, readers in ALLOWED.items():
        scopes = {use.scope for use in live_data_uses((TESTS / module).read_text())}
        stale += [f"{module}: {reader}" for reader in readers if reader != "*" and reader not in scopes]
        if "*" in readers and not scopes:
            stale.append(f"{module}: *")
    assert not stale, f"ALLOWED names readers that no longer read the live data: {stale}"


# ---------------------------------------------------------------------------------------------- the scanner itself

OFFENDING = '''\
from pathlib import Path

from .conftest import ROOT, run_cli, run_cli_in_process

HERE = Path(__file__).resolve().parent.parent
LIVE = (ROOT / "compat.yaml").read_text()


def test_one(tmp_path):
    (tmp_path / "matrix.yaml").write_text((HERE / "matrix.yaml").read_text())
    run_cli_in_process("list", "--format", "json")


def test_two():
    assert f"{ROOT}/images/x/Dockerfile"
    assert Project.at(ROOT).load()
    run_cli("list")


def test_three(cli):
    cli("doctor", "2.13.0-cpu-*")
    subprocess.run([sys.executable, str(ROOT / "build.py"), "list"])
    run_cli_in_process("--project", str(ROOT), "list")
'''


def test_the_scanner_finds_each_way_of_naming_the_live_files():
    uses = live_data_uses(OFFENDING)
    assert [(use.line, use.scope) for use in uses] == [
        (6, ""), (10, "test_one"), (11, "test_one"), (15, "test_two"), (16, "test_two"), (17, "test_two"),
        (21, "test_three"), (22, "test_three"), (23, "test_three")]
    assert "compat.yaml" in uses[0].what and "matrix.yaml" in uses[1].what and "images" in uses[3].what
    assert unexplained("test_something.py", uses) == uses
    assert unexplained("test_project_data.py", uses) == []


def test_the_scanner_lets_the_fixture_project_and_a_tests_own_files_through():
    clean = '''\
from .conftest import FIXTURE_MATRIX, FIXTURE_PROJECT, ROOT, run_cli, run_cli_in_process


def test_fine(tmp_path, monkeypatch):
    (tmp_path / "matrix.yaml").write_text(FIXTURE_MATRIX.read_text())
    assert (ROOT / "docs" / "commands.md").is_file() and (FIXTURE_PROJECT / "compat.yaml").is_file()
    run_cli("--matrix", str(tmp_path / "matrix.yaml"), "list")
    run_cli_in_process("--project", str(FIXTURE_PROJECT), "list")
    run_cli_in_process("test", "--help")
    cli = lambda *args: run_cli("--matrix", str(tmp_path / "matrix.yaml"), *args)  # a test's own, not the fixture
    cli("list")
    monkeypatch.chdir(tmp_path)
    run_cli_in_process("list")
'''
    assert live_data_uses(clean) == []
