"""The train loop of one policy: pull batches from the dataflow, step, publish, acknowledge.

The trainer process (:func:`astraflow.trainer.main.run_trainer`) calls :func:`train_policy` on
every rank. Weight publication is injected (``publish``) so this module depends only on the
protocol: the caller passes a function that stores version ``v`` (e.g.
``WeightStore(root).publish(policy, v, tensors)``) and returns the
:class:`~astraflow.protocol.WeightVersion` it wrote; that version is then announced to the dataflow
service before the batch that produced it is acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.protocol import WeightVersion
from astraflow.recipe.schema import Recipe

#: ``publish(version, state_dict) -> WeightVersion | None`` (tensors valid only during the call).
Publisher = Callable[[int, dict[str, Any]], "WeightVersion | None"]


def train_policy(
    recipe: Recipe,
    policy: str,
    dataflow_url: str,
    token: str,
    run_dir: str | Path | None = None,
    *,
    publish: Publisher | None = None,
    on_step: Callable[[Any], None] | None = None,
    max_staleness: int | None = None,
    resume: bool | str = True,
    wait_s: float = 30.0,
    ca_file: str | None = None,
) -> int:
    """Train ``policy`` until ``run.max_steps`` or until the dataflow says the run is over.

    Returns the final version. Resumes from the newest checkpoint under
    ``run_dir/checkpoints/<policy>`` when ``resume`` is true (a restarted trainer continues the
    version sequence; the batch it had not acknowledged is served again by the dataflow).
    """
    from astraflow.protocol.client import SyncDataflowClient
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import DataflowBatchSource

    if policy not in recipe.policies:
        known = ", ".join(sorted(recipe.policies))
        raise ValueError(f"policy {policy!r} is not defined in the recipe; defined: {known}")
    spec = recipe.policies[policy]
    if not spec.trainable:
        raise ValueError(f"policy {policy!r} has trainable = false; it has no trainer")
    run_dir = Path(run_dir) if run_dir is not None else recipe.run.run_dir
    # patient: a dataflow restart (supervised crash) takes seconds; retrying bridges it
    client = SyncDataflowClient(dataflow_url, token, ca_file=ca_file, retries=10)

    def publish_and_announce(version: int, state_dict: dict[str, Any]) -> None:
        if publish is None:
            return
        written = publish(version, state_dict)
        if written is not None:
            client.announce_version(written)

    try:
        trainer = build_trainer(
            spec.model,
            spec.trainer,
            DataflowBatchSource(client, trainer_id=f"trainer-{policy}", wait_s=wait_s),
            run_dir,
            policy,
            max_steps=recipe.run.max_steps,
            seed=recipe.run.seed,
            publish=publish_and_announce if publish is not None else None,
            on_step=on_step,
            temperature=spec.sampling.temperature,
            max_completion_length=spec.sampling.max_tokens * recipe.workflow.max_turns,
            max_staleness=max_staleness,
            torch_threads=recipe.run.torch_threads,
        )
        return trainer.run(resume=resume)
    finally:
        client.close()
