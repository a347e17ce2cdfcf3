"""The layout check's rules (checks/layout.py) and how verify reads an image's layers (verify/image_layers.py), on
recorded layouts. The check on real images: tests/test_verify.py (a broken image, the CPU rows) and
tests/test_cuda_images.py (the CUDA rows)."""
import gzip
import hashlib
import io
import os
import tarfile

from torchimages.checks.layout import COMPRESSED_LIMIT, EMPTY_DIFF_ID, layout_problems
from torchimages.verify.image_layers import gzip_sizes, matched_layers


def layer(number: int, gzip_size: int | None = None, step: str = "/bin/sh -c something") -> dict:
    return {"diff_id": f"sha256:{number:064x}", "size": None, "gzip_size": gzip_size, "created_by": step}


def test_an_empty_tar_has_the_empty_layers_diff_id():
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w"):
        pass
    assert f"sha256:{hashlib.sha256(stream.getvalue()[:1024]).hexdigest()}" == EMPTY_DIFF_ID


def test_the_cuda_rows_one_nvidia_layer_of_before_is_over_the_limit():
    """The CUDA 13.0 runtime row before issue 58: its nvidia-* wheels in one layer of 2,251 MB gzip (the 3,291 MB
    image's largest; docs/benchmarks.md, bench/coldstart_bench.py, 2026-11-25)."""
    layers = [layer(1, step=""), layer(2, 2_251_000_000, "|1 WHEELS_CUDA=abc /bin/bash -o pipefail -c install nvidia"),
              layer(3, 567_000_000)]
    [problem] = layout_problems(layers)
    assert problem.startswith("layer 2 of 3 (RUN install nvidia) is 2.25 GB compressed, over the "
                              "1.00 GB a layer may have") and "build_inputs/layers.py" in problem


def test_an_empty_layer_and_a_second_copy_are_named():
    layers = [layer(1), {**layer(2), "diff_id": EMPTY_DIFF_ID}, layer(3), {**layer(4), "diff_id": layer(3)["diff_id"]}]
    empty, duplicate = layout_problems(layers)
    assert empty.startswith("layer 2 of 4 (RUN something) is empty")
    assert duplicate.startswith(f"layer 4 of 4 (RUN something) has the same content as layer 3 ({layer(3)['diff_id']})")


def test_a_layout_within_the_rules_passes():
    assert layout_problems([layer(1), layer(2, COMPRESSED_LIMIT), layer(3)]) == []


def test_a_step_is_named_as_the_dockerfile_writes_it():
    from torchimages.checks.layout import step_of

    assert step_of({"created_by": "/bin/bash -o pipefail -c #(nop) COPY file:ab12 in /torchimages-marker "}) == \
        "COPY file:ab12 in /torchimages-marker"
    assert step_of({"created_by": "|2 A=1 B=2 /bin/bash -o pipefail -c apt-get   update"}) == "RUN apt-get update"
    assert step_of({"created_by": "RUN /bin/sh -c true # buildkit"}) == "RUN /bin/sh -c true # buildkit"
    assert step_of({"created_by": ""}) == ""


def test_history_entries_that_ran_no_command_wrote_no_layer():
    """As Docker 20.10's classic builder writes it, newest first: an imported base, a COPY of empty files (a layer of
    size 0 that is not empty), a RUN, and instructions that only set metadata (WORKDIR included)."""
    history = [{"CreatedBy": "/bin/sh -c true", "Size": 0},
               {"CreatedBy": "/bin/sh -c #(nop)  CMD [\"bash\"]", "Size": 0},
               {"CreatedBy": "/bin/sh -c #(nop) WORKDIR /workspace", "Size": 0},
               {"CreatedBy": "|1 WHEELS_TORCH=1 /bin/sh -c install", "Size": 699},
               {"CreatedBy": "/bin/sh -c #(nop)  ARG WHEELS_TORCH", "Size": 0},
               {"CreatedBy": "/bin/sh -c #(nop) COPY dir:f0cd in / ", "Size": 0},
               {"CreatedBy": "", "Size": 117}]
    layers = matched_layers(["sha256:a", "sha256:b", "sha256:c"], history)
    assert [(entry["size"], entry["created_by"][:20]) for entry in layers] == [
        (117, ""), (0, "/bin/sh -c #(nop) CO"), (699, "|1 WHEELS_TORCH=1 /b")]
    unmatched = matched_layers(["sha256:a", "sha256:b"], history)
    assert {(entry["size"], entry["created_by"]) for entry in unmatched} == {(None, "")}


def test_only_large_wanted_layers_are_compressed_as_the_push_would():
    """A `docker save` stream in Docker 20.10's form: the wanted layer's gzip size at the level asked (level 1 is the
    bound from above the check takes first), a small one skipped."""
    big, small = os.urandom(300_000) + bytes(700_000), b"small"
    saved = io.BytesIO()
    with tarfile.open(fileobj=saved, mode="w") as archive:
        for name, content in (("aaa/layer.tar", big), ("bbb/layer.tar", small), ("manifest.json", b"[]")):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    wanted = {f"sha256:{hashlib.sha256(content).hexdigest()}" for content in (big, small)}
    fast, push = (gzip_sizes([saved.getvalue()], wanted, over=100_000, level=level) for level in (1, 6))
    digest = f"sha256:{hashlib.sha256(big).hexdigest()}"
    assert fast == {digest: len(gzip.compress(big, 1, mtime=0))} and push == {digest: len(gzip.compress(big, 6, mtime=0))}
    assert fast[digest] >= push[digest]
