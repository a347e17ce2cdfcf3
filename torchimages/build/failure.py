"""Why a build failed, in one line: the cause read from its build log and the flag or command that fixes it. The
console says this line and the log's path; the log keeps everything Docker and pip said (without terminal escapes)."""
from __future__ import annotations

import re

from ..invocation import command

# Terminal escape sequences: CSI (colours, cursor moves: pip's `ESC[91m`), OSC (titles, links), and the two-byte ones.
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]", re.ASCII)
SHORT = 100  # characters of a step's command the line quotes: enough to know the step, never the 900 of a RUN line

PIP_WANTED = re.compile(r"No matching distribution found for (\S+)", re.ASCII)
PIP_ASKED = re.compile(r"^Looking in indexes: (.+)$", re.MULTILINE | re.ASCII)
TLS_FAILED = re.compile(r"SSLCertVerificationError|CERTIFICATE_VERIFY_FAILED|There was a problem confirming the ssl "
                        r"certificate", re.ASCII)
TLS_WHY = re.compile(r"certificate verify failed: ([^(')]+)", re.ASCII)
HOST_OF = re.compile(r"host='([^']+)'(?:, port=([0-9]+))?", re.ASCII)
NOT_RESOLVED = re.compile(r"Temporary failure in name resolution|Name or service not known|No address associated "
                          r"with hostname|nodename nor servname|getaddrinfo failed", re.ASCII)
REFUSED = re.compile(r"Connection refused", re.ASCII)
TIMED_OUT = re.compile(r"(?:Connect|Read)TimeoutError|timed out", re.ASCII)
PROXY = re.compile(r"ProxyError\('Cannot connect to proxy", re.ASCII)
BASE_MISSING = re.compile(r"pull access denied for (\S+?),|No such image: (\S+)|manifest for (\S+) not found"
                          r"|manifest unknown", re.ASCII)
# A stage's image the build made earlier, gone before a later step copies from it (a prune on the engine meanwhile).
STAGE_GONE = re.compile(r"invalid from flag value (\S+): No such image", re.ASCII)
FROM_STEP = re.compile(r"^Step [0-9]+/[0-9]+ : ARG BASE_IMAGE=(\S+)", re.MULTILINE | re.ASCII)
APT_UNRESOLVED = re.compile(r"Temporary failure resolving '([^']+)'|Could not resolve '([^']+)'", re.ASCII)
APT_FAILED = re.compile(r"^(E: .+)$", re.MULTILINE | re.ASCII)
CLASSIC_STEP = re.compile(r"^Step ([0-9]+/[0-9]+) : (.+)$", re.MULTILINE | re.ASCII)
BUILDKIT_STEP = re.compile(r"^#([0-9]+) \[([^\]]+)\] (.+)$", re.MULTILINE | re.ASCII)
CLASSIC_EXIT = re.compile(r"returned a non-zero code: ([0-9]+)", re.ASCII)
BUILDKIT_TIME = re.compile(r"^[0-9]+\.[0-9]+ ", re.ASCII)  # BuildKit's seconds before each output line
BUILDKIT_EXIT = re.compile(r"did not complete successfully: exit code: ([0-9]+)", re.ASCII)
# Lines that are the builder's own, not the step's output: never "what the step said last".
BUILDER_LINE = re.compile(r"^(?: ---> |Removing intermediate container |ERROR: |Step [0-9]+/|#[0-9]+ (?:ERROR|DONE|CACHED))",
                          re.ASCII)


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def shorten(text: str, limit: int = SHORT) -> str:
    """text on one line, cut to limit characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def diagnose(build_log_text: str, tag: str = "TAG") -> tuple[str, str]:
    """(cause, remedy) of a failed build, read from its log: pip that could not reach or trust its index, a base the
    engine lacks, apt without its mirror; else the failing step and its last output line, and "read the full log".
    tag names the row in the commands of a remedy."""
    text = strip_ansi(build_log_text)
    pip = _pip(text, tag)
    if pip:
        return pip
    stage = STAGE_GONE.search(text)
    if stage:
        return (f"the image of its build stage `{stage.group(1)}` was removed while the build ran (a `docker image "
                "prune`, or another run's `--prune-build-stages`, on the engine)", "build it again")
    base = BASE_MISSING.search(text)
    if base:
        named = FROM_STEP.search(text)
        image = named.group(1) if named else next((group for group in base.groups() if group), "the base image")
        return (f"base image {image} is not on the engine, and the engine could not pull it",
                f"`docker pull {image}` where its registry is reachable, or `docker load` / `docker tag` a copy of it "
                "onto the engine (docs/building.md, \"Offline bases\")")
    apt = APT_UNRESOLVED.search(text)
    if apt:
        return (f"apt could not resolve its mirror {apt.group(1) or apt.group(2)}",
                "give the build a proxy (HTTP_PROXY / HTTPS_PROXY in the environment), or a base whose apt sources "
                "name a mirror it reaches (docs/building.md, \"Offline bases\")")
    return _failed_step(text), ""  # the step's output is in the full log, named after this line


def _pip(text: str, tag: str) -> tuple[str, str] | None:
    """pip's failure, when pip failed: each reason it gave (TLS, DNS, refused, timed out, no such version) with its
    remedy; None when the log holds no pip failure."""
    wanted = PIP_WANTED.search(text)
    causes: list[str] = []
    remedies: list[str] = []
    fetch = command(f"wheels '{tag}' --dest DIR")
    wheels = f"fetch the wheels where the index is reachable: {fetch}, then build with --wheelhouse DIR"
    tls = TLS_FAILED.search(text)
    if tls:
        why = TLS_WHY.search(text)
        causes.append("TLS verification failed" + (f": {why.group(1).strip()}" if why else ""))
        remedies.append("give the TLS-intercepting proxy's CA with --ca-bundle FILE")
    # What each says: where pip named the host, and where it did not (urllib3 1.x names only the connection object).
    unreachable = [(NOT_RESOLVED, "host {} not resolved", "host not resolved"),
                   (REFUSED, "{} refused the connection", "connection refused"),
                   (TIMED_OUT, "connection to {} timed out", "connection timed out"),
                   (PROXY, "proxy {} not reachable", "proxy not reachable")]
    for pattern, named, unnamed in unreachable:
        found = _line_with(text, pattern)
        if found:
            host = HOST_OF.search(found)
            causes.append(named.format(host.group(1)) if host else unnamed)
    if len(causes) > (1 if tls else 0):
        remedies.append(f"{'for the unreachable host, ' if tls else ''}{wheels}")
    if not causes and not wanted:
        return None
    if not causes:
        asked = PIP_ASKED.findall(text)
        causes.append(f"no such version on {shorten(asked[-1], 80)}" if asked else "no such version on the index")
        remedies.append(wheels + " (or name an index that has it with --pip-index-url)")
    subject = f"pip could not fetch {wanted.group(1)}" if wanted else "pip could not reach its index"
    return f"{subject} ({'; '.join(causes)})", "; ".join(remedies)


def _line_with(text: str, pattern: re.Pattern[str]) -> str:
    """The first line of pip's output that pattern matches ('' when none)."""
    for line in text.splitlines():
        if pattern.search(line) and ("WARNING: Retrying" in line or "Could not fetch URL" in line or "Error" in line):
            return line
    return ""


def _failed_step(text: str) -> str:
    """The failing step, shortened, how it ended, and the last line it printed."""
    classic = list(CLASSIC_STEP.finditer(text))
    buildkit = [step for step in BUILDKIT_STEP.finditer(text) if not step.group(2).startswith("internal")]
    exit_code = CLASSIC_EXIT.search(text) or BUILDKIT_EXIT.search(text)
    ending = f"returned a non-zero code: {exit_code.group(1)}" if exit_code else "failed"
    if classic:
        step = classic[-1]
        said = _last_output(text[step.end():].splitlines())
        cause = f"step {step.group(1)} `{shorten(step.group(2))}` {ending}"
    elif buildkit:
        step = buildkit[-1]
        prefix = f"#{step.group(1)} "
        said = _last_output([BUILDKIT_TIME.sub("", line[len(prefix):]) for line in text[step.end():].splitlines()
                             if line.startswith(prefix) and not BUILDER_LINE.match(line)])
        cause = f"step [{step.group(2)}] `{shorten(step.group(3))}` {ending}"
    else:
        errors = [line[len("ERROR: "):] for line in text.splitlines() if line.startswith("ERROR: ")]
        return shorten(errors[-1] if errors else (text.strip().splitlines() or ["the build failed"])[-1], 2 * SHORT)
    return cause + (f"; its last output: {shorten(said)}" if said else "")


def _last_output(lines: list[str]) -> str:
    for line in reversed(lines):
        if line.strip() and not BUILDER_LINE.match(line):
            return line.strip()
    return ""


def failure_line(cause: str, remedy: str) -> str:
    """The one line a failed build's error is: its cause, then what to do."""
    return f"{cause}: {remedy}" if remedy else cause
