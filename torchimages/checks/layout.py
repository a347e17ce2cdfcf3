"""The layout check's rules: an image's layers as a cold node, image streaming and a registry take them (issue 58).

- No empty layer: GKE image streaming refuses an image with one, and it costs a request per pull for nothing.
- No two layers with the same content: image streaming refuses those too, and the second is a pull for nothing.
- No layer over 1 GB compressed: a node's first op waits for its largest layer (a pull unpacks one layer after the
  other), registries cap a layer's size (GHCR: 10 GB), and a ROCm image with one 19.7 GB layer could not be pushed
  at all (ROCm-docker#166).

Pure functions over the facts verify/image_layers.py reads from the engine.
"""
from __future__ import annotations

import re

# The compressed size a layer may have: what a republish or a cold pull waits for in one piece.
COMPRESSED_LIMIT = 1_000_000_000
# An empty layer's diff id: the sha256 of a tar archive with no entry (1,024 zero bytes), whatever wrote it.
EMPTY_DIFF_ID = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def gigabytes(size: int) -> str:
    """Decimal, as registries and pulls count compressed bytes."""
    return f"{size / 1e9:.2f} GB"


# The classic builder's history of a step: its build arguments (`|2 A=1 B=2`), the shell, then the command, or
# `#(nop) ` and the instruction where it ran none (COPY, ADD).
CLASSIC_STEP = re.compile(r"(?:\|[0-9]+ .*?)?/bin/(?:ba)?sh (?:-o pipefail )?-c (#\(nop\)\s*)?(.*)", re.ASCII | re.DOTALL)


def step_of(layer: dict) -> str:
    """The Dockerfile step that wrote a layer, in a few words: `RUN command` or the instruction (the history entry,
    shortened; another builder's as it wrote it)."""
    created_by = " ".join((layer.get("created_by") or "").split())
    classic = CLASSIC_STEP.fullmatch(created_by)
    if classic:
        created_by = classic.group(2) if classic.group(1) else f"RUN {classic.group(2)}"
    return created_by[:120] + ("..." if len(created_by) > 120 else "")


def layout_problems(layers: list[dict], limit: int = COMPRESSED_LIMIT) -> list[str]:
    """What breaks the rules, one sentence each. layers: bottom first, each with its diff_id, size (the tar's bytes),
    empty (no entry), gzip_size (measured where size is over the limit, else None: a layer's gzip is never much larger
    than its tar) and created_by."""
    problems = []
    first_of: dict[str, int] = {}
    count = len(layers)
    for number, layer in enumerate(layers, start=1):
        where = f"layer {number} of {count} ({step_of(layer) or 'no history'})"
        if layer.get("empty") or layer["diff_id"] == EMPTY_DIFF_ID:
            problems.append(f"{where} is empty: image streaming refuses such an image; make the step write "
                            "something or fold it into another")
        elif layer["diff_id"] in first_of:
            problems.append(f"{where} has the same content as layer {first_of[layer['diff_id']]} ({layer['diff_id']}): "
                            "image streaming refuses duplicate layers; drop the step that writes it again")
        first_of.setdefault(layer["diff_id"], number)
        if layer.get("gzip_size") is not None and layer["gzip_size"] > limit:
            problems.append(f"{where} is {gigabytes(layer['gzip_size'])} compressed, over the "
                            f"{gigabytes(limit)} a layer may have: a cold node waits for it whole; split its "
                            "files over steps (build_inputs/layers.py for the venv's wheels)")
    return problems
