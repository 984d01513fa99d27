"""Gymnasium wrappers usable on any AstraFlow env (configured from the recipe)."""

from astraflow.envs.wrappers.latency import (
    LatencyDistribution,
    LatencyEnvFactory,
    LatencySampler,
    LatencyWrapper,
    straggler_bound,
)

__all__ = [
    "LatencyDistribution",
    "LatencyEnvFactory",
    "LatencySampler",
    "LatencyWrapper",
    "straggler_bound",
]
