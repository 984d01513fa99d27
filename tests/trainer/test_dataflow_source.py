"""The trainer against the real dataflow service over loopback HTTP.

A "rollout node" (this test, with the tiny model and transformers) leases real tasks, pushes real
episodes; the trainer pulls them through :class:`DataflowBatchSource`, takes a real optimizer step
and acknowledges the batch; the service then reports the step.
"""

from __future__ import annotations

import pytest
import torch
from trainer_rollouts import rollout_group

pytest.importorskip("astraflow.dataflow.http.app")


from astraflow.tasks.catalog import load_task_set  # noqa: E402

from astraflow.dataflow.http.app import create_app  # noqa: E402
from astraflow.protocol import Episode, Trajectory, WeightVersion  # noqa: E402
from astraflow.protocol.client import SyncDataflowClient  # noqa: E402
from astraflow.protocol.http_server import HTTPServer  # noqa: E402
from astraflow.recipe import Recipe  # noqa: E402
from astraflow.trainer.grpo import build_trainer  # noqa: E402
from astraflow.trainer.loop import train_policy  # noqa: E402
from astraflow.trainer.source import DataflowBatchSource  # noqa: E402

TOKEN = "trainer-test-token"


class LoopbackService:
    """The real dataflow app under uvicorn in a background thread."""

    def __init__(self, recipe: Recipe, store) -> None:
        self.app = create_app(recipe, store, TOKEN, task_source=load_task_set)
        self.http = HTTPServer(self.app, lifespan="on", name="dataflow-service")
        self.url = self.http.url

    def __enter__(self):
        self.http.start_in_thread()
        return self

    def __exit__(self, *exc):
        self.http.stop_thread(timeout=30)


def _episodes(lease, group) -> list[Episode]:
    return [
        Episode(
            task_id=lease.task.id,
            trajectories=[
                Trajectory(
                    role="agent",
                    tokens=s.tokens,
                    loss_mask=s.loss_mask,
                    logprobs=s.logprobs,
                    versions=s.versions,
                )
            ],
            rewards={"agent": s.reward},
        )
        for s in group.samples
    ]


def test_trainer_pulls_steps_and_acks_through_the_dataflow(tmp_path, tiny_model_path, tiny_policy):
    model, tok = tiny_policy
    recipe = Recipe.model_validate(
        {
            "run": {"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 2},
            "policies": {
                "policy": {"model": "builtin:tiny-arith", "trainer": {"groups_per_step": 2}}
            },
            "tasks": {"group_size": 4},
        }
    )
    torch.manual_seed(0)
    with (
        LoopbackService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN) as client,
    ):
        node = client.register(policies={"policy": 0}, name="test-node").node_id
        leases = client.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases
        assert len(leases) == 2
        for lease in leases:
            payload = lease.task.payload
            group = rollout_group(
                model,
                tok,
                payload["question"],
                str(payload["answer"]),
                policy="policy",
                group_size=lease.task.group_size,
                version=0,
            )
            assert client.push(
                node_id=node, lease_id=lease.id, episodes=_episodes(lease, group)
            ).accepted

        source = DataflowBatchSource.connect(svc.url, TOKEN, trainer_id="t0", wait_s=5.0)
        published = []
        trainer = build_trainer(
            tiny_model_path,
            recipe.policies["policy"].trainer,
            source,
            tmp_path / "run",
            "policy",
            max_steps=1,
            publish=lambda v, sd: published.append(v),
        )
        assert trainer.run(resume=False) == 1
        source.close()
        assert published == [0, 1]
        status = client.status()
        assert status["policies"]["policy"]["steps"] == 1

        # The service entry point: resumes at version 1, announces each published version, and
        # stops when the dataflow says the run reached max_steps.
        leases = client.lease(node_id=node, max_tasks=2, versions={"policy": 1}).leases
        assert len(leases) == 2
        for lease in leases:
            payload = lease.task.payload
            group = rollout_group(
                model,
                tok,
                payload["question"],
                str(payload["answer"]),
                policy="policy",
                group_size=lease.task.group_size,
                version=1,
            )
            assert client.push(
                node_id=node, lease_id=lease.id, episodes=_episodes(lease, group)
            ).accepted

        def publish(version, state_dict):
            return WeightVersion(
                policy="policy",
                version=version,
                location=str(tmp_path / "weights"),
                digest=f"sha256:{version:064x}"[:71],
            )

        final = train_policy(recipe, "policy", svc.url, TOKEN, tmp_path / "run", publish=publish)
        assert final == 2
        status = client.status()
        assert status["policies"]["policy"]["steps"] == 2
        assert status["policies"]["policy"]["latest_version"] == 2
        assert status["training_done"]
