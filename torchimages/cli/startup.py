"""`startup-set`: what a cold start of a row's image reads before its first op, per layer (verify/startup_set.py)."""
from __future__ import annotations

from ..build.builder import local_name
from ..files import atomic_write_json
from ..model import InputError, Problem
from ..peers import engine
from ..project import EXIT_OK, Project
from ..reporting import human_size
from ..verify import startup_set
from ..verify.plan import parse_gpus
from .commands import add_command
from .options import add_selectors

RECORD = "startup-set.json"


def cmd_startup_set(project: Project, args) -> int:
    client = engine.client()
    for spec in project.select(args.selectors):
        image = args.image or local_name(spec)
        if engine.inspect_image(client, image) is None:
            raise InputError([Problem(image, 0, f"no such image on the engine: build it first (`torchimages build "
                                                f"{spec.tag}`) or name one with --image")])
        gpus = parse_gpus(args.gpus)
        measured = startup_set.measure(client, image, spec, gpus.device_requests())
        path = project.reports / spec.tag / RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, measured.to_json(), root=project.reports)
        print(f"{spec.tag}: a cold start ({'GPU' if gpus.wanted else 'CPU'}: import torch and a first op, "
              f"{measured.start_s} s) read {human_size(measured.read_bytes)} of {len(measured.files)} files, "
              f"{measured.read_bytes / measured.image_bytes:.1%} of the image's {human_size(measured.image_bytes)}")
        for number, layer in enumerate(measured.layers, start=1):
            if layer["read"]:
                print(f"  layer {number} of {len(measured.layers)}: {human_size(layer['read'])} read of "
                      f"{human_size(layer['bytes'])}")
        print(f"  record: {path}")
    return EXIT_OK


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
    measuring.set_defaults(handler=cmd_startup_set,
                           writes=lambda project, args: [project.reports])
