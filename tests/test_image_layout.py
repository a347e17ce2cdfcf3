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


# The CUDA 13.0 rows' wheel set and each wheel's size, as `torchimages wheels 2.14.1-cuda13.0-cudnn9-runtime
# 2.14.1-cuda13.0-cudnn9-devel` fetched it from PyPI (2026-11-29): a wheel's size is within a few percent of its files'
# gzip in a layer (the one nvidia layer before issue 58: 2,251 MB gzip, docs/benchmarks.md, for these 2,294 MB).
CU130_WHEELS = {
    "cuda_bindings-13.5.0-cp311-cp311-manylinux_2_24_x86_64.whl": 8390178, "cuda_pathfinder-1.9.1-py3-none-any.whl": 63462,
    "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl": 2512, "nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_x86_64.whl": 423138758,
    "nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.whl": 3120526,
    "nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.whl": 134086,
    "nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl": 10715597,
    "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.whl": 37384532,
    "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.whl": 90215200,
    "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.whl": 2243632,
    "nvidia_cudnn_cu13-9.24.0.43-py3-none-manylinux_2_27_x86_64.whl": 553099438,
    "nvidia_cufft-12.0.0.61-py3-none-manylinux2014_x86_64.whl": 214085489,
    "nvidia_cufile-1.15.1.6-py3-none-manylinux2014_x86_64.whl": 1223672,
    "nvidia_curand-10.4.0.35-py3-none-manylinux_2_27_x86_64.whl": 59544258,
    "nvidia_cusolver-12.0.4.66-py3-none-manylinux_2_27_x86_64.whl": 200941980,
    "nvidia_cusparse-12.6.3.3-py3-none-manylinux2014_x86_64.whl": 145942937,
    "nvidia_cusparselt_cu13-0.8.1-py3-none-manylinux2014_x86_64.whl": 170148586,
    "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl": 215965170,
    "nvidia_nvjitlink-13.5.37-py3-none-manylinux2010_x86_64.whl": 46642491,
    "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.whl": 60412546,
    "nvidia_nvtx-13.0.85-py3-none-manylinux1_x86_64.whl": 148047,
    "nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.whl": 61601415,
    "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl": 554581699,
    "torchvision-0.29.1-cp311-cp311-manylinux_2_28_x86_64.whl": 7430666,
    "triton-3.8.0-cp311-cp311-manylinux_2_27_x86_64.whl": 247945226,
}


def test_the_cuda_rows_venv_layers_are_each_filled_and_under_the_limit():
    """build_inputs/layers.py's split of a CUDA 13.0 row's wheels: no venv layer empty (an empty RUN's layer would be
    marked empty_layer, and the image would lack a step the others have), none over the layout check's limit, and
    the start-up libraries (cuBLAS, NVRTC) in the first."""
    from torchimages.build_inputs.layers import VENV_LAYERS, layer_of, wheel_name

    sizes = {layer.name: 0 for layer in VENV_LAYERS}
    for wheel, size in CU130_WHEELS.items():
        sizes[layer_of(wheel_name(wheel)).name] += size
    assert all(sizes[layer.name] for layer in VENV_LAYERS if layer.name != "rest"), sizes
    assert max(sizes.values()) <= COMPRESSED_LIMIT, sizes
    assert layer_of("nvidia-cublas").name == layer_of("nvidia-cuda-nvrtc").name == VENV_LAYERS[0].name == "cuda_start"
    assert layer_of("nvidia-cudnn-cu12").name == "cudnn" and layer_of("nvidia-nccl-cu13").name == "cuda"


def test_measured_sizes_are_kept_by_diff_id_and_a_damaged_cache_is_measured_again(tmp_path, monkeypatch):
    from torchimages.verify import image_layers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    image_layers.keep_sizes({1: {"sha256:" + "a" * 64: 10}, 6: {}})
    image_layers.keep_sizes({1: {"sha256:" + "b" * 64: 20}, 6: {"sha256:" + "b" * 64: 15}})
    assert image_layers.cached_sizes() == {1: {"sha256:" + "a" * 64: 10, "sha256:" + "b" * 64: 20},
                                           6: {"sha256:" + "b" * 64: 15}}
    cache = tmp_path / "torchimages" / image_layers.SIZES_CACHE
    for damaged in ("{", "[]", '{"1": {"sha256:x": "ten", "other": 3}}'):
        cache.write_text(damaged)
        assert image_layers.cached_sizes() == {1: {}, 6: {}}


def test_one_measuring_save_at_a_time_the_second_waits_and_a_lock_never_fails_the_check(tmp_path, monkeypatch):
    """Two layout checks at once (the CUDA rows verified side by side) would hold two `docker save` copies on the
    engine's disk: the second waits for the first. Past its wait, or where the cache folder cannot be made, it goes
    on (the lock saves disk; it never fails a check)."""
    import threading
    import time

    from torchimages.verify.image_layers import one_save_at_a_time

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    order: list[str] = []
    first_holds, second_may_go = threading.Event(), threading.Event()

    def first() -> None:
        with one_save_at_a_time():
            order.append("first in")
            first_holds.set()
            second_may_go.wait(10)
            order.append("first out")

    def second() -> None:
        first_holds.wait(10)
        with one_save_at_a_time():
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_holds.wait(10)
    time.sleep(1.2)  # the second polls twice a second: given time, it would have entered
    second_may_go.set()
    for thread in threads:
        thread.join(10)
    assert order == ["first in", "first out", "second in"]

    with one_save_at_a_time():  # held here, a second one that may not wait goes on
        with one_save_at_a_time(wait_s=0):
            order.append("went on")
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    with one_save_at_a_time():
        order.append("no folder")
    assert order[-2:] == ["went on", "no folder"]
