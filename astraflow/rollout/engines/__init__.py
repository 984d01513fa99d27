"""Inference engines behind one interface (see :mod:`astraflow.rollout.engines.base`)."""

from astraflow.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdate

__all__ = ["Engine", "Generation", "SamplingParams", "WeightUpdate"]
