"""The probe's child sections (checks/probe_base.py's ChildSection), as a loaded host runs them: a child that ends
in the grace after its bound gives what it found; one still running after the grace is killed and said to have
timed out. (The engine lane once failed a healthy CPU image with "the torch.compile process exited with code 0
without a result": its child had sent its result a moment after the bound, and nobody read it.)"""
import time

from torchimages.checks import probe_base


def finds_after(seconds: float) -> dict:
    time.sleep(seconds)
    return {"ok": True, "found": "it"}


def test_a_child_that_ends_just_after_its_bound_gives_its_result():
    result = probe_base.ChildSection("late child", 0.2, finds_after, 1.0).result()
    assert result["ok"] is True and result["found"] == "it", result


def test_a_child_still_running_after_the_grace_is_killed_and_timed_out():
    started = time.monotonic()
    result = probe_base.ChildSection("hung child", 0.2, finds_after, 60.0).result()
    assert result == {"ok": False, "error": "hung child was killed by signal 9 without a result (timed out)"}
    assert time.monotonic() - started < 30
