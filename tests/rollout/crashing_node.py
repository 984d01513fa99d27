"""A real rollout node (``astraflow.rollout.main.run_node``) whose engine dies on demand.

When the file given by ``--crash-file`` appears, the node's transformers engine is shut down from
outside the node, as a crashed inference worker would be: its worker thread stops and every
request in flight or arriving later fails with ``EngineClosedError``. Everything else (HTTP,
dataflow, workflows, envs, the model) is the real thing. The exit status is the node's own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from pathlib import Path

from astraflow.rollout import main as rollout_main


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--join", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--name", default="crashing")
    parser.add_argument("--crash-file", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    engines = []
    real_build = rollout_main.build_policies

    def build(recipe, opts):
        served = real_build(recipe, opts)
        engines.extend(p.engine for p in served.values())
        return served

    rollout_main.build_policies = build

    def crash_when_asked() -> None:
        while not args.crash_file.exists():
            time.sleep(0.02)
        logging.getLogger("crashing_node").warning("killing the engine's worker now")
        for engine in engines:
            asyncio.run(engine.close())

    threading.Thread(target=crash_when_asked, daemon=True).start()
    opts = rollout_main.NodeOptions(join=args.join, token=args.token, name=args.name)
    return rollout_main.run_node(opts)


if __name__ == "__main__":
    sys.exit(main())
