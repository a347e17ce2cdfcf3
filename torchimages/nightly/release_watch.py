"""The release watch (nightly): a torch on the index newer than the matrix's newest -> its facts read into
compat.yaml, rows proposed in matrix.yaml shaped like the newest ones, and their Dockerfiles rendered. A proposal is
a change for review (the workflow opens a pull request with it); nothing is built for publishing from it."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from io import StringIO
from pathlib import Path

from packaging.version import Version
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from ..build import render
from ..build.bases_lock import LOCK_NAME, read_lock
from ..files import atomic_write, read_text, remove_file
from ..matrix import compat_refresh, load
from ..matrix.compat_file import round_trip_yaml
from ..model import InputError, Problem
from ..peers import package_index
from ..redaction import inert
from ..yamlsource import load_yaml

REPORT_JSON, REPORT_MARKDOWN = "release-watch.json", "release-watch.md"


@dataclass(frozen=True)
class WatchOptions:
    matrix_file: Path
    compat_file: Path
    templates: Path
    images: Path
    reports: Path
    index_url: str


@dataclass
class Proposal:
    release: str = ""  # the newer release, "" when the matrix has the newest already
    newest_in_matrix: str = ""
    tags: list[str] = field(default_factory=list)  # the proposed rows' tags
    notes: list[str] = field(default_factory=list)  # rows not proposed, and why
    disagreements: list[str] = field(default_factory=list)


def watch(options: WatchOptions, index: package_index.Index | None = None) -> Proposal:
    index = index or package_index.open_index(options.index_url)
    matrix = load.load_matrix(options.matrix_file, options.compat_file)
    proposal = Proposal(newest_in_matrix=str(max(Version(spec.torch) for spec in matrix.specs)))
    newest = compat_refresh.newest_release(index)
    if newest is None or Version(newest) <= Version(proposal.newest_in_matrix):
        _write_reports(options.reports, proposal)
        return proposal
    proposal.release = newest
    refreshed = compat_refresh.refresh(compat_refresh.RefreshOptions(options.compat_file, options.index_url, (newest,)),
                                       index)
    proposal.disagreements = [f"{d.where}: compat.yaml {d.compat}, index {d.index}" for d in refreshed.disagreements]
    release = refreshed.releases[0]
    compat = load.load_compat(options.compat_file)
    variants = load_yaml(options.matrix_file)["variants"]
    pairs = propose_rows(variants, proposal.newest_in_matrix, release, compat, proposal.notes, index.url)
    matrix_text = read_text(options.matrix_file, "restore it with `git checkout -- matrix.yaml`")
    origin = f"torch {newest} on {inert(index.url)}"
    valid = []
    for pair in pairs:  # a row the matrix would refuse (a CUDA or Python the data lacks) is a note, not a failure
        problems = _problems(options, with_proposed_rows(matrix_text, variants, proposal.newest_in_matrix, [pair],
                                                         origin))
        if problems:
            row = pair[1]
            proposal.notes.append(f"the row like line {pair[0].line} (torch {row['torch']}, cuda {row.get('cuda')}"
                                  f"{', ' + str(row['os']) if row.get('os') else ''}) is not proposed: "
                                  + "; ".join(problems))
        else:
            valid.append(pair)
    if valid:
        text = with_proposed_rows(matrix_text, variants, proposal.newest_in_matrix, valid, origin)
        _write_checked(options, text)
        specs = load.load_matrix(options.matrix_file, options.compat_file).specs
        proposal.tags = [spec.tag for spec in specs if spec.torch == newest]
        _render(options, specs)
    _write_reports(options.reports, proposal)
    return proposal


def _machines_read(row_copy: dict, build: dict, torch: str, notes: list[str]) -> bool:
    """Keep in a copied row the machines whose wheels of this build were read (x86_64's, and those under
    `by_arch:`): a GPU row cannot name a machine without them. False when none is left: the row is not proposed."""
    arch = row_copy.get("arch")
    if arch is None:
        return True
    arches = arch if isinstance(arch, list) else [arch]
    kept = [machine for machine in arches if machine == "x86_64" or machine in (build.get("by_arch") or {})]
    for machine in (machine for machine in arches if machine not in kept):
        notes.append(f"the index has no {machine} wheel of torch {torch}'s {build.get('wheel_index')} build: its "
                     f"rows are proposed without {machine}")
    if not kept:
        return False
    if kept == ["x86_64"]:
        del row_copy["arch"]
    else:
        row_copy["arch"] = kept if isinstance(arch, list) else kept[0]
    return True


def propose_rows(variants, newest_in_matrix: str, release: compat_refresh.ReleaseFacts, compat: dict,
                 notes: list[str], index_url: str = "the index") -> list[tuple]:
    """A copy of each row of the matrix's newest release, for the new one: its torchvision, the same CUDA where
    the new release has that build (else PyPI's build for a row on PyPI's), cuDNN's major as the wheel pins it.
    CPU rows held at an older release (their +cpu wheels were out of reach) follow when the index has the new
    release's CPU build; when it does not, the proposal says they stay behind, and why. Pairs: (row copied, copy)."""
    new_facts = compat["torch"][release.torch]
    old_facts = compat["torch"].get(newest_in_matrix, {})
    pypi_build = next((cuda for cuda, facts in new_facts.get("cuda", {}).items() if facts.get("pypi")), None)
    cpu_versions = [Version(str(row.get("torch"))) for row in variants if str(row.get("cuda")) == "cpu"]
    newest_cpu = str(max(cpu_versions)) if cpu_versions else None
    if newest_cpu and newest_cpu != newest_in_matrix and not new_facts.get("cpu"):
        notes.append(f"the CPU rows stay at torch {newest_cpu}: {index_url} has no +cpu build of torch "
                     f"{release.torch} (its CPU wheels are on {compat_refresh.PYTORCH_INDEX}cpu; where that index is "
                     f"reachable, `compat refresh {release.torch} --index-url {compat_refresh.PYTORCH_INDEX}cpu` "
                     "reads it and the CPU rows can move)")
    proposed = []
    for row in variants:
        held_cpu_row = str(row.get("cuda")) == "cpu" and str(row.get("torch")) == newest_cpu
        if str(row.get("torch")) != newest_in_matrix and not (held_cpu_row and new_facts.get("cpu")):
            continue
        cuda = str(row.get("cuda"))
        if cuda != "cpu" and cuda not in new_facts.get("cuda", {}):
            was_pypi = old_facts.get("cuda", {}).get(cuda, {}).get("pypi")
            if not (was_pypi and pypi_build):
                notes.append(f"torch {release.torch} has no CUDA {cuda} build on the index: its row is not proposed")
                continue
            cuda = pypi_build
        if cuda != "cpu" and not new_facts["cuda"][cuda].get("cudnn"):  # the wheel pinned none: no cuDNN to name
            notes.append(f"torch {release.torch}'s CUDA {cuda} wheel pins no cuDNN: its row is not proposed")
            continue
        if cuda == "cpu" and not new_facts.get("cpu"):
            notes.append(f"torch {release.torch} has no CPU build on the index: the CPU row is not proposed")
            continue
        row_copy = compat_refresh.plain(row)
        row_copy["torch"] = release.torch
        if cuda != "cpu":
            row_copy["cuda"] = compat_refresh.quoted(cuda)
            row_copy["cudnn"] = int(new_facts["cuda"][cuda]["cudnn"].split(".")[0])
            if not _machines_read(row_copy, new_facts["cuda"][cuda], release.torch, notes):
                continue
        if "torchvision" in row_copy:
            if release.torchvision:
                row_copy["torchvision"] = release.torchvision
            else:
                del row_copy["torchvision"]
                notes.append(f"no torchvision on the index takes torch {release.torch}: proposed without it")
        proposed.append((row, row_copy))
    return proposed


def with_proposed_rows(text: str, variants, newest_in_matrix: str, pairs: list[tuple], origin: str) -> str:
    """matrix.yaml's text with the proposed rows above the newest release's rows (their comments and everything else
    kept as written); a copied row's aliases move to its copy (`latest` follows the newest release)."""
    lines = text.splitlines(keepends=True)
    rows = [copy for _, copy in pairs]
    moved = [source for source, _ in pairs if "aliases" in source]
    for row in sorted(moved, key=lambda row: -row.line_of("aliases")):
        del lines[row.line_of("aliases") - 1:_end_of_value(lines, row.line_of("aliases"))]
    first = min(row.line for row in variants if str(row.get("torch")) == newest_in_matrix)
    at = _start_of_comment_above(lines, first - 1)  # the aliases removed are below this line
    stream = StringIO()
    round_trip_yaml().dump([_flow_lists(row) for row in rows], stream)
    header = [f"  # Proposed by the release watch ({origin}),\n",
              (f"  # shaped like the newest rows ({newest_in_matrix}; CPU rows like the newest CPU ones): review its "
              "facts in compat.yaml.\n")]
    proposed = header + stream.getvalue().splitlines(keepends=True) + ["\n"]
    return "".join(lines[:at] + proposed + lines[at:])


def _end_of_value(lines: list[str], line: int) -> int:
    """The index after a key's value: its own line and the lines indented deeper than the key below it."""
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    end = line
    while end < len(lines) and lines[end].strip() and len(lines[end]) - len(lines[end].lstrip()) > indent:
        end += 1
    return end


def _start_of_comment_above(lines: list[str], index: int) -> int:
    while index > 0 and lines[index - 1].lstrip().startswith("#"):
        index -= 1
    return index


def _flow_lists(row: dict) -> CommentedMap:
    """A proposed row in the matrix's style: its lists and mappings on one line."""
    return CommentedMap((key, _flow(value)) for key, value in row.items())


def _flow(value):
    if isinstance(value, str) and re.fullmatch(r"[0-9]+\.[0-9]+", value):
        return compat_refresh.quoted(value)  # "3.12", as the matrix writes it (3.12 would be a number)
    if not isinstance(value, (list, dict)):
        return value
    styled = (CommentedSeq(_flow(item) for item in value) if isinstance(value, list)
              else CommentedMap((key, _flow(item)) for key, item in value.items()))
    styled.fa.set_flow_style()
    return styled


def _problems(options: WatchOptions, text: str) -> list[str]:
    """What the matrix check says of a matrix text (nothing when it validates); matrix.yaml is not touched."""
    try:
        _validate(options, text)
    except InputError as error:
        return list(dict.fromkeys(problem.message for problem in error.problems))
    return []


def _write_checked(options: WatchOptions, text: str) -> None:
    """Write the proposed matrix only if it validates; else leave matrix.yaml as it was and say why."""
    try:
        _validate(options, text)
    except InputError as error:
        raise InputError([Problem(str(options.matrix_file), problem.line, f"the proposed rows do not validate: "
                                  f"{problem.message}") for problem in error.problems]) from None
    atomic_write(options.matrix_file, text)


def _validate(options: WatchOptions, text: str) -> None:
    """Load a matrix text as the matrix file it would become (beside it: its compat.yaml and lock are found the
    same way). Written as every file is (a link there replaced, never written through), in the locked folder."""
    candidate = options.matrix_file.with_name(f".{options.matrix_file.name}.proposed")
    atomic_write(candidate, text)
    try:
        load.load_matrix(candidate, options.compat_file)
    finally:
        remove_file(candidate, candidate.parent)


def _render(options: WatchOptions, specs) -> None:
    pinned = {image: base.reference for image, base in read_lock(options.matrix_file.parent / LOCK_NAME).items()}
    repository = specs[0].repository if specs else ""
    render.write_rendered(options.images, render.render_files(
        specs, options.templates, options.matrix_file.name, repository, pinned))


def _write_reports(reports: Path, proposal: Proposal) -> None:
    atomic_write(reports / REPORT_JSON, json.dumps(asdict(proposal), indent=2) + "\n")
    atomic_write(reports / REPORT_MARKDOWN, markdown(proposal))


def markdown(proposal: Proposal) -> str:
    """The pull request's body (the workflow appends the verification summary)."""
    if not proposal.release:
        return f"No torch release newer than the matrix's {proposal.newest_in_matrix} on the index.\n"
    lines = [f"## torch {proposal.release}: proposed rows", "",
             (f"The index has torch {proposal.release}; the matrix's newest was {proposal.newest_in_matrix}. "
             "`torchimages watch` read its facts from the wheels into `compat.yaml` (each build with its "
             "`source:`), proposed rows shaped like the newest ones in `matrix.yaml` and rendered them. Nothing is "
             "published from this proposal: merging it lets the nightly build, verify and publish the rows."), ""]
    lines += [f"- `{tag}`" for tag in proposal.tags] or ["- no rows could be proposed"]
    # Notes and disagreements quote the index: one line each, whatever it sent.
    lines += ["", *(f"- note: {inert(note)}" for note in proposal.notes)]
    lines += [f"- disagreement (kept, check it): {inert(item)}" for item in proposal.disagreements]
    return "\n".join(lines).rstrip() + "\n"
