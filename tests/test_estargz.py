"""eStargz layers (torchimages/publish/estargz.py, issue 58): an ordinary tar+gzip to a plain reader, a TOC whose
offsets hold what it says, the prefetch files before the landmark, the same bytes every time; checked by hand against
the spec's footer, by GNU tar, and by ctr-remote (Debian's stargz-snapshotter) where it can run. And the lazy-pull
bench's blob server and clients (bench/lazy_pull_bench.py) on a small layer."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import shutil
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest

from torchimages.publish import estargz, estargz_reader

CHUNK = estargz.CHUNK_SIZE
BIG = CHUNK * 2 + 12345  # three chunks, the last a short one
NON_ASCII = "opt/naïve-文字.txt"
LONG = "opt/" + "deep/" * 25 + "file.txt"  # past ustar's 100-byte name field
XATTRS = {"SCHILY.xattr.user.note": "hi", "SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}


def _add(archive: tarfile.TarFile, name: str, data: bytes | None = None, **fields) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.mode = 1_700_000_000, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    archive.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer_bytes() -> tuple[bytes, dict[str, bytes]]:
    """A layer with every kind of entry a CUDA image's layers hold, and the contents of its regular files."""
    rng = random.Random(58)
    contents = {"opt/small.txt": b"hello, layer\n", "opt/mid.bin": rng.randbytes(100_000),
                "opt/lib/big.so": rng.randbytes(BIG // 2) + b"\x00" * (BIG - BIG // 2), "opt/empty": b"",
                "opt/.wh.gone": b"", "opt/lib/.wh..wh..opq": b"", NON_ASCII: "zeichen ✓\n".encode(),
                "opt/odd": b"#!/bin/sh\n", LONG: b"long name\n", "opt/caps": b"\x7fELF",
                "opt/fraction": b"sub-second mtime\n"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _add(archive, "opt", type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "opt/lib", type=tarfile.DIRTYPE, mode=0o755)
        for name in ("opt/small.txt", "opt/mid.bin", "opt/lib/big.so", "opt/empty", "opt/.wh.gone",
                     "opt/lib/.wh..wh..opq", NON_ASCII):
            _add(archive, name, contents[name])
        _add(archive, "opt/odd", contents["opt/odd"], mode=0o4751, uid=1001, gid=2002, uname="svc", gname="ops")
        _add(archive, "opt/lib/libbig.so.1", type=tarfile.SYMTYPE, linkname="big.so", mode=0o777)
        _add(archive, "opt/hard", type=tarfile.LNKTYPE, linkname="opt/mid.bin")
        _add(archive, "opt/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)
        _add(archive, "opt/pipe", type=tarfile.FIFOTYPE)
        _add(archive, LONG, contents[LONG])
        _add(archive, "opt/caps", contents["opt/caps"], pax_headers=dict(XATTRS))
        _add(archive, "opt/fraction", contents["opt/fraction"], mtime=1_700_000_000.25)
    return out.getvalue(), contents


def _gnu_layer_bytes() -> bytes:
    """A GNU-format tar (long names in ././@LongLink entries) named from "./", with a name given twice."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        _add(archive, "./", type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "./usr/", type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "./usr/" + "x" * 150, b"a long GNU name")
        _add(archive, "./usr/link", type=tarfile.SYMTYPE, linkname="/usr/" + "y" * 150)
        _add(archive, "./usr/twice", b"first" * 3000)
        _add(archive, "./usr/twice", b"second")  # the last one is the file: it keeps that entry's place
        _add(archive, "./usr/g", b"g" * 10)
    return out.getvalue()


@pytest.fixture(scope="module")
def layer() -> tuple[bytes, dict[str, bytes]]:
    return _layer_bytes()


@pytest.fixture(scope="module")
def converted(layer) -> tuple[bytes, estargz.Converted]:
    return estargz.convert_bytes(layer[0], ["/opt/hard", "opt/lib/big.so", "/not/here"])


def _members(tar: bytes) -> dict[str, tuple]:
    """Each entry of a tar as a plain reader sees it: its header's facts and its content."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for info in archive:
            content = archive.extractfile(info).read() if info.isreg() else None  # type: ignore[union-attr]
            found[info.name] = (info.type, info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime,
                                info.linkname, info.devmajor, info.devminor, content,
                                {key: value for key, value in info.pax_headers.items() if key.startswith("SCHILY.")})
    return found


def _raw_toc(blob: bytes) -> dict:
    """The TOC read by hand as the spec gives it, not through the module's reader: the footer's extra field names
    the TOC's gzip member, whose tar entry stargz.index.json holds the JSON."""
    tail = blob[-estargz.FOOTER_SIZE:]
    extra_length, = struct.unpack("<H", tail[10:12])
    offset = int(tail[16:32], 16)
    assert (tail[:4], extra_length, tail[12:14], tail[32:38]) == (b"\x1f\x8b\x08\x04", 26, b"SG", b"STARGZ")
    member = zlib.decompressobj(31).decompress(blob[offset:-estargz.FOOTER_SIZE])
    with tarfile.open(fileobj=io.BytesIO(member)) as archive:
        first = archive.next()
        assert first is not None and first.name == "stargz.index.json"
        text = archive.extractfile(first).read()  # type: ignore[union-attr]
    return {"json": json.loads(text), "digest": "sha256:" + hashlib.sha256(text).hexdigest(), "offset": offset}


def test_a_plain_gunzip_gives_the_layer_entries_plus_the_landmark_and_toc(layer, converted):
    tar, _ = layer
    blob, facts = converted
    plain = gzip.decompress(blob)  # the members, one after another, are one ordinary gzip stream
    before, after = _members(tar), _members(plain)
    assert set(after) == set(before) | {".prefetch.landmark", "stargz.index.json"}
    assert {name: after[name] for name in before} == before
    assert after[".prefetch.landmark"][10] == b"\x0f"
    assert facts.diff_id == "sha256:" + hashlib.sha256(plain).hexdigest()
    assert facts.uncompressed_size == len(plain)
    assert (facts.digest, facts.size) == ("sha256:" + hashlib.sha256(blob).hexdigest(), len(blob))
    assert facts.annotations() == {"containerd.io/snapshot/stargz/toc.digest": facts.toc_digest,
                                   "io.containers.estargz.uncompressed-size": str(len(plain))}


@pytest.mark.skipif(shutil.which("tar") is None, reason="no GNU tar")
def test_gnu_tar_unpacks_the_blob_as_any_tar_gz(layer, converted, tmp_path):
    blob, _ = converted
    (tmp_path / "layer.tar.gz").write_bytes(blob)
    (tmp_path / "root").mkdir()
    subprocess.run(["tar", "-xzf", str(tmp_path / "layer.tar.gz"), "-C", str(tmp_path / "root"), "--no-same-owner",
                    "--exclude=opt/null"], check=True, capture_output=True)  # mknod is no test's business
    for name, content in layer[1].items():
        assert (tmp_path / "root" / name).read_bytes() == content, name
    assert (tmp_path / "root/opt/lib/libbig.so.1").readlink() == Path("big.so")
    assert (tmp_path / "root/opt/hard").stat().st_ino == (tmp_path / "root/opt/mid.bin").stat().st_ino


def test_b_every_toc_entry_points_at_its_content(layer, converted):
    tar, contents = layer
    blob, facts = converted
    toc = estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob), facts.toc_digest)
    assert (toc.digest, toc.offset) == (facts.toc_digest, facts.toc_offset)
    with pytest.raises(ValueError, match="not the one its descriptor names"):
        estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob), "sha256:" + "0" * 64)
    names = {entry.name for entry in toc.entries}
    assert {estargz.clean_name(info.name) for info in tarfile.open(fileobj=io.BytesIO(tar))} <= names
    for name, content in contents.items():
        chunks = toc.data(name)
        assert b"".join(estargz_reader.chunk_content(blob[chunk.offset:], chunk) for chunk in chunks) == content, name
        assert toc.lookup(name).digest == "sha256:" + hashlib.sha256(content).hexdigest()  # type: ignore[union-attr]
        for chunk in chunks:  # each payload starts a gzip member of its own, written with nothing of this machine's
            assert blob[chunk.offset:chunk.offset + 10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    assert [(chunk.type, chunk.chunk_offset, chunk.chunk_size) for chunk in toc.data("opt/lib/big.so")] == [
        ("reg", 0, CHUNK), ("chunk", CHUNK, CHUNK), ("chunk", 2 * CHUNK, BIG - 2 * CHUNK)]
    raw = {(entry["name"], entry.get("chunkOffset", 0)): entry for entry in _raw_toc(blob)["json"]["entries"]}
    assert raw[("opt/lib/big.so", 2 * CHUNK)].get("chunkSize", 0) == 0  # the last chunk: "to the end of the file"
    odd = raw[("opt/odd", 0)]
    assert (odd["mode"], odd["uid"], odd["gid"], odd["userName"], odd["groupName"]) == (0o4751, 1001, 2002, "svc",
                                                                                        "ops")
    assert raw[("opt/fraction", 0)]["modtime"] == "2023-11-14T22:13:20Z"
    assert raw[("opt/null", 0)]["devMinor"] == 3 and raw[("opt/lib/libbig.so.1", 0)]["linkName"] == "big.so"
    assert raw[("opt/caps", 0)]["xattrs"] == {"security.capability": "AQAAAg==", "user.note": "aGk="}
    assert raw[("opt/", 0)]["type"] == "dir" and raw[(NON_ASCII, 0)]["size"] == len(contents[NON_ASCII])


def test_b_the_ranges_a_lazy_puller_fetches(converted):
    blob, _ = converted
    toc = estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob))
    tail = (toc.offset, len(blob) - toc.offset)
    assert toc.ranges([]) == [tail] and toc.ranges(["/not/here", "opt/empty"]) == [tail]
    big = toc.data("opt/lib/big.so")
    # A link resolves to its target's members; a file's chunks are contiguous, so one range.
    assert toc.ranges(["/opt/lib/libbig.so.1"]) == [(big[0].offset, big[-1].next_offset - big[0].offset), tail]
    mid = toc.data("opt/mid.bin")
    assert toc.ranges(["opt/hard"]) == toc.ranges(["opt/mid.bin"]) == [
        (mid[0].offset, mid[0].next_offset - mid[0].offset), tail]


def test_c_the_prefetch_files_come_first_then_the_landmark(converted):
    blob, facts = converted
    toc = estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob))
    order = [entry.name for entry in toc.entries if entry.type != "chunk"]
    # A file comes after the directories above it, a hard link after its target (build.go's moveRec).
    assert order[:6] == ["opt", "opt/mid.bin", "opt/hard", "opt/lib", "opt/lib/big.so", ".prefetch.landmark"]
    assert facts.prefetched == ("opt/", "opt/mid.bin", "opt/hard", "opt/lib/", "opt/lib/big.so")
    assert facts.missed == ("/not/here",)
    assert order[6:] == ["opt/small.txt", "opt/empty", "opt/.wh.gone", "opt/lib/.wh..wh..opq", NON_ASCII, "opt/odd",
                         "opt/lib/libbig.so.1", "opt/null", "opt/pipe", estargz.clean_name(LONG), "opt/caps",
                         "opt/fraction"]
    end = toc.prefetch_end()
    assert end == toc.lookup(".prefetch.landmark").offset  # type: ignore[union-attr]
    assert all(chunk.next_offset <= end for name in ("opt/mid.bin", "opt/lib/big.so") for chunk in toc.data(name))
    assert all(entry.offset > end for entry in toc.entries if entry.has_data and entry.offset != end
               and entry.name not in ("opt/mid.bin", "opt/lib/big.so"))


@pytest.mark.parametrize("prefetch", [[], ["/nothing/of/this/layer"]])
def test_c_without_a_prefetch_file_the_no_prefetch_landmark_opens_the_blob(layer, prefetch):
    blob, facts = estargz.convert_bytes(layer[0], prefetch)
    toc = estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob))
    assert toc.entries[0].name == ".no.prefetch.landmark" and toc.prefetch_end() == 0
    assert facts.prefetched == () and facts.missed == tuple(prefetch)


def test_d_the_same_layer_gives_the_same_bytes(layer, converted, tmp_path):
    tar, _ = layer
    blob, facts = converted
    (tmp_path / "layer.tar").write_bytes(tar)
    again = estargz.convert(tmp_path / "layer.tar", tmp_path / "layer.esgz", ["/opt/hard", "opt/lib/big.so"])
    assert (tmp_path / "layer.esgz").read_bytes() == blob and again.digest == facts.digest

    class Pipe(io.BytesIO):  # a stream that cannot seek (a pipe, an HTTP body): spooled, the same bytes
        def seekable(self) -> bool:
            return False

    out = io.BytesIO()
    assert estargz.convert(Pipe(tar), out, ["opt/hard", "/opt/lib/big.so"]).digest == facts.digest
    assert out.getvalue() == blob


def test_e_the_footer_is_the_spec_s_51_bytes_and_names_the_toc(converted):
    blob, facts = converted
    # docs/estargz.md, "Footer", written out byte by byte.
    spec = (b"\x1f\x8b\x08\x04" + b"\x00" * 4 + b"\x00\xff" + struct.pack("<H", 26) + b"SG" + struct.pack("<H", 22)
            + b"%016xSTARGZ" % facts.toc_offset + b"\x01\x00\x00\xff\xff" + b"\x00" * 8)
    assert len(spec) == 51 and blob[-51:] == spec
    raw = _raw_toc(blob)
    assert raw["offset"] == facts.toc_offset and raw["digest"] == facts.toc_digest
    assert raw["json"]["version"] == 1
    assert [entry["name"] for entry in raw["json"]["entries"]][-1] == "opt/fraction"  # the TOC lists not itself


def test_a_blob_that_is_no_estargz_is_refused(layer, converted):
    plain = gzip.compress(layer[0])
    with pytest.raises(ValueError, match="footer"):
        estargz_reader.read_toc(lambda start, length: plain[start:start + length], len(plain))
    with pytest.raises(ValueError, match="51 bytes"):
        estargz.parse_footer(b"short")
    blob = converted[0]
    small = estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob)).data("opt/small.txt")[0]
    with pytest.raises(ValueError, match="chunkDigest"):  # a chunk that is not the one the (verified) TOC names
        estargz_reader.chunk_content(blob[small.offset:], small._replace(chunk_digest="sha256:" + "0" * 64))
    lying = estargz.footer(10**9)  # a TOC offset past the blob's end
    with pytest.raises(ValueError, match="outside"):
        estargz_reader.read_toc(lambda start, length: (plain + lying)[start:start + length], len(plain) + len(lying))


# Cuts (publish --lazy's chunk boundaries where a start's reads begin and end): chunks of any size, same files.


def test_chunk_spans_start_a_chunk_at_each_cut_and_a_chunk_size_after_the_last():
    assert estargz.chunk_spans(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert estargz.chunk_spans(10, 4, [3, 5, 5, 0, 10, 99]) == [(0, 3), (3, 2), (5, 4), (9, 1)]  # outside: ignored
    assert estargz.chunk_spans(0, 4, [1]) == []
    assert estargz.chunk_spans(8, 4) == [(0, 4), (4, 4)]


CUTS = [100, 5000, CHUNK + 7]  # in opt/lib/big.so: chunks of 100, 4,900, CHUNK - 4,993, then as before


@pytest.fixture(scope="module")
def cut(layer) -> tuple[bytes, estargz.Converted]:
    return estargz.convert_bytes(layer[0], ["/opt/hard"], cuts={"/opt/lib/big.so": CUTS, "/not/here": [5]})


def test_a_cut_file_is_chunked_at_its_cuts_and_reads_back_whole(layer, cut):
    blob, facts = cut
    assert _members(gzip.decompress(blob)).keys() >= _members(layer[0]).keys()
    assert {name: fact for name, fact in _members(gzip.decompress(blob)).items() if name in _members(layer[0])} == \
        _members(layer[0])
    toc = estargz_reader.read_toc(lambda start, length: blob[start:start + length], len(blob), facts.toc_digest)
    chunks = toc.data("/opt/lib/big.so")
    assert [(chunk.chunk_offset, chunk.chunk_size) for chunk in chunks] == [
        (0, 100), (100, 4900), (5000, CHUNK + 7 - 5000), (CHUNK + 7, CHUNK), (2 * CHUNK + 7, BIG - 2 * CHUNK - 7)]
    raw = [entry for entry in _raw_toc(blob)["json"]["entries"] if entry["name"] == "opt/lib/big.so" or
           entry.get("type") == "chunk"]
    assert [entry.get("chunkSize", 0) for entry in raw] == [100, 4900, CHUNK + 7 - 5000, CHUNK, 0]  # 0: to the end
    assert b"".join(estargz_reader.chunk_content(blob[chunk.offset:chunk.next_offset], chunk) for chunk in chunks) \
        == layer[1]["opt/lib/big.so"]
    # No other file is cut: the other entries are the uncut blob's.
    plain_blob, plain = estargz.convert_bytes(layer[0], ["/opt/hard"])
    plain_toc = estargz_reader.read_toc(lambda start, length: plain_blob[start:start + length], len(plain_blob))
    assert [chunk.chunk_size for chunk in plain_toc.data("/opt/mid.bin")] == \
        [chunk.chunk_size for chunk in toc.data("/opt/mid.bin")]
    assert estargz.convert_bytes(layer[0], ["/opt/hard"], cuts={})[1].digest == plain.digest


# ctr-remote (Go's estargz package, the reader stargz-snapshotter mounts layers with) reads blobs only out of a
# containerd's content store: devtools/stargz.py starts a private one (never the engine's).


@pytest.fixture(scope="module")
def containerd():
    from devtools import stargz

    reason = stargz.cannot_check()
    if reason:
        pytest.skip(reason)
    with stargz.private_containerd() as running:
        yield running


@pytest.mark.parametrize("kind", ["chunks of the chunk size", "cut"])
def test_ctr_remote_reads_our_toc(containerd, converted, cut, kind):
    blob, facts = converted if kind == "chunks of the chunk size" else cut
    assert containerd.toc_digest(blob) == facts.toc_digest
    assert containerd.dump_toc(blob) == _raw_toc(blob)["json"]


@pytest.mark.parametrize("kind", ["every entry kind", "GNU names from ./"])
def test_ctr_remote_converts_the_layer_into_the_same_entries(containerd, layer, kind):
    tar, prefetch = (layer[0], ["/opt/hard", "opt/lib/big.so", "/not/here"]) if kind == "every entry kind" else (
        _gnu_layer_bytes(), ["/usr/g", "usr/" + "x" * 150])
    blob, facts = estargz.convert_bytes(tar, prefetch)
    theirs, descriptor = containerd.convert(tar, prefetch)
    assert descriptor["annotations"]["io.containers.estargz.uncompressed-size"] == str(facts.uncompressed_size)

    def without_offsets(data: bytes) -> list[dict]:
        return [{key: value for key, value in entry.items() if key != "offset"}
                for entry in _raw_toc(data)["json"]["entries"]]

    # The same entries, fields, chunks and order; only the members' offsets differ (Go's deflate is not zlib's).
    assert without_offsets(theirs) == without_offsets(blob)
    ours, go = _members(gzip.decompress(blob)), _members(gzip.decompress(theirs))
    assert {name: fact for name, fact in go.items() if name != "stargz.index.json"} == {
        name: fact for name, fact in ours.items() if name != "stargz.index.json"}


# The lazy-pull bench's parts, on a layer of a few MB through a fast link.


def test_the_bench_pulls_fully_and_lazily_to_the_same_files(tmp_path):
    from bench import lazy_pull_bench as bench

    prefetch, demand = bench.synthetic_layer(tmp_path / "layer.tar", total=3 << 20, seed=1)
    facts = bench.measure([tmp_path / "layer.tar"], prefetch, demand, tmp_path, rate=1e9, latency_s=0)
    for path in [*prefetch, *demand]:
        assert (tmp_path / "lazy" / path).read_bytes() == (tmp_path / "full" / path).read_bytes(), path
    lazy_files = {path.relative_to(tmp_path / "lazy") for path in (tmp_path / "lazy").rglob("*") if path.is_file()}
    assert lazy_files == {Path(path) for path in [*prefetch, *demand]}  # nothing else was fetched
    assert 0 < facts["B"] < 0.5 and facts["lazy_requests"] == 2 + 1 + len(demand)
    assert facts["full_skipped_entries"] == 0


def test_the_full_pull_checks_each_blob_s_digest_and_diff_id_as_an_engine_does(tmp_path):
    """The full side does what dockerd does with a layer it pulls: the blob's digest checked as it arrives, the
    diff id of the tar it applies; a mismatch stops it."""
    from bench import lazy_pull_bench as bench

    prefetch, _ = bench.synthetic_layer(tmp_path / "layer.tar", total=1 << 20, seed=3)
    blobs = bench.convert_layers([tmp_path / "layer.tar"], prefetch, tmp_path, CHUNK)
    assert blobs.digests["0.tar.gz"][1] == bench.file_digest(tmp_path / "layer.tar")
    with bench.serving(blobs.paths(), rate=1e9, latency_s=0) as server:
        client = bench.BlobClient(server.port)
        bench.full_pull(client, blobs.plain, tmp_path / "full", blobs.digests)
        wrong = {name: (blob, "sha256:" + "0" * 64) for name, (blob, _) in blobs.digests.items()}
        with pytest.raises(RuntimeError, match="diff id"):
            bench.full_pull(client, blobs.plain, tmp_path / "again", wrong)
        client.close()


def test_the_blob_server_honours_ranges(tmp_path):
    from bench import lazy_pull_bench as bench

    (tmp_path / "blob").write_bytes(bytes(range(256)) * 4)
    with bench.serving({"b": tmp_path / "blob"}, rate=1e9, latency_s=0) as server:
        client = bench.BlobClient(server.port)
        assert client.get("b", 10, 5) == bytes(range(10, 15))
        response = client.open("b", 1000)  # an open range: to the end
        assert response.status == 206 and response.getheader("Content-Range") == "bytes 1000-1023/1024"
        assert response.read() == bytes(range(232, 256))
        assert len(client.open("b").read()) == 1024
        client.close()
        assert (server.requests, server.bytes_sent) == (3, 5 + 24 + 1024)


def test_the_bench_reads_a_saved_image_layer_by_layer(tmp_path):
    """Two layers as `docker save` writes them (one a plain tar, one gzip as in an OCI layout): the upper one's link
    and whiteout reach down into the lower one, in the full pull and the lazy one alike."""
    from bench import lazy_pull_bench as bench

    rng = random.Random(7)
    library, tool = rng.randbytes(150_000), rng.randbytes(50_000)
    lower, upper = io.BytesIO(), io.BytesIO()
    with tarfile.open(fileobj=lower, mode="w") as archive:
        for folder in ("usr", "usr/lib", "usr/bin"):
            _add(archive, folder, type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "usr/lib/libx.so.1", library)
        _add(archive, "usr/lib/old.txt", b"gone above")
    with tarfile.open(fileobj=upper, mode="w") as archive:
        _add(archive, "usr/bin", type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "usr/bin/tool", tool, mode=0o755)
        _add(archive, "usr/lib/libx.so", type=tarfile.SYMTYPE, linkname="libx.so.1")
        _add(archive, "usr/lib/.wh.old.txt", b"")
    with tarfile.open(tmp_path / "image.tar", "w") as saved:
        manifest = json.dumps([{"Config": "config.json", "Layers": ["lower/layer.tar", "blobs/sha256/upper"]}])
        for name, data in (("manifest.json", manifest.encode()), ("lower/layer.tar", lower.getvalue()),
                           ("blobs/sha256/upper", gzip.compress(upper.getvalue()))):
            _add(saved, name, data)
    (tmp_path / "work").mkdir()
    layers = bench.saved_layers(tmp_path / "image.tar", tmp_path / "work")
    assert [path.read_bytes() for path in layers] == [lower.getvalue(), upper.getvalue()]
    facts = bench.measure(layers, ["/usr/bin/tool"], ["/usr/lib/libx.so"], tmp_path / "work", rate=1e9, latency_s=0)
    full, lazy = tmp_path / "work/full", tmp_path / "work/lazy"
    assert not (full / "usr/lib/old.txt").exists()
    for tree in (full, lazy):
        assert bench.inside(tree, "/usr/lib/libx.so").read_bytes() == library
        assert (tree / "usr/bin/tool").read_bytes() == tool
    # Each layer's footer and TOC, the upper one's prefetch area (the lower one holds no prefetch file), the library.
    assert facts["lazy_requests"] == 2 + 2 + 1 + 1
    assert facts["full_skipped_entries"] == facts["lazy_skipped_entries"] == 0


def test_layers_prefetched_side_by_side_give_the_tree_the_layers_applied_in_order_give(tmp_path):
    """The lazy client prefetches every layer at once (as stargz-snapshotter's Mount does), into one tree: what an
    upper layer replaces, whites out, makes opaque or turns into a link is never written from below, whichever
    layer's thread gets there first, and folders merge."""
    from bench import lazy_pull_bench as bench

    lower, upper = io.BytesIO(), io.BytesIO()
    with tarfile.open(fileobj=lower, mode="w") as archive:
        for folder in ("etc", "opt", "opt/pkg", "opt/old", "srv"):
            _add(archive, folder, type=tarfile.DIRTYPE, mode=0o755)
        for name in ("etc/conf", "opt/pkg/a", "opt/old/b", "srv/gone", "opt/keep"):
            _add(archive, name, f"lower {name}".encode() * 500)
    with tarfile.open(fileobj=upper, mode="w") as archive:
        for folder in ("etc", "opt", "opt/pkg", "srv"):
            _add(archive, folder, type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "etc/conf", b"upper conf" * 400)
        _add(archive, "opt/pkg/.wh..wh..opq", b"")
        _add(archive, "opt/pkg/c", b"upper c" * 300)
        _add(archive, "opt/old", type=tarfile.SYMTYPE, linkname="pkg")
        _add(archive, "srv/.wh.gone", b"")
    layers = []
    for index, data in enumerate((lower, upper)):
        layers.append(tmp_path / f"layer{index}.tar")
        layers[-1].write_bytes(data.getvalue())
    prefetch = ["/etc/conf", "/opt/pkg/a", "/opt/pkg/c", "/opt/old/b", "/srv/gone", "/opt/keep", "/opt/old"]
    (tmp_path / "work").mkdir()
    facts = bench.measure(layers, prefetch, [], tmp_path / "work", rate=1e9, latency_s=0)
    full, lazy = tmp_path / "work/full", tmp_path / "work/lazy"
    listing = {tree: sorted(str(path.relative_to(tree)) for path in tree.rglob("*")) for tree in (full, lazy)}
    assert listing[lazy] == listing[full] == ["etc", "etc/conf", "opt", "opt/keep", "opt/old", "opt/pkg",
                                              "opt/pkg/c", "srv"]
    assert (lazy / "etc/conf").read_bytes() == b"upper conf" * 400 and (lazy / "opt/old").is_symlink()
    assert facts["lazy_skipped_entries"] == 0


def test_the_bench_never_writes_through_a_link_out_of_its_tree(tmp_path):
    from bench import lazy_pull_bench as bench

    (tmp_path / "tree/etc").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tree/etc/away").symlink_to(tmp_path / "elsewhere")  # an image's absolute link, seen from here
    (tmp_path / "tree/etc/near").symlink_to("../etc")
    assert bench._target(tmp_path / "tree", "etc/near/x") == tmp_path / "tree/etc/near/x"
    with pytest.raises(bench.OutsideTree):
        bench._target(tmp_path / "tree", "/etc/away/x")
    (tmp_path / "tree/etc/rooted").symlink_to("/opt")  # the start reads it as a chroot would: from the tree's root
    assert bench.inside(tmp_path / "tree", "etc/rooted/x") == tmp_path / "tree/opt/x"


# What goes into the prefetch area (publish/lazy.py): files a start reads in every chunk; of the others, only the
# chunks a read touches, fetched when read.


def test_only_a_file_read_in_every_chunk_is_prefetched_whole():
    from torchimages.publish import lazy

    CHUNK = lazy.CHUNK_SIZE  # noqa: N806 (publish's, not the converter's default)
    size = 3 * CHUNK + 10  # four chunks, the last 10 bytes
    assert lazy.chunks_read(size, [[0, 1], [CHUNK - 1, CHUNK + 1], [3 * CHUNK + 9, 3 * CHUNK + 10]]) == {0, 1, 3}
    assert not lazy.read_whole(size, [[0, 1], [CHUNK - 1, CHUNK + 1], [3 * CHUNK + 9, 3 * CHUNK + 10]])
    assert lazy.read_whole(size, [[0, 1], [CHUNK - 1, CHUNK + 1], [2 * CHUNK, 2 * CHUNK + 1], [size - 1, size]])
    assert lazy.read_whole(4096, [[0, 4096]]) and lazy.read_whole(100, [[50, 51]])  # one chunk: read at all, whole
    assert lazy.chunks_read(size, [[5, 5]]) == set()  # an empty range touches nothing
    assert not lazy.read_whole(2 * CHUNK, [[0, 4096]], chunk_size=CHUNK)
    assert lazy.read_whole(2 * CHUNK, [[0, 4096]], chunk_size=4 * CHUNK)


def test_the_prefetch_areas_leave_a_partly_read_library_to_be_read_on_demand(tmp_path):
    from torchimages.publish import lazy

    CHUNK = lazy.CHUNK_SIZE  # noqa: N806
    record = {"image_id": "sha256:" + "a" * 64, "layers": [{"diff_id": "sha256:" + "1" * 64},
                                                           {"diff_id": "sha256:" + "2" * 64}],
              "files": {"/opt/libbig.so": {"layer": 1, "size": 10 * CHUNK, "ranges": [[0, CHUNK]]},
                        "/opt/small.py": {"layer": 1, "size": 900, "ranges": [[0, 900]]},
                        "/usr/lib/os-release": {"layer": 0, "size": 267, "ranges": [[0, 267]]},
                        "/old": {"layer": 0, "ranges": [[0, 1]]}}}  # recorded before sizes: prefetched, as then
    (tmp_path / "row").mkdir()
    (tmp_path / "row" / lazy.STARTUP_RECORD).write_text(json.dumps(record))
    assert lazy.prefetch_by_layer(tmp_path, "row", record["image_id"]) == {
        "sha256:" + "1" * 64: ["/old", "/usr/lib/os-release"], "sha256:" + "2" * 64: ["/opt/small.py"]}
    assert lazy.prefetch_by_layer(tmp_path, "row", "sha256:" + "b" * 64) == {}  # measured on another image
    assert lazy.cuts_by_layer(tmp_path, "row", record["image_id"]) == {"sha256:" + "2" * 64: {"/opt/libbig.so": [CHUNK]}}
    assert lazy.cuts_by_layer(tmp_path, "row", "sha256:" + "b" * 64) == {}


def test_the_cuts_are_where_the_runs_a_start_reads_begin_and_end():
    from torchimages.publish import lazy

    gap = lazy.CUT_GAP
    assert lazy.read_cuts(10 * gap, [[4096, 8192], [gap, 2 * gap]]) == [4096, 2 * gap]  # 4 KiB apart: one run
    assert lazy.read_cuts(10 * gap, [[0, 4096], [2 * gap, 3 * gap]]) == [4096, 2 * gap, 3 * gap]
    assert lazy.read_cuts(3 * gap, [[gap, 3 * gap], [5, 5]]) == [gap]  # the file's ends and empty runs cut nothing
    assert lazy.read_cuts(10 * gap, [[0, 10], [4 * gap, 4 * gap + 10]], gap=0) == [10, 4 * gap, 4 * gap + 10]


def test_the_bench_fetches_only_the_chunks_a_start_reads_of_a_partly_read_file(tmp_path):
    from bench import lazy_pull_bench as bench

    rng = random.Random(11)
    library, module = rng.randbytes(5 * CHUNK + 100), rng.randbytes(3000)
    with tarfile.open(tmp_path / "layer.tar", "w") as archive:
        _add(archive, "opt", type=tarfile.DIRTYPE, mode=0o755)
        _add(archive, "opt/libbig.so", library)
        _add(archive, "opt/mod.py", module)
    reads = [[10, 20], [3 * CHUNK + 5, 3 * CHUNK + 4096]]  # chunks 0 and 3 of 6
    record = {"/opt/libbig.so": {"size": len(library), "ranges": reads},
              "/opt/mod.py": {"size": len(module), "ranges": [[0, 3000]]}}
    prefetch, demand, ranges = bench.split_record(record, CHUNK)
    assert (prefetch, demand) == (["/opt/mod.py"], ["/opt/libbig.so"])
    facts = bench.measure([tmp_path / "layer.tar"], prefetch, demand, tmp_path, rate=1e9, latency_s=0, ranges=ranges)
    lazy_copy, full_copy = (tmp_path / "lazy/opt/libbig.so").read_bytes(), (tmp_path / "full/opt/libbig.so").read_bytes()
    for start, end in reads:
        assert lazy_copy[start:end] == full_copy[start:end] == library[start:end]
    assert lazy_copy[CHUNK:2 * CHUNK] == bytes(CHUNK), "a chunk no read touched was fetched"
    assert (tmp_path / "lazy/opt/mod.py").read_bytes() == module
    # The footer, the TOC, the prefetch area, then one request for each run of chunks read: chunk 0, then chunk 3.
    assert facts["lazy_requests"] == 2 + 1 + 2 and facts["on_demand_by_chunk"] == 1
    assert facts["lazy_bytes"] < 3 * CHUNK
    whole = bench.split_record(record, CHUNK, whole_files=True)
    assert whole == (["/opt/libbig.so", "/opt/mod.py"], [], {})

    # Cut where the reads begin and end (publish --lazy's layout), the lazy side fetches and inflates about what the
    # start reads: two chunks of 10 and 4,091 bytes, not two of 4 MiB.
    cuts = bench.record_cuts(record, CHUNK)
    assert cuts == {"/opt/libbig.so": [10, 20, 3 * CHUNK + 5, 3 * CHUNK + 4096]}
    (tmp_path / "cut").mkdir()
    cut = bench.measure([tmp_path / "layer.tar"], prefetch, demand, tmp_path / "cut", rate=1e9, latency_s=0,
                        ranges=ranges, cuts=cuts, fetchers=(4, 1))
    assert list(cut["R_by_fetchers"]) == [4, 1] and cut["fetchers"] == 4  # the lazy pull again, one request at a time
    lazy_copy = (tmp_path / "cut/lazy/opt/libbig.so").read_bytes()
    for start, end in reads:
        assert lazy_copy[start:end] == library[start:end]
    assert cut["lazy_requests"] == 2 + 1 + 2 and cut["lazy_bytes"] < 64 << 10 < facts["lazy_bytes"]
