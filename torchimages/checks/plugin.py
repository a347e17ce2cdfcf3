"""pytest plugin for the image checks (torchimages/checks/suite): expectations and facts in, one verdict per check out.

    pytest torchimages/checks/suite -c torchimages/checks/suite/pytest.ini --hosts docker://<container> \\
        -p torchimages.checks.plugin --expect reports/<tag>/expect.json --probe reports/<tag>/facts.json \\
        --check-results checks.json

Every test carries `@pytest.mark.check("<name>")`. A check fails if any of its tests failed, is skipped (with the
reasons) if all of them were skipped, and passes otherwise. Test ids name the image tag, not the container. The tests
of a check the expectations' selection leaves out (`build.py test --only/--skip`) are skipped, naming the option.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from .checklist import NAMES
from .selection import CheckSelection

CHECK_MARKER = "check"
# The CheckRecorder's name in pytest's plugin manager, where the suite's fixtures find it.
RECORDER = "torchimages-check-recorder"


class CheckWarning(UserWarning):
    """A test that passed with a limit worth knowing (a driver under the release's own, in minor-version
    compatibility): warnings.warn(CheckWarning(...)) in a test puts it on the check's verdict, which still passes."""


# A test skipped because the host spoils the work it checks (the GPU it ran on has uncorrected memory errors): not
# judged, and charged to the host. Never a pass: the work did not run right, so nothing is proven of the image, and
# its check is skipped (not judged) whatever its other tests did, so that publishing asks for a healthy host.
HOST_SKIP = "host: "


class HostWarning(CheckWarning):
    """A CheckWarning whose cause is the host, not the image (a sick GPU, a degraded link): the check's verdict says
    blame "host"."""


@dataclass(frozen=True)
class Outcome:
    test: str
    check: str
    status: str  # passed | failed | skipped
    message: str = ""
    seconds: float = 0.0
    host: bool = False  # a passed test that warned about the host (HostWarning), or one skipped for it (HOST_SKIP)


def aggregate(outcomes: list[Outcome], checks: tuple[str, ...] = NAMES) -> dict[str, dict]:
    """Per check: failed if any test failed, skipped if all were skipped or one was not judged for the host (HOST_SKIP:
    its work proved nothing, so the check cannot pass), else passed; messages say why. Its blame: "image" where it
    failed, "host" where a test warned about the host or was skipped for it, else ""."""
    verdicts = {}
    for name in checks:
        mine = [o for o in outcomes if o.check == name]
        if not mine:
            continue
        failed = [o for o in mine if o.status == "failed"]
        skipped = [o for o in mine if o.status == "skipped"]
        warned = list(dict.fromkeys(o.message for o in mine if o.status == "passed" and o.message))
        if failed:
            status, message = "failed", "; ".join(o.message for o in failed)
        elif len(skipped) == len(mine):
            status, message = "skipped", "; ".join(dict.fromkeys(o.message for o in skipped))
        elif any(o.host for o in skipped):
            status = "skipped"
            message = "not judged: " + "; ".join(dict.fromkeys(o.message for o in skipped if o.host))
        else:
            status = "passed"
            message = f"{len(mine) - len(skipped)} of {len(mine)} tests passed"
            if warned:
                message += "; warning: " + "; ".join(warned)
            if skipped:
                message += "; not applicable: " + "; ".join(dict.fromkeys(o.message for o in skipped))
        host = status != "failed" and any(o.host for o in mine if o.status != "failed")
        verdicts[name] = {"status": status, "message": message,
                          "warnings": warned if status == "passed" else [],
                          "blame": "image" if status == "failed" else "host" if host else "",
                          "tests": [{"test": o.test, "status": o.status, "message": o.message, "seconds": o.seconds}
                                    for o in mine]}
    return verdicts


def failure_message(excinfo: pytest.ExceptionInfo) -> str:
    """The sentence a test wrote, without pytest's re-rendering of the assert expression."""
    error = excinfo.value
    if isinstance(error, AssertionError):
        text = str(error).split("\nassert ", 1)[0].strip()
        return text or "assertion failed without a message"
    if isinstance(error, pytest.fail.Exception):
        return str(error.msg)
    return f"{type(error).__name__}: {error}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchimages", "torchimages image checks")
    group.addoption("--expect", type=Path, help="expect.json: the matrix row and how the container was run")
    group.addoption("--probe", type=Path, help="facts.json: what the probe found in the container")
    group.addoption("--check-results", type=Path, help="write the per-check verdicts here as JSON")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{CHECK_MARKER}(name): the check ({', '.join(NAMES)}) this test belongs to")
    if config.getoption("--expect") and config.getoption("--probe"):
        config.pluginmanager.register(CheckRecorder(config), RECORDER)


class CheckRecorder:
    """The run's expectations and facts (the suite's conftest gives them to its tests as fixtures: a fixture defined as
    a method here is deprecated in pytest 9 and removed in 10), and every test's outcome, aggregated per check."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.expectations = json.loads(config.getoption("--expect").read_text())
        self.probe_facts = json.loads(config.getoption("--probe").read_text())
        self.selection = CheckSelection.from_json(self.expectations.get("selection", {}))
        self.outcomes: dict[str, Outcome] = {}
        self.check_of: dict[str, str] = {}

    def _stable(self, nodeid: str) -> str:
        """The test id with the tag in place of a container id that changes every run."""
        return nodeid.replace(f"docker://{self.expectations['container_id']}", self.expectations["tag"])

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        unmarked = []
        for item in items:
            marker = item.get_closest_marker(CHECK_MARKER)
            if marker is None or not marker.args or marker.args[0] not in NAMES:
                unmarked.append(item.nodeid)
                continue
            self.check_of[self._stable(item.nodeid)] = marker.args[0]
            item.user_properties.append(("check", marker.args[0]))
            if not self.selection.runs(marker.args[0]):  # skipped before its fixtures read facts never gathered
                item.add_marker(pytest.mark.skip(reason=self.selection.reason))
        if unmarked:
            raise pytest.UsageError(f"tests without @pytest.mark.check(<one of {', '.join(NAMES)}>): {', '.join(unmarked)}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        report.nodeid = self._stable(report.nodeid)  # what JUnit and the terminal show
        test = report.nodeid
        check = self.check_of.get(test)
        if check is None:
            return report
        previous = self.outcomes.get(test)
        if report.failed:
            message = failure_message(call.excinfo) if call.excinfo else report.longreprtext[-500:]
            self.outcomes[test] = Outcome(test, check, "failed", message, round(report.duration, 3))
        elif report.skipped and (previous is None or previous.status != "failed"):
            reason = (report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                      ).removeprefix("Skipped: ")
            self.outcomes[test] = Outcome(test, check, "skipped", reason, host=reason.startswith(HOST_SKIP))
        elif report.when == "call" and report.passed:
            self.outcomes[test] = Outcome(test, check, "passed", "", round(report.duration, 3))
        return report

    def pytest_warning_recorded(self, warning_message, when, nodeid, location) -> None:
        """Recorded once the test's reports are made: a CheckWarning becomes its passed outcome's message."""
        outcome = self.outcomes.get(self._stable(nodeid))
        if issubclass(warning_message.category, CheckWarning) and outcome and outcome.status == "passed":
            message = "; ".join(filter(None, (outcome.message, str(warning_message.message))))
            host = outcome.host or issubclass(warning_message.category, HostWarning)
            self.outcomes[outcome.test] = replace(outcome, message=message, host=host)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.config.getoption("--check-results")
        if path:
            path.write_text(json.dumps(aggregate(list(self.outcomes.values())), indent=2))
