"""`astraflow serve policy` as a user runs it: a real server process on loopback, driven with the
official ``openai`` SDK (models, chat with and without streaming, completions, errors)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

openai = pytest.importorskip("openai", reason="the openai SDK is in the test extra")

from astraflow.models import resolve_model  # noqa: E402

#: a real `serve policy` process per module (a few seconds to start): the full suite runs it
pytestmark = pytest.mark.slow

KEY = "serve-policy-test-key"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as a trainer leaves it: the newest checkpoint carries its weight version."""
    root = tmp_path_factory.mktemp("run")
    builtin = resolve_model("builtin:tiny-arith")
    for step in (2, 11):
        ckpt = root / "checkpoints" / "policy" / f"checkpoint-{step}"
        shutil.copytree(builtin, ckpt)
        (ckpt / "astraflow-step.json").write_text(json.dumps({"version": step}))
    return root


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    port_file = tmp_path_factory.mktemp("srv") / "url"
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.main", "serve", "policy", str(run_dir), "--name", "tiny",
         "--api-key", KEY, "--port", "0", "--port-file", str(port_file), "--device", "cpu"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []  # what it printed, read as it comes (a full pipe would block it)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            reader.join(10)
            pytest.fail(f"serve policy did not start: {''.join(lines)}")
        time.sleep(0.1)
    try:
        yield Served(port_file.read_text().strip(), lines)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Served:
    url: str
    lines: list[str]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


def direct_greedy(messages, max_tokens):
    """What the served checkpoint generates for ``messages``, computed here without the server."""
    from astraflow.rollout.engines import SamplingParams
    from astraflow.rollout.engines.transformers_engine import TransformersEngine

    async def main():
        engine = TransformersEngine(resolve_model("builtin:tiny-arith"), device="cpu")
        try:
            ids = engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            (gen,) = await engine.generate(
                ids, SamplingParams(temperature=0.0, max_tokens=max_tokens)
            )
            return engine.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        finally:
            await engine.close()

    return asyncio.run(main())


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_chat_serves_the_run_directory_latest_checkpoint(client):
    messages = [{"role": "user", "content": "12+30"}]
    reply = client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=8, logprobs=True
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == direct_greedy(messages, 8)
    assert reply.system_fingerprint == "astraflow-v11"  # the newest checkpoint's version
    assert reply.usage.completion_tokens == len(choice.logprobs.content) >= 1
    assert all(t.logprob <= 0 for t in choice.logprobs.content)


def test_chat_streams_the_same_completion_as_events(client):
    messages = [{"role": "user", "content": "47-11"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=8
    )
    stream = client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert "".join(deltas) == whole.choices[0].message.content
    assert len([d for d in deltas if d]) >= 2  # token by token, not one blob
    assert finishes[-1] == whole.choices[0].finish_reason and finishes[0] is None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_text_and_tokens_and_stream(client):
    whole = client.completions.create(
        model="tiny", prompt="<|user|>5+29<|end|><|assistant|>", temperature=0, max_tokens=6,
        logprobs=1, extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = whole.choices[0]
    assert len(choice.logprobs.token_logprobs) == len(choice.model_extra["token_ids"]) >= 1
    streamed = client.completions.create(
        model="tiny", prompt="<|user|>5+29<|end|><|assistant|>", temperature=0, max_tokens=6,
        stream=True,
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == choice.text


def test_port_zero_prints_the_bound_port(server, client):
    """`serve policy --port 0` prints the port it bound (not 0, no "free port" fallback), and
    that address is the one that answers (was tests/cli/test_serve_port_zero.py)."""
    deadline = time.monotonic() + 60
    while not any("/v1" in line for line in server.lines) and time.monotonic() < deadline:
        time.sleep(0.1)  # the line is printed as it binds; the reader thread may lag a little
    printed = "".join(server.lines)
    m = re.search(r"on (http://127\.0\.0\.1:(\d+))/v1", printed)
    assert m is not None, printed
    assert int(m.group(2)) > 0 and "free port" not in printed
    assert m.group(1) == server.url
    assert [model.id for model in client.models.list()] == ["tiny"]


def test_errors_reach_the_sdk_as_its_exceptions(server, client):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    with pytest.raises(openai.NotFoundError, match="tiny"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "1"}])
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1"}], temperature=-1
        )
