"""devel: devel images compile torch extensions (nvcc equal to torch's CUDA on GPU rows, a C++ compiler on all);
runtime images carry no nvcc."""
import pytest

pytestmark = pytest.mark.check("devel")


def test_runtime_image_has_no_nvcc(main, spec):
    if spec.flavor == "devel":
        pytest.skip("devel image: nvcc belongs here")
    nvcc = main["tools"]["nvcc"]
    assert not nvcc["path"], (
        f"runtime image contains nvcc ({nvcc['path']}): it adds gigabytes; build runtime images FROM the -base or "
        "-runtime CUDA image, not -devel")


def test_compiler_is_present(main, spec):
    if spec.flavor != "devel":
        pytest.skip("runtime image: no compiler expected")
    compiler = main["tools"]["cxx"]
    assert compiler["path"] and compiler.get("ok"), (
        f"devel image has no working C++ compiler (c++/g++: {compiler.get('error') or compiler['path'] or 'not found'}): "
        "torch extensions cannot build; install g++ (and ninja-build) in the devel image")


def test_nvcc_matches_torch_cuda(main, torch_facts, spec):
    if spec.flavor != "devel" or not spec.is_gpu:
        pytest.skip("only GPU devel images need nvcc")
    nvcc = main["tools"]["nvcc"]
    assert nvcc["path"], (f"devel image has no nvcc, but torch is built for CUDA {torch_facts['cuda']}: build it FROM "
                          f"the CUDA -devel base ({spec.base_image}) and put /usr/local/cuda/bin on PATH")
    assert nvcc.get("release") == torch_facts["cuda"], (
        f"nvcc is CUDA {nvcc.get('release')}, but torch is built for CUDA {torch_facts['cuda']}: extensions will fail "
        f"to build or load; use the CUDA {torch_facts['cuda']} devel base")


def test_extension_compiles_and_runs(main, torch_facts, spec):
    if spec.flavor != "devel":
        pytest.skip("runtime image: extensions are built in the devel image")
    result = main["extension"]
    language = "CUDA" if spec.is_gpu else "C++"
    assert result.get("ok"), (
        f"a small {language} torch extension (load_inline) did not build and run: "
        f"{(result.get('error') or result)!s:.1500}; devel images need a compiler, ninja, Python headers"
        + (" and nvcc" if spec.is_gpu else ""))
