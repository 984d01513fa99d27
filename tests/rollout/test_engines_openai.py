"""The OpenAI engine against a real OpenAI-compatible server on loopback (our openai_server module,
serving a transformers engine), plus that server's own contract (auth, model name, errors)."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from tiny_random_model import build_random_tiny_model

from astraflow.protocol.http_server import HTTPServer
from astraflow.rollout.engines import SamplingParams, WeightUpdate, make_engine
from astraflow.rollout.engines.completions_api import CompletionsAPIError
from astraflow.rollout.engines.openai_engine import OpenAIEngine
from astraflow.rollout.engines.openai_server import create_app
from astraflow.rollout.engines.transformers_engine import TransformersEngine

KEY = "test-key"
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_random_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def backend(model_dir):
    engine = TransformersEngine(str(model_dir))
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def server(backend):
    with HTTPServer(create_app(backend, "tiny", api_key=KEY), lifespan="off") as srv:
        yield srv


@pytest.fixture(scope="module")
def chat_only_server(backend):
    with HTTPServer(
        create_app(backend, "tiny", api_key=KEY, endpoints=("chat",)), lifespan="off"
    ) as srv:
        yield srv


def prompts_for(tokenizer, count=5):
    return [tokenizer.encode(f"{i * 9 % 70}-{i}=") for i in range(count)]


def test_token_in_token_out_matches_the_backend(server, backend, model_dir):
    async def main():
        client = make_engine(
            "openai", "tiny", base_url=server.url, api_key=KEY, tokenizer=str(model_dir)
        )
        prompts = prompts_for(client.tokenizer)
        remote = await asyncio.gather(*[client.generate(p, GREEDY) for p in prompts])
        local = await asyncio.gather(*[backend.generate(p, GREEDY) for p in prompts])
        sampled = await client.generate(prompts[0], SamplingParams(n=3, temperature=1.0, seed=3))
        mode = client.mode
        await client.close()
        return remote, local, sampled, mode

    remote, local, sampled, mode = asyncio.run(main())
    assert mode == "completions"
    for r, loc in zip(remote, local, strict=True):
        assert r[0].token_ids == loc[0].token_ids
        assert r[0].logprobs == pytest.approx(loc[0].logprobs, abs=1e-4)
        assert r[0].finish_reason == loc[0].finish_reason
    assert len(sampled) == 3 and all(not math.isnan(x) for g in sampled for x in g.logprobs)


def test_chat_fallback_when_only_chat_is_served(chat_only_server, backend, model_dir):
    async def main():
        client = OpenAIEngine(chat_only_server.url, "tiny", api_key=KEY, tokenizer=str(model_dir))
        tok = client.tokenizer
        question = "12+30"
        prompt = tok.encode(question)
        via_fallback = await client.generate(prompt, GREEDY)
        chat = await client.generate_chat([{"role": "user", "content": question}], GREEDY)
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
        )
        if hasattr(rendered, "keys"):
            rendered = rendered["input_ids"]
        direct = await backend.generate(list(rendered), GREEDY)
        mode = client.mode
        await client.close()
        return tok, via_fallback, chat, direct, mode

    tok, via_fallback, chat, direct, mode = asyncio.run(main())
    assert mode == "chat"
    expected_text = tok.decode(direct[0].token_ids, skip_special_tokens=True)
    for gens in (via_fallback, chat):
        assert gens[0].meta["text"] == expected_text
        assert gens[0].token_ids == tok.encode(expected_text, add_special_tokens=False)
    # The chat route returns log-probs; they are kept when they line up with our tokens.
    if chat[0].meta.get("logprobs") != "unavailable":
        assert chat[0].logprobs == pytest.approx(direct[0].logprobs[: len(chat[0].logprobs)])


def test_server_contract(server):
    body = {
        "model": "tiny",
        "prompt": [4, 5, 6],
        "max_tokens": 4,
        "return_token_ids": True,
        "logprobs": 1,
        "temperature": 0,
    }
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/healthz").status_code == 200
        assert http.post("/v1/completions", json=body).status_code == 401
        bad_auth = {"Authorization": "Bearer nope"}
        assert http.post("/v1/completions", json=body, headers=bad_auth).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        ok = http.post("/v1/completions", json=body, headers=auth)
        assert ok.status_code == 200
        choice = ok.json()["choices"][0]
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) <= 4
        assert choice["prompt_token_ids"] == [4, 5, 6]
        wrong_model = http.post("/v1/completions", json={**body, "model": "gpt"}, headers=auth)
        assert wrong_model.status_code == 404 and "tiny" in wrong_model.text
        bad_field = http.post("/v1/completions", json={**body, "top_p": 2}, headers=auth)
        assert bad_field.status_code == 422 and "top_p" in bad_field.text
        bad_ids = http.post("/v1/completions", json={**body, "prompt": [99999]}, headers=auth)
        assert bad_ids.status_code == 400 and "vocabulary" in bad_ids.text
        text = http.post("/v1/completions", json={**body, "prompt": "1+2="}, headers=auth)
        assert text.status_code == 200
        models = http.get("/v1/models", headers=auth).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]


def test_frozen_policy_refuses_weights_and_reports_errors(server, model_dir):
    async def main():
        client = OpenAIEngine(server.url, "tiny", api_key="wrong", tokenizer=str(model_dir))
        with pytest.raises(NotImplementedError, match="frozen"):
            await client.load_weights(WeightUpdate(version=1, full={}))
        with pytest.raises(CompletionsAPIError, match="401"):
            await client.generate([4, 5], GREEDY)
        await client.close()

    asyncio.run(main())
    with pytest.raises(ValueError, match="mode"):
        OpenAIEngine(server.url, "tiny", mode="grpc")
