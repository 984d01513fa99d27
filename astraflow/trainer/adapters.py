"""One trainer process for several LoRA adapter policies of one base.

Each adapter keeps everything a trainer owns (its own ``AstraGRPOTrainer``: optimizer, scheduler,
version stream, checkpoints under ``checkpoints/<policy>``, dataflow client), and all of them train
on one copy of the base: :class:`SharedBase` loads the base once and gives each adapter a model
object of its own whose frozen tensors *are* the base's (a deep copy that shares every parameter
and buffer), so peft can wrap each copy separately without a second copy of the weights. The
adapters then train side by side in threads (:func:`run_side_by_side`): a torch op releases the
GIL, so one adapter's step runs while another waits for its batch or steps too.

Why copies sharing tensors instead of one peft model with several adapters: TRL's trainer owns
its model (it wraps it, switches train/eval mode, saves it), and peft's active adapter is state of
the model; one model per adapter keeps each trainer's view exactly what it is for a single policy.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("astraflow.trainer")


class SharedBase:
    """The frozen base model of a trainer's adapter policies, in memory once."""

    def __init__(self, model: torch.nn.Module):
        from astraflow.weights.digest import state_digest

        for param in model.parameters():
            param.requires_grad_(False)
        self.model = model
        #: digest of the base as loaded (:meth:`check_unchanged` compares against it)
        self.digest = state_digest(self.tensors())

    @classmethod
    def load(cls, model_path: str, dtype: torch.dtype) -> SharedBase:
        from transformers import AutoModelForCausalLM

        from astraflow.models import resolve_model

        return cls(AutoModelForCausalLM.from_pretrained(resolve_model(model_path), dtype=dtype))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The base's parameters and buffers by name (the tensors every copy shares)."""
        named = dict(self.model.named_parameters())
        named.update(self.model.named_buffers())
        return named

    def check_unchanged(self, name: str) -> bool:
        """Whether the base is still the bytes it was loaded as (logged either way): every
        adapter trained on it assumed so, and a node serves the base as loaded."""
        from astraflow.weights.digest import state_digest

        now = state_digest(self.tensors())
        if now == self.digest:
            log.info("base %s unchanged after training (%s)", name, now)
            return True
        log.error("base %s changed during training: %s, loaded as %s", name, now, self.digest)
        return False

    def copy(self) -> torch.nn.Module:
        """A model of its own (modules, config) over the base's tensors (shared, not copied)."""
        memo: dict[int, Any] = {id(t): t for t in self.model.parameters()}
        memo.update({id(t): t for t in self.model.buffers()})
        return copy.deepcopy(self.model, memo)


def run_side_by_side(jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run each job in a thread of its own; return their results by name.

    The first job to fail fails the call at once (the others are left running in daemon threads:
    the process is expected to exit, and its supervisor restarts every adapter from its
    checkpoint)."""
    if len(jobs) == 1:
        ((name, job),) = jobs.items()
        return {name: job()}
    done: queue.Queue[tuple[str, Any, BaseException | None]] = queue.Queue()
    # torch's intra-op thread count is per OS thread (OpenMP's): a new thread would use every
    # core, and its reductions would split (and round) differently from this thread's
    threads = torch.get_num_threads()

    def work(name: str, job: Callable[[], Any]) -> None:
        torch.set_num_threads(threads)
        try:
            done.put((name, job(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.put((name, None, exc))

    for name, job in jobs.items():
        threading.Thread(target=work, args=(name, job), name=f"train-{name}", daemon=True).start()
    results: dict[str, Any] = {}
    while len(results) < len(jobs):
        name, result, error = done.get()
        if error is not None:
            raise RuntimeError(
                f"training {name} failed: {type(error).__name__}: {error}"
            ) from error
        results[name] = result
    return results
