"""The repository's nightly workflow, read as GitHub runs it (test_release_watch, test_hostile_index)."""
import yaml

from .conftest import ROOT


def workflow_step(job: str, name: str) -> dict:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    return next(step for step in workflow["jobs"][job]["steps"] if step.get("name") == name)
