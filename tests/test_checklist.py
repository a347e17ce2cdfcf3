"""One declaration per check (torchimages/checks/checklist.py): the reports, the suite's markers, the docs' table
and the CLI's help follow it. The README's and the docs' command lines and links hold."""
import re
from pathlib import Path

from torchimages.checks import checklist
from torchimages.verify.plan import CHECKS, GPU_CHECKS, SUITE

from .conftest import ROOT, run_cli_in_process

MARKED = re.compile(r"""(?:pytestmark = pytest\.mark\.check|@pytest\.mark\.check)\("([^"]+)"\)""")


VERIFICATION_PAGE = ROOT / "docs" / "verification.md"  # "What verification proves": the check table
COMMANDS_PAGE = ROOT / "docs" / "commands.md"  # "Every command": one line per command
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "policies" / "README.md"]


def test_the_docs_table_is_the_declared_one():
    assert checklist.markdown_table() in VERIFICATION_PAGE.read_text(), (
        "docs/verification.md's check table differs from torchimages/checks/checklist.py: paste markdown_table()'s "
        "output")


def test_every_declared_check_has_tests_in_the_suite_and_every_marked_check_is_declared():
    marked = {name for path in SUITE.glob("test_*.py") for name in MARKED.findall(path.read_text())}
    assert marked == set(checklist.NAMES)


def test_verification_and_the_cli_follow_the_declaration():
    assert CHECKS == checklist.NAMES and set(GPU_CHECKS) == {"gpu", "driver", "cudnn", "multi-gpu"}
    help_text = " ".join(run_cli_in_process("test", "--help").stdout.split())
    assert all(name in help_text for name in checklist.NAMES) and "multi-gpu (2+ GPUs)" in help_text


def parser_commands() -> set[str]:
    """Every command build.py's parser takes, a group's actions as "group action" (report merge)."""
    import argparse

    from torchimages.cli import build_parser

    def subcommands(parser) -> dict:
        return next((action.choices for action in parser._actions
                     if isinstance(action, argparse._SubParsersAction)), {})

    return {f"{name} {action}".strip() for name, command in subcommands(build_parser(everything=True)).items()
            for action in (subcommands(command) or [""])}


def command_of(line: str, commands: set[str]) -> str | None:
    """The command a shown command line runs (`torchimages X` or, from a clone, `python build.py X`), or None."""
    words = line.split()
    start = 1 if words[:1] == ["torchimages"] else 2 if words[:2] == ["python", "build.py"] else None
    if start is None or len(words) <= start or words[start].startswith("-"):
        return None
    pair = " ".join(words[start:start + 2])
    return pair if pair in commands else words[start]


def shell_lines(page: Path) -> list[str]:
    """The lines of a page's ```bash blocks."""
    blocks = page.read_text().split("```bash\n")[1:]
    return [line for block in blocks for line in block.split("```", 1)[0].splitlines()]


def test_the_command_list_names_every_command_and_no_other():
    """docs/commands.md's `## Every command` block against the parser: a command added or removed is listed or
    unlisted there."""
    block = COMMANDS_PAGE.read_text().split("## Every command\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = parser_commands()
    listed = {command_of(line, commands) for line in block.splitlines()} - {None}
    assert listed == commands, (f"docs/commands.md's command list lacks {sorted(commands - listed)} and lists "
                                f"{sorted(listed - commands)}: add a line for each command (see `torchimages --help`)")


def test_every_command_the_readme_and_the_docs_show_exists_and_answers_help():
    commands = parser_commands()
    shown = {(page.name, command_of(line, commands)) for page in DOCS for line in shell_lines(page)}
    shown = {(page, command) for page, command in shown if command is not None}
    assert {command for _, command in shown} & {"init", "images", "render"}, "the pages' commands were not found"
    unknown = sorted((page, command) for page, command in shown if command not in commands)
    assert unknown == [], f"commands the docs show that do not exist: {unknown}"
    for command in {command for _, command in shown}:
        run_cli_in_process(*command.split(), "--help", check_exit=0)


LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_link_of_the_readme_and_the_docs_to_a_file_of_this_repository_resolves():
    broken = [(page.relative_to(ROOT).as_posix(), target) for page in DOCS for target in LINK.findall(page.read_text())
              if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()]
    assert broken == [], f"links to nothing: {broken}"
