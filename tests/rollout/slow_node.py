"""A real rollout node (``astraflow.rollout.main.run_node``) whose engine answers slowly.

Every generation request waits ``--delay`` seconds before reaching the real transformers engine,
as on a node serving a large model. Tests use it when they need a group to be still generating at
the moment they act (the built-in tiny model finishes a group in milliseconds, so a signal
usually lands while its push is already under way). Everything else is the real thing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from astraflow.rollout import main as rollout_main


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--join", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--name", default="slow")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

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

    rollout_main.build_policies = build
    opts = rollout_main.NodeOptions(
        join=args.join,
        token=args.token,
        name=args.name,
        concurrency=args.concurrency,
        drain_timeout_s=args.drain_timeout,
    )
    return rollout_main.run_node(opts)


if __name__ == "__main__":
    sys.exit(main())
