"""`astraflow train RECIPE`: the main job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from astraflow.cli.common import console, fail

#: `train`'s exit codes besides 0 (done), 1 (a service failed), 3 (--timeout)
EXIT_STALLED = 4
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT


def train(
    recipe: Path = typer.Argument(..., help="TOML recipe"),
    set_: list[str] = typer.Option([], "--set", help="Override a key: a.b.c=value"),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a stopped run from its run directory"
    ),
    live: bool = typer.Option(
        True, "--live/--no-live", help="Live view (off: one line per update)"
    ),
    timeout: float = typer.Option(0, help="Stop the run after this many seconds (0: no limit)"),
) -> None:
    """Start the dataflow service, rollout nodes and trainers of a recipe and train to max_steps."""
    from dataclasses import replace

    from rich.live import Live

    from astraflow.launch.exits import exit_summary
    from astraflow.launch.live import MetricsTail, render_status, status_line
    from astraflow.launch.local import LaunchError, LocalLauncher, install_sigint, prepare_run
    from astraflow.launch.outcome import describe as describe_outcome
    from astraflow.launch.text import safe_text
    from astraflow.recipe import RecipeError

    try:
        rec, run_dir = prepare_run(recipe, set_, resume)
    except (RecipeError, LaunchError) as exc:
        fail(str(exc))
    if rec.run.launcher == "ray":
        from astraflow.launch.ray_launcher import RayLauncher

        try:
            launcher: LocalLauncher = RayLauncher(rec, run_dir, resume=resume)
        except LaunchError as exc:
            fail(str(exc), 2)
    else:
        launcher = LocalLauncher(rec, run_dir, resume=resume)
    install_sigint(launcher)
    console.print(
        f"[bold]astraflow[/] run [cyan]{safe_text(rec.run.name)}[/] → {safe_text(run_dir, None)}"
        f"  (mode {safe_text(rec.run.mode)})"
    )
    started = time.time()
    outcome = "interrupted"
    stop_dashboard = None
    try:
        handle = launcher.start()
        console.print(f"dataflow service at {handle.url}; logs in {run_dir / 'logs'}")
        if rec.logging.dashboard:
            from astraflow.launch.dashboard import serve_dashboard

            assert launcher.security
            dash_url, stop_dashboard = serve_dashboard(
                run_dir, handle.url, launcher.token, launcher.security.client_ca_file,
                port=rec.logging.dashboard_port,
            )  # fmt: skip
            console.print(f"dashboard at {dash_url}", highlight=False, soft_wrap=True)
        if rec.run.launcher == "ray":
            console.print(f"on the Ray cluster at {launcher.cluster_address}")
        tail = MetricsTail(run_dir / "metrics.jsonl")

        def scaling() -> str | None:
            return launcher.scaler.line() if launcher.scaler is not None else None

        use_live = live and rec.logging.live and console.is_terminal
        if use_live:
            first = render_status(None, handle.services, str(run_dir), started, tail)
            with Live(first, console=console, refresh_per_second=2) as view:
                outcome = launcher.wait(
                    lambda st, svcs: view.update(
                        render_status(st, svcs, str(run_dir), started, tail, scaling())
                    ),
                    timeout_s=timeout or None,
                )
        else:
            last = [0.0]
            newest = [None]

            def line(st, svcs):
                newest[0] = st or newest[0]
                if st and time.time() - last[0] >= 10:
                    last[0] = time.time()
                    console.print(
                        status_line(st, time.time() - started, tail, scaling()), highlight=False
                    )

            outcome = launcher.wait(line, timeout_s=timeout or None)
            if outcome != "done" and newest[0] is not None:  # how it stood when it ended
                console.print(status_line(newest[0], time.time() - started, tail), highlight=False)
    except LaunchError as exc:
        launcher.stop()
        fail(str(exc))
    except KeyboardInterrupt:
        console.print("[yellow]stopping (Ctrl-C): nodes release their leases, then trainers, "
                      "then the dataflow service…[/]")  # fmt: skip
    finally:
        codes = launcher.stop(interrupted=outcome == "interrupted")
        if stop_dashboard is not None:
            stop_dashboard()
    services = launcher.handle.services if launcher.handle else []
    killed = {s.name for s in services if getattr(s, "killed", False)}  # (Ray: never)
    # the raw exit status of every service, for scripts (the console gets a plain sentence)
    (run_dir / "exit_codes.json").write_text(json.dumps(codes, indent=1, sort_keys=True))
    stall = getattr(launcher, "stall", None)
    ended = describe_outcome(outcome, stall.message if stall is not None else None)
    replace(ended, services=exit_summary(codes, killed), exit_codes=codes).write(run_dir)
    console.print(
        f"run {outcome} in {time.time() - started:.0f}s; {exit_summary(codes, killed)}",
        highlight=False,
    )
    if outcome.startswith("failed"):
        name = outcome.split(":", 1)[1]
        log = run_dir / "logs" / f"{name}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
        fail(f"service {name} failed; last lines of {log}:\n{tail}")
    if outcome == "stalled" and launcher.stall is not None:
        fail(f"run stopped: {launcher.stall.message}", EXIT_STALLED)
    if rec.logging.report and outcome == "done":
        try:
            from astraflow.launch.report import write_report

            out = write_report(run_dir)
            console.print(f"report: {out}")
        except Exception as exc:  # the run itself succeeded; a plotting problem must not hide that
            console.print(f"[yellow]report failed: {safe_text(exc, 2000, multiline=True)}[/]")
    if outcome == "timeout":
        raise typer.Exit(3)
    if outcome == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
