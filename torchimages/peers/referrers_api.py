"""The two registry requests of OCI 1.1 referrers that skopeo 1.9 cannot make, over HTTP.

- The referrers API (`GET /v2/<name>/referrers/<digest>`): a registry that implements it answers 200 with an image
  index (empty when nothing refers to the digest); one that does not (Debian's docker-registry 2.8, distribution 2.x)
  answers 404, and the referrers tag schema's index is used instead (trust/referrers.py).
- Writing that index: its entries carry `artifactType`, which containers/image 5.23 (skopeo 1.9.3) does not know, so
  it will not copy the index byte for byte ("Manifest list must be converted ... Instructed to preserve digests").
  The index is PUT as it is, and read back by digest through skopeo.

Reached as skopeo reaches the registry (registry_access.py): HTTPS verified against the registry's CA folder, or
plain HTTP where Docker's rule allows it; the login from the same copy of the Docker config, Basic or exchanged for a
Bearer token as the registry's challenge asks. A login held by a credential helper is not read here: the API is then
taken not to answer (the fallback index is read, as every client can), and a write says to log in with
`docker login`. Answers are bounded (MAX_BODY_BYTES); no login reaches a message.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import warnings
from pathlib import Path

import requests
import urllib3

from .registry_access import RegistryAccess
from .registry_address import Registry

TIMEOUT_S = 15
MAX_BODY_BYTES = 4 << 20  # a referrers list of thousands of entries; more is no answer
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CHALLENGE = re.compile(r'(\w+)="([^"]*)"', re.ASCII)


class RegistryHTTP:
    """HTTP requests to one repository, authenticated as skopeo is."""

    def __init__(self, registry: Registry, access: RegistryAccess):
        self.registry = registry
        self.access = access
        self.session = requests.Session()
        # Given with every request: a session's own `verify` loses to $REQUESTS_CA_BUNDLE (requests' merge order).
        self.verify = _verify(access)
        self.scheme: str | None = None  # found by the first request that reaches the registry

    def referrers(self, digest: str) -> bytes | None:
        """The referrers index the registry's API lists for digest; None when it has no such API (or cannot be
        asked here)."""
        try:
            response = self._request("GET", f"referrers/{digest}", "pull", headers={"Accept": INDEX_TYPE})
        except requests.RequestException:
            return None
        if response is None or response.status_code != 200 or \
                not response.headers.get("Content-Type", "").startswith(INDEX_TYPE):
            return None
        body = response.raw.read(MAX_BODY_BYTES + 1, decode_content=True)
        return body if len(body) <= MAX_BODY_BYTES else None

    def put_index(self, body: bytes, tag: str) -> str | None:
        """PUT an OCI index under tag byte for byte; None when the registry took it, else why not (its words)."""
        try:
            response = self._request("PUT", f"manifests/{tag}", "pull,push", data=body,
                                     headers={"Content-Type": INDEX_TYPE})
        except requests.RequestException as error:
            return f"it could not be reached ({type(error).__name__})"
        if response is None:
            return "it asks for a login this tool cannot present here: `docker login HOST`"
        if response.status_code in (200, 201):
            return None
        return f"HTTP {response.status_code}: {response.raw.read(600, decode_content=True).decode(errors='replace')}"

    def _request(self, method: str, path: str, scope: str, **arguments) -> requests.Response | None:
        url = f"/v2/{self.registry.repository}/{path}"
        for scheme in [self.scheme] if self.scheme else ["https"] if self.access.tls_verify else ["https", "http"]:
            try:
                with warnings.catch_warnings():  # an unverified loopback registry, as skopeo reaches it: no warning
                    warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                    response = self._send(method, f"{scheme}://{self.registry.host}{url}", scope, **arguments)
            except requests.RequestException:
                if scheme == "http" or self.access.tls_verify or self.scheme:
                    raise
                continue
            self.scheme = scheme
            return response
        return None

    def _send(self, method: str, url: str, scope: str, **arguments) -> requests.Response | None:
        response = self.session.request(method, url, **arguments, timeout=TIMEOUT_S, stream=True, allow_redirects=False,
                                        verify=self.verify)
        if response.status_code != 401:
            return response
        authorization = self._authorization(response.headers.get("WWW-Authenticate", ""), scope)
        if authorization is None:
            return None
        headers = {**arguments.pop("headers", {}), "Authorization": authorization}
        return self.session.request(method, url, headers=headers, **arguments, timeout=TIMEOUT_S, stream=True,
                                    allow_redirects=False, verify=self.verify)

    def _basic(self) -> str | None:
        """user:password in base64, from the Docker config's copy skopeo reads too (None: anonymous)."""
        if self.access.auth_file is None:
            return None
        try:
            entry = json.loads(Path(self.access.auth_file).read_text()).get("auths", {}).get(self.registry.host) or {}
            login = entry.get("auth") or ""
            base64.b64decode(login, validate=True)
        except (OSError, ValueError, AttributeError, binascii.Error):
            return None
        return login or None

    def _authorization(self, challenge: str, scope: str) -> str | None:
        basic = self._basic()
        kind = challenge.split(" ", 1)[0].lower()
        if kind == "basic":
            return f"Basic {basic}" if basic else None
        if kind != "bearer":
            return None
        fields = dict(CHALLENGE.findall(challenge))
        if not fields.get("realm", "").startswith("https://") and not self.registry.is_loopback:
            return None  # a token asked for over plain HTTP would carry the login in the clear
        parameters = {"service": fields.get("service", ""), "scope": f"repository:{self.registry.repository}:{scope}"}
        try:
            answer = self.session.get(fields["realm"], params=parameters, timeout=TIMEOUT_S, verify=self.verify,
                                      headers={"Authorization": f"Basic {basic}"} if basic else {}).json()
            token = answer.get("token") or answer.get("access_token")
        except (requests.RequestException, ValueError, AttributeError, KeyError):
            return None
        return f"Bearer {token}" if isinstance(token, str) and token else None


def _verify(access: RegistryAccess) -> bool | str:
    if not access.tls_verify:
        return False
    if access.cert_dir is not None:
        authorities = sorted(Path(access.cert_dir).glob("*.crt"))
        if authorities:
            return str(authorities[0])
    return True
