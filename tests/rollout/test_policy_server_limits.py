"""Issue 48 #6: the OpenAI-compatible server (``astraflow serve policy``) facing hostile clients,
over real HTTP on loopback against the built-in tiny model.

Why: a 16 MiB prompt peaked at 3.6 GB, an 8 MiB prompt kept ``/healthz`` waiting 14.6 s while it
was tokenized on the event loop, one client's ``seed: 2**100`` failed three other clients'
in-flight generations (the engine batches them), and one ``n=256`` request made a normal request
wait 93.5 s. Each request is now bounded and fails alone, with a 4xx naming what was wrong.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import httpx
import pytest

from astraflow.models import resolve_model
from astraflow.protocol.http_server import HTTPServer
from astraflow.rollout.engines.openai_server import ServerLimits, create_app
from astraflow.rollout.engines.transformers_engine import TransformersEngine

KEY = "limits-key"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine():
    engine = TransformersEngine(resolve_model("builtin:tiny-arith"), device="cpu")
    yield engine
    asyncio.run(engine.close())


class Gated:
    """The real engine, except that generation waits for ``release`` (a slow generation held
    open for as long as a test needs it)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.version = engine.version
        self.max_context = engine.max_context
        self.release = threading.Event()
        self.started = threading.Event()

    async def generate(self, prompt_ids, params):
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        return await self.engine.generate(prompt_ids, params)


def serve(engine, **limits):
    app = create_app(engine, "tiny", KEY, limits=ServerLimits(**limits))
    return HTTPServer(app, lifespan="off")


def completion(url: str, timeout: float = 60.0, **body) -> httpx.Response:
    body = {"model": "tiny", "prompt": "12+30=", "max_tokens": 4, **body}
    return httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=timeout)


def test_a_body_over_the_limit_is_413_before_it_is_read(engine):
    with serve(engine, max_body_bytes=4096) as srv:
        big = completion(srv.url, prompt="1" * 8192)
        assert big.status_code == 413
        assert "exceeds the limit of 4096 bytes" in big.json()["error"]["message"]

        def chunks():  # no Content-Length: a chunked body
            for _ in range(10):
                yield b" " * 1024

        chunked = httpx.post(
            f"{srv.url}/v1/completions",
            content=chunks(),
            headers={**AUTH, "content-type": "application/json"},
            timeout=30,
        )
        assert chunked.status_code == 413 and "4096 bytes" in chunked.text
        assert completion(srv.url).status_code == 200


def test_a_prompt_over_the_token_limit_is_413_naming_it(engine):
    with serve(engine, max_prompt_tokens=64) as srv:
        for prompt in ("1+" * 100, list(range(3, 103))):
            reply = completion(srv.url, prompt=prompt)
            assert reply.status_code == 413
            assert "accepts at most 64" in reply.json()["error"]["message"]
        chat = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "1+" * 100}]},
            headers=AUTH,
            timeout=30,
        )
        assert chat.status_code == 413
        assert completion(srv.url).status_code == 200


def test_tokenizing_does_not_hold_the_event_loop(engine, monkeypatch):
    tokenizer = engine.tokenizer
    real = tokenizer.encode

    def slow_encode(*args, **kwargs):
        time.sleep(2.0)  # what a multi-MiB prompt costs a real tokenizer
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    with serve(engine) as srv, concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(completion, srv.url)
        time.sleep(0.3)  # the slow request is being tokenized now
        start = time.monotonic()
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200
        assert time.monotonic() - start < 1.0
        assert slow.result().status_code == 200


@pytest.mark.parametrize(
    "field,value,says",
    [
        ("seed", 2**100, "seed"),
        ("seed", -1, "seed"),
        ("temperature", 1e9, "temperature"),
        ("top_p", 0, "top_p"),
        ("max_tokens", 2**40, "max_tokens"),
        ("stop", ["x"] * 100, "stop"),
        ("prompt", [10**9], "outside the vocabulary"),
        ("stop_token_ids", [10**9], "outside the vocabulary"),
        ("n", 17, "1..16"),
    ],
)
def test_a_bad_sampling_value_fails_alone_naming_the_field(engine, field, value, says):
    gated = Gated(engine)
    with serve(gated) as srv, concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = [pool.submit(completion, srv.url, seed=i, temperature=1.0) for i in range(3)]
        assert gated.started.wait(30)
        bad = completion(srv.url, **{field: value})
        gated.release.set()
        assert bad.status_code in (400, 422), bad.text
        assert says in bad.json()["error"]["message"]
        assert [f.result().status_code for f in others] == [200, 200, 200]


def test_one_client_gets_its_share_not_the_whole_engine(engine):
    gated = Gated(engine)
    with serve(gated, max_n=4, max_inflight_per_client=4) as srv:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            hog = pool.submit(completion, srv.url, n=4)
            assert gated.started.wait(30)
            more = completion(srv.url)
            assert more.status_code == 429 and more.headers.get("retry-after") == "1"
            assert "limit is 4 per client" in more.json()["error"]["message"]
            gated.release.set()
            assert hog.result().status_code == 200
        assert completion(srv.url).status_code == 200  # its share is back
        too_many = completion(srv.url, n=5)
        assert too_many.status_code == 400 and "n is 5" in too_many.json()["error"]["message"]
