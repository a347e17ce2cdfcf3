"""Stage 1, the matrix: matrix.yaml and compat.yaml read, checked and turned into typed ImageSpecs; compat.yaml's facts
read from the package index (`compat refresh`)."""
