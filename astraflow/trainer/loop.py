"""The train loop of one policy: pull batches from the dataflow, step, publish, acknowledge.

The trainer process (:func:`astraflow.trainer.main.run_trainer`) calls :func:`train_policies` on
every rank: one policy, or several LoRA adapter policies of one base trained side by side on one
copy of the base. Weight publication is injected (``publish``) so this module depends only on the
protocol: the caller passes a function that stores version ``v`` (e.g.
``WeightStore(root).publish(policy, v, tensors)``) and returns the
:class:`~astraflow.protocol.WeightVersion` it wrote; that version is then announced to the dataflow
service before the batch that produced it is acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
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
    versions = train_policies(
        recipe, [policy], dataflow_url, token, run_dir,
        publish={policy: publish} if publish is not None else None,
        on_step={policy: on_step} if on_step is not None else None,
        max_staleness=max_staleness, resume=resume, wait_s=wait_s, ca_file=ca_file,
    )  # fmt: skip
    return versions[policy]


def train_policies(
    recipe: Recipe,
    policies: list[str],
    dataflow_url: str,
    token: str,
    run_dir: str | Path | None = None,
    *,
    publish: dict[str, Publisher] | None = None,
    on_step: dict[str, Callable[[Any], None]] | None = None,
    max_staleness: int | None = None,
    resume: bool | str = True,
    wait_s: float = 30.0,
    ca_file: str | None = None,
) -> dict[str, int]:
    """Train each of ``policies`` as :func:`train_policy` does, in this one process; returns
    each policy's final version.

    Several policies must be LoRA adapters of one base (``policies.X.base``): the base is loaded
    once and shared (:class:`~astraflow.trainer.adapters.SharedBase`), and each adapter trains in
    a thread of its own with its own trainer, optimizer, dataflow client, version stream and
    checkpoints."""
    from astraflow.models.lora import adapter_specs
    from astraflow.protocol.client import SyncDataflowClient
    from astraflow.trainer.adapters import SharedBase, run_side_by_side
    from astraflow.trainer.grpo import build_trainer, resolve_precision
    from astraflow.trainer.source import DataflowBatchSource
    from astraflow.weights.publisher import BackgroundPublisher

    for policy in policies:
        if policy not in recipe.policies:
            known = ", ".join(sorted(recipe.policies))
            raise ValueError(f"policy {policy!r} is not defined in the recipe; defined: {known}")
        if not recipe.policies[policy].trainable:
            raise ValueError(f"policy {policy!r} has trainable = false; it has no trainer")
    if len(set(policies)) != len(policies) or not policies:
        raise ValueError(f"train_policies needs distinct policies, got {policies}")
    bases = {recipe.policies[p].base for p in policies}
    if len(policies) > 1 and (None in bases or len(bases) > 1):
        raise ValueError(
            f"one trainer process trains several policies only when they are LoRA adapters of "
            f"one base; {', '.join(policies)} are not (bases: {sorted(map(str, bases))})"
        )
    run_dir = Path(run_dir) if run_dir is not None else recipe.run.run_dir
    shared = None
    if len(policies) > 1:
        first = recipe.policies[policies[0]].trainer
        _, dtype = resolve_precision(first)
        shared = SharedBase.load(recipe.model_of(policies[0]), dtype)
    clients = []
    publishers: list[BackgroundPublisher] = []
    jobs = {}
    try:
        for policy in policies:
            spec = recipe.policies[policy]
            # patient: a dataflow restart (supervised crash) takes seconds; retrying bridges it
            client = SyncDataflowClient(dataflow_url, token, ca_file=ca_file, retries=10)
            clients.append(client)
            publisher = (publish or {}).get(policy)
            announcer = _Announcer(publisher, client) if publisher is not None else None
            # the step returns once the weights are copied to host memory; writing and
            # announcing the version run in the background (astraflow.weights.publisher)
            background = None
            if announcer is not None:
                background = BackgroundPublisher(announcer, name=f"publish-{policy}")
                publishers.append(background)
            adapter = adapter_specs(recipe, [policy])[0] if spec.base is not None else None
            trainer = build_trainer(
                recipe.model_of(policy),
                spec.trainer,
                DataflowBatchSource(client, trainer_id=f"trainer-{policy}", wait_s=wait_s),
                run_dir,
                policy,
                max_steps=recipe.run.max_steps,
                seed=recipe.run.seed,
                publish=background,
                on_step=(on_step or {}).get(policy),
                temperature=spec.sampling.temperature,
                max_completion_length=recipe.max_completion_length(policy),
                max_staleness=max_staleness,
                torch_threads=recipe.run.torch_threads,
                adapter=adapter,
                base_model=shared.copy() if shared is not None else None,
            )
            if announcer is not None:
                announcer.facts.update(trainer.model_facts())
            jobs[policy] = partial(trainer.run, resume=resume)
        versions = run_side_by_side(jobs)
        for background in publishers:  # the newest version is written and announced
            background.flush()
        if shared is not None:
            shared.check_unchanged(recipe.model_of(policies[0]))
        return versions
    finally:
        for background in publishers:
            try:
                background.close()
            except Exception:  # already raised by flush(), or the run failed before it
                pass
        for client in clients:
            client.close()


class _Announcer:
    """Publishes a version (the injected publisher), then announces it to the dataflow service
    with the model's vocabulary size and context length, so that the service refuses pushes
    this model could not train on (``facts``, filled once the trainer is built)."""

    def __init__(self, publish: Publisher, client: Any):
        self.publish = publish
        self.client = client
        self.facts: dict[str, int | None] = {}

    def __call__(self, version: int, state_dict: dict[str, Any]) -> None:
        written = self.publish(version, state_dict)
        if written is not None:
            self.client.announce_version(written.model_copy(update=self.facts))
