"""Commands that publish and scale out: plan (CI shards). publish, prune, catalog, lock, nightly and report merge
join this group."""
from __future__ import annotations

import json

from .. import plan
from ..project import EXIT_OK, Project, add_selectors


def cmd_plan(project: Project, args) -> int:
    shards = plan.make_plan(project.select(args.selectors), project.reports, args.shards)
    print(plan.github_matrix(shards) if args.format == "github" else json.dumps(plan.plan_document(shards), indent=2))
    return EXIT_OK


def register(commands) -> None:
    planning = commands.add_parser("plan", help="split the rows into shards of similar build time (a CI matrix)")
    add_selectors(planning)
    planning.add_argument("--shards", type=int, required=True, metavar="N", help="number of shards (runners)")
    planning.add_argument("--format", choices=("github", "json"), default="json",
                          help="github: one line {\"include\": [...]} for a strategy matrix; json: the full plan")
    planning.set_defaults(handler=cmd_plan)
