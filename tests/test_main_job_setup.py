"""The main job pays only for what it builds (issue 46): `make images` sets up emulation and the arm64 base only when
its selection names an -arm64 row; `make test`, whose arm64 tests need them, always does."""
import subprocess

import pytest

from devtools import localengine

from .conftest import ROOT


def engine_command(*assignments: str) -> str:
    planned = subprocess.run(["make", "-n", "images", *assignments], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    return next(line for line in planned.splitlines() if "devtools.localengine up" in line)


@pytest.mark.parametrize(("selection", "native_only"), [
    ("", True), ("2.14.1-cpu-runtime", True), ("'*-cpu-*'", True), ("'*-arm64'", False), ("2.15.0-cpu-runtime-arm64", False),
])
def test_make_images_sets_up_another_machine_only_for_its_rows(selection, native_only):
    assert ("--native-only" in engine_command(f"SELECTION={selection}")) == native_only


def test_a_native_only_engine_seeds_only_this_machines_bases(monkeypatch):
    monkeypatch.setattr(localengine.os, "uname", lambda: type("Uname", (), {"machine": "x86_64"})())
    assert [name for name in localengine.SEEDED_BASES if localengine._is_native(name)] == ["debian:bookworm"]
    monkeypatch.setattr(localengine.os, "uname", lambda: type("Uname", (), {"machine": "aarch64"})())
    assert all(localengine._is_native(name) for name in localengine.SEEDED_BASES)
