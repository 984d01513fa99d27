"""A hostile rollout node: raw HTTP with only a node token, bodies no honest client would send."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgpack
from dataflow_helpers import TOKEN

from astraflow.protocol.auth import NODE, TRAINER, derive_token

NODE_TOKEN = derive_token(TOKEN, NODE)
TRAINER_TOKEN = derive_token(TOKEN, TRAINER)
VOCAB = 4096


class Raw:
    """Sends exactly the bytes given (JSON text or msgpack) with one role's token."""

    def __init__(self, url: str, token: str = NODE_TOKEN) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()

    def json(self, method: str, path: str, body: Any = None, text: str | None = None, **kw):
        content = text if text is not None else json.dumps(body)
        return self.http.request(
            method,
            path,
            content=content.encode("utf-8", "surrogatepass"),
            headers={"content-type": "application/json", **kw.pop("headers", {})},
            **kw,
        )

    def msgpack(self, method: str, path: str, body: Any, **kw):
        return self.http.request(
            method,
            path,
            content=msgpack.packb(body, use_bin_type=True),
            headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
            **kw,
        )


def traj(tokens: list[int], mask: list[int] | None = None, logprobs=None) -> dict:
    n = len(tokens)
    return {
        "role": "agent",
        "tokens": tokens,
        "loss_mask": mask if mask is not None else [0] * (n // 2) + [1] * (n - n // 2),
        "logprobs": logprobs if logprobs is not None else [0.0] * n,
        "versions": [0] * n,
    }


def push_body(node_id: str, lease: dict, trajectory: dict, reward: Any = 1.0, **extra) -> dict:
    episodes = [
        {
            "id": "ep-" + lease["id"],
            "task_id": lease["task"]["id"],
            "trajectories": [trajectory],
            "rewards": {"agent": reward},
        }
    ]
    return {"node_id": node_id, "lease_id": lease["id"], "episodes": episodes, **extra}


def detail(resp: httpx.Response) -> str:
    return str(resp.json().get("detail"))
