"""The trainer process (``astraflow serve trainer``): a weight store with its HTTP server,
evaluations, and the train loop of one policy (or of several LoRA adapter policies of one base,
each with its own version stream, checkpoints and evaluations, served by the one weight server).

The train loop itself (:func:`astraflow.trainer.loop.train_policy`) knows nothing about where
weights go; here each published version lands in ``run_dir/weights`` (full snapshot + sparse
delta), is served over HTTP(S) to any token of the run, and is announced to the dataflow service,
which tells the rollout nodes. A trainer holding only its trainer token cannot derive the node
tokens it must accept, so its weight server checks them against digests the dataflow service hands
to trainers (``GET /auth/verifiers``); one holding the run secret checks them itself.

Under torchrun/accelerate (``trainer.processes > 1``) every rank runs :func:`run_trainer`: rank 0
is the trainer above; the other ranks only train (their share of each batch, which rank 0 pulls and
broadcasts) and take part in the collective calls, with no weight server, no evaluations and no
acknowledgements of their own.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.protocol import EvaluationRequest
from astraflow.protocol.auth import TokenVerifier, token_role
from astraflow.protocol.prometheus import Stopwatch
from astraflow.protocol.tls import ServerTLS
from astraflow.recipe import Recipe

log = logging.getLogger("astraflow.trainer")


@dataclass
class TrainerOptions:
    recipe: Recipe
    #: the policies this trainer trains: one trainable policy, or several LoRA adapter policies
    #: of one base (``Recipe.trainer_processes``)
    policies: list[str]
    #: dataflow service URL
    join: str
    #: trainer token (or the run secret)
    token: str
    #: checkpoints under ``run_dir/checkpoints``, weights under ``run_dir/weights``
    run_dir: Path
    #: continue from the newest checkpoint
    resume: bool = False
    #: where the weight server listens (nodes fetch from the URL it announces); port 0: free
    weights_host: str = "127.0.0.1"
    weights_port: int = 0
    #: serve weights over HTTPS
    tls: ServerTLS | None = None
    #: CA file to verify an https:// dataflow service against
    ca_file: str | None = None


def run_trainer(opts: TrainerOptions) -> dict[str, int]:
    """Train ``opts.policies`` until the run is done; returns each one's final weight version."""
    from astraflow.protocol.client import SyncDataflowClient
    from astraflow.trainer.loop import train_policies
    from astraflow.weights import WeightStore
    from astraflow.weights.server import create_weight_app, serve_in_thread

    recipe, policies, dataflow_url, token = opts.recipe, opts.policies, opts.join, opts.token
    resume, ca_file = opts.resume, opts.ca_file
    run_dir = Path(opts.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rank = distributed_rank()
    if rank is not None:
        _die_with_launcher()
    if rank:  # not rank 0: train on this rank's shard, publish and report nothing
        log.info("%s: trainer rank %d (rank 0 talks to the dataflow)", policies, rank)
        nothing = dict.fromkeys(policies, _rank_publishes_nothing)
        return train_policies(recipe, policies, dataflow_url, token, run_dir,
                              publish=nothing, resume=resume, ca_file=ca_file)  # fmt: skip
    # The weight server needs the store to exist before it knows its own URL, and the store stamps
    # that URL into every WeightVersion it announces: bind first, then create the announcing store.
    root = run_dir / "weights"
    metrics = {policies[0]: TrainerMetrics(policies[0])}
    for policy in policies[1:]:
        metrics[policy] = TrainerMetrics(policy, like=metrics[policies[0]])
    evals = SyncDataflowClient(dataflow_url, token, ca_file=ca_file)
    try:
        verifier = _weight_verifier(evals, token)
        url, stop = serve_in_thread(
            create_weight_app(WeightStore(root), verifier, metrics[policies[0]].service),
            opts.weights_host,
            opts.weights_port,
            tls=opts.tls,
        )
    except BaseException:
        evals.close()
        raise
    store = WeightStore(root, location=url)
    log.info("weight server for %s at %s (store %s)", ", ".join(policies), url, root)
    every = recipe.evaluation.every_steps

    def publisher(policy: str):
        keep = max(recipe.policies[policy].trainer.keep_versions, 5)  # delta chains of up to 4

        def publish(version: int, state: dict[str, Any]):
            # versions after this one belong to a run interrupted before checkpointing them
            store.discard_from(policy, version + 1)
            with Stopwatch(metrics[policy].publish):
                # a private host copy (BackgroundPublisher's snapshot): no second copy
                written = store.publish(policy, version, state, copy=False)
            store.gc(policy, keep)
            log.info("published %s v%d", policy, version)
            return written

        return publish

    def stepper(policy: str):
        def on_step(report) -> None:
            metrics[policy].stepped(report.version)
            log.info("%s step v%d: %s", policy, report.version,
                     {k: round(v, 4) for k, v in report.metrics.items() if "/" not in k})  # fmt: skip
            last = report.version >= recipe.run.max_steps
            if every and (report.version % every == 0 or last):
                _request_eval(evals, policy, report.version)

        return on_step

    if every and recipe.evaluation.at_start and not resume:
        for policy in policies:
            _request_eval(evals, policy, 0)
    try:
        versions = train_policies(
            recipe, policies, dataflow_url, token, run_dir,
            publish={p: publisher(p) for p in policies},
            on_step={p: stepper(p) for p in policies},
            resume=resume, ca_file=ca_file,
        )  # fmt: skip
        # Nodes fetch these policies' weights from this process, for their final evaluations and
        # for the other policies' remaining training (a node joining late needs them too): keep
        # the weight server up until the whole run is done.
        _wait_for_run_end(evals, ", ".join(policies))
        return versions
    finally:
        evals.close()
        stop()


class TrainerMetrics:
    """The trainer's figures on its weight server's ``/metrics``: step time (between two
    finished steps, the first from start-up), weight publication time, newest version.

    ``like``: the metrics of another policy trained in the same process; the two share its
    registry (one weight server) and differ by their ``policy`` label."""

    def __init__(self, policy: str, like: TrainerMetrics | None = None):
        from astraflow.protocol.prometheus import ServiceMetrics

        if like is not None:
            self.service, self._families = like.service, like._families
        else:
            self.service = ServiceMetrics()
            buckets = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
            self._families = (
                self.service.histogram(
                    "astraflow_trainer_step_seconds", "Seconds per optimizer step", ("policy",),
                    buckets,
                ),
                self.service.histogram(
                    "astraflow_weight_publish_seconds",
                    "Seconds to write a version to the weight store",
                    ("policy",),
                    buckets,
                ),
                self.service.gauge(
                    "astraflow_trainer_version", "Newest version this trainer produced",
                    ("policy",),
                ),
            )  # fmt: skip
        step, publish, version = self._families
        self.step = step.labels(policy)
        self.publish = publish.labels(policy)
        self.version = version.labels(policy)
        self._last = time.monotonic()

    def stepped(self, version: int) -> None:
        now = time.monotonic()
        self.step.observe(now - self._last)
        self._last = now
        self.version.set(version)


def distributed_rank() -> int | None:
    """This process's global rank under torchrun/accelerate launch, or ``None`` when it was
    started alone. Read from the launcher's environment, before any process group exists."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"])


def _rank_publishes_nothing(version: int, state: dict[str, Any]) -> None:
    """A non-zero rank joins the collective state gathering of each publication; rank 0 writes."""
    return None


def _die_with_launcher() -> None:
    """torchrun starts each rank in its own session, so a trainer killed by the launcher (or a
    crash) would orphan its ranks: have the kernel stop this rank when torchrun dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # torchrun died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


def _weight_verifier(client, token: str) -> TokenVerifier:
    """Who may read this trainer's weights: every token of the run. With the run secret that is
    checked locally; with a role token, against the digests the dataflow service serves."""
    if token_role(token) is None:
        return TokenVerifier.from_secret(token)
    return TokenVerifier.from_digests(client.auth_verifiers())


def _wait_for_run_end(client, policy: str, wait_s: float = 30.0) -> None:
    """Serve weights until the run is done: a long poll (``/status?wait_done_s``) that the service
    answers the moment the run ends, so this trainer's exit (which the launcher waits for to
    declare the run over) adds no polling delay."""
    log.info("%s finished training; serving the weights until the run is done", policy)
    while True:
        try:
            if client.status(wait_done_s=wait_s).done:
                return
        except Exception as exc:  # the service is gone: nobody needs the weights any more
            log.info("stopping the weight server: %s", exc)
            return


def evaluation_key(token: str, policy: str, version: int) -> str:
    """The idempotency key of the evaluation of ``policy`` at ``version``: the same for a
    restarted trainer (no second evaluation of one version), not guessable without the token."""
    mac = hmac.new(token.encode(), f"evaluation/{policy}/{version}".encode(), hashlib.sha256)
    return "eval-" + mac.hexdigest()[:32]


def _request_eval(client, policy: str, version: int) -> None:
    try:
        client.request_evaluation(
            EvaluationRequest(
                idempotency_key=evaluation_key(client.token, policy, version),
                policy=policy,
                version=version,
                step=version,
            )  # fmt: skip
        )
    except Exception as exc:  # evaluation is best effort; training goes on
        log.warning("could not request evaluation of %s v%d: %s", policy, version, exc)
