"""The registry client's own logic, with skopeo's runs recorded instead of made (the real pushes are in
tests/test_publish.py, on the engine's registry)."""
import subprocess
from pathlib import Path

from torchimages import registry
from torchimages.registry import RegistryClient, RetryPolicy, image_registry, registry_access


def test_the_pushes_of_one_run_share_a_blob_info_cache_that_goes_with_the_run(monkeypatch, tmp_path):
    """A devel image's push finds the runtime layers it shares through the cache the runtime's push wrote, instead
    of compressing them again; no other skopeo run sees that cache, and it is removed when the run ends."""
    caches: list[str] = []

    def skopeo(command, env, **_):
        caches.append(env["XDG_DATA_HOME"])
        if "--digestfile" in command:
            Path(command[command.index("--digestfile") + 1]).write_text("sha256:" + "a" * 64)
        return subprocess.CompletedProcess(command, 0, b'{"Tags": []}', b"")

    monkeypatch.setattr(registry.subprocess, "run", skopeo)
    address, _ = image_registry("127.0.0.1:5999/ml/pytorch:1")
    client = RegistryClient(address, registry_access(address, config_dir=tmp_path), RetryPolicy(retries=0), print)
    with client.pushes_share_a_cache():
        client.push("sha256:" + "1" * 64, "runtime", None)
        client.tags()
        client.push("sha256:" + "2" * 64, "devel", None)
    client.push("sha256:" + "3" * 64, "later", None)
    runtime, question, devel, later = caches
    assert runtime == devel, "the run's second push had a cache of its own"
    assert question != runtime and later != runtime, "a run outside the pushes' shared the cache"
    assert not Path(runtime).exists(), "the run's cache was left behind"
