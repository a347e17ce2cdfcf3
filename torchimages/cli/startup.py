"""`startup-set`: what a cold start of a row's image reads before its first op, per layer (verify/startup_set.py)."""
from __future__ import annotations

import argparse

from ..build.builder import local_name
from ..files import atomic_write_json
from ..model import InputError, Problem
from ..peers import engine
from ..project import EXIT_OK, Project
from ..reporting import human_size
from ..verify import snapshotter_view, startup_set
from ..verify.plan import parse_gpus
from .commands import add_command
from .options import add_selectors

RECORD = "startup-set.json"


def cmd_startup_set(project: Project, args) -> int:
    if args.readahead_kib is not None and (problems := snapshotter_view.usable(engine.where())):
        raise InputError(problems)
    client = engine.client()
    for spec in project.select(args.selectors):
        image = args.image or local_name(spec)
        if engine.inspect_image(client, image) is None:
            raise InputError([Problem(image, 0, f"no such image on the engine: build it first (`torchimages build "
                                                f"{spec.tag}`) or name one with --image")])
        gpus = parse_gpus(args.gpus)
        path = project.reports / spec.tag / RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        if args.readahead_kib is None:
            measured = startup_set.measure(client, image, spec, gpus.device_requests())
        else:
            with snapshotter_view.loop_copy(client, image, args.readahead_kib, path.parent) as binds:
                measured = startup_set.measure(client, image, spec, gpus.device_requests(), binds, args.readahead_kib)
        atomic_write_json(path, measured.to_json(), root=project.reports)
        print(f"{spec.tag}: a cold start ({'GPU' if gpus.wanted else 'CPU'}: import torch and a first op, "
              f"{measured.start_s} s{readahead(measured.readahead_kib)}) read {human_size(measured.read_bytes)} of {len(measured.files)} files, "
              f"{measured.read_bytes / measured.image_bytes:.1%} of the image's {human_size(measured.image_bytes)}")
        for number, layer in enumerate(measured.layers, start=1):
            if layer["read"]:
                print(f"  layer {number} of {len(measured.layers)}: {human_size(layer['read'])} read of "
                      f"{human_size(layer['bytes'])}")
        print(f"  record: {path}")
    return EXIT_OK


def readahead(kib: int | None) -> str:
    return "" if kib is None else f", /usr and /opt reading ahead {kib} KiB"


def read_ahead_size(text: str) -> int:
    try:
        kib = int(text)
    except ValueError:
        kib = 0
    if not 4 <= kib <= 1 << 20:
        raise argparse.ArgumentTypeError(f"{text!r} is not a read-ahead in KiB from 4 to {1 << 20} "
                                         f"(a snapshotter's FUSE mount: {snapshotter_view.SNAPSHOTTER_READAHEAD_KIB})")
    return kib


def register(commands) -> None:
    measuring = add_command(commands, "startup-set", description="Run a cold start in a container of each row's "
                            "image (its files' page cache dropped first; `import torch`, a matmul and a convolution "
                            "as the image's user) and record which byte ranges of which files it read, per layer, in "
                            f"REPORTS/<tag>/{RECORD}: what a lazily pulled image must fetch before the first op. "
                            "Exit 0: measured; 1: the engine or the start failed; 2: bad input or no such image.")
    add_selectors(measuring, required=True)
    measuring.add_argument("--image", metavar="REF", help="measure this image instead of the row's local build")
    measuring.add_argument("--gpus", metavar="all|none|N|device=0,1", default="none",
                           help="GPUs for the container (Docker's syntax; default: none); given any, the start also "
                                "runs torch.cuda.init(), a bf16 matmul and a cuDNN convolution (a GPU host)")
    measuring.add_argument(snapshotter_view.OPTION, type=read_ahead_size, metavar="KIB",
                           help="read the image's /usr and /opt from a copy on a loop device reading ahead KIB KiB, "
                                "as a lazy-pull snapshotter's mount does (stargz-snapshotter's FUSE mount: "
                                f"{snapshotter_view.SNAPSHOTTER_READAHEAD_KIB}), not as the engine's disk does; root "
                                "on the engine's host. The set `publish --lazy` prefetches is then what such a "
                                "snapshotter would fetch")
    measuring.set_defaults(handler=cmd_startup_set,
                           writes=lambda project, args: [project.reports])
