"""Which checks a verification runs (`build.py test --only/--skip`): a developer re-running the one check that failed,
or the test suite verifying a broken image without the slow work of checks it does not test. The probe leaves the
work of unselected checks undone, and they are reported skipped, naming the option. A selective verification never
counts for shipping: publish and the nightly take only a report of every check."""
from __future__ import annotations

from dataclasses import dataclass

from ..model import InputError, Problem
from . import checklist


@dataclass(frozen=True)
class CheckSelection:
    """--only names the checks to run, --skip those not to; neither: every check (the default)."""

    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        return not self.only and not self.skip

    def runs(self, check: str) -> bool:
        return check in self.only if self.only else check not in self.skip

    def selected(self) -> tuple[str, ...]:
        """The checks that run, in the checklist's order."""
        return tuple(name for name in checklist.NAMES if self.runs(name))

    def to_json(self) -> dict[str, list[str]]:
        """What verify.json and expect.json record: {} for every check, else {"only": [...]} or {"skip": [...]}."""
        return {option: list(names) for option, names in (("only", self.only), ("skip", self.skip)) if names}

    @classmethod
    def from_json(cls, data: dict[str, list[str]]) -> CheckSelection:
        return cls(only=tuple(data.get("only", ())), skip=tuple(data.get("skip", ())))

    @property
    def flags(self) -> str:
        return as_flags(self.to_json())

    @property
    def reason(self) -> str:
        """What an unselected check's verdict says."""
        return f"not selected: {self.flags}"


def as_flags(selection: dict[str, list[str]]) -> str:
    """A recorded selection as the flags that made it: {"skip": ["smoke", "devel"]} -> "--skip smoke,devel"."""
    return " ".join(f"--{option} {','.join(names)}" for option, names in selection.items())


def check_names(flag: str, values: list[str]) -> tuple[str, ...]:
    """--only/--skip values, repeated or comma-separated -> check names, each once; an unknown name is an InputError
    naming it and the checks there are."""
    names = tuple(dict.fromkeys(name.strip() for value in values for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in checklist.NAMES]
    if unknown:
        raise InputError([Problem(flag, 0, f"{flag} {unknown[0]!r} is not a check: name one or more of "
                                           f"{', '.join(checklist.NAMES)}")])
    if not names:
        raise InputError([Problem(flag, 0, f"{flag} names no check: name one or more of {', '.join(checklist.NAMES)}")])
    return names


def parse_selection(only: list[str] | None, skip: list[str] | None) -> CheckSelection:
    """The selection `build.py test` was given (None: the flag is absent); InputError for one it cannot run."""
    if only is not None and skip is not None:
        raise InputError([Problem("--only", 0, "--only and --skip cannot be combined: --only names the checks to run, "
                                               "--skip the ones not to; pass one of them")])
    selection = CheckSelection(only=check_names("--only", only) if only is not None else (),
                               skip=check_names("--skip", skip) if skip is not None else ())
    if not selection.selected():
        raise InputError([Problem("--skip", 0, "--skip names every check, so nothing would be verified: skip fewer, "
                                               "or name the checks to run with --only")])
    return selection
