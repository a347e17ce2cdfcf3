"""Stage 5, publish: verified images pushed by digest, signed and attested; multi-arch indexes; catalog.json and the
images/README.md page developers pull from."""
