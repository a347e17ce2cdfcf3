"""Stage 2: ImageSpecs -> images/<tag>/Dockerfile (+ context files), deterministic and checkable."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import jinja2

from .files import atomic_write
from .model import ImageSpec, InputError, Problem

DOCKERFILE_TEMPLATE = "Dockerfile.j2"
CONTEXT_DIR = "context"


def render_files(specs: list[ImageSpec], templates_dir: Path, matrix_file: str, repository: str,
                 pinned_bases: dict[str, str] | None = None) -> dict[str, bytes]:
    """Pure rendering: relative path under images/ -> file content. `pinned_bases` maps a base image to the
    reference its FROM uses (image@sha256:... from bases.lock.json); unpinned bases keep their tag."""
    pinned_bases = pinned_bases or {}
    environment = _environment(templates_dir)
    context_files = _context_files(templates_dir)
    rendered: dict[str, bytes] = {}
    for spec in specs:
        text = _render_template(environment, templates_dir, spec=spec, matrix_file=matrix_file, repository=repository,
                                base_reference=pinned_bases.get(spec.base_image, spec.base_image))
        rendered[f"{spec.tag}/Dockerfile"] = _tidy(text).encode()
        for name, content in context_files.items():
            rendered[f"{spec.tag}/{name}"] = content
    return rendered


def _environment(templates_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render_template(environment: jinja2.Environment, templates_dir: Path, **values) -> str:
    try:
        return environment.get_template(DOCKERFILE_TEMPLATE).render(**values)
    except jinja2.TemplateSyntaxError as error:
        where = error.filename or str(templates_dir / DOCKERFILE_TEMPLATE)
        raise InputError([Problem(where, error.lineno, f"template syntax error: {error.message}")]) from None
    except jinja2.TemplateNotFound as error:
        raise InputError([Problem(str(templates_dir), 0, f"template '{error.name}' not found: restore it or fix the import")]) from None
    except jinja2.UndefinedError as error:
        filename, line = _template_position(error, templates_dir)
        raise InputError([Problem(filename, line, f"template uses an undefined value: {error.message}; "
                                                  "use a field of ImageSpec (torchimages/model.py)")]) from None


def _template_position(error: Exception, templates_dir: Path) -> tuple[str, int]:
    """The innermost template frame of a rendering error's traceback."""
    traceback = error.__traceback__
    position = (str(templates_dir / DOCKERFILE_TEMPLATE), 0)
    while traceback is not None:
        filename = traceback.tb_frame.f_code.co_filename
        if filename.startswith(str(templates_dir)):
            position = (filename, traceback.tb_lineno)
        traceback = traceback.tb_next
    return position


def _tidy(text: str) -> str:
    """Collapse runs of blank lines left by template conditionals."""
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") + "\n"


def _context_files(templates_dir: Path) -> dict[str, bytes]:
    folder = templates_dir / CONTEXT_DIR
    if not folder.is_dir():
        return {}
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def stale_paths(images_dir: Path, rendered: dict[str, bytes]) -> list[str]:
    """What differs between images/ and a fresh render: changed, missing and extra files."""
    stale = [rel for rel, content in rendered.items() if _read(images_dir / rel) != content]
    if images_dir.is_dir():
        existing = {str(p.relative_to(images_dir)) for p in images_dir.rglob("*") if p.is_file()}
        stale += sorted(rel for rel in existing - set(rendered) if _is_generated(rel))
    return sorted(stale)


def _is_generated(relative: str) -> bool:
    """images/README.md is the catalog's page, not a rendered image folder."""
    return "/" in relative


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def write_rendered(images_dir: Path, rendered: dict[str, bytes]) -> list[str]:
    """Write what changed (atomically per file) and remove stale tag folders; return changed paths."""
    changed = stale_paths(images_dir, rendered)
    for rel in changed:
        target = images_dir / rel
        if rel not in rendered:
            target.unlink()
            continue
        atomic_write(target, rendered[rel], mode=0o755 if rel.endswith(".sh") else 0o644)
    tags = {rel.split("/", 1)[0] for rel in rendered}
    for folder in sorted(images_dir.iterdir()) if images_dir.is_dir() else []:
        if folder.is_dir() and folder.name not in tags:
            shutil.rmtree(folder)
    return changed

