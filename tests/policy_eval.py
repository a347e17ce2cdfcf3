"""The shipped admission policies (docs/policies/) judged without a cluster: their shape against the projects' own CRD
schemas (tests/data/crds/), and their conditions evaluated for real on in-toto statements that a test has already
verified the signatures of (JMESPath for Kyverno's ClusterPolicy, CEL for its ImageValidatingPolicy).

Each `*_admits(policy_path, image_ref, statements)` answers (admitted, why) the way the admission controller decides,
as read in its source: which policy entries match the image reference (so CUDA tags meet the GPU rule), which
statements each judges, what makes it refuse. The statements are taken as signed by the policy's first key.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path

import celpy
import jmespath
import jsonschema
import yaml
from celpy import celtypes

REPORT = "https://torchimages.io/verification-report/v1"
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")


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
        if properties is None or schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("additionalProperties"):
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


# ---------------------------------------------------------------------------------------- Kyverno's ClusterPolicy

def _substitute(value, predicate: dict):
    """A condition's key or value with its `{{ jmespath }}` read from the predicate, as Kyverno adds the predicate
    to its JSON context (pkg/engine/internal/utils.go EvaluateConditions); a variable that reads nothing is an error
    (Kyverno's "variable substitution failed"), as is an expression JMESPath cannot parse."""
    if not isinstance(value, str) or not _TEMPLATE.search(value):
        return value
    whole = _TEMPLATE.fullmatch(value.strip())
    if whole:
        found = jmespath.search(whole.group(1).strip(), predicate)
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


def kyverno_admits(policy_path: Path, image_ref: str, statements: list[dict]) -> tuple[bool, str]:
    """Whether Kyverno's ClusterPolicy admits image_ref with these statements: every verifyImages entry whose
    imageReferences match (wildcards, ext/wildcard) needs, for each attestation type, at least one statement of it,
    and every statement of it must meet the conditions (imageverifier.go verifyAttestation loops over all)."""
    for document in policy_documents(policy_path):
        for rule in document["spec"]["rules"]:
            for entry in rule.get("verifyImages", []):
                if not any(fnmatch.fnmatchcase(image_ref, pattern) for pattern in entry.get("imageReferences", [])):
                    continue
                for attestation in entry.get("attestations", []):
                    kind = attestation["type"]
                    of_kind = [statement for statement in statements if statement["predicateType"] == kind]
                    if not of_kind:
                        return False, f"{rule['name']}: no {kind} attestation"
                    for statement in of_kind:
                        holds, why = _conditions_hold(attestation.get("conditions", []), statement["predicate"])
                        if not holds:
                            return False, f"{rule['name']}: a {kind} statement {why}"
    return True, "admitted"


# ---------------------------------------------------------------------------- Kyverno's ImageValidatingPolicy (CEL)

class _ImageVerification:
    """Kyverno's image verification CEL functions (pkg/cel/libs/imageverify/impl.go) over statements already
    verified as signed by the attestor named signer: a verification counts the attestors given that are the
    signer, and, as ImageData.AddVerifiedIntotoPayloads keeps one payload per predicate type, leaves the last
    statement of the type for extractPayload."""

    def __init__(self, spec: dict, statements: list[dict], signer: str):
        self.globs = [reference["glob"] for reference in spec.get("matchImageReferences", []) if "glob" in reference]
        self.kinds = {attestation["name"]: attestation["intoto"]["type"] for attestation in spec["attestations"]}
        self.statements, self.signer = statements, signer
        self.payloads: dict[str, dict] = {}

    def _matched(self, image) -> bool:
        return any(fnmatch.fnmatchcase(str(image), glob) for glob in self.globs)

    def _signers(self, attestors) -> int:
        return sum(1 for attestor in attestors if str(attestor["name"]) == self.signer)

    def verify_image_signatures(self, image, attestors):
        return celtypes.IntType(self._signers(attestors) if self._matched(image) else 0)

    def verify_attestation_signatures(self, image, attestation, attestors):
        kind = self.kinds.get(str(attestation))
        if kind is None:
            return celpy.CELEvalError(f"attestation not found in policy: {attestation}")
        of_kind = [statement for statement in self.statements if statement["predicateType"] == kind]
        if not self._matched(image) or not of_kind or not self._signers(attestors):
            return celtypes.IntType(0)
        self.payloads[kind] = of_kind[-1]["predicate"]
        return celtypes.IntType(self._signers(attestors))

    def extract_payload(self, image, attestation):
        kind = self.kinds.get(str(attestation), "")
        if kind not in self.payloads:
            return celpy.CELEvalError("intoto attestation payload cannot be fetch before verifying intoto attestation")
        return celpy.json_to_cel(self.payloads[kind])

    def functions(self) -> dict:
        return {"verifyImageSignatures": self.verify_image_signatures,
                "verifyAttestationSignatures": self.verify_attestation_signatures,
                "extractPayload": self.extract_payload}


def ivp_admits(policy_path: Path, image_ref: str, statements: list[dict],
               signer: str | None = None) -> tuple[bool, str]:
    """Whether Kyverno's ImageValidatingPolicy admits a pod running image_ref, with statements signed by the
    attestor named signer (the first attestor by default): its variables, then each validation in order, each an
    error or false refusing (failurePolicy Fail, validationActions Deny)."""
    spec = policy_documents(policy_path)[0]["spec"]
    verification = _ImageVerification(spec, statements, signer or spec["attestors"][0]["name"])
    environment = celpy.Environment()
    activation = {
        "images": celpy.json_to_cel({"containers": [image_ref], "initContainers": [], "ephemeralContainers": []}),
        "attestors": celpy.json_to_cel({attestor["name"]: {"name": attestor["name"]} for attestor in spec["attestors"]}),
        "attestations": celpy.json_to_cel({attestation["name"]: attestation["name"]
                                           for attestation in spec["attestations"]}),
    }

    def evaluate(expression: str):
        program = environment.program(environment.compile(expression), functions=verification.functions())
        return program.evaluate({**activation, "variables": celtypes.MapType(variables)})

    variables: dict = {}
    for variable in spec.get("variables", []):
        variables[celtypes.StringType(variable["name"])] = evaluate(variable["expression"])
    for validation in spec["validations"]:
        try:
            result = evaluate(validation["expression"])
        except celpy.CELEvalError as error:
            return False, f"{validation['message']} (error: {error.args[0]})"
        if result is not celtypes.BoolType(True) and result != celtypes.BoolType(True):
            return False, validation["message"]
    return True, "admitted"


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
    """The docker transport's scopes from the most specific (docs: the reference, the repository, each parent
    namespace, the host) to the transport's default ""."""
    repository = repository_of(image_ref)
    parts = repository.split("/")
    return [image_ref, *("/".join(parts[:count]) for count in range(len(parts), 0, -1)), ""]


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
SHIPPED = {"ClusterPolicy": (kyverno_admits, POLICIES / "kyverno-clusterpolicy.yaml"),
           "ImageValidatingPolicy": (ivp_admits, POLICIES / "kyverno-imagevalidatingpolicy.yaml")}
PLACEHOLDER_REPOSITORY = "registry.example.com/ml/pytorch"  # what the shipped policies name until a user edits them


def shipped_policies_admit(tag: str, predicates: dict[str, list[dict]]) -> dict[str, tuple[bool, str]]:
    """Each evaluable shipped policy's verdict on an image published under tag whose verified statements are
    predicates (predicate type -> predicates, as signatures.gather_evidence gathers them), the policies' placeholder
    repository standing for the test's own."""
    statements = [{"predicateType": kind, "predicate": predicate}
                  for kind, found in predicates.items() for predicate in found]
    return {name: admits(path, f"{PLACEHOLDER_REPOSITORY}:{tag}", statements)
            for name, (admits, path) in SHIPPED.items()}
