"""What the build tests share (test_build, test_build_inputs, test_hostile_files, test_hostile_build_inputs): a
two-row matrix for builds that need no torch, and a small pure-Python wheel."""
import re
import zipfile
from pathlib import Path

from torchimages.build_inputs.container import SERVER_LABEL, SERVES_LABEL

from .conftest import with_live_compat


def tiny_matrix(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(
        "registry: localhost:5000/test/tiny\n"
        "defaults: {python: \"3.11\", os: debian12, cuda: cpu}\n"
        "variants:\n"
        "  - torch: 2.13.0\n    flavors: [runtime]\n"
        "  - torch: 2.12.0\n    flavors: [runtime]\n"
    )
    return with_live_compat(path)


def make_wheel(folder: Path, name: str, version: str, body: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", body)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def steps_run(log: str) -> list[str]:
    """The instructions a classic builder's log shows run, not taken from the cache, in order (a log may hold two
    builds: the python stage for the server on the engine, then the image)."""
    steps = re.split(r"^Step [0-9]+/[0-9]+ : ", log, flags=re.MULTILINE)[1:]
    return [step.splitlines()[0] for step in steps if " ---> Using cache" not in step]


def build_input_servers_left(docker_client, serving: Path | str) -> tuple[list[str], list[str]]:
    """The containers and networks of build-input servers on the engine (the label container.py gives them) that
    serve builds under serving (a run's reports folder): the other side of the engine lane builds at the same time,
    and its servers are its own."""
    label = {"label": SERVER_LABEL}

    def ours(labels: dict[str, str] | None) -> bool:
        return (labels or {}).get(SERVES_LABEL, "").startswith(str(Path(serving).resolve()))

    return ([c["Id"] for c in docker_client.api.containers(all=True, filters=label) if ours(c["Labels"])],
            [n["Name"] for n in docker_client.api.networks(filters=label) if ours(n["Labels"])])
