"""The shipped admission policies (docs/policies/) judged without a cluster, each engine release as its source behaves:
their shape against the projects' own CRD schemas (tests/data/crds/); which of a digest's signatures and
attestations the engine finds and verifies (cosign's classic `.sig`/`.att` tags, Sigstore bundle v0.3 referrers
through the referrers API or the referrers tag); and the policy's conditions evaluated for real on what it verified
(JMESPath for Kyverno's ClusterPolicy, CEL for its ImageValidatingPolicy).

A `Published` says what the registry holds for one digest; each `*_admits(policy_path, image_ref, published, ...)`
answers (admitted, why) the way that engine decides. Every behaviour modelled names the source it was read from,
as `file:line` at a tag or branch and commit of the mirrors read on 2026-11-29, or the issue that reports it:
  Kyverno        v1.18.1@ec14520a5531, v1.19.0@ee97ce09538b, release-1.19@c53e5bd8f7c6, main@111e07bbecc6
  cosign         v3.0.6@f1ad3ee95231 (Kyverno 1.18.1's), v3.1.2@193d2153431f (Kyverno 1.19.0's)
  go-containerregistry v0.21.8@2ea098f4b134 (Kyverno 1.19.0's)
  policy-controller v0.13.1@ccbb37f30097, main@f925c0c1a412
  container-libs (containers/image) main@f0ddf1a745bb
  go-containerregistry v0.20.3@c4dd792fa06c, v0.21.3@3888fb8f8738 (policy-controller v0.13.1's, main's)

How each names an image before matching it (none folds letter case or drops a default port, so
`Registry.Example.com:443/ml/pytorch` is another text than `registry.example.com/ml/pytorch` to all of them):
  Kyverno ClusterPolicy   imageReferences against ImageInfo.String() (kyverno_reference), go-wildcard v1.0.3
  Kyverno IVP             matchImageReferences against the pod's text as written, gobwas/glob or CEL
  policy-controller       spec.images globs against go-containerregistry's Reference.Name() (ggcr_name)
  containers/image        policy.json scopes compared as written with the parsed reference's name (_scopes)
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import celpy
import jmespath
import jmespath.functions
import jsonschema
import re2
import yaml
from celpy import celtypes

REPORT = "https://torchimages.io/verification-report/v1"
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)


# ----------------------------------------------------------------------------------------------------- CRD schemas

def crd_schema(crd_path: Path) -> dict:
    """The openAPIV3Schema of the one version a vendored CRD file keeps."""
    crd = yaml.safe_load(crd_path.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def schema_errors(document: dict, schema: dict) -> list[str]:
    """What the API server's structural validation would refuse (the x-kubernetes-* keywords are no JSON Schema
    and are ignored here, as jsonschema ignores any keyword it does not know)."""
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)]


def _walk(document, schema: dict, path: str) -> Iterator[tuple[str, object, dict | None]]:
    """Each (path, value, its schema or None where the schema has no such field) under document."""
    if isinstance(document, dict):
        properties = schema.get("properties")
        # An object without declared properties (metadata, a preserved or free-form map) is not the CRD's to close.
        closed = not (schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("additionalProperties"))
        if properties is None or not closed:
            return
        for name, value in document.items():
            child = properties.get(name)
            yield f"{path}.{name}", value, child
            if child is not None:
                yield from _walk(value, child, f"{path}.{name}")
    elif isinstance(document, list) and isinstance(schema.get("items"), dict):
        for index, value in enumerate(document):
            yield from _walk(value, schema["items"], f"{path}[{index}]")


# The API server knows these of every object, whether the CRD's schema declares them or not (policy-controller's
# does not).
_EVERY_OBJECTS = (".apiVersion", ".kind", ".metadata")


def unknown_fields(document: dict, schema: dict) -> list[str]:
    """Fields the schema does not declare: an absent `additionalProperties` is taken as closed, as the API server's
    pruning drops such a field without a word (so a misspelt field would silently do nothing)."""
    return [path for path, _, child in _walk(document, schema, "") if child is None and path not in _EVERY_OBJECTS]


def deprecated_fields(document: dict, schema: dict) -> list[str]:
    """Fields whose CRD description says "Deprecated" (the vendored CRDs keep only those descriptions)."""
    return [path for path, _, child in _walk(document, schema, "")
            if child is not None and str(child.get("description", "")).lstrip().startswith("Deprecated")]


def policy_documents(policy_path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(policy_path.read_text()) if document]



# ------------------------------------------------------------------------------------ what the registry holds

# cosign v3 signs an image by attesting a statement of this type with an empty predicate (`cosign tree` lists it,
# policy-controller#1958); publish writes it beside the attestations' bundles.
SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
# The policies' keys in the order each file lists them: a Kyverno attestor, a ClusterPolicy attestor entry, a
# policy-controller authority's name prefix, a containers-policy.json keyPaths item.
KEY_NAMES = ("current", "next")


class Referrers(Enum):
    """How a digest's bundle v0.3 referrers can be found."""
    NONE = "no bundle referrers"
    API = "the referrers API"  # GET /v2/<name>/referrers/<digest>
    TAG = "the referrers tag"  # an OCI index tagged sha256-<hex>, on a registry without the API (docker-registry 2.8)


@dataclass(frozen=True)
class Published:
    """What a registry holds for one digest: the in-toto statements attested (both formats carry the same ones), the
    key that signed everything (a name of KEY_NAMES, or another), whether the classic `.sig`/`.att` tags are there, how
    the bundle referrers are found, and the docker-reference the classic signature's simple-signing payload names
    ("" for the image's own)."""
    statements: tuple[dict, ...]
    signer: str = "current"
    classic: bool = True
    bundles: Referrers = Referrers.TAG
    signed_reference: str = ""

    def bundled(self) -> list[dict]:
        """The statements of the bundle referrers, the signature's first."""
        if self.bundles is Referrers.NONE:
            return []
        return [{"predicateType": SIGN_PREDICATE, "predicate": {}}, *self.statements]


def published(statements: list[dict], **where) -> Published:
    """What publish writes (both formats, the bundles under the referrers tag) unless where says otherwise."""
    return Published(tuple(statements), **where)


def _of_type(statements: list[dict], predicate_type: str) -> list[dict]:
    return [statement for statement in statements if statement["predicateType"] == predicate_type]


# ---------------------------------------------------------------------------- how each engine spells an image

# distribution/reference v0.6.0 regexp.go (Kyverno's; containers/image keeps a copy, image/docker/reference/regexp.go):
# a domain component takes upper-case letters, a port any digits; a path component lower case only.
_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_COMPONENT}(?:\.{_COMPONENT})*"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_REFERENCE = re.compile(rf"(?:(?P<domain>{_DOMAIN}(?::[0-9]+)?)/)?(?P<path>{_PATH})(?::(?P<tag>[\w][\w.-]{{0,127}}))?"
                        r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?")


def _parsed(reference: str, default_domain: str) -> tuple[str, str, str, str]:
    """(domain, path, tag, digest) as distribution/reference's Parse reads reference, the first component taken for
    the domain only where it has a `.` or `:`, is `localhost` or has an upper-case letter (Kyverno's
    addDefaultRegistry, pkg/utils/image/infos.go:103-108 at v1.19.0; reference's splitDockerDomain): the domain is
    kept as written, letter case and port."""
    first, _, rest = reference.partition("/")
    if not rest or not (any(c in first for c in ".:") or first == "localhost" or first.lower() != first):
        reference = f"{default_domain}/{reference}"
    match = _REFERENCE.fullmatch(reference)
    if match is None:
        raise ValueError(f"invalid reference format: {reference}")
    return match["domain"], match["path"], match["tag"] or "", match["digest"] or ""


def kyverno_reference(image: str) -> str:
    """What a ClusterPolicy's imageReferences are matched against: ImageInfo.String() (pkg/engine/utils/image.go:34
    GetMatchingImages at v1.19.0, v1.18.1 and main@111e07bbecc6): GetImageInfo (pkg/utils/image/infos.go:48-100)
    parses with reference.Parse and keeps the registry as written, adds `latest` where there is neither tag nor
    digest, and where there is a digest drops the tag (String, infos.go:34-45)."""
    domain, path, tag, digest = _parsed(image, "docker.io")
    return f"{domain}/{path}@{digest}" if digest else f"{domain}/{path}:{tag or 'latest'}"


def ggcr_name(image: str) -> str:
    """go-containerregistry's name.ParseReference(image).Name(), what policy-controller matches its globs against
    (pkg/webhook/validator.go:1234-1241, pkg/apis/glob/glob.go Match at main@f925c0c1a412): the registry is the
    first component where it holds a `.` or `:` (pkg/name/repository.go:88 at v0.21.3), kept as written
    (registry.go:121-139: only `docker.io` becomes `index.docker.io`); `latest` where no tag; a digest's name drops
    the tag."""
    first, _, rest = image.partition("/")
    if not (rest and any(c in first for c in ".:")):
        registry, rest = "index.docker.io", (image if "/" in image.split("@")[0].split(":")[0] else f"library/{image}")
    else:
        registry = "index.docker.io" if first == "docker.io" else first
    name, _, digest = rest.partition("@")
    repository, _, tag = name.partition(":")
    if repository.lower() != repository:
        raise ValueError(f"repository must be lowercase: {image}")
    return f"{registry}/{repository}@{digest}" if digest else f"{registry}/{repository}:{tag or 'latest'}"


def go_wildcard_match(pattern: str, text: str) -> bool:
    """Kyverno's ext/wildcard.Match, github.com/IGLOU-EU/go-wildcard v1.0.3 (go.mod at v1.18.1, v1.19.0, main): `*`
    any run of characters, everything else itself, letter case included (`?` is not modelled)."""
    if "?" in pattern:
        raise NotImplementedError("go-wildcard's ? is not modelled")
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text, re.DOTALL) is not None


def gobwas_glob_match(pattern: str, text: str) -> bool:
    """A matchImageReferences glob: github.com/gobwas/glob v0.2.3 glob.Compile(pattern) with no separators
    (pkg/cel/compiler/compiler.go:178 at v1.19.0), so `*` is any run, `/` included; case-sensitive (`?`, `[...]`,
    `{...}` are not modelled)."""
    if any(c in pattern for c in "?[]{}\\"):
        raise NotImplementedError("only * of gobwas/glob is modelled")
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text, re.DOTALL) is not None


def policy_controller_glob_match(glob: str, image: str) -> bool:
    """policy-controller's glob.Match (pkg/apis/glob/glob.go at v0.13.1 and main@f925c0c1a412): the glob becomes a
    regexp, `**` any run, `*` any run without `/`, `.` itself, anchored both ends; it is matched against
    ggcr_name(image) and, where that differs, against the image as written. Case-sensitive."""
    if glob == "*/*":
        glob = "index.docker.io/*/*"
    if glob == "*":
        glob = "index.docker.io/library/*"
    if not re.fullmatch(r"[a-zA-Z0-9-_:/*.@]+", glob):
        raise ValueError(f"invalid glob {glob!r}")
    pattern = glob.replace(".", r"\.").replace("**", "#").replace("*", "[^/]*").replace("#", ".*")
    name = ggcr_name(image)
    return re.fullmatch(pattern, name) is not None or (name != image and re.fullmatch(pattern, image) is not None)


# ------------------------------------------------------------------------------------------- Kyverno releases

@dataclass(frozen=True)
class KyvernoRelease:
    """One Kyverno release line's cosign verification. in_source False: the release is newer than the source read,
    and verifies_key_bundles is what the issue's fix is expected to give, not what was read."""
    name: str
    source: str
    verifies_key_bundles: bool  # whether a key-signed bundle v0.3 without a transparency log entry verifies
    basis: str
    in_source: bool = True
    serves_cluster_policy: bool = True


KYVERNO = {release.name: release for release in (
    KyvernoRelease("1.18", "v1.18.1@ec14520a5531", True,
                   "kyverno#17363 (key-signed bundle-only referrers verify on v1.18.1) and #16678 (v1.18.1 reads "
                   "bundle attestations under the referrers tag)"),
    # The mechanism is the PR's, not confirmed in the source read: v1.18.1's key path also leaves TrustedMaterial nil
    # (opts.go checkOptions), and cosign v3.0.6 -> v3.1.2 and sigstore-go v1.1.4 -> v1.3.0 changed too (go.mod).
    KyvernoRelease("1.19.0", "v1.19.0@ee97ce09538b", False,
                   "kyverno#17363: every key-signed bundle fails `accepted signatures do not match threshold, "
                   "Found: 0, Expected 1`; #16678: 0 verified under the referrers tag; PR #17380 traces it to "
                   "opts.go:87 skipSigstoreInfra (key + insecureIgnoreTlog skips the Sigstore trust material)"),
    KyvernoRelease("1.19.1", "release-1.19@c53e5bd8f7c6", True,
                   "expected from the release-critical kyverno#17363 being fixed; release-1.19@c53e5bd8f7c6, the "
                   "newest 1.19 source read (before 1.19.1), still has v1.19.0's verifier.go and opts.go",
                   in_source=False),
    KyvernoRelease("1.20", "main@111e07bbecc6", True,
                   "as 1.19.1: main@111e07bbecc6 still has v1.19.0's verifier.go and opts.go", in_source=False,
                   # ClusterPolicy is deprecated since 1.17, its removal planned for 1.20
                   serves_cluster_policy=False),
)}
CLUSTER_POLICY_RELEASES = tuple(name for name, release in KYVERNO.items() if release.serves_cluster_policy)

# ---------------------------------------------------------------------------------------- Kyverno's ClusterPolicy

class _KyvernoFunctions(jmespath.functions.Functions):
    """The Kyverno JMESPath functions the shipped policy uses (pkg/engine/jmespath/functions.go at v1.19.0)."""

    @jmespath.functions.signature({"types": ["string"]}, {"types": ["string", "number"]})
    def _func_regex_match(self, pattern, value):
        # jpRegexMatch (functions.go:799-811): Go's regexp.Match, RE2, as the re2 module is (celpy's)
        return re2.search(pattern, str(value)) is not None


_JMESPATH = jmespath.Options(custom_functions=_KyvernoFunctions())


def _substitute(value, predicate: dict):
    """A condition's key or value with its `{{ jmespath }}` read from the predicate, as Kyverno adds the predicate
    to its JSON context (pkg/engine/internal/utils.go EvaluateConditions); a variable that reads nothing is an error
    (Kyverno's "variable substitution failed"), as is an expression JMESPath cannot parse."""
    if not isinstance(value, str) or not _TEMPLATE.search(value):
        return value
    whole = _TEMPLATE.fullmatch(value.strip())
    if whole:
        found = jmespath.search(whole.group(1).strip(), predicate, options=_JMESPATH)
        if found is None:
            raise LookupError(f"{value} reads nothing")
        return found
    return _TEMPLATE.sub(lambda match: str(_substitute(match.group(0), predicate)), value)


def _number(value) -> float:
    return float(value)


# The operators the shipped policy and its documented examples use (Kyverno pkg/engine/variables/operator).
_OPERATORS = {
    "Equals": lambda key, value: key == value or str(key) == str(value),
    "NotEquals": lambda key, value: not (key == value or str(key) == str(value)),
    "GreaterThanOrEquals": lambda key, value: _number(key) >= _number(value),
    "GreaterThan": lambda key, value: _number(key) > _number(value),
    "AnyIn": lambda key, value: any(item in (value if isinstance(value, list) else [value])
                                    for item in (key if isinstance(key, list) else [key])),
}


def _condition_holds(condition: dict, predicate: dict) -> bool:
    key = _substitute(condition["key"], predicate)
    value = _substitute(condition.get("value"), predicate)
    return bool(_OPERATORS[condition["operator"]](key, value))


def _conditions_hold(blocks: list[dict], predicate: dict) -> tuple[bool, str]:
    """Kyverno's AnyAllConditions: every `all` condition and, where there are any, one `any` condition, in each
    block."""
    for block in blocks:
        try:
            failed = [c["key"] for c in block.get("all", []) if not _condition_holds(c, predicate)]
            any_of = block.get("any", [])
            if any_of and not any(_condition_holds(c, predicate) for c in any_of):
                failed.append("none of " + ", ".join(c["key"] for c in any_of))
        except (LookupError, ValueError, TypeError, jmespath.exceptions.JMESPathError) as error:
            return False, f"condition error: {error}"
        if failed:
            return False, "fails " + ", ".join(failed)
    return True, ""


def _cluster_policy_verifies(attestor_sets: list[dict], found: Published, predicate_type: str | None
                             ) -> tuple[list[dict], str]:
    """What a ClusterPolicy's attestors verify: the signature (predicate_type None) or the statements of one type.
    Its cosign verifier reads only the classic tags: pkg/image/verifiers/cpol/cosign/ sets no NewBundleFormat (at
    v1.18.1, v1.19.0, main), so a bundle referrer is never seen. Without `rekor.ignoreTlog` it makes a Rekor client
    and cosign asks for the entry our signatures lack (cpol/cosign/cosign.go:148-149 at main); with it, cosign's
    bundleVerified false is only logged (cpol/cosign/verifier.go:68 and :165 at main, :67 and :164 at v1.18.1), so
    a key-signed attestation in no transparency log verifies. An attestor set needs `count` of its entries (all
    where absent); each entry is one of KEY_NAMES in order."""
    for attestor_set in attestor_sets:
        entries = attestor_set["entries"]
        verified = [name for name, entry in zip(KEY_NAMES, entries, strict=False)
                    if name == found.signer and (entry["keys"].get("rekor") or {}).get("ignoreTlog")]
        if len(verified) < attestor_set.get("count", len(entries)):
            if not found.classic:
                return [], "no signatures found (it reads no bundle referrer)"
            return [], "no matching signatures"
    if not found.classic:
        return [], "no signatures found (it reads no bundle referrer)"
    if predicate_type is None:
        return [{"predicateType": "simple-signing", "predicate": {}}], ""
    return _of_type(list(found.statements), predicate_type), ""


def pod_of(image_ref: str) -> dict:
    """A pod whose one container runs image_ref, as the admission request's object."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job"},
            "spec": {"containers": [{"name": "main", "image": image_ref}]}}


def _denies(validate: dict | None, pod: dict) -> tuple[bool, str]:
    """A validate rule's `deny`: its conditions read the admission request (`request.object`, the pod as written);
    `any` denies where one holds, `all` where every one does (pkg/engine/handlers/validation validateResource with
    pkg/engine/variables EvaluateConditions); a variable error is a rule error, which Enforce refuses too."""
    if not validate or "deny" not in validate:
        return False, ""
    if validate.get("failureAction") != "Enforce":
        raise NotImplementedError("only an enforcing deny is modelled")
    conditions = validate["deny"]["conditions"]
    context = {"request": {"object": pod, "operation": "CREATE"}}
    try:
        any_of = [_condition_holds(c, context) for c in conditions.get("any", [])]
        all_of = [_condition_holds(c, context) for c in conditions.get("all", [])]
    except (LookupError, ValueError, TypeError, jmespath.exceptions.JMESPathError) as error:
        return True, f"rule error: {error}"
    if (any_of and any(any_of)) or (all_of and all(all_of)):
        return True, " ".join(validate["message"].split())
    return False, ""


def kyverno_admits(policy_path: Path, image_ref: str, found: Published, release: str = "1.19.1") -> tuple[bool, str]:
    """Whether Kyverno's ClusterPolicy admits a pod running image_ref on the release: no validate rule's deny holds,
    and every verifyImages entry whose imageReferences match kyverno_reference(image_ref) (go_wildcard_match) needs
    its signature attestors verified and, for each attestation type, at least one statement of it from the classic
    `.att`, every one of which must meet the conditions (imageverifier.go verifyAttestation loops over all)."""
    if not KYVERNO[release].serves_cluster_policy:
        return False, f"Kyverno {release} serves no ClusterPolicy (deprecated since 1.17, removal planned for 1.20)"
    for document in policy_documents(policy_path):
        for rule in document["spec"]["rules"]:
            denied, why = _denies(rule.get("validate"), pod_of(image_ref))
            if denied:
                return False, f"{rule['name']}: {why}"
            for entry in rule.get("verifyImages", []):
                if not any(go_wildcard_match(pattern, kyverno_reference(image_ref))
                           for pattern in entry.get("imageReferences", [])):
                    continue
                if entry.get("attestors"):
                    _, why = _cluster_policy_verifies(entry["attestors"], found, None)
                    if why:
                        return False, f"{rule['name']}: {why}"
                for attestation in entry.get("attestations", []):
                    kind = attestation["type"]
                    of_kind, why = _cluster_policy_verifies(attestation.get("attestors", []), found, kind)
                    if why or not of_kind:
                        return False, f"{rule['name']}: no {kind} attestation{': ' + why if why else ''}"
                    for statement in of_kind:
                        holds, why = _conditions_hold(attestation.get("conditions", []), statement["predicate"])
                        if not holds:
                            return False, f"{rule['name']}: a {kind} statement {why}"
    return True, "admitted"


# ---------------------------------------------------------------------------- Kyverno's ImageValidatingPolicy (CEL)

def _ivp_cosign_verifies(release: KyvernoRelease, attestor: dict, found: Published, predicate_type: str | None
                         ) -> tuple[list[dict], str]:
    """What Kyverno's ImageValidatingPolicy cosign Verifier (pkg/image/verifiers/ivpol/cosign/verifier.go) verifies
    for one attestor: the signature (predicate_type None) or the statements of one type; ([], why) where it returns
    an error, which verifyImageSignatures and verifyAttestationSignatures count as 0 (pkg/cel/libs/imageverify/
    impl.go:274-279 at main).

    The format is detected first (verifier.go:39-41 at main, :37-42 at v1.18.1): cosign.GetBundles lists every
    referrer of the digest (cosign v3.1.2 pkg/cosign/verify.go:1730, no artifact type filter) through the referrers
    API or, where it answers 404, the referrers tag (go-containerregistry v0.21.8 pkg/v1/remote/referrers.go:79-80,
    on by default: options.go:113) and keeps the manifests whose one layer is a bundle (cosign pkg/oci/remote/
    signatures.go:55 Bundle). Any found: the signature and every attestation take the bundle path and the `.sig`/`.att`
    tags are never read. None: the classic path."""
    ctlog = attestor["cosign"].get("ctlog") or {}
    ignores_tlog = bool(ctlog.get("insecureIgnoreTlog"))
    by_this_key = attestor["name"] == found.signer
    if found.bundles is not Referrers.NONE:
        if not ignores_tlog:  # cosign verify.go:252 asks for a tlog entry unless IgnoreTlog; publish uploads none
            return [], "bundle: no transparency log entry"
        if not release.verifies_key_bundles:
            return [], f"bundle: accepted signatures do not match threshold, Found: 0, Expected 1 ({release.basis})"
        if not by_this_key:  # verify.go:241: the attestor's key is tried whatever the bundle's key hint says
            return [], "bundle: no matching attestations (signed by another key)"
        # verifyImageAttestationsSigstoreBundle (verify.go:1905): every bundle the key verifies, the signature's
        # too, and `verified` true once one did (:1959), so neither path asks for a transparency log here.
        verified = found.bundled()
    elif predicate_type is None:
        if not found.classic:
            return [], "no signatures found"
        if not by_this_key:
            return [], "no matching signatures"
        if not (ignores_tlog or ctlog.get("insecureIgnoreSCT")):  # verifier.go:104-110 at main
            return [], "transparency log or timestamp verification failed"
        return [{"predicateType": "simple-signing", "predicate": {}}], ""
    else:
        if not found.classic or not by_this_key:
            return [], "no matching attestations"
        # verifier.go:156-163 at main (:132-139 at v1.18.1): cosign's `verified` is false for an attestation in no
        # transparency log, and unlike the signature path there is no insecureIgnoreTlog escape (kyverno#17109, open;
        # fix PR #17217 open): every classic key-signed, tlog-free attestation fails.
        return [], "cosign bundle verification failed (kyverno#17109)"
    if predicate_type is None:
        return verified, ""
    of_type = _of_type(verified, predicate_type)
    if not of_type:  # verifier.go:198 at main
        return [], f"required predicate type {predicate_type} not found"
    return of_type, ""


def _image_reference_matches(reference: dict, image: str) -> bool:
    if "glob" in reference:
        return gobwas_glob_match(reference["glob"], image)
    environment = celpy.Environment()
    program = environment.program(environment.compile(reference["expression"]))
    return program.evaluate({"ref": celtypes.StringType(image)}) == celtypes.BoolType(True)


class _ImageVerification:
    """Kyverno's image verification CEL functions (pkg/cel/libs/imageverify/impl.go) on one release and registry: a
    verification counts the attestors given whose verification succeeds, and, as ImageData.AddVerifiedIntotoPayloads
    keeps one payload per predicate type (verifier.go:189 at main), leaves the last statement of the type for
    extractPayload."""

    def __init__(self, spec: dict, found: Published, release: KyvernoRelease):
        self.references = spec.get("matchImageReferences", [])
        self.kinds = {attestation["name"]: attestation["intoto"]["type"] for attestation in spec["attestations"]}
        self.attestors = {attestor["name"]: attestor for attestor in spec["attestors"]}
        self.found, self.release = found, release
        self.payloads: dict[str, dict] = {}
        self.failures: list[str] = []

    def _matched(self, image) -> bool:
        """matching.MatchImage (pkg/cel/matching/image.go at v1.19.0): any entry, a gobwas glob or a CEL expression
        on `ref` (pkg/cel/compiler/keys.go:9, image.go matchCel), over the image as the pod spec writes it; no
        entries match everything."""
        return not self.references or any(_image_reference_matches(reference, str(image))
                                          for reference in self.references)

    def _verify(self, attestors, predicate_type: str | None) -> int:
        count, failures = 0, []
        for attestor in attestors:
            verified, why = _ivp_cosign_verifies(self.release, self.attestors[str(attestor["name"])], self.found,
                                                 predicate_type)
            if why:
                failures.append(f"{attestor['name']}: {why}")
                continue
            count += 1
            if predicate_type is not None:
                self.payloads[predicate_type] = verified[-1]["predicate"]
        if not count:  # an attestor of a rotation that verifies nothing is no news while another one does
            self.failures.extend(failures)
        return count

    def verify_image_signatures(self, image, attestors):
        return celtypes.IntType(self._verify(attestors, None) if self._matched(image) else 0)

    def verify_attestation_signatures(self, image, attestation, attestors):
        kind = self.kinds.get(str(attestation))
        if kind is None:
            return celpy.CELEvalError(f"attestation not found in policy: {attestation}")
        return celtypes.IntType(self._verify(attestors, kind) if self._matched(image) else 0)

    def extract_payload(self, image, attestation):
        kind = self.kinds.get(str(attestation), "")
        if kind not in self.payloads:
            return celpy.CELEvalError("intoto attestation payload cannot be fetch before verifying intoto attestation")
        return celpy.json_to_cel(self.payloads[kind])

    def functions(self) -> dict:
        return {"verifyImageSignatures": self.verify_image_signatures,
                "verifyAttestationSignatures": self.verify_attestation_signatures,
                "extractPayload": self.extract_payload}


def ivp_admits(policy_path: Path, image_ref: str, found: Published, release: str = "1.20") -> tuple[bool, str]:
    """Whether Kyverno's ImageValidatingPolicy on the release admits a pod running image_ref: its variables, then
    each validation in order, each an error or false refusing (failurePolicy Fail, validationActions Deny); the
    refusal names what failed to verify."""
    spec = policy_documents(policy_path)[0]["spec"]
    verification = _ImageVerification(spec, found, KYVERNO[release])
    environment = celpy.Environment()
    # the `images` CEL sees are those matchImageReferences select (pkg/image/verification/evaluator/policy.go:151 at
    # v1.19.0 and main, :133 at v1.18.1): another image is in no list
    matched = [image_ref] if verification._matched(image_ref) else []
    activation = {
        "images": celpy.json_to_cel({"containers": matched, "initContainers": [], "ephemeralContainers": []}),
        "attestors": celpy.json_to_cel({name: {"name": name} for name in verification.attestors}),
        "attestations": celpy.json_to_cel({attestation["name"]: attestation["name"]
                                           for attestation in spec["attestations"]}),
    }

    def evaluate(expression: str):
        program = environment.program(environment.compile(expression), functions=verification.functions())
        return program.evaluate({**activation, "variables": celtypes.MapType(variables)})

    def refused(message: str) -> tuple[bool, str]:
        failures = "; ".join(dict.fromkeys(verification.failures))
        return False, f"{message} ({failures})" if failures else message

    variables: dict = {}
    for variable in spec.get("variables", []):
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"])
    for validation in spec["validations"]:
        try:
            result = evaluate(validation["expression"])
        except celpy.CELEvalError as error:
            return refused(f"{validation['message']} (error: {error.args[0]})")
        if result is not celtypes.BoolType(True) and result != celtypes.BoolType(True):
            return refused(validation["message"])
    return True, "admitted"


# -------------------------------------------------------------------------- policy-controller ClusterImagePolicy

def _authority_verifies(authority: dict, found: Published) -> tuple[bool, str]:
    """Whether one key authority verifies, as policy-controller v0.13.1 (and v0.14.0, v0.15.1, main@f925c0c1a412)
    reads: checkOptsFromAuthority refuses `signatureFormat: bundle` on any authority but a keyless one
    (pkg/webhook/validator.go:1371-1373 at v0.13.1, :1451-1454 at main; cosign v3's key-signed signatures are
    unverifiable, policy-controller#1958, open), and every other value is the legacy format: `.sig`, or `.att` where
    the authority lists attestations (validator.go:528-533), with no transparency log asked where the authority has
    no `ctlog` (validator.go:1446-1455) and cosign's bundleVerified ignored (validation.go:63, :69). An authority with
    attestations needs a statement of each predicateType (validator.go ValidatePolicyAttestationsForAuthority)."""
    if authority.get("key") is None:
        raise NotImplementedError("only key authorities are modelled")
    if authority.get("signatureFormat") == "bundle":
        return False, "when using the new bundle format, the authority must be keyless"
    if authority.get("ctlog") is not None:
        return False, "no transparency log entry"
    if not found.classic:
        return False, "no matching signatures (it reads no bundle referrer)"
    if authority["name"].split("-", 1)[0] != found.signer:
        return False, "no matching signatures"
    for attestation in authority.get("attestations", []):
        if not _of_type(list(found.statements), attestation["predicateType"]):
            return False, f"no matching attestations with type {attestation['predicateType']}"
    return True, "verified"


def policy_controller_authorities(policy_path: Path, image_ref: str, found: Published) -> dict[str, tuple[bool, str]]:
    """Each authority of the ClusterImagePolicies whose glob matches image_ref, as `<policy>/<authority>`: whether its
    signature or attestations verify. The attestations' CUE policies and the policy-level CUE that decide from there
    are not evaluated (no CUE evaluator installs here)."""
    verdicts = {}
    for document in policy_documents(policy_path):
        globs = [image["glob"] for image in document["spec"]["images"]]
        if not any(policy_controller_glob_match(glob, image_ref) for glob in globs):
            continue
        for authority in document["spec"]["authorities"]:
            verdicts[f"{document['metadata']['name']}/{authority['name']}"] = _authority_verifies(authority, found)
    return verdicts


# --------------------------------------------------------------------------------- containers/image policy.json

_IDENTITY = {"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["matchExact", "matchRepoDigestOrExact", "matchRepository", "exactReference", "exactRepository",
                      "remapIdentity"]},
    "dockerReference": {"type": "string"}, "dockerRepository": {"type": "string"},
    "prefix": {"type": "string"}, "signedPrefix": {"type": "string"}}, "additionalProperties": False}
_KEY_SOURCES = ["keyPath", "keyPaths", "keyData", "keyDatas", "fulcio", "pki"]
_REQUIREMENT = {"type": "object", "required": ["type"], "oneOf": [
    {"properties": {"type": {"enum": ["insecureAcceptAnything", "reject"]}}, "additionalProperties": False},
    {"properties": {"type": {"const": "signedBy"}, "keyType": {"const": "GPGKeys"}, "keyPath": {"type": "string"},
                    "keyPaths": {"type": "array", "items": {"type": "string"}}, "keyData": {"type": "string"},
                    "signedIdentity": _IDENTITY}, "required": ["keyType"], "additionalProperties": False},
    {"properties": {"type": {"const": "sigstoreSigned"}, "keyPath": {"type": "string"},
                    "keyPaths": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "keyData": {"type": "string"}, "keyDatas": {"type": "array", "items": {"type": "string"}},
                    "fulcio": {"type": "object"}, "pki": {"type": "object"},
                    "rekorPublicKeyPath": {"type": "string"}, "rekorPublicKeyPaths": {"type": "array"},
                    "rekorPublicKeyData": {"type": "string"}, "rekorPublicKeyDatas": {"type": "array"},
                    "signedIdentity": _IDENTITY},
     "oneOf": [{"required": [source]} for source in _KEY_SOURCES], "additionalProperties": False},
]}
# containers-policy.json(5), github.com/containers/image docs/containers-policy.json.5.md: `default` is required,
# `transports` maps a transport to scopes, each a list of requirements; "Exactly one of keyPath, keyPaths, keyData,
# keyDatas, fulcio and pki must be present" in a sigstoreSigned requirement.
CONTAINERS_POLICY_SCHEMA = {
    "type": "object", "required": ["default"], "additionalProperties": False,
    "properties": {
        "default": {"type": "array", "items": _REQUIREMENT, "minItems": 1},
        "transports": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": {"type": "array", "items": _REQUIREMENT, "minItems": 1}}},
    },
}


def repository_of(reference: str) -> str:
    """A docker reference without its tag or digest."""
    name = reference.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _scopes(image_ref: str) -> list[str]:
    """The docker transport's scopes from the most specific to the transport's default "", each compared as written
    with a policy.json (or registries.d) key: the reference, the repository, each parent namespace, the host with
    its port, then `*.` and each parent domain of the host without its port (image/docker/policyconfiguration/
    naming.go DockerReferenceIdentity, DockerReferenceNamespaces; image/signature/policy_eval.go
    requirementsForImageRef). ParseNormalizedNamed keeps the host's letter case and port (image/docker/reference/
    normalize.go:32-56, regexp.go:26), so nothing here folds them."""
    repository = repository_of(image_ref)
    parts = repository.split("/")
    host = parts[0].split(":", 1)[0]
    wildcards = ["*." + ".".join(host.split(".")[count:]) for count in range(1, host.count(".") + 1)]
    return [image_ref, *("/".join(parts[:count]) for count in range(len(parts), 0, -1)), *wildcards, ""]


def sigstore_signatures(found: Published, image_ref: str, key_paths: dict[str, str],
                        registries_d: dict | None = None) -> list[tuple[str, str]]:
    """The signatures containers/image reads for image_ref, as (the key file that verifies it, the docker-reference it
    signs): only the simple-signing payloads under the `sha256-<hex>.sig` tag (image/docker/docker_client.go:1269-1273
    at container-libs main@f0ddf1a745bb), read where registries.d's use-sigstore-attachments is on for the most
    specific of the image's scopes that has it (image/docker/registries_d.go:238-258 useSigstoreAttachments; every
    scope where registries_d is None); a bundle referrer is never read (bundle support is container-libs PR #1153,
    open)."""
    if registries_d is not None:
        namespaces = registries_d.get("docker") or {}
        settings = [namespaces[scope]["use-sigstore-attachments"] for scope in _scopes(image_ref)[:-1]
                    if "use-sigstore-attachments" in namespaces.get(scope, {})]
        if not (settings and settings[0]):
            return []
    if not found.classic or found.signer not in key_paths:
        return []
    return [(key_paths[found.signer], found.signed_reference or image_ref)]


def containers_policy_accepts(policy: dict, image_ref: str, signatures: list[tuple[str, str]]) -> tuple[bool, str]:
    """Whether containers/image accepts image_ref under policy, given its sigstore signatures as (the key file that
    verifies it, the docker-reference it signs): the most specific scope's requirements must all hold; a
    sigstoreSigned one needs a signature by one of its keys whose identity matches."""
    scopes = (policy.get("transports") or {}).get("docker") or {}
    requirements = next((scopes[scope] for scope in _scopes(image_ref) if scope in scopes), policy["default"])
    for requirement in requirements:
        kind = requirement["type"]
        if kind == "reject":
            return False, "rejected"
        if kind == "sigstoreSigned":
            keys = requirement.get("keyPaths") or [requirement.get("keyPath")]
            identity = requirement.get("signedIdentity", {"type": "matchRepoDigestOrExact"})["type"]
            if identity not in ("matchRepository", "exactRepository"):
                raise NotImplementedError(identity)
            wanted = repository_of(image_ref) if identity == "matchRepository" \
                else requirement["signedIdentity"]["dockerRepository"]
            signed_by_a_key = [reference for key, reference in signatures if key in keys]
            if not signed_by_a_key:
                return False, "no signature by an accepted key"
            if not any(repository_of(reference) == wanted for reference in signed_by_a_key):
                return False, f"Signature for identity {signed_by_a_key[0]} is not accepted"
    return True, "accepted"


# ------------------------------------------------------------------------------------ what a cluster would decide

POLICIES = Path(__file__).resolve().parent.parent / "docs" / "policies"
# Each evaluable shipped policy on the newest release it is written for.
SHIPPED = {"ClusterPolicy": (kyverno_admits, POLICIES / "kyverno-clusterpolicy.yaml", "1.19.1"),
           "ImageValidatingPolicy": (ivp_admits, POLICIES / "kyverno-imagevalidatingpolicy.yaml", "1.20")}
PLACEHOLDER_REPOSITORY = "registry.example.com/ml/pytorch"  # what the shipped policies name until a user edits them


def shipped_policies_admit(tag: str, predicates: dict[str, list[dict]]) -> dict[str, tuple[bool, str]]:
    """Each evaluable shipped policy's verdict on an image published under tag as publish writes it (both formats,
    the bundles under the referrers tag, signed by the policies' `current` key) whose verified statements are
    predicates (predicate type -> predicates, as signatures.gather_evidence gathers them), the policies' placeholder
    repository standing for the test's own."""
    found = published([{"predicateType": kind, "predicate": predicate}
                       for kind, predicates_of_kind in predicates.items() for predicate in predicates_of_kind])
    return {name: admits(path, f"{PLACEHOLDER_REPOSITORY}:{tag}", found, release)
            for name, (admits, path, release) in SHIPPED.items()}
