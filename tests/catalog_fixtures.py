"""A catalog entry as publish writes one (test_catalog, test_multiarch)."""
from torchimages.publish.catalog import CatalogEntry, PinnedTag

REPOSITORY = "registry.example.com/ml/pytorch"
DIGEST_NEW, DIGEST_OLD = "sha256:" + "b" * 64, "sha256:" + "a" * 64


def entry(tag: str = "2.14.0-cuda13.0-cudnn9-runtime", aliases=("latest",), deprecated=None) -> CatalogEntry:
    return CatalogEntry(
        tag=tag, repository=REPOSITORY, digest=DIGEST_NEW, image_id="sha256:" + "c" * 64,
        pinned=[PinnedTag(f"{tag}-20260102", DIGEST_NEW, "2026-01-02", f"sbom/{tag}-20260102.cdx.json"),
                PinnedTag(f"{tag}-20260101", DIGEST_OLD, "2026-01-01", f"sbom/{tag}-20260101.cdx.json")],
        floating=[tag, *aliases], versions={"torch": "2.14.0", "cuda": "13.0.2", "cudnn": "9.24.0.43", "python": "3.12",
                                            "os": "ubuntu24.04", "flavor": "runtime"},
        size=7_400_000_000, download_size=3_100_000_000,
        checks={"passed": 6, "failed": 0, "skipped": 3, "skipped_checks": {}, "verified_at": "2026-01-02T01:00:00Z"},
        scan={"status": "skipped"}, sbom=f"sbom/{tag}-20260102.cdx.json", published_at="2026-01-02T02:00:00Z",
        updated_at="2026-01-02T02:00:00Z", deprecated=deprecated,
    )
