"""The command line that starts one policy's trainer: one process, torchrun or accelerate.

Every launcher (local subprocesses, Ray) starts trainers through :func:`trainer_argv`, so a
recipe's ``trainer.processes`` and ``trainer.accelerate_config`` mean the same thing everywhere:

* ``processes = 1`` and no accelerate config: ``python -m astraflow.cli.main serve trainer ...``;
* ``processes = N > 1``: ``python -m astraflow.launch.torchrun --standalone --nproc_per_node N -m
  astraflow.cli.main serve trainer ...`` (torchrun, stopping cleanly on SIGTERM; it picks a free
  rendezvous port, so runs never collide);
* an accelerate config (DDP, FSDP, DeepSpeed): ``python -m accelerate.commands.launch
  --config_file F --num_processes N -m astraflow.cli.main serve trainer ...``.

Every rank runs the same ``serve trainer`` command; inside it rank 0 alone pulls batches,
acknowledges them and serves/publishes weights (:mod:`astraflow.trainer.main`).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from astraflow.recipe import Recipe


def trainer_argv(
    recipe: Recipe,
    recipe_path: Path,
    policy: str,
    dataflow_url: str,
    run_dir: Path,
    *,
    resume: bool = False,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The argv that trains ``policy`` of ``recipe`` (saved at ``recipe_path``) against the
    dataflow service at ``dataflow_url``, writing checkpoints and weights under ``run_dir``; with
    the LoRA adapter policies trained in the same process (``Recipe.trainer_process_of``).

    ``extra_args`` are appended to ``serve trainer`` (e.g. ``--weights-host``). Raises
    ``ValueError`` naming the key when :func:`check_trainer_launch` finds a problem.
    """
    group = recipe.trainer_process_of(policy)
    for name in group:
        check_trainer_launch(recipe, name)
    spec = recipe.policies[policy].trainer
    serve = ["-m", "astraflow.cli.main", "serve", "trainer", "--recipe", str(recipe_path)]
    for name in group:
        serve += ["--policy", name]
    serve += ["--join", dataflow_url, "--run-dir", str(run_dir)]
    if resume:
        serve.append("--resume")
    serve += list(extra_args)
    if spec.accelerate_config is not None:
        config = Path(spec.accelerate_config).expanduser().resolve()
        launch = [python, "-m", "accelerate.commands.launch", "--config_file", str(config),
                  "--num_processes", str(spec.processes)]  # fmt: skip
        return [*launch, *serve]
    if spec.processes > 1:
        launch = [python, "-m", "astraflow.launch.torchrun", "--standalone",
                  "--nproc_per_node", str(spec.processes)]  # fmt: skip
        return [*launch, *serve]
    return [python, *serve]


def check_trainer_launch(recipe: Recipe, policy: str) -> None:
    """What would make ``policy``'s trainer fail at start, found before anything starts: a missing
    accelerate config file, LoRA without peft installed. ``ValueError`` names the recipe key."""
    spec = recipe.policies[policy].trainer
    if spec.accelerate_config is not None:
        config = Path(spec.accelerate_config).expanduser().resolve()
        if not config.is_file():
            raise ValueError(
                f"policies.{policy}.trainer.accelerate_config: {config} is not a file; expected "
                "an accelerate config (e.g. written by `accelerate config`)"
            )
    lora = "trainer.lora" if spec.lora is not None else None
    if recipe.policies[policy].base is not None:
        lora = "base"
    if lora is not None and importlib.util.find_spec("peft") is None:
        raise ValueError(
            f"policies.{policy}.{lora} needs peft, which is not installed; install the "
            "extra with `pip install 'astraflow[lora]'` (or `pip install peft`)"
        )


def trainer_service_name(recipe: Recipe, policy: str) -> str:
    """The launcher's name for the trainer process of ``policy``: ``trainer-POLICY``, or
    ``trainer-A+B`` for the one process of adapters A and B of a base."""
    return "trainer-" + "+".join(recipe.trainer_process_of(policy))


def trainer_service_policy(name: str) -> str:
    """The first policy a trainer service trains (what :func:`trainer_argv` takes), by name."""
    return name.removeprefix("trainer-").split("+", 1)[0]
