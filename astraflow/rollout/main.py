"""The rollout process (``astraflow serve rollout``): engines for the recipe's policies, one node.

The process builds one inference engine per policy the workflow uses (one per base for the LoRA
adapter policies of a base, :func:`build_policies`), then runs a
:class:`~astraflow.rollout.node.RolloutNode` (lease, run workflow groups, push, fetch weights)
until the run is done, a SIGTERM drains it, or its engine dies (exit status
:data:`EXIT_ENGINE_DEAD`).

A node needs only the dataflow URL and its node token (and, over HTTPS, the run's CA file): it
reads the run's recipe from the service (``GET /recipe``), so a node started by hand in another
region joins with two or three arguments.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from astraflow.recipe import Recipe

log = logging.getLogger("astraflow.rollout")


@dataclass
class NodeOptions:
    join: str
    token: str
    policies: list[str] = field(default_factory=list)  # empty = every policy the workflow uses
    engine: str | None = None  # override the recipe's engine kind
    concurrency: int | None = None
    device: str | None = None
    name: str = ""
    #: restarts a crashed node of the same name (its leases go back to the queue at once)
    replace: bool = False
    region: str | None = None
    torch_threads: int = 1
    #: on SIGTERM, seconds in-flight groups may run on before their leases are released
    drain_timeout_s: float = 60.0
    #: override the recipe's rollout.env_workers / rollout.env_timeout_s on this node
    env_workers: int | None = None
    env_timeout_s: float | None = None
    #: CA file to verify https:// services against (None: $ASTRAFLOW_CA_FILE, else system CAs)
    ca_file: str | None = None
    #: fetch weights from this URL (a region's weight cache) instead of the announced locations
    weight_cache: str | None = None
    #: the run's recipe as given on this node's command line (None: the one the service serves)
    recipe: Recipe | None = None


#: Exit status of a node whose engine died (its leases are left to expire; see node.py).
EXIT_ENGINE_DEAD = 3

#: Startup probe: a wrong URL must fail in seconds, not after the long retries used mid-run.
STARTUP_RETRIES = 2
STARTUP_TIMEOUT_S = 5.0


def _sampling(policy_cfg):
    from astraflow.rollout.engines import SamplingParams

    s = policy_cfg.sampling
    return SamplingParams(
        temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, stop=tuple(s.stop)
    )


def build_policies(recipe: Recipe, opts: NodeOptions) -> dict[str, Any]:
    """One :class:`RolePolicy` (engine and default sampling) per policy the workflow's roles need
    (optionally filtered by ``--policies``).

    The LoRA adapter policies of one base (``policies.X.base``), and the base policy itself when
    the workflow plays it, share one engine: the base's weights are loaded once and requests of
    every adapter are batched together (:mod:`astraflow.rollout.engines.adapters`)."""
    from astraflow.rollout.workflows.base import RolePolicy

    wanted = set(recipe.workflow.roles.values())
    if opts.policies:
        unknown = sorted(set(opts.policies) - set(recipe.policies))
        if unknown:
            raise ValueError(
                f"--policies names unknown policies {unknown}; recipe has {sorted(recipe.policies)}"
            )
        wanted &= set(opts.policies)
    engines: dict[str, Any] = {}
    groups = recipe.adapter_groups()
    for key, adapters in groups.items():
        mine = [a for a in adapters if a in wanted]
        with_base = key in recipe.policies and key in wanted
        if mine:
            engines.update(_adapter_engines(recipe, opts, key, mine, with_base))
    served = {}
    for name in sorted(wanted):
        cfg = recipe.policies[name]
        engine = engines.get(name) or _engine(recipe, opts, name, cfg.model)
        served[name] = RolePolicy(name, engine, _sampling(cfg), cfg.trainable, cfg.tool_parser)
    return served


def _engine_args(recipe: Recipe, opts: NodeOptions, name: str) -> tuple[str, dict[str, Any]]:
    cfg = recipe.policies[name]
    kind = opts.engine or cfg.engine
    args = dict(cfg.engine_args)
    if kind == "transformers":
        args.setdefault("device", opts.device or recipe.rollout.device)
        args.setdefault("num_threads", opts.torch_threads)
    return kind, args


def _engine(recipe: Recipe, opts: NodeOptions, name: str, model: str, **extra: Any):
    """The engine of policy ``name``: its recipe ``engine_args`` (checked against the kind's
    declared arguments by the recipe schema and again by ``make_engine``, which also finds a hub
    id in the local HF cache), the node's device and threads for the transformers engine."""
    from astraflow.rollout.engines import make_engine

    kind, args = _engine_args(recipe, opts, name)
    return make_engine(kind, model, **args, **extra)


def _adapter_engines(
    recipe: Recipe, opts: NodeOptions, base: str, adapters: list[str], with_base: bool
) -> dict[str, Any]:
    """One engine for the adapter policies ``adapters`` of ``base`` (and the base policy when
    ``with_base``), as one :class:`~astraflow.rollout.engines.adapters.AdapterEngine` each."""
    from astraflow.engine_kinds import ADAPTER_ENGINE_KINDS
    from astraflow.models.lora import adapter_specs
    from astraflow.rollout.engines.adapters import adapter_engines

    kind, _ = _engine_args(recipe, opts, adapters[0])
    if kind not in ADAPTER_ENGINE_KINDS:
        raise ValueError(
            f"--engine {kind} cannot serve the LoRA adapters {', '.join(adapters)} of {base!r}; "
            f"use one of {', '.join(ADAPTER_ENGINE_KINDS)}"
        )
    engine = _engine(
        recipe, opts, adapters[0], recipe.model_of(adapters[0]),
        adapters=adapter_specs(recipe, adapters),
    )  # fmt: skip
    faces: dict[str, str | None] = {name: name for name in adapters}
    if with_base:
        faces[base] = None
    log.info("one %s engine for base %s serves %s", kind, base, ", ".join(faces))
    return adapter_engines(engine, faces)


def run_node(opts: NodeOptions) -> int:
    """Run this node until done; returns the process exit status."""
    return asyncio.run(_run(opts))


async def _probe(opts: NodeOptions) -> Recipe:
    """Reach the service and check the token before loading any model: a wrong URL or token is
    reported in seconds (``ServiceUnreachable`` / ``AuthError``), not after minutes of retries."""
    from astraflow.protocol.client import DataflowClient

    async with DataflowClient(
        opts.join,
        opts.token,
        timeout=STARTUP_TIMEOUT_S,
        retries=STARTUP_RETRIES,
        ca_file=opts.ca_file,
    ) as probe:
        await probe.healthz()
        return await probe.recipe()  # needs the token: a wrong one fails here with AuthError


async def _run(opts: NodeOptions) -> int:
    from astraflow.envs import default_registry
    from astraflow.protocol.client import DataflowClient
    from astraflow.rollout.node import EngineFailure, NodeSettings, RolloutNode
    from astraflow.rollout.workflows import default_workflows
    from astraflow.weights import WeightClient

    served_recipe = await _probe(opts)
    recipe = opts.recipe or served_recipe
    client = DataflowClient(opts.join, opts.token, ca_file=opts.ca_file)
    policies: dict[str, Any] = {}
    workflows = None
    try:
        policies = build_policies(recipe, opts)
        workflows = default_workflows()
        envs = default_registry()
        for error in [*workflows.errors.values(), *envs.errors.values()]:
            log.warning("plugin not loaded: %s", error)  # the run goes on without it

        def make_env(env_id: str, kwargs: dict[str, Any]):
            return envs.make(env_id, **{**recipe.tasks.env_kwargs, **kwargs})

        latest: dict[str, int] = {}
        if recipe.tasks.env_latency is not None:
            # [tasks.env_latency]: every env gets a delay stream of its own, seeded by the run
            # seed, this node's name and the env's number (envs/wrappers/latency.py).
            from astraflow.envs.wrappers.latency import LatencyEnvFactory

            make_env = LatencyEnvFactory(
                make_env,
                recipe.tasks.env_latency,
                seed=recipe.run.seed,
                stream=opts.name,
                # the phase of a changing load follows training: the newest version heard of
                step=lambda: max(latest.values(), default=0),
            )

        weight_clients: dict[str, Any] = {}

        def fetch(policy: str, location: str, have: int | None, want: int):
            location = opts.weight_cache or location
            wc = weight_clients.get(location)
            if wc is None:
                wc = weight_clients[location] = WeightClient(
                    location, opts.token, ca_file=opts.ca_file
                )
            return wc.fetch_update(policy, have_version=have, want_version=want)

        settings = NodeSettings(
            concurrency=opts.concurrency or recipe.rollout.concurrency,
            name=opts.name,
            replace=opts.replace,
            region=opts.region or recipe.rollout.region,
            workflow_kwargs={
                "max_turns": recipe.workflow.max_turns,
                **recipe.workflow.kwargs,
                **({"agent": recipe.workflow.agent} if recipe.workflow.agent else {}),
            },
            roles=dict(recipe.workflow.roles),
            drain_timeout_s=opts.drain_timeout_s,
            env_workers=opts.env_workers or recipe.rollout.env_workers,
            env_timeout_s=opts.env_timeout_s or recipe.rollout.env_timeout_s,
            checkpoint_after_s=recipe.rollout.checkpoint_after_s,
        )
        node = RolloutNode(client, policies, workflows.get, make_env, settings, fetch)
        latest = node.latest  # (read by the latency schedule's step, one dict shared)
        try:
            stats = await node.run()
        except EngineFailure as exc:
            log.error(
                "engine failure, node %s stops (its leases expire and other nodes redo them): %s",
                node.node_id,
                exc,
            )
            return EXIT_ENGINE_DEAD
        log.info("node done: %s", stats.as_metrics())
        return 0
    finally:
        if workflows is not None:
            try:
                await workflows.aclose()  # the openai_agent endpoint, if one was started
            except Exception as exc:
                log.debug("closing workflows: %s", exc)
        for p in policies.values():
            try:
                await p.engine.close()
            except Exception as exc:  # a dead engine may fail to close; the process exits anyway
                log.debug("closing engine %s: %s", p.name, exc)
        await client.close()
