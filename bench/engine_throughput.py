"""Throughput of the transformers engine versus a plain batched ``model.generate``.

For each concurrency c, c episodes call ``engine.generate`` at once (each its own request, as the
rollout node does) and we time until all finish; the baseline is one ``model.generate`` call over the
same c prompts, left-padded, with a KV cache. Both generate exactly ``max_tokens`` tokens per sequence
(eos ignored), sample at temperature 1 and run in one torch thread, so tokens/s compare like for like.
``overhead_vs_generate`` = engine time / generate time - 1 (target: under 0.20), on wall-clock time
(best of the repeats); ``cpu_overhead_vs_generate`` is the same on process CPU time, which other
load on a shared machine disturbs less.

    python bench/engine_throughput.py --quick --json /tmp/engine_throughput.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import _stamp
import torch
from rich.console import Console
from rich.table import Table

from astraflow.rollout.engines import SamplingParams
from astraflow.rollout.engines.transformers_engine import TransformersEngine


def resolve_bench_model(tmp: Path) -> tuple[Path, str]:
    try:
        from astraflow.models import resolve_model

        return Path(resolve_model("builtin:tiny-arith")), "builtin:tiny-arith"
    except Exception:  # noqa: BLE001 - fall back to a random model of the same family
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rollout"))
        from tiny_random_model import build_random_tiny_model

        return build_random_tiny_model(tmp / "tiny", hidden_size=128, num_layers=4), "random tiny"


def make_prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        text = f"{(i * 37) % 100}+{(i * 11) % 100}="
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


async def time_engine(
    engine: TransformersEngine, prompts, params: SamplingParams
) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) to serve every prompt as its own concurrent request."""
    start, cpu = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(len(o[0].token_ids) == params.max_tokens for o in outs)
    return elapsed, cpu


def time_generate(model, tokenizer, prompts, max_tokens: int) -> tuple[float, float]:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            pad_token_id=pad,
        )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] == width + max_tokens
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< ~2 min)")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    max_tokens = args.max_tokens or (32 if args.quick else 128)
    repeats = args.repeats or (2 if args.quick else 3)
    torch.set_num_threads(1)
    console = Console()

    with tempfile.TemporaryDirectory() as tmp:
        model_path, model_name = resolve_bench_model(Path(tmp))
        engine = TransformersEngine(str(model_path), device="cpu", num_threads=1, seed=0)
        model, tokenizer = engine.model, engine.tokenizer
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
        rows = []
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(time_engine(engine, make_prompts(tokenizer, 2), params))
            time_generate(model, tokenizer, make_prompts(tokenizer, 2), 4)  # warm-up
            for conc in args.concurrency:
                prompts = make_prompts(tokenizer, conc)
                # Interleave the two so background load affects both alike; keep the best run.
                eng_t, gen_t = [], []
                for _ in range(repeats):
                    eng_t.append(loop.run_until_complete(time_engine(engine, prompts, params)))
                    gen_t.append(time_generate(model, tokenizer, prompts, max_tokens))
                tokens = conc * max_tokens
                best_e, best_g = min(t[0] for t in eng_t), min(t[0] for t in gen_t)
                cpu_e, cpu_g = min(t[1] for t in eng_t), min(t[1] for t in gen_t)
                rows.append(
                    {
                        "concurrency": conc,
                        "tokens": tokens,
                        "engine_s": best_e,
                        "generate_s": best_g,
                        "engine_cpu_s": cpu_e,
                        "generate_cpu_s": cpu_g,
                        "engine_tok_s": tokens / best_e,
                        "generate_tok_s": tokens / best_g,
                        "overhead_vs_generate": best_e / best_g - 1.0,
                        "cpu_overhead_vs_generate": cpu_e / cpu_g - 1.0,
                    }
                )
                console.log(f"concurrency {conc}: engine {best_e:.2f}s, generate {best_g:.2f}s")
            loop.run_until_complete(engine.close())
        finally:
            loop.close()

    table = Table(title=f"transformers engine vs model.generate ({model_name}, CPU, 1 thread)")
    columns = ["concurrency", "tokens", "engine tok/s", "generate tok/s", "overhead (wall)"]
    for col in [*columns, "overhead (CPU time)"]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["concurrency"]),
            str(r["tokens"]),
            f"{r['engine_tok_s']:.0f}",
            f"{r['generate_tok_s']:.0f}",
            f"{100 * r['overhead_vs_generate']:+.1f}%",
            f"{100 * r['cpu_overhead_vs_generate']:+.1f}%",
        )
    console.print(table)
    if args.json:
        result = {
            "benchmark": "engine_throughput",
            "model": model_name,
            "max_tokens": max_tokens,
            "repeats": repeats,
            "results": rows,
            "overhead_vs_generate": {
                str(r["concurrency"]): r["overhead_vs_generate"] for r in rows
            },
        }
        _stamp.write_json(args.json, result)
        console.log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
