"""The package's shape, as the developers' guide asks it: one exception hierarchy under one base; the floor plan
(wings by pipeline stage, pyproject.toml's import contracts) that `make lint` holds."""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchimages
from torchimages.model import TorchImagesError

ROOT = Path(__file__).resolve().parent.parent


def package_modules():
    for info in pkgutil.walk_packages(torchimages.__path__, "torchimages."):
        if ".checks.suite" not in info.name:  # the image checks: pytest modules run against containers
            yield importlib.import_module(info.name)


def test_every_error_the_toolkit_raises_derives_from_one_base():
    """A caller driving the stages from Python catches TorchImagesError, as docker-py's callers catch DockerException;
    the command line maps its kinds to exit codes. Warnings are not errors, and SIGTERM's Terminated unwinds as Ctrl-C
    does (a KeyboardInterrupt, not an Exception), on purpose."""
    defined = {cls for module in package_modules() for _, cls in inspect.getmembers(module, inspect.isclass)
               if cls.__module__ == module.__name__ and issubclass(cls, Exception) and not issubclass(cls, Warning)}
    assert defined and all(issubclass(cls, TorchImagesError) for cls in defined), sorted(
        cls.__qualname__ for cls in defined if not issubclass(cls, TorchImagesError))


LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """import-linter over the package in tree, with this checkout's contracts (pyproject.toml), as `make lint` runs it."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=tree,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tree)},
                          check=False)


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "torchimages", tmp_path / "torchimages", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_floor_plan_holds_on_this_tree(package_copy):
    result = lint_imports(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("module", "line", "broken"), [
    # a low module reaching the command-line layer: the floors are broken
    ("model.py", "from .cli import main\n", "The pipeline's floors"),
    # a stage reaching a later one: build does not know verify
    ("build/builder.py", "from ..verify import plan\n", "The pipeline's floors"),
    # two modules of one wing that need each other, even only for a type annotation
    ("build/context.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .builder import Builder\n",
     "No import circles"),
])
def test_an_upward_import_or_a_circle_fails_make_lint(package_copy, module, line, broken):
    target = package_copy / "torchimages" / module
    target.write_text(target.read_text() + "\n" + line)
    result = lint_imports(package_copy)
    assert result.returncode != 0, result.stdout
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout


def test_help_starts_without_the_docker_sdk_or_cryptography():
    """The command table imports only the chosen command's group: `--help` lists every command from the table alone."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchimages", "--help"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "verify-image" in result.stdout and "report" in result.stdout
    assert not imported & {"docker", "cryptography", "jsonschema", "pkcs11"}, sorted(
        imported & {"docker", "cryptography", "jsonschema", "pkcs11"})


def test_the_command_table_names_each_command_with_the_group_that_registers_it():
    import argparse

    from torchimages.cli import commands

    for group in commands.groups():
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(f"torchimages.cli.{group}").register(subparsers)
        assert set(subparsers.choices) == {name for name, command in commands.COMMANDS.items()
                                          if command.group == group}, group


def test_the_package_stands_in_wings():
    """Only the shared ground stands directly under torchimages/ (model, files, redaction, reporting, yamlsource,
    project, invocation, with __init__ and __main__); everything else is in the wing of its stage, and no file is a
    house."""
    top = sorted(path.name for path in (ROOT / "torchimages").glob("*.py"))
    assert len(top) <= 9, top
    too_long = {str(path.relative_to(ROOT)): lines for path in (ROOT / "torchimages").rglob("*.py")
                if (lines := len(path.read_text().splitlines())) > 600}
    assert not too_long, too_long
