"""No credential in any output: every text a peer sends back (the engine's errors, skopeo's, pip's) passes through
`Secrets.redact` before it is printed, logged or written to a report.

Two layers. The secrets this run knows (the password of --pip-index-url, proxy logins, what the Docker config holds
for a registry) are taken out in every spelling a peer may repeat them in: as given, percent-encoded (docker-py puts
the build args, as JSON, in the build request's URL, and its HTTP errors repeat that URL) and JSON-escaped. Then the
shapes of credentials this run does not know: the user and password of any URL, plain or percent-encoded,
Authorization headers, and password or token parameters.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import quote, quote_plus, unquote

REDACTED = "<redacted>"
SHORTEST_SECRET = 4  # shorter values (a user name 'ci') would redact ordinary words
# scheme://USER:PASSWORD@ or scheme://TOKEN@ (userinfo holds no '/', no '@', no space)
URL_LOGIN = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^\s/@'\"]+@", re.IGNORECASE | re.ASCII)
# The same with '://' and '@' percent-encoded: a URL inside a URL's query (docker-py's build request).
ENCODED_URL_LOGIN = re.compile(r"(%3A%2F%2F)(?:(?!%40|%2F)[^\s&/?#'\"])+%40", re.IGNORECASE | re.ASCII)
AUTH_HEADER = re.compile(r"\b(basic|bearer)\s+[A-Za-z0-9+/=._~-]{8,}", re.IGNORECASE | re.ASCII)
# How files.brief ends a value it cut short: what precedes it may be the start of a secret, cut mid-way.
CUT_QUOTE = re.compile(r"\.\.\. \([0-9]+ characters\)", re.ASCII)
SECRET_PARAMETER = re.compile(r"\b(password|passwd|token|access_token|secret)=[^\s&'\"]+", re.IGNORECASE | re.ASCII)
# An image reference's scheme (`https://`), which Docker does not take but a user may paste with a login after it.
REFERENCE_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://", re.ASCII)
# What follows a reference's '@' when it ends with a digest: an algorithm and its encoded value, never a '/'. The
# algorithm holds no dot, so that a host (registry.example.com:5000) after a login is never taken for one.
DIGEST_SHAPE = re.compile(r"[a-z0-9]+(?:[+_-][a-z0-9]+)*:[A-Za-z0-9=_-]+", re.ASCII)
# The first part of a name a digest may follow: a host (with its port) or a Docker Hub namespace; never 'user:pass'.
NAME_START = re.compile(r"[A-Za-z0-9._-]+(?::[0-9]+)?", re.ASCII)


def reference_login(text: str) -> tuple[str, str, str]:
    """An image reference split as (scheme, login, the rest): 'https://ci:pa/ss@host/repo:tag' -> ('https://',
    'ci:pa/ss', 'host/repo:tag'); the login is '' when there is none. A password typed unencoded may hold '/', ':',
    '@', '+', '=' or '%', so the login ends at the last '@' no digest could start: one with a '/' after it (a digest
    holds none), or one that neither a digest follows nor an image name (after the login before it) precedes. Reading
    too much as the login only hides more of the reference."""
    scheme = REFERENCE_SCHEME.match(text)
    body = text[scheme.end():] if scheme else text
    end = -1  # where the login read so far ends
    for at in (at for at, character in enumerate(body) if character == "@"):
        name = body[end + 1:at]
        if ("/" in body[at + 1:] or not DIGEST_SHAPE.fullmatch(body[at + 1:])
                or not NAME_START.fullmatch(name.partition("/")[0])):
            end = at
    return scheme[0] if scheme else "", body[:max(end, 0)], body[end + 1:]


def _spellings(secret: str) -> set[str]:
    """secret as a peer may repeat it: as given, decoded, percent-encoded (both ways), JSON-escaped and both, and as
    Python quotes it in a message (repr: a quote or a non-printing character escaped differently from JSON)."""
    forms = set()
    for value in {secret, unquote(secret)}:
        escaped = json.dumps(value)[1:-1]
        forms |= {value, escaped, quote(value, safe=""), quote_plus(value), quote_plus(escaped), quote(escaped, safe=""),
                  repr(value)[1:-1]}
    return {form for form in forms if len(form) >= SHORTEST_SECRET}


@dataclass(frozen=True)
class Secrets:
    """What this run must never show; `redact` takes it out of a peer's text."""

    values: frozenset[str] = frozenset()

    @classmethod
    def of(cls, *values: object) -> Secrets:
        found = {value for value in values if isinstance(value, str) and len(value) >= SHORTEST_SECRET}
        return cls(frozenset(form for value in found for form in _spellings(value)))

    @classmethod
    def in_urls(cls, *urls: str | None) -> Secrets:
        """The logins inside URLs: an index URL with a password, a proxy with a login. Read by hand, not with
        urlsplit, which refuses some URLs a peer would still repeat (a '[' in the password). A password typed
        unencoded may hold '/', '?', '#' and '@' (base64 tokens hold '/'), so every '@' after '://' may end the
        login: each such reading is a secret (taking too much only redacts more)."""
        found = []
        for url in urls:
            _, separator, rest = (url or "").partition("://")
            ends = [at for at, character in enumerate(rest) if character == "@"] if separator else []
            for end in ends:
                user, colon, password = rest[:end].partition(":")
                found += [rest[:end], password] if colon else [user]
        return cls.of(*found)

    def __or__(self, other: Secrets) -> Secrets:
        return Secrets(self.values | other.values)

    @classmethod
    def in_arguments(cls, arguments: list[str]) -> Secrets:
        """The logins a command line holds anywhere, positional arguments (an image REF) included: in a URL
        (scheme://user:password@host), or before a registry's host (user:password@host/repo, the password perhaps
        holding '/'; see reference_login). `--flag=value` is read as its value."""
        values = [argument.partition("=")[2] if argument.startswith("--") else argument for argument in arguments]
        logins = [value.split("/", 1)[0].rpartition("@")[0] for value in values if "://" not in value]
        # A password holding '/' puts the login's end after the first '/': read as an image reference reads it. Only
        # a login with a password is taken so, lest a path holding an '@' ('/tmp/a@b/c') redact its own folders.
        logins += [login for login in (reference_login(value)[1] for value in values) if ":" in login]
        return cls.in_urls(*values) | cls.of(*logins, *(login.partition(":")[2] for login in logins))

    def redact(self, text: str) -> str:
        for secret in sorted(self.values, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return redact(self._cut_quotes_redacted(text))

    def _cut_quotes_redacted(self, text: str) -> str:
        """A secret quoted cut short (`'user:s3cr... (90 characters)'`) matches no spelling whole: the start of one
        just before the cut is taken out too."""
        for cut in reversed(list(CUT_QUOTE.finditer(text))):
            before = text[:cut.start()]
            starts = [secret[:length] for secret in self.values for length in range(len(secret), SHORTEST_SECRET - 1, -1)
                      if before.endswith(secret[:length])]
            if starts:
                text = before[:-len(max(starts, key=len))] + REDACTED + text[cut.start():]
        return text


def redact(text: str) -> str:
    """text without anything shaped like a credential (for text from a peer when no secret is known)."""
    text = URL_LOGIN.sub(rf"\1{REDACTED}@", text)
    text = ENCODED_URL_LOGIN.sub(rf"\1{REDACTED}%40", text)
    text = AUTH_HEADER.sub(rf"\1 {REDACTED}", text)
    return SECRET_PARAMETER.sub(rf"\1={REDACTED}", text)


# Characters that move a terminal's cursor or start its escape sequences, end a line (for a log, Markdown, YAML), or
# reorder what is shown (bidirectional overrides): none belongs in a value a peer sent.
UNSHOWN = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# A line that starts with `::` after any white space the runner trims (.NET's, Unicode's).
WORKFLOW_COMMAND = re.compile(r"^([\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)::",
                              re.MULTILINE | re.ASCII)


def inert(text: str) -> str:
    """Text from a peer (an index, a wheel, nvidia-smi) made one line that changes nothing where it is shown: each
    control character escaped (\\x1b, \\n), and a GitHub workflow command's leading `::` broken."""
    return workflow_commands_broken(UNSHOWN.sub(lambda match: match[0].encode("unicode_escape").decode(), text))


def workflow_commands_broken(text: str) -> str:
    """No line of text is a GitHub Actions workflow command (`::error::`, `::add-mask::`, `::stop-commands::`): the
    runner reads them from every line a step prints, and this tool prints none of its own."""
    return WORKFLOW_COMMAND.sub(r"\1\\::", text)
