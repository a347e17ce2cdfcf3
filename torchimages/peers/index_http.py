"""HTTP to a package index and the hosts its pages name for files, as a hostile or broken peer may answer.

A mirror's login is bound to the index's origin (scheme, host, port): it is added to a request for that origin only,
and is never the session's (requests sends `request.auth or session.auth`, so a login set on the session would go
to every host a page names). Every body is read here, in pieces, against bounds for the whole command: seconds
(a page that drips a byte at a time passes every per-read timeout) and bytes (any number of answers each under a
limit add up). A range answer must be the range asked for: remotezip believes any 206."""
from __future__ import annotations

import io
import re
import time
from urllib.parse import urlsplit

import requests
import urllib3
from remotezip import RangeNotSupported

from ..model import TorchImagesError

# Every request to the index or its file host: seconds to connect, and between two reads of an answer.
TIMEOUT_S = 30.0
# All requests of one command together: a refresh of every release compat.yaml lists reads well under 1 GiB in
# minutes; a peer that keeps answering slowly or at length is stopped here.
COMMAND_TIME_S = 1800.0
COMMAND_BYTES = 2 << 30
# An index page is read whole into memory: PyPI's torch page is 0.9 MB; one claiming far more is not an index's.
MAX_PAGE_BYTES = 64 << 20
ERROR_BODY_BYTES = 64 << 10  # what is read of an error answer (a 404 page), at most
PIECE_BYTES = 64 << 10
DEFAULT_PORTS = {"http": 80, "https": 443}
ASKED_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.ASCII)
ANSWERED_RANGE = re.compile(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19}|\*)", re.ASCII)

Origin = tuple[str, str, int]


class PeerAnswerError(TorchImagesError, requests.RequestException):
    """An answer the index or its file host should not have given (too long, too slow, not the range asked): a
    RequestException too, so that every caller's handling of requests' own errors takes it."""


class CommandTimeout(PeerAnswerError, requests.Timeout):
    """The command's total time for its index requests ran out."""


def origin(url: str) -> Origin | None:
    """(scheme, host, port) of an http(s) URL, default ports spelled out; None for anything else."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if scheme not in DEFAULT_PORTS or not parts.hostname or port is None:
        return None
    return scheme, parts.hostname.lower(), port


class IndexSession(requests.Session):
    """One command's session to an index: its login for its own origin only, every body bounded in time and size."""

    def __init__(self, login: tuple[str, str] | None = None, login_origin: Origin | None = None):
        super().__init__()
        self._login, self._login_origin = login, login_origin
        self._deadline = time.monotonic() + COMMAND_TIME_S
        self._bytes_left = COMMAND_BYTES

    def request(self, method, url, *args, **kwargs):
        kwargs["auth"] = self._login if self._login and origin(url) == self._login_origin else None
        kwargs["timeout"] = self._timeout()
        streamed = kwargs.pop("stream", False)
        try:
            response = super().request(method, url, *args, stream=True, **kwargs)
            answer = response.raw
            try:
                self._take_body(response, streamed)
            finally:
                answer.close()
                answer.release_conn()
        except urllib3.exceptions.ReadTimeoutError as error:
            raise requests.Timeout(str(error)) from None
        except urllib3.exceptions.HTTPError as error:
            raise requests.ConnectionError(str(error)) from None
        return response

    def get_redirect_target(self, response: requests.Response) -> str | None:
        """Where a redirect leads; its body read bounded first (requests would read it whole)."""
        target = super().get_redirect_target(response)
        if target:
            response._content = self._read(response, ERROR_BODY_BYTES, decode=False, cut=True)
            response._content_consumed = True  # type: ignore[attr-defined]  # requests' own flag: the body is read
        return target

    def should_strip_auth(self, old_url: str, new_url: str) -> bool:
        """A redirect keeps the login only within its origin: requests lets http -> https on one host keep it."""
        return origin(old_url) != origin(new_url)

    def _take_body(self, response: requests.Response, ranged: bool) -> None:
        """Read the answer's body now, bounded; a range answer checked against the range asked."""
        if response.request.method == "HEAD":
            return
        if not response.ok:
            response._content = self._read(response, ERROR_BODY_BYTES, decode=True, cut=True)
            return
        if not ranged:
            response._content = self._read(response, MAX_PAGE_BYTES, decode=True)
            return
        asked = ASKED_RANGE.fullmatch(response.request.headers.get("Range", ""))
        if asked is None:
            raise PeerAnswerError(f"its zip directory points outside the file (range "
                                  f"{response.request.headers.get('Range', '')[:40]!r}): not a wheel")
        length = _answered_length(asked, response)
        response.raw = io.BytesIO(self._read(response, length, decode=False, exact=True))

    def _read(self, response: requests.Response, limit: int, decode: bool, cut: bool = False,
              exact: bool = False) -> bytes:
        pieces, size = [], 0
        while True:
            self._timeout()
            piece = response.raw.read1(PIECE_BYTES, decode_content=decode)
            if not piece:
                break
            size += len(piece)
            self._spend(len(piece))
            if size > limit:
                if cut:
                    pieces.append(piece[:limit - size])
                    break
                raise PeerAnswerError(f"the answer is larger than {_what(limit, exact)}")
            pieces.append(piece)
        if exact and size != limit:
            raise PeerAnswerError(f"the answer ended after {size} of the {limit} bytes its range announced")
        return b"".join(pieces)

    def _timeout(self) -> tuple[float, float]:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise CommandTimeout(f"timed out: the index and its file host did not finish within {COMMAND_TIME_S:g} s "
                                 "(all requests of this command together)")
        bound = min(TIMEOUT_S, left)
        return bound, bound

    def _spend(self, size: int) -> None:
        self._bytes_left -= size
        if self._bytes_left < 0:
            raise PeerAnswerError(f"the index and its file host sent more than {COMMAND_BYTES >> 20} MiB in all, "
                                  "more than any refresh reads")


def _what(limit: int, exact: bool) -> str:
    return f"the {limit} bytes its range announced" if exact else f"an index page ({limit >> 20} MiB)"


def _answered_length(asked: re.Match, response: requests.Response) -> int:
    """The length of a range answer, when it is the range asked for (a 200 is the whole file: refused unread)."""
    if response.status_code != 206:
        raise RangeNotSupported("The server doesn't support range requests")
    answered = ANSWERED_RANGE.fullmatch(response.headers.get("Content-Range", ""))
    if answered is None:
        raise PeerAnswerError(f"its Content-Range {response.headers.get('Content-Range', '')[:80]!r} is not "
                              "`bytes FIRST-LAST/SIZE`")
    first, last, total = int(answered[1]), int(answered[2]), answered[3]
    want_first, want_last = asked[1], asked[2]
    if want_first:
        fits = first == int(want_first) and (not want_last or last <= int(want_last))
    else:  # bytes=-N: the last N bytes
        fits = total != "*" and last == int(total) - 1 and first == max(0, int(total) - int(want_last or 0))
    if not fits or last < first or (total != "*" and last >= int(total)):
        raise PeerAnswerError(f"answered bytes {first}-{last}/{total} for the range {asked[0]} asked: not that range")
    return last - first + 1
