"""Pure helpers of the image checks: expectations from the row and the run, readable sizes and failures."""
from __future__ import annotations

import re
from fnmatch import fnmatchcase

from torchimages.checks.rules import NVIDIA_SMI_UUID, decode_cudnn_version, os_tag
from torchimages.model import LABEL_PREFIX, ImageSpec


def gpu_skip_reason(spec: ImageSpec, expect: dict) -> str | None:
    """Why GPU checks cannot run in this container, or None when they must."""
    if not spec.is_gpu:
        return "CPU image: no GPU checks apply"
    if expect["gpus"]["wanted"]:
        return None
    why = "no GPUs were requested (--gpus none)"
    if not expect["host_gpu_runtime"]:
        why += " and this Docker engine has no NVIDIA runtime"
    return f"not run: {why}; verify on a GPU host with --gpus all"


MIG_ENUMERATION = ("one CUDA process enumerates a single MIG device, however many it is given (NVIDIA MIG User Guide, "
                   "\"CUDA Device Enumeration\"; pytorch#130181)")
# Beside GPUs with MIG disabled, CUDA's count is not documented: it lists them and appends the first MIG device
# (DataDog/datadog-agent#36377), or was seen to list one device in all (kokkos/kokkos#6529). Either is a good image.
MIXED_MIG_ENUMERATION = ("beside {whole} GPU(s) with MIG disabled, CUDA enumerates those and at most one MIG device "
                         "(its order and count on mixed hosts are undocumented: datadog-agent#36377, kokkos#6529)")


MIG_WITHOUT_DEVICES = ("a GPU in MIG mode runs CUDA only in the MIG devices made on it, and {unusable} has none "
                       "(NVIDIA MIG User Guide, \"Getting Started with MIG\")")


def _whole_gpus(gpu: dict) -> int:
    """GPUs in the container that CUDA uses whole: MIG mode off (nvidia-smi's mig.mode.current), else those without
    MIG devices under them where the mode was not read."""
    modes = gpu.get("mig_modes")
    if modes:
        return sum(1 for mode in modes if mode != "Enabled")
    return len(gpu.get("nvidia_smi_gpus") or []) - len(gpu.get("mig_devices") or {})


def _mig_device_count(expect: dict, gpu: dict) -> tuple[int | range, str]:
    """What torch may see where MIG is on: exactly 1 with MIG devices alone, 1 to (whole GPUs + 1) with MIG devices
    beside whole GPUs, the whole GPUs alone where no GPU in MIG mode has a MIG device."""
    if expect["gpus"].get("mig"):
        where = f"--gpus {expect['gpus']['text']}"
        whole = sum(1 for device in expect["gpus"].get("device_ids", []) if not device.startswith("MIG-")
                    and ":" not in device)
    else:
        where = "nvidia-smi in the container"
        whole = _whole_gpus(gpu)
        if not gpu.get("mig_devices"):
            unusable = len(gpu.get("nvidia_smi_gpus") or []) - whole
            return whole, f"{where}: {MIG_WITHOUT_DEVICES.format(unusable=f'{unusable} GPU(s) in MIG mode')}"
    if whole <= 0:
        return 1, f"{where}: {MIG_ENUMERATION}"
    return range(1, whole + 2), f"{where}: {MIG_ENUMERATION}; {MIXED_MIG_ENUMERATION.format(whole=whole)}"


def expected_device_count(expect: dict, gpu: dict) -> tuple[int | range | None, str]:
    """How many devices torch must see (a range where CUDA's count is not determined), and where that comes from."""
    requested = expect["gpus"]["expected_count"]
    if expect["gpus"].get("mig") or gpu.get("mig_devices") or "Enabled" in (gpu.get("mig_modes") or []):
        return _mig_device_count(expect, gpu)
    if requested is not None:
        expected, source = requested, f"--gpus {expect['gpus']['text']}"
    elif gpu.get("nvidia_smi_gpus") is not None:
        expected, source = len(gpu["nvidia_smi_gpus"]), "nvidia-smi -L in the container (--gpus all)"
    else:
        return None, "unknown: no nvidia-smi in the container to count the GPUs given to it"
    visible = gpu.get("cuda_visible_devices")
    if visible is not None:
        entries = [entry for entry in visible.split(",") if entry.strip()]
        if len(entries) < expected:
            expected, source = len(entries), f"CUDA_VISIBLE_DEVICES={visible}"
    return expected, source


def _listed_uuids(gpu: dict) -> list[str]:
    """The GPU and MIG device UUIDs nvidia-smi -L lists in the container (the names CUDA_VISIBLE_DEVICES may use)."""
    lines = [*(gpu.get("nvidia_smi_gpus") or []),
             *(line for lines in (gpu.get("mig_devices") or {}).values() for line in lines)]
    return [match.group(1) for match in map(NVIDIA_SMI_UUID.search, lines) if match]


def _hiding_entry(value: str, listed: int, uuids: list[str]) -> str | None:
    """Why CUDA sees no device under CUDA_VISIBLE_DEVICES=value, where the variable is the cause: CUDA reads the
    entries up to the first invalid one (CUDA Programming Guide, "CUDA Environment Variables"), and a repeated one
    leaves none (error 101; torch's _parse_visible_devices: "Repeated ordinal results in empty set"). None where
    the first entry names a GPU: the variable leaves CUDA one, so something else stopped it."""
    if not value.strip():
        return "hides every GPU (an empty value leaves CUDA no device)"
    seen: list[str] = []
    for entry in (part.strip() for part in value.split(",")):
        if entry in seen:
            return f"repeats {entry}, and CUDA then sees no device at all (error 101, invalid device ordinal)"
        if entry.isdigit():
            valid, why = int(entry) < listed, (f"names index {entry}, past the {listed} GPU(s) nvidia-smi lists here "
                                               f"(indices 0 to {listed - 1})")
        elif entry.startswith(("GPU-", "MIG-")):
            valid = any(uuid.startswith(entry) for uuid in uuids)
            why = f"names {entry}, which is no GPU nvidia-smi -L lists here ({', '.join(uuids)})"
        else:
            valid, why = False, f"starts with {entry!r}, which is neither an index nor a GPU UUID"
        if not valid:
            return None if seen else why
        seen.append(entry)
    return None


def hiding_visible_devices(gpu: dict, image_env: list[str] | None = None) -> str | None:
    """CUDA_VISIBLE_DEVICES as the cause torch sees no GPU where nvidia-smi lists some (nvidia-smi ignores the
    variable), with the fix; None where it is unset or not the cause. A classic: `--gpus device=1` gives the
    container that GPU as index 0, so CUDA_VISIBLE_DEVICES=1 carried over from the host hides it."""
    value, listed = gpu.get("cuda_visible_devices"), gpu.get("nvidia_smi_gpus") or []
    why = _hiding_entry(value, len(listed), _listed_uuids(gpu)) if value is not None and listed else None
    if why is None:
        return None
    origin = ("the image's ENV sets it" if any(entry.startswith("CUDA_VISIBLE_DEVICES=") for entry in image_env or ())
              else "set by the job, the shell or `docker run -e`")
    indices = ",".join(str(index) for index in range(len(listed)))
    return (f"CUDA_VISIBLE_DEVICES={value!r} {why}, so torch sees no GPU ({origin}). Inside a container the GPUs it "
            f"was given are numbered from 0 (after `--gpus device=2,3` they are 0 and 1): unset CUDA_VISIBLE_DEVICES, "
            f"or set it to {indices} or to UUIDs nvidia-smi -L lists")


def observed_label_values(main: dict) -> dict[str, str]:
    """io.torchimages.* label values as the image's contents say they should read."""
    torch = main["torch"]
    torchvision = torch.get("torchvision") or {}
    cudnn = decode_cudnn_version(torch.get("cudnn_version"))
    return {
        "torch": torch["version"].split("+")[0],
        "torchvision": (torchvision.get("version") or "").split("+")[0],
        "cuda": torch["cuda"] or "cpu",
        "cudnn": str(cudnn[0]) if cudnn else "",
        "python": main["python"]["major_minor"],
        "os": os_tag(main["os_release"]),
    }


def row_label_values(spec: ImageSpec) -> dict[str, str]:
    """Labels that describe the row rather than something measurable inside the image."""
    return {
        "io.torchimages.flavor": spec.flavor,
        "io.torchimages.arch-list": ";".join(spec.arch_list),
        "io.torchimages.min-driver": spec.min_driver or "",
        "org.opencontainers.image.version": spec.tag,
    }


def minimum_driver(image: dict, spec: ImageSpec) -> tuple[str, str]:
    """The driver floor the image declares (its io.torchimages.min-driver label), else the row's, and which it was."""
    label = image["labels"].get(f"{LABEL_PREFIX}.min-driver")
    if label:
        return label, f"the image's {LABEL_PREFIX}.min-driver label"
    return spec.min_driver or "", f"row {spec.tag}; the image has no {LABEL_PREFIX}.min-driver label"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def cuda_version_number(cuda: str) -> int:
    """"13.2" -> 13020, as cuDriverGetVersion reports the CUDA version a libcuda supports."""
    major, _, minor = cuda.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


# Why CUDA cannot start, where the host's driver is the cause (whatever the versions say): the words nvidia-smi and
# torch's first CUDA call print, and what to do. Sources: nvml.h NVML_ERROR_LIB_RM_VERSION_MISMATCH (nvidia-smi's
# "Driver/library version mismatch"); CUDA Runtime API cudaError: cudaErrorSystemDriverMismatch = 803,
# cudaErrorCompatNotSupportedOnDevice = 804 (torch warns "Error 803: ..." / "Error 804: ..."); NVIDIA "CUDA
# Compatibility", Forward Compatibility: cuda-compat serves datacenter GPUs only.
DRIVER_START_FAILURES = (
    (("Driver/library version mismatch", "Error 803"),
     "the loaded NVIDIA kernel module and the driver's user-space libraries (libcuda, NVML) are different versions, "
     "as after a driver upgrade without a reboot: reboot the host, or unload and reload the nvidia kernel modules"),
    (("Error 804",),
     "a forward-compatible libcuda (cuda-compat) is loaded, but this GPU does not support forward compatibility "
     "(datacenter GPUs only): upgrade the host driver to the CUDA release's own, or take cuda-compat off the loader "
     "path"),
)


# Why CUDA cannot start where a host service is the cause, the driver being right: cudaErrorSystemNotReady = 802,
# "system not yet initialized" (CUDA Runtime API, cudaError): on NVSwitch systems CUDA starts only once the Fabric
# Manager runs (NVIDIA Fabric Manager User Guide).
HOST_SERVICE_FAILURES = (
    (("Error 802",),
     "CUDA waits for a host service: on NVSwitch systems (HGX/DGX A100, H100, B200) start nvidia-fabricmanager, of the "
     "driver's own version (`systemctl status nvidia-fabricmanager`)"),
)


def _start_failure(table: tuple, gpu: dict) -> str | None:
    said = [(gpu.get("nvidia_smi_error") or {}).get("output") or "", *gpu.get("warnings", [])]
    for words, meaning in table:
        quoted = next((text for text in said for word in words if word in text), None)
        if quoted:
            return f"{meaning} (seen: {quoted.strip()[-300:]!r})"
    return None


def driver_start_failure(gpu: dict) -> str | None:
    """The host-driver reason CUDA could not start, from nvidia-smi's failure and torch's warnings; None if none."""
    return _start_failure(DRIVER_START_FAILURES, gpu)


def host_start_failure(gpu: dict) -> str | None:
    """Why CUDA could not start, where the host (its driver or a service) is the cause; None if no known cause."""
    return driver_start_failure(gpu) or _start_failure(HOST_SERVICE_FAILURES, gpu)


def driver_verdict(driver: str, libcuda: int | None, spec: ImageSpec,
                   minimum: tuple[str, str] | None = None) -> tuple[str, str]:
    """ok | warn | fail for a row on a host driver (the kernel module's version, as nvidia-smi reports it), with why.

    A libcuda that supports the row's CUDA (cuDriverGetVersion, e.g. a cuda-compat forward-compatibility libcuda on
    an older datacenter branch) decides alone; pass it only where CUDA started (a compat libcuda on a GPU without
    forward compatibility reports its version all the same). Otherwise: below the CUDA major's
    minor-version-compatibility floor CUDA does not start; between the floor and the release's GA driver the cubins
    run but PTX newer than the driver cannot be JIT-compiled and newer features fail; at or above the GA driver
    everything works."""
    ga, source = minimum or (spec.min_driver or "", f"row {spec.tag}")
    floor = spec.driver_floor or ga
    if libcuda and spec.cuda and libcuda >= cuda_version_number(spec.cuda):
        supported = f"{libcuda // 1000}.{libcuda % 1000 // 10}"
        return "ok", f"the libcuda this process loads supports CUDA {supported} (driver {driver}; CUDA {spec.cuda} needs it)"
    if version_tuple(driver) < version_tuple(floor):
        return "fail", (f"the host driver {driver} is older than any CUDA {(spec.cuda or '').split('.')[0]}.x runs on "
                        f"({floor}, minor-version compatibility; {ga} for all of CUDA {spec.cuda}, {source})")
    if version_tuple(driver) < version_tuple(ga):
        return "warn", (f"the host driver {driver} is older than CUDA {spec.cuda}'s own ({ga}, {source}): it runs in "
                        f"minor-version compatibility (>= {floor}); PTX newer than the driver cannot be JIT-compiled "
                        f"(GPUs only the arch list's +PTX covers fail) and features that need a newer driver are "
                        f"unavailable; upgrade to {ga}+ for all of CUDA {spec.cuda}")
    return "ok", f"driver {driver} >= {ga} ({source})"


# PTX is JIT-compiled by the driver, which reads only PTX of its own CUDA release or older: under minor-version
# compatibility (a driver older than the release's own) "applications that use PTX ... will not work" past the
# driver's CUDA version (NVIDIA CUDA Compatibility guide, "Minor Version Compatibility", limitations; the error is
# CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain").
PTX_TOO_NEW = "CUDA error: the provided PTX was compiled with an unsupported toolchain."


def ptx_only_without_jit(coverage: str | None, driver_status: str) -> bool:
    """A GPU that only the arch list's PTX covers, on a driver below the release's own (driver_verdict's "warn"):
    nothing runs on it, whatever the versions' floor says."""
    return bool(coverage and coverage.startswith("PTX")) and driver_status == "warn"


# Triton ships CUPTI for its own profiler (proton), which dlopens it from these folders only when asked to profile
# (triton.knobs.proton.cupti_lib_dir / TRITON_CUPTI_LIB_PATH). torch never loads them: libtorch_cpu.so needs
# libcupti.so.N and finds the nvidia-cuda-cupti wheel's copy through its RPATH ($ORIGIN/../../nvidia/cu13/lib).
TRITON_PROFILER_CUPTI = re.compile(r"/site-packages/triton/backends/nvidia/lib/cupti[^/]*/libcupti\.so[.0-9]*$")


def duplicated_libraries(library_copies: dict[str, list[str]]) -> dict[str, list[str]]:
    """CUDA library families with more than one copy that torch could load, Triton's profiler CUPTI aside."""
    counted = {family: [path for path in paths if not TRITON_PROFILER_CUPTI.search(path)]
               for family, paths in library_copies.items()}
    return {family: paths for family, paths in counted.items() if len(paths) > 1}


def distinct_errors(outcomes: dict[str, str], limit: int = 600) -> str:
    """{"float16": "InvalidCxxCompiler: ...", "float32": same} -> "float16, float32: InvalidCxxCompiler: ...": one
    failure repeated per dtype is said once."""
    by_error: dict[str, list[str]] = {}
    for name, outcome in outcomes.items():
        if outcome != "ok":
            by_error.setdefault(outcome[-limit:], []).append(name)
    return "; ".join(f"{', '.join(names)}: {error}" for error, names in by_error.items())


def compile_fix(error: str) -> str:
    """What to do about a failed torch.compile, from its error."""
    if "Python.h" in error:
        return "Install the Python headers (pythonX.Y-dev): inductor's CPU kernels include Python.h"
    if re.search(r"InvalidCxxCompiler|C\+\+ compiler|Failed to find C compiler|gcc|g\+\+|cc1plus", error):
        return ("Install a C/C++ compiler (gcc, g++) and the Python headers (pythonX.Y-dev) in every image, runtime "
                "too: inductor compiles its CPU kernels, and Triton its GPU launcher, when a program runs")
    return "Run torch.compile in the image to see the whole error (TORCH_LOGS=+inductor)"


def pip_error(output: str) -> str:
    """The explanation in pip's output (or a build log's failing step): its last ERROR line or Python exception,
    else the last line it wrote, without terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", output).rsplit(" ---> Running in", 1)[-1]
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.startswith("Removing intermediate container")]
    errors = [line for line in lines if re.match(r"^(ERROR:|[A-Za-z]+Error:)", line)]
    return (errors or lines or ["(no output)"])[-1]


def os_is_the_rows(found: str, spec) -> bool:
    """/etc/os-release's ID+VERSION_ID against the row's OS: compat.yaml's `os_release` may be a pattern (rocky9.*,
    for a base image that floats across point releases)."""
    return fnmatchcase(found, spec.os_release or spec.os)
