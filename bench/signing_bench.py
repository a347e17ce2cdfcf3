#!/usr/bin/env python3
"""What signing costs a publish: one row published unsigned, signed in cosign's classic format, and signed in both
formats (classic tags and Sigstore bundle referrers, publish's default), each into a fresh repository on the engine's
registry, in rotating order, `--runs` times; Markdown for docs/benchmarks-log.md.

Each publish is `build.py publish ROW` as a user runs it (a process of its own, Python start-up included): the push
of every layer (a fresh repository holds none of them), the scan, the SBOM, the catalog, and with `--signing-key` the
signature and the three attestations (SBOM, provenance, verification report) written to the registry. Reported: the
median wall time of each kind, the differences, and the bytes each format adds to the registry per digest.

Needs the project's engine (`make engine`, `source .engine/env`) and the row built and verified
(`build.py images ROW --wheelhouse wheelhouse`). Leaves nothing behind but the registry's shared blobs: its
repositories' manifests and its scratch folders are removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchimages.peers.registry import RegistryClient, RetryPolicy  # noqa: E402
from torchimages.peers.registry_access import registry_access  # noqa: E402
from torchimages.peers.registry_address import Registry  # noqa: E402
from torchimages.trust import bundles  # noqa: E402
from torchimages.trust.signatures import attestation_tag, signature_tag  # noqa: E402

KEY = ROOT / "tests" / "data" / "signing" / "first.key"  # a test key, never used for anything published
PASSWORD = "torchimages-test"


KINDS = ("unsigned", "classic", "both")


def publish(row: str, registry: str, catalog: Path, kind: str) -> float:
    """Wall seconds of one `build.py publish` into registry (a fresh repository)."""
    # The catalog and its page (images/README.md) go to scratch folders: the bench publishes nothing of the project's.
    command = [sys.executable, str(ROOT / "build.py"), "--images", str(catalog / "images"), "publish", row,
               "--registry", registry, "--catalog", str(catalog), *(["--signing-key", str(KEY), "--signature-format", kind] if kind != "unsigned" else [])]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ, "COSIGN_PASSWORD": PASSWORD})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"publish failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall


def artifact_bytes(client: RegistryClient, digest: str) -> int:
    """Bytes the .sig and .att tags add: their manifests, configs and layers."""
    total = 0
    for tag in (signature_tag(digest), attestation_tag(digest)):
        manifest = client.manifest(tag)
        total += len(manifest.body) + manifest.download_size
    return total


def referrer_bytes(client: RegistryClient, digest: str) -> int:
    """Bytes the bundle referrers add: the referrers index, each referrer's manifest, its empty config and bundle."""
    index = client.manifest(bundles.referrers_tag(digest))
    total = len(index.body)
    for entry in bundles.index_entries(index.body):
        manifest = client.manifest(entry["digest"])
        total += len(manifest.body) + manifest.download_size
    return total


def delete_repository(client: RegistryClient) -> None:
    for tag in client.tags():
        digest = client.digest_of(tag)
        if digest:
            client.delete(digest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default="2.13.0-cpu-runtime")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    host = os.environ.get("TORCHIMAGES_REGISTRY", "127.0.0.1:5000")
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    clients, added = [], {"classic": [], "both": []}
    with tempfile.TemporaryDirectory(prefix="signing-bench-") as scratch:
        for run in range(args.runs):
            for kind in KINDS[run % 3:] + KINDS[:run % 3]:  # each kind first once in three runs
                repository = f"bench-{uuid.uuid4().hex[:8]}/pytorch"
                catalog = Path(scratch) / f"catalog-{run}-{kind}"
                (catalog / "images").mkdir(parents=True)
                times[kind].append(publish(args.row, f"{host}/{repository}", catalog, kind))
                registry = Registry(host, repository)
                client = RegistryClient(registry, registry_access(registry), RetryPolicy(retries=1), lambda _: None)
                clients.append(client)
                if kind != "unsigned":
                    entry = json.loads((catalog / "catalog.json").read_text())["images"][args.row]
                    classic = artifact_bytes(client, entry["digest"])
                    added[kind].append(classic + (referrer_bytes(client, entry["digest"]) if kind == "both" else 0))
        for client in clients:
            delete_repository(client)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"### Signing's cost per image ({args.row}, {when}, {platform.node()}, {os.cpu_count()} cores)\n")
    print("| publish into a fresh repository | runs (s) | median | bytes added per digest |")
    print("|---|---|---|---|")
    for kind in KINDS:
        runs = ", ".join(f"{value:.1f}" for value in times[kind])
        size = f"{statistics.median(added[kind]):,.0f}" if kind in added else "-"
        print(f"| {kind} | {runs} | {medians[kind]:.1f} s | {size} |")
    print(f"\nClassic signing adds {medians['classic'] - medians['unsigned']:+.1f} s; both formats add "
          f"{medians['both'] - medians['classic']:+.1f} s more and "
          f"{statistics.median(added['both']) / statistics.median(added['classic']):.2f}x the classic bytes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
