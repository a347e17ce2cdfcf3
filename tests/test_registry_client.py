"""The registry client's own logic, with skopeo's runs recorded instead of made (the real pushes are in
tests/test_publish.py, on the engine's registry)."""
import subprocess
from pathlib import Path

import pytest

from torchimages.files import brief
from torchimages.peers import registry
from torchimages.peers.registry import RegistryClient, RegistryError, RetryPolicy
from torchimages.peers.registry_access import registry_access
from torchimages.peers.registry_address import image_registry


def caches_of_skopeo_runs(monkeypatch) -> list[str]:
    """The blob-info cache folder (XDG_DATA_HOME) of each skopeo run, recorded instead of run."""
    caches: list[str] = []

    def skopeo(command, env, **_):
        caches.append(env["XDG_DATA_HOME"])
        if "--digestfile" in command:
            Path(command[command.index("--digestfile") + 1]).write_text("sha256:" + "a" * 64)
        return subprocess.CompletedProcess(command, 0, b'{"Tags": []}', b"")

    monkeypatch.setattr(registry.subprocess, "run", skopeo)
    return caches


def test_the_pushes_of_one_run_share_a_blob_info_cache_that_goes_with_the_run(monkeypatch, tmp_path):
    """A devel image's push finds the runtime layers it shares through the cache the runtime's push wrote, instead
    of compressing them again; no other skopeo run sees that cache, and it is removed when the run ends."""
    caches = caches_of_skopeo_runs(monkeypatch)
    client = client_for(tmp_path)
    with client.pushes_share_a_cache():
        client.push("sha256:" + "1" * 64, "runtime", None)
        client.tags()
        client.push("sha256:" + "2" * 64, "devel", None)
    client.push("sha256:" + "3" * 64, "later", None)
    runtime, question, devel, later = caches
    assert runtime == devel, "the run's second push had a cache of its own"
    assert question != runtime and later != runtime, "a run outside the pushes' shared the cache"
    assert not Path(runtime).exists(), "the run's cache was left behind"


def test_a_kept_cache_serves_the_next_run_and_each_compression_has_its_own(monkeypatch, tmp_path):
    """Kept between runs (last night's unchanged layers are not compressed again), but never shared between
    compressions: skopeo 1.9 offers a cached zstd blob to a gzip push (issue 20's trap)."""
    caches = caches_of_skopeo_runs(monkeypatch)
    kept = tmp_path / "cache" / "push-blob-info"
    for compression in ("gzip", "zstd", "gzip"):  # three runs, each with a client of its own as each command makes
        client = client_for(tmp_path)
        with client.pushes_share_a_cache(kept):
            client.push("sha256:" + "1" * 64, "runtime", None, compression=compression)
    first_gzip, zstd, second_gzip = caches
    assert first_gzip == second_gzip == str(kept / "gzip") and zstd == str(kept / "zstd")
    assert Path(first_gzip).is_dir() and Path(zstd).is_dir()


def test_a_cache_folder_that_cannot_be_made_is_said_and_the_run_keeps_its_own(monkeypatch, tmp_path):
    caches = caches_of_skopeo_runs(monkeypatch)
    (tmp_path / "file").write_text("not a folder")
    said: list[str] = []
    client = RegistryClient(client_for(tmp_path).registry, client_for(tmp_path).access, RetryPolicy(retries=0),
                            said.append)
    with client.pushes_share_a_cache(tmp_path / "file" / "push-blob-info"):
        client.push("sha256:" + "1" * 64, "runtime", None)
    assert not caches[0].startswith(str(tmp_path / "file")) and not Path(caches[0]).exists()
    assert said == [f"pushes' blob-info cache: {brief(str(tmp_path / 'file' / 'push-blob-info'))}: Not a directory; "
                    "this run keeps its own"]


def test_the_kept_cache_is_in_the_users_cache_folder():
    assert registry.publish_cache_folder({"XDG_CACHE_HOME": "/c"}) == Path("/c/torchimages/push-blob-info")
    assert registry.publish_cache_folder({}) == Path.home() / ".cache" / "torchimages" / "push-blob-info"


def recording_skopeo(monkeypatch, stderr: bytes = b"", returncode: int = 0) -> list[list[str]]:
    """skopeo's runs recorded, each answering returncode and stderr."""
    commands: list[list[str]] = []

    def skopeo(command, **_):
        commands.append(command)
        if returncode == 0 and "--digestfile" in command:
            Path(command[command.index("--digestfile") + 1]).write_text("sha256:" + "a" * 64)
        return subprocess.CompletedProcess(command, returncode, b"", stderr)

    monkeypatch.setattr(registry.subprocess, "run", skopeo)
    return commands


def client_for(tmp_path) -> RegistryClient:
    address, _ = image_registry("127.0.0.1:5999/ml/pytorch:1")
    return RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)


def test_a_push_spools_the_image_where_tmpdir_says(monkeypatch, tmp_path):
    """skopeo 1.9.3 writes an engine's image to a temporary file in /var/tmp whatever TMPDIR says (seen here); only its
    --tmpdir moves it, so TMPDIR is passed on, before the subcommand (a global option)."""
    commands = recording_skopeo(monkeypatch)
    monkeypatch.delenv("TMPDIR", raising=False)
    client_for(tmp_path).push("sha256:" + "1" * 64, "runtime", None)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "big"))
    client_for(tmp_path).push("sha256:" + "1" * 64, "runtime", None)
    without, with_tmpdir = commands
    assert "--tmpdir" not in without
    assert with_tmpdir[with_tmpdir.index("--tmpdir") + 1] == str(tmp_path / "big")
    assert with_tmpdir.index("--tmpdir") < with_tmpdir.index("copy")


def test_a_full_disk_is_said_with_the_folder_and_not_retried(monkeypatch, tmp_path):
    """What skopeo said when a CI runner's disk filled during a publish (its words mention a 'temporary file', which
    was taken for a transient failure and retried three times)."""
    recording_skopeo(monkeypatch, returncode=1, stderr=(
        b'time="2026-11-26T20:56:01Z" level=fatal msg="initializing source docker-daemon:sha256:' + b"5" * 64 +
        b': copying contents to temporary file \\"/var/tmp/docker-tar1148341603\\": write /var/tmp/docker-tar1148341603:'
        b' no space left on device"\n'))
    monkeypatch.delenv("TMPDIR", raising=False)
    with pytest.raises(RegistryError) as raised:
        client_for(tmp_path).push("sha256:" + "5" * 64, "runtime", None)
    assert not raised.value.transient
    assert "no space left on device" in str(raised.value)
    assert "a temporary file as large as the image, in /var/tmp: free space there, or set TMPDIR" in str(raised.value)
    assert registry.is_transient("Temporary failure in name resolution")
    assert registry.is_transient("503 Service Unavailable: temporarily overloaded")
