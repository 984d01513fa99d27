"""A real rollout node (``astraflow.rollout.main.run_node``) whose policies are scripted engines.

Every generation answers ``--reply`` and carries weight version ``--version``, so a test can tell
which node generated which turn of an episode from the trained sample alone (its tokens and its
per-token versions); ``--calls-log`` counts the turns the node generated (a line each, written
before the turn is used, so a node killed mid-episode has counted what it did). Everything else is the real node: registration, leases, env runner, saves of
episodes in flight, pushes.
"""

from __future__ import annotations

import sys

from node_script import node_parser, run_node

from astraflow.rollout import main as rollout_main
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.workflows.base import RolePolicy


def main() -> int:
    parser = node_parser("scripted")
    parser.add_argument("--reply", default="no idea")
    parser.add_argument("--version", type=int, default=0)
    parser.add_argument(
        "--calls-log", default=None, help="append a line per generation here (turns generated)"
    )
    args = parser.parse_args()

    calls = open(args.calls_log, "a", buffering=1) if args.calls_log else None  # noqa: SIM115

    def reply(_observation: str) -> str:
        if calls is not None:
            calls.write("turn\n")  # line-buffered: on disk before the reply is used
        return args.reply

    def build(recipe, opts):
        served = {}
        for name in sorted(set(recipe.workflow.roles.values())):
            engine = ScriptedEngine(reply)
            engine.version = args.version
            cfg = recipe.policies[name]
            served[name] = RolePolicy(name, engine, rollout_main._sampling(cfg), cfg.trainable)
        return served

    return run_node(args, build)


if __name__ == "__main__":
    sys.exit(main())
