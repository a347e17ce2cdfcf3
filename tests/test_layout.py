"""The package's shape, as the developers' guide asks it: one exception hierarchy under one base."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import torchimages
from torchimages.model import TorchImagesError


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
