"""What the verification tests on the engine share (test_verify, test_cuda_images): a broken image's flags, the
containers a run leaves, and its reports read back."""
import json
from pathlib import Path

from torchimages.verify import VERIFY_LABEL
from torchimages.verify.plan import image_folder


def selection_for(check: str) -> tuple[str, ...]:
    """The flags a broken image caught by `check` is verified with: --skip smoke, unless smoke is that check. The smoke
    check's compiles are most of a verification's time, and every other check still runs, so the image is still
    proven to fail exactly its check among them."""
    return () if check == "smoke" else ("--skip", "smoke")


def containers_left(docker_client, reports: Path) -> list[str]:
    """Verification containers and derived images of the run writing to reports (others may verify on the same
    engine meanwhile). Listed without inspecting each, as the SDK's containers.list() does: a derived image's build
    container may be gone between the list and the inspect."""
    labels = {"label": [VERIFY_LABEL, f"{VERIFY_LABEL}.reports={reports.resolve()}"]}
    containers = [entry["Names"][0].lstrip("/") for entry in docker_client.api.containers(all=True, filters=labels)]
    return containers + docker_client.api.images(all=True, filters=labels, quiet=True)


def report_of(reports: Path, tag: str) -> dict:
    return json.loads((reports / tag / "verify.json").read_text())


def image_report_of(reports: Path, tag: str, image: str) -> dict:
    """The verification of an image given by `test --image`: apart from the row's own (reports/<tag>/verify.json)."""
    return json.loads((reports / tag / image_folder(image) / "verify.json").read_text())


def statuses(report: dict) -> dict[str, str]:
    return {name: check["status"] for name, check in report["checks"].items()}


def failed_checks(report: dict) -> set[str]:
    return {name for name, status in statuses(report).items() if status == "failed"}


def assert_only_check_failed(report: dict, good: dict, check: str, says: tuple[str, ...]) -> None:
    """The check fails saying what was wrong and what to do; no other check fails that passes on the good image.

    (Others may turn skipped: without torch, the checks that need it skip and point at identity.)"""
    assert statuses(report)[check] == "failed", report["checks"][check]
    assert failed_checks(report) - {check} == failed_checks(good) - {check}, report["checks"]
    message = report["checks"][check]["message"]
    for words in says:
        assert words in message, f"{words!r} not in: {message}"
