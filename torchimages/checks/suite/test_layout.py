"""layout: the image's layers as a cold node, image streaming and registries take them (the rules and why:
torchimages/checks/layout.py)."""
import pytest

from torchimages.checks.layout import layout_problems

pytestmark = pytest.mark.check("layout")


@pytest.fixture(scope="module")
def layers(facts) -> dict:
    part = facts["layers"]
    if "probe_error" in part:
        pytest.fail(part["probe_error"])
    return part


def test_layers_stream_and_upload_well(layers):
    problems = layout_problems(layers["layers"], layers["limit"])
    assert not problems, "; ".join(problems)
