"""What the hostile-document tests share (test_hostile_documents, test_hostile_files): a scratch project of the
fixture's, the documents the tool reads back (lock entries, catalogs, shards), and a refusal's messages."""
import json
import os
from dataclasses import asdict
from pathlib import Path

from torchimages.build.builder import BUILD_REPORT, BuildReportEntry
from torchimages.nightly.summary import Summary
from torchimages.publish.catalog import Catalog, CatalogEntry, PinnedTag

from .conftest import copy_fixture_project
from .conftest import run_cli_in_process as run_cli

ROW = "2.13.0-cpu-runtime"
DIGEST = "sha256:" + "a" * 64
TIMEOUT = 120  # a read that hangs (on a FIFO) fails its test instead of stopping the run


class Space:
    """A copy of the matrix in tmp_path with the tool's folders beside it: nothing in the repository changes."""

    def __init__(self, root: Path):
        self.root = root
        self.matrix = copy_fixture_project(root)
        self.images, self.reports, self.catalog = root / "images", root / "reports", root / "catalog"
        self.lock = root / "bases.lock.json"

    def cli(self, *args: str, env=None):
        return run_cli("--matrix", str(self.matrix), "--images", str(self.images), "--reports", str(self.reports),
                       *args, env=env, timeout=TIMEOUT)

    def merge(self, *shards: Path, catalog: Path | None = None):
        return self.cli("report", "merge", *map(str, shards), "--catalog", str(catalog or self.catalog))


def refused(result, *expected) -> str:
    """Exit 2, no traceback, and each of expected (file names, quoted values) in the messages; returns them with
    whitespace made single spaces (the console wraps long lines)."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    messages = " ".join(result.stderr.split())
    for text in expected:
        assert " ".join(str(text).split()) in messages, f"{text} not in:\n{result.stderr}"
    return messages


def write_json(path: Path, document) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2))
    return path


def lock_entry(image: str, digest: str | None = DIGEST, image_id: str | None = "sha256:" + "b" * 64) -> dict:
    return {"image": image, "digest": digest, "image_id": image_id, "source": "registry", "note": "",
            "resolved_at": "2026-01-02T00:00:00Z"}


def catalog_entry(tag: str = ROW, sbom: str | None = None, **changes) -> CatalogEntry:
    sbom = sbom or f"sbom/{tag}-20260102.cdx.json"
    entry = CatalogEntry(tag, "127.0.0.1:5000/ml/pytorch", DIGEST, "sha256:" + "c" * 64,
                         [PinnedTag(f"{tag}-20260102", DIGEST, "2026-01-02", sbom)], [tag],
                         {"torch": "2.13.0", "cuda": "cpu", "python": "3.11", "os": "debian12"}, 1000, 500,
                         {"passed": 1}, {"status": "skipped"}, sbom, "2026-01-02T00:00:00Z", "2026-01-02T00:00:00Z")
    for name, value in changes.items():
        setattr(entry, name, value)
    return entry


def catalog_document(*entries: CatalogEntry) -> dict:
    return Catalog({entry.tag: entry for entry in entries}).to_json()


def shard(folder: Path, rows=(ROW,), **summary_changes) -> Path:
    """What a `nightly --shard` runner uploads (reports/ with its summary and build report), valid unless changed."""
    summary = Summary("127.0.0.1:5000/ml/pytorch", "1/2", list(rows), "2026-01-02T00:00:00Z", duration_s=60.0,
                      render="images is up to date", built=list(rows)).to_json()
    write_json(folder / "reports" / "nightly-summary.json", {**summary, **summary_changes})
    BUILD_REPORT.write(folder / "reports", {tag: asdict(BuildReportEntry(tag, "built", duration=10.0)) for tag in rows})
    return folder


def without_proxies() -> dict:
    return {name: value for name, value in os.environ.items() if "proxy" not in name.lower()}
