"""Entry point of the ``astraflow`` command.

Sub-commands live in one module each; each module imports torch/transformers/trl only inside the
command functions, so ``astraflow --help`` stays fast.
"""

from __future__ import annotations

import typer
from astraflow.cli import (
    certs,
    dashboard,
    envs,
    export,
    models,
    recipe,
    report,
    sandbox,
    serve,
    status,
    stop,
    tasks,
    token,
    train,
    transcripts,
)
from astraflow.cli import eval as eval_cmd

app = typer.Typer(
    name="astraflow",
    help="AstraFlow: dataflow-oriented RL for agentic LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("train", help="Train policies from a TOML recipe (starts every service).")(train.train)
app.add_typer(eval_cmd.app, name="eval", help="Evaluate a policy on benchmarks (agentbench, ...).")
app.add_typer(envs.app, name="envs", help="List, inspect and check environments.")
app.add_typer(tasks.app, name="tasks", help="List and inspect task sets (built-in and plugins).")
app.add_typer(
    serve.app,
    name="serve",
    help="Run one service: dataflow, rollout, trainer, weight-cache, policy.",
)
app.command("status", help="Live view of a running job's dataflow service.")(status.status)
app.command("stop", help="Stop a running job cleanly (admin token).")(stop.stop)
app.add_typer(recipe.app, name="recipe", help="Validate and inspect recipes.")
app.add_typer(models.app, name="models", help="Build and list built-in models.")
app.add_typer(
    sandbox.app, name="sandbox", help="Code sandboxes: build the Docker image, list backends."
)
app.command("report", help="Plots and summary of a run directory.")(report.report)
app.command("dashboard", help="The run in a browser: figures, nodes, single trajectories.")(
    dashboard.dashboard
)
app.command("transcripts", help="What the policy wrote: a run's sampled episodes, turn by turn.")(
    transcripts.transcripts
)
app.add_typer(certs.app, name="certs", help="Create a CA and server certificate for HTTPS.")
app.command("export", help="A trainer checkpoint as a standalone model (LoRA merged).")(
    export.export
)
app.command("token", help="Print a role-scoped token (node, trainer, admin) of a run.")(token.token)


def main() -> None:
    from astraflow.protocol.http_server import PortUnavailable

    try:
        app()
    except PortUnavailable as exc:  # a user's choice of port, not a bug: one line, no traceback
        from astraflow.cli.common import fail

        try:
            fail(str(exc))
        except typer.Exit as done:  # outside the app's own runner: exit with its status
            raise SystemExit(done.exit_code) from None


if __name__ == "__main__":
    main()
