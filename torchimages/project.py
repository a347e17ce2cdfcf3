"""Where a run reads and writes, and the exit codes every command shares."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import matrix as matrix_stage
from . import render as render_stage
from .bases_lock import LOCK_NAME, read_lock

ROOT = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class Project:
    """Paths of one run; every one can be moved with a global option of build.py."""

    matrix: Path
    compat: Path  # the compatibility facts the matrix is checked against (by default beside it)
    templates: Path
    images: Path
    reports: Path

    def load(self) -> matrix_stage.Matrix:
        return matrix_stage.load_matrix(self.matrix, self.compat)

    def select(self, selectors: list[str]):
        return matrix_stage.select(self.load().specs, selectors, str(self.matrix))

    @property
    def lock_file(self) -> Path:
        return self.matrix.parent / LOCK_NAME

    def rendered(self, matrix: matrix_stage.Matrix) -> dict[str, bytes]:
        """Dockerfiles as the matrix and the base pins (bases.lock.json, when present) say."""
        pinned = {image: base.reference for image, base in read_lock(self.lock_file).items()}
        return render_stage.render_files(matrix.specs, self.templates, self.matrix.name, matrix.repository, pinned)
