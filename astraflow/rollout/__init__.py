"""Rollout service: inference engines, workflows, the node loop and its weight client."""
