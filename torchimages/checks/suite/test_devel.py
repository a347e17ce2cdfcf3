"""devel: images whose flavor builds extensions (devel) compile torch extensions (nvcc equal to torch's CUDA and a CUDA extension for the row's
whole arch list on GPU rows, without a GPU; a C++ extension on CPU rows); running the CUDA kernel needs a GPU.
Runtime images carry no nvcc."""
import pytest

pytestmark = pytest.mark.check("devel")


def test_runtime_image_has_no_nvcc(main, spec):
    if spec.builds_extensions:
        pytest.skip(f"{spec.flavor} image: nvcc belongs here")
    nvcc = main["tools"]["nvcc"]
    assert not nvcc["path"], (
        f"runtime image contains nvcc ({nvcc['path']}): it adds gigabytes; build runtime images FROM the -base or "
        "-runtime CUDA image, not -devel")


def test_compiler_is_present(main, spec):
    if not spec.builds_extensions:
        pytest.skip(f"{spec.flavor} image: no compiler toolchain expected")
    compiler = main["tools"]["cxx"]
    assert compiler["path"] and compiler.get("ok"), (
        f"devel image has no working C++ compiler (c++/g++: {compiler.get('error') or compiler['path'] or 'not found'}): "
        "torch extensions cannot build; install g++ (and ninja-build) in the devel image")


def test_nvcc_matches_torch_cuda(main, torch_facts, spec):
    if not spec.builds_extensions or not spec.is_gpu:
        pytest.skip("only GPU images for building extensions (devel) need nvcc")
    nvcc = main["tools"]["nvcc"]
    assert nvcc["path"], (
        f"devel image has no nvcc (CUDA_HOME={nvcc.get('cuda_home') or 'unset'}, none on PATH), but torch is built for "
        f"CUDA {torch_facts['cuda']}: install the CUDA {torch_facts['cuda']} toolkit wheels (cuda-toolkit[nvcc]) and "
        "point CUDA_HOME at them, or put nvcc on PATH")
    assert nvcc.get("release") == torch_facts["cuda"], (
        f"nvcc ({nvcc['path']}) is CUDA {nvcc.get('release')}, but torch is built for CUDA {torch_facts['cuda']}: "
        f"extensions will fail to build or load; install the toolkit of torch's CUDA {torch_facts['cuda']}")


def test_extension_compiles_and_links(main, torch_facts, spec):
    if not spec.builds_extensions:
        pytest.skip(f"{spec.flavor} image: extensions are built in the devel image")
    result = main["extension"]
    what = f"a CUDA torch extension for arch list {';'.join(spec.arch_list)}" if spec.is_gpu else "a C++ torch extension"
    assert result.get("compiled") and result.get("cpu_ok"), (
        f"{what} (torch.utils.cpp_extension) did not compile, link and run its CPU function: {(result.get('error') or result)!s:.1500}"
        "; expected it to build with the image's toolchain: devel images need a compiler, ninja, Python headers"
        + (" and nvcc" if spec.is_gpu else ""))


def test_cuda_extension_runs_on_the_gpu(main, spec, devices):
    if not spec.builds_extensions:
        pytest.skip(f"{spec.flavor} image: extensions are built in the devel image")
    result = main["extension"]
    if result.get("cuda_skipped"):
        pytest.skip(result["cuda_skipped"])
    assert result.get("cuda_ran") and result.get("cuda_ok"), (
        f"the CUDA extension built for {';'.join(spec.arch_list)} did not run correctly on {devices[0]['name']}: "
        f"{(result.get('error') or result)!s:.1500}; expected its kernel to add one to every element: check that the "
        "arch list covers this GPU (see gpu)")
