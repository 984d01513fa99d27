"""What the test node scripts (``scripted_node.py``, ``slow_node.py``) share: the real node's
command line and start-up (``astraflow.rollout.main.run_node``), each script giving only its own
way of building the policies it serves."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from astraflow.rollout import main as rollout_main


def node_parser(name: str) -> argparse.ArgumentParser:
    """The options every test node takes (a script adds its own)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--join", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--name", default=name)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    return parser


def run_node(args: argparse.Namespace, build_policies: Callable[[Any, Any], dict]) -> int:
    """Run the real node with ``build_policies`` in place of the recipe's engines."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rollout_main.build_policies = build_policies
    opts = rollout_main.NodeOptions(
        join=args.join,
        token=args.token,
        name=args.name,
        concurrency=args.concurrency,
        drain_timeout_s=args.drain_timeout,
    )
    return rollout_main.run_node(opts)
