"""One declaration per check (torchimages/checks/checklist.py): the reports, the suite's markers, the README's table
and the CLI's help follow it."""
import re

from torchimages.checks import checklist
from torchimages.verify.plan import CHECKS, GPU_CHECKS, SUITE

from .conftest import ROOT, run_cli_in_process

MARKED = re.compile(r"""(?:pytestmark = pytest\.mark\.check|@pytest\.mark\.check)\("([^"]+)"\)""")


def test_the_readme_table_is_the_declared_one():
    assert checklist.markdown_table() in (ROOT / "README.md").read_text(), (
        "README.md's check table differs from torchimages/checks/checklist.py: paste markdown_table()'s output")


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

    return {f"{name} {action}".strip() for name, command in subcommands(build_parser()).items()
            for action in (subcommands(command) or [""])}


def test_the_readmes_command_list_names_every_command_and_no_other():
    """README.md's `## Commands` block against the parser: a command added or removed is listed or unlisted there."""
    block = (ROOT / "README.md").read_text().split("## Commands\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = parser_commands()
    listed = set()
    for line in block.splitlines():
        words = line.split()
        if words[:2] == ["python", "build.py"]:
            pair = " ".join(words[2:4])
            listed.add(pair if pair in commands else words[2])
    assert listed == commands, (f"README.md's command list lacks {sorted(commands - listed)} and lists "
                                f"{sorted(listed - commands)}: add a line for each command (see `build.py --help`)")
