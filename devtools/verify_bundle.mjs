// An independent check of a Sigstore bundle (v0.3, a DSSE envelope signed with a key) by sigstore-js's own verifier,
// @sigstore/verify, pinned in devtools/sigstore-js/ (`python -m devtools.sigstore_js` installs it):
//
//     node devtools/verify_bundle.mjs BUNDLE.json PUBLIC_KEY.pem SUBJECT_DIGEST
//
// The public key is the only trust material: an empty trusted root (no CAs, logs or timestamp authorities, as cosign's
// `--trusted-root` with `--insecure-ignore-tlog` is given) and the key found by the bundle's hint, as
// base64(sha256(the key's DER)), the hint cosign writes. No tlog entry or timestamp is required (thresholds of 0).
// The envelope must carry an in-toto statement whose subjects include SUBJECT_DIGEST (`sha256:<hex>`).
// Exit 0 printing the statement's predicateType; exit 1 with one line saying why not; exit 2 on a usage error.
import { createHash, createPublicKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

// The packages live in devtools/sigstore-js/node_modules, which an import from this folder would not search.
const require = createRequire(new URL('./sigstore-js/package.json', import.meta.url));
const { bundleFromJSON } = require('@sigstore/bundle');
const { TrustedRoot } = require('@sigstore/protobuf-specs');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

const IN_TOTO_PAYLOAD_TYPE = 'application/vnd.in-toto+json';
const IN_TOTO_STATEMENT_TYPES = new Set(['https://in-toto.io/Statement/v0.1', 'https://in-toto.io/Statement/v1']);
const EMPTY_TRUSTED_ROOT = { mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1' };

class Refused extends Error {}

function verify(bundlePath, publicKeyPath, subjectDigest) {
  const bundle = bundleFromJSON(JSON.parse(readFileSync(bundlePath, 'utf8')));
  if (bundle.content.$case !== 'dsseEnvelope') {
    throw new Refused(`the bundle holds a ${bundle.content.$case}, not a DSSE envelope`);
  }
  const keyDer = createPublicKey(readFileSync(publicKeyPath, 'utf8')).export({ type: 'spki', format: 'der' });
  const hint = createHash('sha256').update(keyDer).digest('base64');
  // The package's own key locator: a bundle whose hint names another key is refused as `key not found`.
  const trustMaterial = toTrustMaterial(TrustedRoot.fromJSON(EMPTY_TRUSTED_ROOT), { [hint]: { rawBytes: keyDer } });
  const verifier = new Verifier(trustMaterial, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
  verifier.verify(toSignedEntity(bundle));

  // Only now, the signature verified, is the payload worth reading.
  const envelope = bundle.content.dsseEnvelope;
  if (envelope.payloadType !== IN_TOTO_PAYLOAD_TYPE) {
    throw new Refused(`payloadType is ${JSON.stringify(envelope.payloadType)}, not ${IN_TOTO_PAYLOAD_TYPE}`);
  }
  const statement = JSON.parse(envelope.payload.toString('utf8'));
  if (!IN_TOTO_STATEMENT_TYPES.has(statement._type)) {
    throw new Refused(`the payload is not an in-toto statement (_type ${JSON.stringify(statement._type)})`);
  }
  const [algorithm, hex] = subjectDigest.split(':', 2);
  const subjects = Array.isArray(statement.subject) ? statement.subject : [];
  if (!hex || !subjects.some((subject) => subject?.digest?.[algorithm] === hex)) {
    const named = subjects.map((subject) => JSON.stringify(subject?.digest)).join(', ');
    throw new Refused(`no subject has the digest ${subjectDigest} (the statement's: ${named || 'none'})`);
  }
  return statement.predicateType;
}

const args = process.argv.slice(2);
if (args.length !== 3) {
  console.error('usage: node verify_bundle.mjs BUNDLE.json PUBLIC_KEY.pem SUBJECT_DIGEST');
  process.exit(2);
}
try {
  console.log(verify(...args));
} catch (error) {
  // VerificationError and ValidationError carry a code and the fields at fault; one line either way.
  const code = error.code ? `${error.code}: ` : '';
  const fields = Array.isArray(error.fields) ? ` (${error.fields.join(', ')})` : '';
  console.error(`refused: ${code}${error.message}${fields}`.replace(/\s+/g, ' '));
  process.exit(1);
}
