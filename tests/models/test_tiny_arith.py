"""The committed built-in policy: resolvable, loadable, small, untied, weak but non-zero."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from astraflow.tasks import arith

from astraflow.models import (
    BUILTIN_MODELS,
    UnknownModelError,
    load_model,
    load_tokenizer,
    resolve_model,
    tiny_arith,
)

CKPT = "builtin:tiny-arith"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(CKPT)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_model(CKPT)


def test_resolve_model():
    path = Path(resolve_model(CKPT))
    assert path == BUILTIN_MODELS["tiny-arith"].path and (path / "config.json").is_file()
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model("/some/local/dir") == "/some/local/dir"
    with pytest.raises(UnknownModelError, match="builtin:tiny-arith"):
        resolve_model("builtin:huge")
    with pytest.raises(ValueError, match="non-empty"):
        resolve_model("")


def test_committed_files_are_small():
    path = Path(resolve_model(CKPT))
    names = {p.name for p in path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    } <= names
    assert sum(p.stat().st_size for p in path.iterdir()) < 10 * 1024 * 1024


def test_auto_tokenizer_keeps_the_character_level_tokenizer():
    """Tools that load with AutoTokenizer (vLLM) must get the same ids as load_tokenizer."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(resolve_model(CKPT))
    ours = load_tokenizer(CKPT)
    text = "<|user|>12 + 3 = ?\tcafé<|end|>"
    assert auto.encode(text, add_special_tokens=False) == ours.encode(
        text, add_special_tokens=False
    )


def test_tokenizer_is_character_level_and_round_trips(tokenizer):
    from transformers import PreTrainedTokenizerFast

    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    ids = tokenizer.encode("47-11", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == ["4", "7", "-", "1", "1"]
    for text in ["ls -la /tmp && echo 'hi'\n\tSELECT * FROM t;", "naïve café ✓ 😀", "~`!@#$%^&*()"]:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.unk_token_id not in tokenizer.encode("ünïcödé", add_special_tokens=False)
    assert tokenizer.eos_token == "<|end|>" and tokenizer.pad_token == "<|pad|>"


def test_chat_template_multi_turn(tokenizer):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "47-11"},
        {"role": "assistant", "content": "36"},
        {"role": "user", "content": "2*3"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|system|>be brief<|end|><|user|>47-11<|end|><|assistant|>36<|end|>"
        "<|user|>2*3<|end|><|assistant|>"
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids[:1]) == ["<|system|>"]
    with pytest.raises(Exception, match="unknown chat role"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_model_loads_with_untied_embeddings(model, tokenizer):
    from transformers import AutoModelForCausalLM

    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert model.config.vocab_size == len(tokenizer)
    again = AutoModelForCausalLM.from_pretrained(resolve_model(CKPT))
    assert type(again).__name__ == "LlamaForCausalLM"


def test_greedy_accuracy_is_weak_but_nonzero(model, tokenizer):
    test = arith.generate("test", level=tiny_arith.ARITH_LEVEL)[:200]
    acc = tiny_arith.accuracy(model, tokenizer, test)
    assert 0.05 < acc < 0.60, acc


def test_generate_stops_at_end_token(model, tokenizer):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1] :].tolist()
    assert tokenizer.eos_token_id in new


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.slow
def test_build_command_is_deterministic(tmp_path):
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    runner = CliRunner()
    for name in ("a", "b"):
        args = ["models", "build", "tiny-arith", "--seed", "3", "--steps", "3", "--eval-size", "20"]
        result = runner.invoke(app, [*args, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert "greedy accuracy" in result.output
    c = tiny_arith.build(tmp_path / "c", seed=4, steps=3, eval_size=20)
    assert c.steps == 3 and c.final_loss is not None
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    assert _digests(tmp_path / "a")["model.safetensors"] != _digests(c.out_dir)["model.safetensors"]
    assert _digests(tmp_path / "a")["tokenizer.json"] == _digests(c.out_dir)["tokenizer.json"]


def test_models_cli_list_and_bad_name():
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    runner = CliRunner()
    listed = runner.invoke(app, ["models", "list"])
    assert listed.exit_code == 0 and "builtin:tiny-arith" in listed.output
    bad = runner.invoke(app, ["models", "build", "nope"])
    assert bad.exit_code != 0
    bad_steps = runner.invoke(app, ["models", "build", "tiny-arith", "--steps", "-1"])
    assert bad_steps.exit_code != 0


def test_load_model_dtype():
    model = load_model(CKPT, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(CKPT, dtype="float33")
