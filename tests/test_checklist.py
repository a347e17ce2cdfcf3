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
