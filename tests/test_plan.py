"""Sharding the matrix for CI (`plan`), and joining the shards' results (`report merge`)."""
import hashlib
import json
import subprocess
from dataclasses import asdict

import pytest
import yaml

from torchimages.build.bases_lock import LockedBase, write_lock
from torchimages.build.builder import BUILD_REPORT, BuildReportEntry
from torchimages.build.lock import BaseChange
from torchimages.matrix.load import load_matrix
from torchimages.model import InputError
from torchimages.nightly.plan import balance, make_plan, parse_shard, together
from torchimages.nightly.summary import Published, Summary, merge_summaries
from torchimages.publish.catalog import Catalog, CatalogEntry, PinnedTag
from torchimages.publish.catalog_page import save

from .conftest import FIXTURE_MATRIX, FIXTURE_PROJECT, ROOT, copy_fixture_project, run_cli_in_process

TAGS = [spec.tag for spec in load_matrix(FIXTURE_MATRIX).specs]
FIXTURE = ("--matrix", str(FIXTURE_MATRIX))  # planning reads the matrix only: the fixture project's, in place


def test_plan_for_3_shards_covers_every_row_exactly_once():
    for output_format in ("json", "github"):
        document = json.loads(run_cli_in_process(*FIXTURE, "plan", "--shards", "3", "--format", output_format, check_exit=0).stdout)
        shards = document["shards"] if output_format == "json" else document["include"]
        planned = [tag for shard in shards for tag in (shard["tags"] if output_format == "json" else shard["tags"].split())]
        assert sorted(planned) == sorted(TAGS) and len(planned) == len(set(planned))
        assert [shard["shard"] for shard in shards] == ["1/3", "2/3", "3/3"]


def test_github_format_is_one_line_for_github_output():
    output = run_cli_in_process(*FIXTURE, "plan", "--shards", "2", "--format", "github", check_exit=0).stdout
    assert output.count("\n") == 1 and output.startswith('{"include":[')


def test_plan_balances_by_past_build_durations(tmp_path):
    durations = {tag: (1200.0 if "devel" in tag else 400.0 if "cuda" in tag else 100.0) for tag in TAGS}
    BUILD_REPORT.write(tmp_path, {tag: asdict(BuildReportEntry(tag, "built", last_build_duration=seconds))
                                  for tag, seconds in durations.items()})
    plan = json.loads(run_cli_in_process(*FIXTURE, "--reports", str(tmp_path), "plan", "--shards", "3", check_exit=0).stdout)["shards"]
    loads = [sum(durations[tag] for tag in shard["tags"]) for shard in plan]
    assert [shard["estimated_seconds"] for shard in plan] == loads
    assert max(loads) - min(loads) <= max(durations.values())
    assert max(loads) < sum(durations.values()) / 3 + 1200


def test_rows_without_history_weigh_the_mean_and_order_is_stable():
    shards = balance(["a", "b", "c", "d"], {"a": 30.0, "b": 10.0}, 2)  # c and d weigh 20 each
    assert [shard.tags for shard in shards] == [("a", "b"), ("c", "d")]
    assert [shard.estimated_seconds for shard in shards] == [40.0, 40.0]
    unknown = balance(["a", "b", "c", "d"], {}, 2)
    assert unknown == balance(["a", "b", "c", "d"], {}, 2)
    assert [shard.tags for shard in unknown] == [("a", "c"), ("b", "d")]
    assert [shard.estimated_seconds for shard in unknown] == [None, None]
    assert [shard.tags for shard in balance(["a"], {}, 3)] == [("a",), (), ()]


def test_a_multi_arch_rows_images_share_one_shard(tmp_path):
    """publish writes the row's tag as an index over both machines' images, only in a run that has them both."""
    specs = load_matrix(FIXTURE_PROJECT / "grace-matrix.yaml").specs  # four rows, each for x86_64 and aarch64
    grace = [spec.tag for spec in specs]
    assert together(specs)[0] == ("2.15.0-cuda13.2-cudnn9-runtime", "2.15.0-cuda13.2-cudnn9-runtime-arm64")
    for count in range(1, 5):
        shards = make_plan(specs, tmp_path, count)
        assert sorted(tag for shard in shards for tag in shard.tags) == sorted(grace)
        for shard in shards:
            assert {tag.removesuffix("-arm64") for tag in shard.tags} == {
                tag for tag in shard.tags if not tag.endswith("-arm64")}, shard
    assert [len(shard.tags) for shard in make_plan(specs, tmp_path, 4)] == [2, 2, 2, 2]
    with pytest.raises(InputError, match="at most 4 shards"):
        make_plan(specs, tmp_path, 5)  # eight images, but four rows: a fifth shard could only be empty
    # Weighed by past builds (the emulated arm64 image far heavier), tag by tag would split the row; by rows it does not.
    tags, durations = ["a", "a-arm64", "b", "c"], {"a": 10.0, "a-arm64": 100.0, "b": 50.0, "c": 40.0}
    assert [shard.tags for shard in balance(tags, durations, 2)] == [("a-arm64",), ("a", "b", "c")]
    paired = balance(tags, durations, 2, [("a", "a-arm64"), ("b",), ("c",)])
    assert [(shard.tags, shard.estimated_seconds) for shard in paired] == [(("a", "a-arm64"), 110.0), (("b", "c"), 90.0)]


def test_the_nightly_builds_each_shards_arm64_images_natively_and_hands_them_to_that_shard(tmp_path):
    jobs = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())["jobs"]
    arm64, shard = jobs["arm64"], jobs["shard"]
    assert arm64["runs-on"] == "ubuntu-24.04-arm", "a native arm64 runner: no emulation"
    assert arm64["strategy"]["matrix"] == shard["strategy"]["matrix"], "job-index pairs each lane with its shard"
    assert "arm64" in shard["needs"] and "always()" in shard["if"]
    picking = next(step["run"] for step in arm64["steps"] if step.get("name") == "The shard's arm64 images")
    output = tmp_path / "output"
    tags = "2.15.0-cuda13.2-cudnn9-runtime 2.15.0-cuda13.2-cudnn9-runtime-arm64 2.14.1-cuda13.0-cudnn9-devel-arm64"
    for given, picked in ((tags, "2.15.0-cuda13.2-cudnn9-runtime-arm64 2.14.1-cuda13.0-cudnn9-devel-arm64"),
                          ("2.13.0-cpu-runtime", "")):
        output.write_text("")
        subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", picking], check=True, timeout=30,
                       env={"TAGS": given, "GITHUB_OUTPUT": str(output), "PATH": "/usr/bin:/bin"})
        assert output.read_text() == f"tags={picked}\n"


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", ""])
def test_bad_shard_is_an_input_error(text):
    with pytest.raises(InputError, match="--shard"):
        parse_shard(text)


def test_bad_plan_inputs_exit_2_naming_the_flag(tmp_path):
    project = ("--matrix", str(copy_fixture_project(tmp_path / "project")), "--images", str(tmp_path / "images"),
               "--reports", str(tmp_path / "reports"))
    assert "--shards must be at least 1" in run_cli_in_process(*project, "plan", "--shards", "0", check_exit=2).stderr
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(run_cli_in_process(*project, "plan", "--shards", "3", check_exit=0).stdout)
    result = run_cli_in_process(*project, "nightly", "--shard", "1/2", "--plan", str(plan_file), "--registry", "127.0.0.1:5000/x/y", check_exit=2)
    assert "was made for other rows or another shard count" in result.stderr and "plan --shards 2" in result.stderr
    result = run_cli_in_process(*project, "nightly", "--plan", str(plan_file), "--registry", "127.0.0.1:5000/x/y", check_exit=2)
    assert "use it with --shard i/n" in result.stderr
    result = run_cli_in_process(*project, "nightly", "--shard", "3/2", "--registry", "127.0.0.1:5000/x/y", check_exit=2)
    assert "--shard '3/2' must be i/n" in result.stderr


# --------------------------------------------------------------------------------------------------- report merge

def catalog_entry(tag: str, digest: str) -> CatalogEntry:
    sbom = f"sbom/{tag}-20260102.cdx.json"
    return CatalogEntry(tag, "127.0.0.1:5000/ml/pytorch", digest, "sha256:" + "c" * 64,
                        [PinnedTag(f"{tag}-20260102", digest, "2026-01-02", sbom)], [tag], {"torch": "2.13.0"},
                        1000, 500, {"passed": 1}, {"status": "skipped"}, sbom, "2026-01-02T00:00:00Z",
                        "2026-01-02T00:00:00Z")


def row_digest(tag: str) -> str:
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


def write_shard(folder, rows: list[str], failed: bool = False) -> None:
    """What a `nightly --shard` runner uploads: reports/ (summary, build report, row folders) and catalog/."""
    summary = Summary("127.0.0.1:5000/ml/pytorch", "", rows, "2026-01-02T00:00:00Z", duration_s=60.0,
                      render="images is up to date", built=rows, published=[Published(t, f"{t}-20260102", row_digest(t)) for t in rows])
    if failed:
        summary.fail(rows[0], "verify", "checks failed: hygiene")
    (folder / "reports" / rows[0]).mkdir(parents=True)
    (folder / "reports" / rows[0] / "verify.json").write_text("{}")
    (folder / "reports" / "nightly-summary.json").write_text(json.dumps(summary.to_json()))
    BUILD_REPORT.write(folder / "reports", {t: asdict(BuildReportEntry(t, "built", duration=10.0))
                                            for t in [*rows, "stale-row-from-an-old-run"]})
    catalog = Catalog({t: catalog_entry(t, row_digest(t)) for t in rows})
    save(catalog, folder / "catalog", folder / "images")
    for t in rows:
        (folder / "catalog" / "sbom").mkdir(exist_ok=True)
        (folder / "catalog" / "sbom" / f"{t}-20260102.cdx.json").write_text("{}")


def test_report_merge_joins_the_shards_reports_catalogs_and_summaries(tmp_path):
    first, second = tmp_path / "shard-1", tmp_path / "shard-2"
    write_shard(first, ["2.13.0-cpu-runtime"])
    write_shard(second, ["2.13.0-cpu-devel"], failed=True)
    merged = tmp_path / "merged"
    merged.mkdir()
    copy_fixture_project(merged)
    write_lock(first / "bases.lock.json", {"debian:bookworm": LockedBase(
        "debian:bookworm", None, "sha256:" + "d" * 64, "local-only", "", "2026-01-02T00:00:00Z")})
    base = ("--matrix", str(merged / "matrix.yaml"), "--images", str(merged / "images"), "--reports", str(merged / "reports"))
    result = run_cli_in_process(*base, "report", "merge", str(first), str(second), "--catalog", str(merged / "catalog"))
    assert result.returncode == 1  # a shard had a failure

    summary = json.loads((merged / "reports" / "nightly-summary.json").read_text())
    assert summary["rows"] == ["2.13.0-cpu-devel", "2.13.0-cpu-runtime"] and summary["shard"] == "2 shards merged"
    assert summary["failed"] == [{"tag": "2.13.0-cpu-devel", "stage": "verify", "error": "checks failed: hygiene"}]
    assert "## Failures" in result.stdout
    report = json.loads((merged / "reports" / "build-report.json").read_text())
    assert [entry["tag"] for entry in report["images"]] == ["2.13.0-cpu-devel", "2.13.0-cpu-runtime"]
    assert (merged / "reports" / "2.13.0-cpu-runtime" / "verify.json").is_file()
    catalog = json.loads((merged / "catalog" / "catalog.json").read_text())["images"]
    assert sorted(catalog) == ["2.13.0-cpu-devel", "2.13.0-cpu-runtime"]
    assert (merged / "catalog" / "sbom" / "2.13.0-cpu-devel-20260102.cdx.json").is_file()
    assert "2.13.0-cpu-devel-20260102" in (merged / "images" / "README.md").read_text()
    lock = json.loads((merged / "bases.lock.json").read_text())["bases"]
    assert lock["debian:bookworm"]["image_id"] == "sha256:" + "d" * 64


def test_report_merge_refuses_overlapping_or_foreign_folders(tmp_path):
    write_shard(tmp_path / "a", ["2.13.0-cpu-runtime"])
    write_shard(tmp_path / "b", ["2.13.0-cpu-runtime"])
    project = ("--project", str(copy_fixture_project(tmp_path / "project").parent), "--reports", str(tmp_path / "out"))
    overlap = run_cli_in_process(*project, "report", "merge", str(tmp_path / "a"), str(tmp_path / "b"), check_exit=2)
    assert not (tmp_path / "out").exists()
    assert "row 2.13.0-cpu-runtime was also run by" in overlap.stderr
    (tmp_path / "empty").mkdir()
    foreign = run_cli_in_process(*project, "report", "merge", str(tmp_path / "empty"), check_exit=2)
    assert "not a shard's results" in foreign.stderr


def test_merged_summary_adds_up_the_parts():
    parts = [Summary("r", "1/2", ["a"], "2026-01-02T00:00:05Z", 30.0, built=["a"]),
             Summary("r", "2/2", ["b"], "2026-01-02T00:00:01Z", 50.0, skipped=["b"], unchanged=["b"],
                     bases_changed=[BaseChange("debian:bookworm", "x", "y", ("b",))]),
             Summary("r", "3/3", ["c"], "2026-01-02T00:00:01Z", 10.0, built=["c"],
                     bases_changed=[BaseChange("debian:bookworm", "x", "y", ("c",))])]
    merged = merge_summaries(parts)
    assert (merged.rows, merged.built, merged.skipped, merged.duration_s) == (["a", "b", "c"], ["a", "c"], ["b"], 50.0)
    assert merged.started_at == "2026-01-02T00:00:01Z" and merged.exit_code == 0
    assert merged.bases_changed == [BaseChange("debian:bookworm", "x", "y", ("b", "c"))]
