"""startup-set's pure parts: which layer a file of the image comes from (verify/startup_set.py's layer_files, on
`docker save` streams written here in Docker 20.10's form and in the OCI layout's), and the probe's page ranges
(checks/startup_probe.py, on a file of this host)."""
import hashlib
import io
import json
import os
import tarfile

import pytest

from torchimages.checks import startup_probe
from torchimages.verify.startup_set import layer_files


def layer_tar(entries: dict[str, bytes | None]) -> bytes:
    """A layer: files (bytes) and folders (None)."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    return stream.getvalue()


def saved(layers: list[bytes], oci: bool) -> bytes:
    names = [f"blobs/sha256/{hashlib.sha256(layer).hexdigest()}" if oci else f"l{index}/layer.tar"
             for index, layer in enumerate(layers)]
    members = {**dict(zip(reversed(names), reversed(layers), strict=True)),  # the stream's order is not the image's
               "manifest.json": json.dumps([{"Config": "c.json", "Layers": names}]).encode(), "c.json": b"{}"}
    return layer_tar(members)


def test_each_file_is_the_topmost_layers_and_whiteouts_remove_lower_ones():
    layers = [layer_tar({"opt/": None, "opt/a": b"1", "opt/gone": b"2", "opt/dir/x": b"3", "etc/keep": b"4"}),
              layer_tar({"opt/a": b"5", "opt/.wh.gone": b"", "etc/.wh..wh..opq": b"", "etc/new": b"6"}),
              layer_tar({"opt/dir/.wh..wh..opq": b"", "opt/dir/y": b"7"})]
    for oci in (False, True):
        owners, listed = layer_files([saved(layers, oci)])
        assert owners == {"opt": 0, "opt/a": 1, "etc/new": 1, "opt/dir/y": 2}, oci
        assert [entry["diff_id"] for entry in listed] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"
                                                          for layer in layers]
        assert [entry["bytes"] for entry in listed] == [len(layer) for layer in layers]


def test_the_probe_reads_back_the_pages_it_just_read_and_not_the_ones_it_dropped(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(os.urandom(64 * startup_probe.PAGE))
    files = [(str(path), path.stat().st_size)]
    os.sync()
    startup_probe.evict(files)
    libc = startup_probe._libc()
    if startup_probe.resident_ranges(libc, str(path), files[0][1]):
        pytest.skip(f"{tmp_path} keeps every page in memory (tmpfs): no page cache to drop there")
    with open(path, "rb") as reading:
        os.posix_fadvise(reading.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no readahead around the one page read
        reading.seek(8 * startup_probe.PAGE)
        reading.read(100)
    assert startup_probe.resident_ranges(libc, str(path), files[0][1]) == [
        [8 * startup_probe.PAGE, 9 * startup_probe.PAGE]]
