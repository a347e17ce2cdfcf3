"""reports/<tag>/wheels.json: the wheels a build installed, by sha256, and the inputs its hash was made of (publish's
provenance names the wheels, `why` and `rebuild` read them)."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write_json, read_json_document
from ..invocation import command
from ..model import InputError, Problem
from ..reporting import require_schema

if TYPE_CHECKING:
    from .context import BuildContext

WHEEL_RECORD_SCHEMA = 1


def wheel_record_path(reports_dir: Path, tag: str) -> Path:
    return reports_dir / tag / "wheels.json"


def write_wheel_record(reports_dir: Path, tag: str, context: BuildContext) -> None:
    """reports/<tag>/wheels.json: every wheel the build installed from a wheelhouse, by name and sha256, with the
    input hash they went into (publish's build provenance names them: the image keeps no wheel's hash), and every
    input the hash was made of (`why` compares them with today's)."""
    wheels = [{"name": name, "sha256": file_sha256(path)} for name, path in sorted(context.wheels.items())
              if name.endswith(".whl")]
    atomic_write_json(wheel_record_path(reports_dir, tag),
                      {"schema": WHEEL_RECORD_SCHEMA, "input_hash": context.input_hash, "wheels": wheels,
                       "inputs": context.inputs},
                      root=reports_dir)


def read_wheel_record(path: Path) -> dict:
    """A wheel record as write_wheel_record left it ({} when there is none); another shape is an InputError."""
    fix = f"delete it: {command(f'build {path.parent.name} --force')} writes it again"
    record = read_json_document(path, fix, default=None)
    if record is None:
        return {}
    require_schema(record, WHEEL_RECORD_SCHEMA, path, "a wheel record", fix)
    wheels = record.get("wheels")
    if not isinstance(record.get("input_hash"), str) or not isinstance(wheels, list) or not all(
            isinstance(wheel, dict) and isinstance(wheel.get("name"), str) and isinstance(wheel.get("sha256"), str)
            for wheel in wheels) or not _text_mapping(record.get("inputs", {})):
        raise InputError([Problem(str(path), 1, f"not a wheel record (input_hash, wheels: name and sha256, inputs: "
                                                 f"name: identity): {fix}")])
    return record


def _text_mapping(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
