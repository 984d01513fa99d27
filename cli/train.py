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
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the launch plan (every process, its command, devices and memory per device) "
        "and exit without starting anything; non-zero when a device is over-subscribed",
    ),
    device_memory_gib: float = typer.Option(
        None,
        "--device-memory-gib",
        min=0.001,
        help="Memory of one GPU for the plan's fit check (default: run.device_memory_gib, else "
        "the smallest visible GPU's, else 80)",
    ),
) -> None:
    """Start the dataflow service, rollout nodes and trainers of a recipe and train to max_steps.

    Before anything starts, the launch plan (astraflow.launch.plan) places every process on its
    devices and estimates its memory; a plan that over-subscribes a device is refused."""
    from dataclasses import replace

    from rich.live import Live

    from astraflow.launch.exits import exit_summary
    from astraflow.launch.live import MetricsTail, render_status, status_line
    from astraflow.launch.local import LaunchError, LocalLauncher, install_sigint, prepare_run
    from astraflow.launch.outcome import describe as describe_outcome
    from astraflow.launch.text import safe_text
    from astraflow.recipe import RecipeError
    from astraflow.recipe.preflight import preflight_or_raise

    try:
        rec, run_dir = prepare_run(recipe, set_, resume)
        # every check `recipe check` runs (env, workflow, tools, task sets and their rows,
        # models, engine arguments, data paths), in seconds, before anything starts. A Ray
        # run's models may live on its worker hosts only: not looked up here. --dry-run plans a
        # machine the run is meant for, not this one: it checks what does not depend on the
        # machine (the plan itself reads the models' configs and names any that is absent).
        here = not dry_run
        preflight_or_raise(rec, recipe, models=here and rec.run.launcher != "ray", tasks=here)
    except (RecipeError, LaunchError) as exc:
        fail(str(exc))
    plan = _plan_or_exit(rec, run_dir, device_memory_gib, show=dry_run)
    if dry_run:
        return
    if rec.run.launcher == "ray":
        from astraflow.launch.ray_launcher import RayLauncher

        try:
            launcher: LocalLauncher = RayLauncher(rec, run_dir, resume=resume, plan=plan)
        except LaunchError as exc:
            fail(str(exc), 2)
    else:
        launcher = LocalLauncher(rec, run_dir, resume=resume, plan=plan)
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
            from astraflow.launch.dashboard import printable_address

            shown = printable_address(dash_url, run_dir)  # never the token: logs are shared
            console.print(f"dashboard at {shown}", highlight=False, soft_wrap=True)
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


#: `train`'s exit code for a launch plan that cannot run (over-subscribed or missing devices,
#: a model whose size is unknown)
EXIT_PLAN = 2


def _plan_or_exit(rec, run_dir: Path, device_memory_gib: float | None, *, show: bool):
    """The run's launch plan, checked; with ``show`` (``--dry-run``) printed first as a table
    and a line per device. A plan that cannot run ends the command (:data:`EXIT_PLAN`)."""
    from astraflow.launch.plan import PlanError, build_plan

    try:
        plan = build_plan(rec, run_dir, device_memory_gib=device_memory_gib)
    except PlanError as exc:
        fail(str(exc), EXIT_PLAN)
    if show:
        print_plan(plan)
    try:
        plan.check()
    except PlanError as exc:
        fail(str(exc), EXIT_PLAN)
    if show:
        console.print("plan fits; nothing was started (--dry-run)", highlight=False)
    return plan


def print_plan(plan) -> None:
    """The plan as a table (process, command, devices, memory per device), then each device's
    total against its size."""
    from rich.table import Table

    from astraflow.launch.text import safe_text

    m = plan.machine
    if m.devices is None:
        seen = "unknown here (planned on the devices the recipe names)"
    else:
        seen = f"{len(m.devices)} ({','.join(m.devices)})" if m.devices else "none"
    console.print(
        f"launch plan of [cyan]{safe_text(plan.recipe_name)}[/] (launcher {plan.launcher}); "
        f"GPUs seen: {safe_text(seen)}; device memory {m.memory_gib:g} GiB ({m.memory_source})",
        highlight=False,
    )
    table = Table(show_lines=False)
    for column in ("process", "command", "CUDA_VISIBLE_DEVICES", "memory per device"):
        table.add_column(column, overflow="fold")
    for row in plan.rows():
        table.add_row(*(safe_text(cell, None) for cell in row))
    console.print(table)
    for line in plan.device_lines():
        console.print(safe_text(line, None), highlight=False)
