"""A real rollout node (``astraflow.rollout.main.run_node``) whose engine answers slowly.

Every generation request waits ``--delay`` seconds before reaching the real transformers engine,
as on a node serving a large model. Tests use it when they need a group to be still generating at
the moment they act (the built-in tiny model finishes a group in milliseconds, so a signal
usually lands while its push is already under way). Everything else is the real thing.
"""

from __future__ import annotations

import asyncio
import sys

from node_script import node_parser, run_node

from astraflow.rollout import main as rollout_main


def main() -> int:
    parser = node_parser("slow")
    parser.add_argument("--delay", type=float, default=0.5)
    args = parser.parse_args()

    real_build = rollout_main.build_policies

    def build(recipe, opts):
        served = real_build(recipe, opts)
        for policy in served.values():
            generate = policy.engine.generate

            async def slow_generate(*a, _generate=generate, **kw):
                await asyncio.sleep(args.delay)
                return await _generate(*a, **kw)

            policy.engine.generate = slow_generate
        return served

    return run_node(args, build)


if __name__ == "__main__":
    sys.exit(main())
