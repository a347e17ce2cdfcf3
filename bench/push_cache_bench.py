#!/usr/bin/env python3
"""Publishing's pushes with a blob-info cache kept between runs against one per run (issue 27); Markdown for
docs/benchmarks-log.md.

For each built row given (default the CPU runtime row), the product's own push (registry.RegistryClient.push: skopeo,
gzip, digests precomputed) into a repository of this run's own on the engine's registry:
1. the first night: an empty kept cache (every layer compressed and uploaded);
2. the next night, the same image under a new tag in the same repository (a republish whose layers are all
   unchanged: the least a nightly's push costs), with a cache of the run's own (what publishing did before) and with
   the kept one;
3. the same image into another repository of the registry (a second name for a row, or the test suite's
   repositories), with a cache of its own and, into a third, with the kept one (its layers are mounted from the first).

Needs the project's engine (`make engine`, `source .engine/env`) and the rows built (`build.py build ROW`). Leaves
nothing behind: the repositories' manifests are deleted and the kept cache is removed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools import localengine  # noqa: E402
from torchimages.build.builder import local_name  # noqa: E402
from torchimages.matrix.load import load_matrix, select  # noqa: E402
from torchimages.peers import engine  # noqa: E402
from torchimages.peers.registry import RegistryClient, RetryPolicy  # noqa: E402
from torchimages.peers.registry_access import registry_access  # noqa: E402
from torchimages.peers.registry_address import image_registry  # noqa: E402


def timed_push(image_id: str, reference: str, kept: Path | None) -> float:
    registry, tag = image_registry(reference)
    client = RegistryClient(registry, registry_access(registry), RetryPolicy(retries=0), lambda _: None)
    started = time.monotonic()
    with client.pushes_share_a_cache(kept):
        client.push(image_id, tag, os.environ.get("DOCKER_HOST"))
    return time.monotonic() - started


def delete_tags(host: str, repository: str) -> None:
    with urllib.request.urlopen(f"http://{host}/v2/{repository}/tags/list", timeout=10) as response:
        tags = json.loads(response.read())["tags"] or []
    for tag in tags:
        request = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{tag}", method="HEAD",
                                         headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            digest = response.headers["Docker-Content-Digest"]
        urllib.request.urlopen(urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{digest}",
                                                      method="DELETE"), timeout=10).close()


def bench_row(tag: str, host: str, client) -> list[tuple[str, float]]:
    spec = select(load_matrix(ROOT / "matrix.yaml").specs, [tag])[0]
    image = client.images.get(local_name(spec))
    run = uuid.uuid4().hex[:8]
    first, second, third = f"bench-{run}/first", f"bench-{run}/second", f"bench-{run}/third"
    rows = []
    with tempfile.TemporaryDirectory(prefix="push-cache-bench-") as folder:
        kept = Path(folder)
        try:
            rows.append(("first night, empty kept cache", timed_push(image.id, f"{host}/{first}:night1", kept)))
            rows.append(("next night, same repository: the run's own cache (before)",
                         timed_push(image.id, f"{host}/{first}:night2", None)))
            rows.append(("next night, same repository: the kept cache",
                         timed_push(image.id, f"{host}/{first}:night3", kept)))
            rows.append(("another repository: the run's own cache (before)",
                         timed_push(image.id, f"{host}/{second}:a", None)))
            rows.append(("another repository: the kept cache", timed_push(image.id, f"{host}/{third}:a", kept)))
        finally:
            for repository in (first, second, third):
                try:
                    delete_tags(host, repository)
                except OSError:
                    pass
    return [(f"{tag} ({image.attrs['Size'] / 1e9:.2f} GB): {what}", seconds) for what, seconds in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", default=["2.13.0-cpu-runtime"])
    args = parser.parse_args()
    info = localengine.ensure_engine()
    client = engine.client()
    started = datetime.now(timezone.utc)
    rows = [row for tag in args.rows for row in bench_row(tag, info.registry, client)]
    print(f"\n{platform.node()}, {os.cpu_count()} cores, from {started:%Y-%m-%d %H:%M} UTC\n")
    print("| push | seconds |\n|---|---|")
    for what, seconds in rows:
        print(f"| {what} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
