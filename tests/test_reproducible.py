"""Issue 47, the pure parts: the settled image config, the archive that loads it, the source date of a row, and
where two layers differ. The engine's part (two --no-cache builds, one image id) is tests/test_reproducible_build.py."""
import base64
import hashlib
import io
import json
import subprocess
import tarfile

from torchimages.build.reproducible import (
    INLINE_CACHE_KEY,
    UNCOMMITTED,
    UNCOMMITTED_EPOCH,
    config_bytes,
    iso_time,
    load_archive,
    saved_config,
    settled_config,
    source_date,
    stored_config,
)
from torchimages.trust.layer_diff import FileEntry, first_differing_file, first_differing_layer, layer_entries

BUILT = {
    "architecture": "amd64", "os": "linux", "created": "2026-11-27T21:10:34.123Z", "docker_version": "20.10.24",
    "container": "b92a1fa7903346", "container_config": {"Hostname": "b92a1fa79033", "Image": "sha256:c69e"},
    "config": {"Hostname": "vm", "Image": "sha256:c69e", "Env": ["PATH=/opt/venv/bin"], "Labels": {"a": "b"}},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:1", "sha256:2"]},
    "history": [{"created": "2026-11-27T21:09:00Z", "created_by": "RUN apt-get"},
                {"created": "2026-11-27T21:10:00Z", "created_by": "LABEL a=b", "empty_layer": True}],
}


def test_the_settled_config_keeps_what_the_inputs_made_and_drops_what_the_run_did():
    settled = settled_config(BUILT, "2026-11-20T10:00:00Z", 0)
    assert settled["created"] == "2026-11-20T10:00:00Z"
    assert [entry["created"] for entry in settled["history"]] == ["2026-11-20T10:00:00Z"] * 2
    assert [entry["created_by"] for entry in settled["history"]] == ["RUN apt-get", "LABEL a=b"]
    assert settled["history"][1]["empty_layer"] is True
    assert not {"container", "container_config", "docker_version"} & set(settled)
    assert settled["config"] == {"Env": ["PATH=/opt/venv/bin"], "Labels": {"a": "b"}}
    assert settled["rootfs"] == BUILT["rootfs"]


def test_two_runs_of_one_build_settle_to_the_same_bytes():
    other_run = {**BUILT, "created": "2026-11-28T03:00:00Z", "container": "ffff", "container_config": {"Hostname": "x"},
                 "config": {**BUILT["config"], "Hostname": "other", "Image": "sha256:dddd"},
                 "history": [{**entry, "created": "2026-11-28T03:00:00Z"} for entry in BUILT["history"]]}
    created = iso_time(1795000000)
    assert config_bytes(settled_config(BUILT, created, 0)) == config_bytes(settled_config(other_run, created, 0))
    changed_input = {**BUILT, "config": {**BUILT["config"], "Labels": {"a": "c"}}}
    assert config_bytes(settled_config(changed_input, created, 0)) != config_bytes(settled_config(BUILT, created, 0))


def test_the_base_s_history_entries_stay_as_the_base_has_them():
    """A published image is a cache source only where its history begins exactly as its base's (moby's
    isValidParent compares those entries whole, times included): a changed row's build on a fresh runner takes the
    published layers (tests/test_registry_login.py::test_a_changed_row_builds_on_the_layers_of_its_last_published_image)."""
    settled = settled_config(BUILT, "2026-11-20T10:00:00Z", 1)
    assert settled["history"][0] == BUILT["history"][0]
    assert settled["history"][1]["created"] == "2026-11-20T10:00:00Z"


def test_the_load_archive_holds_the_config_and_a_manifest_naming_every_layer():
    config = config_bytes(settled_config(BUILT, iso_time(0), 1))
    with tarfile.open(fileobj=io.BytesIO(load_archive(config, 2, "repo:tag"))) as archive:
        [manifest] = json.loads(archive.extractfile("manifest.json").read())
        assert archive.extractfile(manifest["Config"]).read() == config
    assert manifest["RepoTags"] == ["repo:tag"] and len(manifest["Layers"]) == 2


def save_stream(members: tuple[tuple[str, bytes], ...]) -> bytes:
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return stream.getvalue()


def test_the_config_is_read_from_a_save_stream_in_chunks():
    data = save_stream((("abc/layer.tar", b"x" * 5000), ("abc.json", json.dumps(BUILT).encode()),
                        ("manifest.json", json.dumps([{"Config": "abc.json"}]).encode())))
    assert saved_config(data[index:index + 777] for index in range(0, len(data), 777)) == BUILT


def test_the_config_is_read_from_the_oci_layout_docker_25_and_later_save():
    """Docker 26.1's `docker save` (Debian 13's dockerd, bench/engine_versions_bench.py, 2026-11-28): every blob is
    blobs/sha256/<hex>, the config among the layers, named by manifest.json; there was no <hex>.json, and settling
    failed with "held no image config" after the build."""
    config = json.dumps(BUILT).encode()
    data = save_stream((("blobs/sha256/" + "1" * 64, b"x" * 5000), ("blobs/sha256/" + "2" * 64, config),
                        ("index.json", b"{}"), ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                        ("manifest.json", json.dumps([{"Config": "blobs/sha256/" + "2" * 64}]).encode())))
    assert saved_config(iter([data])) == BUILT


def test_a_row_outside_git_or_edited_has_no_commit_and_the_fixed_date(tmp_path):
    assert source_date(tmp_path) == (source := source_date(tmp_path)) and source.commit == UNCOMMITTED
    assert source.epoch == UNCOMMITTED_EPOCH


def test_a_committed_row_carries_its_commit_and_its_date(tmp_path):
    git = lambda *args: subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,  # noqa: E731
                                       text=True).stdout.strip()
    git("init", "-q")
    row = tmp_path / "images" / "row"
    row.mkdir(parents=True)
    (row / "Dockerfile").write_text("FROM x\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "row", "--date", "@1790000000")
    source = source_date(row)
    assert source.commit == git("rev-parse", "HEAD") and source.epoch == int(git("log", "-1", "--format=%ct"))
    (row / "Dockerfile").write_text("FROM y\n")
    assert source_date(row).commit == UNCOMMITTED, "an edited Dockerfile is no commit's"


def layer(*files: tuple[str, bytes, int]) -> io.BytesIO:
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        for name, content, mtime in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), mtime
            archive.addfile(info, io.BytesIO(content))
    stream.seek(0)
    return stream


def test_the_first_differing_layer_and_file_are_named():
    assert first_differing_layer(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert first_differing_layer(["a", "b"], ["a", "b", "c"]) == 2
    assert first_differing_layer(["a"], ["a"]) is None
    same = [("a", b"1", 5), ("b", b"2", 5)]
    assert first_differing_file(layer_entries(layer(*same)), layer_entries(layer(*same))) is None
    differs = first_differing_file(layer_entries(layer(*same)), layer_entries(layer(("a", b"1", 5), ("b", b"3", 5))))
    assert differs.startswith("ours b: size 1") and "theirs b:" in differs and "content sha256:" in differs
    dated = first_differing_file(layer_entries(layer(*same)), layer_entries(layer(("a", b"1", 6), ("b", b"2", 5))))
    assert "ours a: size 1, mode 0o644, owner 0:0, time 5" in dated and "time 6" in dated
    extra = first_differing_file(layer_entries(layer(*same)),
                                 layer_entries(layer(("a", b"1", 5), ("c", b"", 5), ("b", b"2", 5))))
    assert extra.startswith("only in theirs: c:")


def test_a_file_entry_says_everything_compared():
    entry = FileEntry("usr/bin/x", 3, "0o755", "0:0", 946684800, "sha256:ab")
    assert entry.describe() == "usr/bin/x: size 3, mode 0o755, owner 0:0, time 946684800, content sha256:ab"


def test_buildkit_s_inline_cache_gets_the_image_s_time_and_keeps_everything_else():
    """Two BuildKit builds of the CPU runtime row had the same layers and configs but for the inline cache's
    createdAt per layer (Docker 20.10.24, 2026-11-28)."""
    records = [{"layers": [{"layer": 2, "createdAt": "2026-11-28T00:44:46.314666974Z"}], "digest": "sha256:17b3",
                "inputs": [[{"link": 20}]]}]
    built = {**BUILT, INLINE_CACHE_KEY: base64.b64encode(json.dumps(records).encode()).decode()}
    settled = settled_config(built, iso_time(0), 1)
    assert json.loads(base64.b64decode(settled[INLINE_CACHE_KEY])) == [
        {"layers": [{"layer": 2, "createdAt": iso_time(0)}], "digest": "sha256:17b3", "inputs": [[{"link": 20}]]}]
    assert settled_config({**BUILT, INLINE_CACHE_KEY: "not base64!"}, iso_time(0), 1)[INLINE_CACHE_KEY] == "not base64!"


class StoreOnly:
    """The one call stored_config makes of the engine: where it keeps its images."""

    def __init__(self, root, driver="overlay2"):
        self.root, self.driver = root, driver

    def info(self) -> dict:
        return {"DockerRootDir": str(self.root), "Driver": self.driver}


def test_the_engine_s_stored_config_is_read_only_where_its_id_vouches_for_it(tmp_path):
    """Issue 58: a BuildKit build's config read from the engine's store, not a save of the image. The file named by
    the id is taken only when its sha256 is that id; a missing folder, a short id, another driver's folder, a file
    whose bytes are not the config (a store we do not understand, a file changed on disk) all give None: the caller
    saves the image."""
    content = config_bytes(BUILT)
    image_hex = hashlib.sha256(content).hexdigest()
    store = tmp_path / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    store.mkdir(parents=True)
    (store / image_hex).write_bytes(content)
    assert stored_config(StoreOnly(tmp_path), f"sha256:{image_hex}") == BUILT
    assert stored_config(StoreOnly(tmp_path), image_hex[:12]) is None
    assert stored_config(StoreOnly(tmp_path, "vfs"), f"sha256:{image_hex}") is None
    assert stored_config(StoreOnly(tmp_path / "elsewhere"), f"sha256:{image_hex}") is None
    (store / image_hex).write_bytes(content.replace(b"amd64", b"arm64"))
    assert stored_config(StoreOnly(tmp_path), f"sha256:{image_hex}") is None
    other = b'["not a config"]'
    (store / hashlib.sha256(other).hexdigest()).write_bytes(other)
    assert stored_config(StoreOnly(tmp_path), f"sha256:{hashlib.sha256(other).hexdigest()}") is None
