"""What makes a digest trustworthy: signing keys (files, env, PKCS#11), cosign-format signatures and attestations on
the registry, the attestations' predicates, `verify-image`'s admission decision, and `rebuild` (a published digest
built again from its signed provenance)."""
