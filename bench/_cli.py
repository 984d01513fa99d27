"""The command-line flags the benchmarks share, spelled once: every bench that has a flag gives it
the same name, type and meaning (``--quick``, ``--json``, ``--plot``, ``--seeds``, ...).

A bench adds the groups it uses and its own flags beside them; defaults that differ per bench
(how many seeds, steps, the per-run limit) stay ``None`` here and are resolved by the bench.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first line of the bench's docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n")[0])


def add_output_flags(ap: argparse.ArgumentParser, *, quick: str, plot: bool = True) -> None:
    """``--quick`` (``quick`` says what it runs), ``--json`` and, with ``plot``, ``--plot``."""
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    if plot:
        ap.add_argument("--plot", type=Path, default=None, help="PNG of accuracy against time")


def add_run_flags(ap: argparse.ArgumentParser, *, seeds_default: int = 3) -> None:
    """How many and how long the training runs are: ``--seeds``, ``--steps``, ``--eval-every``,
    ``--eval-tasks``, ``--timeout`` (per run) and ``--workdir`` (keep the runs)."""
    ap.add_argument(
        "--seeds", type=int, default=None, help=f"seeds per system (default {seeds_default})"
    )
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: recipe's)")
    ap.add_argument("--eval-every", type=int, default=None, help="evaluate every k steps")
    ap.add_argument("--eval-tasks", type=int, default=None, help="held-out problems per eval")
    ap.add_argument("--timeout", type=float, default=None, help="per-run limit in seconds")
    ap.add_argument("--workdir", type=Path, default=None, help="keep runs here (default: temp)")


def add_comparison_flags(
    ap: argparse.ArgumentParser, systems: Sequence[str], *, from_json: bool = True
) -> None:
    """The flags of a bench that compares systems: ``--systems``, ``--trl-threads``, ``--af-set``
    (recipe overrides for the AstraFlow runs only) and, with ``from_json``, ``--from-json``."""
    ap.add_argument("--systems", default=",".join(systems), help="comma-separated subset")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL run")
    ap.add_argument(
        "--af-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe override for the AstraFlow runs only (tuning; recorded in the results)",
    )
    if from_json:
        ap.add_argument(
            "--from-json",
            type=Path,
            default=None,
            help="re-analyse the runs saved in an earlier --json file instead of running",
        )


def add_set_flag(ap: argparse.ArgumentParser, *, who: str = "every system") -> None:
    """``--set KEY=VALUE`` (repeatable, into ``sets``): a recipe override for ``who``."""
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help=f"recipe override for {who} (e.g. tasks.env_latency.p99_s=2)",
    )  # fmt: skip


def parse_systems(ap: argparse.ArgumentParser, text: str, known: Sequence[str]) -> list[str]:
    """``--systems``: a comma-separated subset of ``known`` (an argparse error otherwise)."""
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = set(systems) - set(known)
    if unknown:
        ap.error(f"--systems: unknown {sorted(unknown)}; expected some of {', '.join(known)}")
    return systems
