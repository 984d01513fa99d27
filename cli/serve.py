"""`astraflow serve dataflow|rollout|trainer`."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Run one AstraFlow service.", no_args_is_help=True)


@app.command()
def dataflow(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="TOML recipe of the run"),
    host: str = typer.Option(None, "--host", help="Bind address (default: recipe dataflow.host)"),
    port: int = typer.Option(None, "--port", help="Port; 0 picks a free one (default: recipe)"),
    store: Path = typer.Option(None, "--store", help="SQLite file (default: run_dir/dataflow.db)"),
    token: str = typer.Option(
        None, "--token", envvar="ASTRAFLOW_TOKEN", help="Run token clients must present"
    ),
    port_file: Path = typer.Option(
        None, "--port-file", help="Write http://host:port here once listening"
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override a recipe key: a.b=c"),
    synchronous: str = typer.Option(
        "FULL", "--synchronous", help="SQLite synchronous mode: FULL (fsync each commit) or NORMAL"
    ),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Dataflow service: tasks, leases, buffers, dataflow policies."""
    from cli.common import console, fail, load_recipe_or_exit

    if not token:
        fail("no run token: pass --token or set ASTRAFLOW_TOKEN")
    if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
        fail(f"--synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
    spec = load_recipe_or_exit(recipe, overrides)
    from astraflow.dataflow.app import create_app
    from astraflow.dataflow.policies import PolicyConfigError
    from astraflow.dataflow.server import run

    host = host or spec.dataflow.host
    port = spec.dataflow.port if port is None else port
    try:
        app_ = create_app(spec, store, token, synchronous=synchronous.upper())
    except (PolicyConfigError, ValueError, KeyError) as exc:
        fail(f"{recipe}: {exc}")
    console.print(
        f"[bold]dataflow[/] run {spec.run.name!r} store "
        f"{app_.state.service.store.path} on {host}:{port or '(free port)'}",
        highlight=False,
    )
    run(app_, host, port, port_file, log_level)


@app.command()
def rollout(
    join: str = typer.Option(..., "--join", help="Dataflow service URL, e.g. http://10.0.0.5:8700"),
    token: str = typer.Option(None, "--token", envvar="ASTRAFLOW_TOKEN", help="Run token"),
    recipe: Path = typer.Option(
        None, "--recipe", "-r", help="Recipe file (default: fetched from the dataflow service)"
    ),
    policies: list[str] = typer.Option([], "--policies", help="Serve only these policies"),
    engine: str = typer.Option(None, "--engine", help="Override the engine kind of every policy"),
    concurrency: int = typer.Option(None, "--concurrency", min=1, help="Episodes in flight"),
    device: str = typer.Option(None, "--device", help="auto | cpu | cuda | cuda:N"),
    name: str = typer.Option("", "--name", help="Node name shown in status"),
    region: str = typer.Option(None, "--region", help="Region label shown in status"),
    weight_cache: str = typer.Option(
        None,
        "--weight-cache",
        help="Fetch weights from this URL (a region's `astraflow serve weight-cache`, or any weight "
        "server reachable from here) instead of the location each trainer announces",
    ),
    threads: int = typer.Option(1, "--threads", min=1, help="torch threads for this process"),
    drain_timeout: float = typer.Option(
        60.0,
        "--drain-timeout",
        min=0.0,
        help="On SIGTERM: seconds to finish in-flight groups before releasing their leases",
    ),
    env_workers: int = typer.Option(
        None, "--env-workers", min=1, help="Threads for sync env calls (recipe rollout.env_workers)"
    ),
    env_timeout: float = typer.Option(
        None,
        "--env-timeout",
        min=0.001,
        help="Seconds one env call may take (recipe rollout.env_timeout_s)",
    ),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Rollout node: engines, workflows, envs; joins a running job (and may leave at any time)."""
    import logging

    from cli.common import fail, load_recipe_or_exit

    if not token:
        fail("no run token: pass --token or set ASTRAFLOW_TOKEN")
    if engine is not None and engine not in ("transformers", "vllm", "openai"):
        fail(f"--engine must be transformers, vllm or openai, got {engine!r}")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the log
    spec = load_recipe_or_exit(recipe) if recipe else None
    from astraflow.protocol.client import AuthError, ServiceUnreachable
    from astraflow.rollout.service import NodeOptions, run_node

    opts = NodeOptions(join=join, token=token, policies=policies, engine=engine,
                       concurrency=concurrency, device=device, name=name, region=region,
                       torch_threads=threads, drain_timeout_s=drain_timeout,
                       env_workers=env_workers, env_timeout_s=env_timeout,
                       weight_cache=weight_cache)  # fmt: skip
    try:
        code = run_node(opts, spec)
    except AuthError:
        fail(f"the dataflow service at {join} rejected the run token (wrong --token?)")
    except ServiceUnreachable as exc:
        fail(f"cannot reach the dataflow service at {join}: {exc}")
    except ValueError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@app.command()
def trainer(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="Recipe file"),
    policy: str = typer.Option(..., "--policy", help="Policy this trainer trains"),
    join: str = typer.Option(..., "--join", help="Dataflow service URL"),
    token: str = typer.Option(None, "--token", envvar="ASTRAFLOW_TOKEN", help="Run token"),
    run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (default: the recipe's)"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint"),
    weights_host: str = typer.Option(
        "127.0.0.1", "--weights-host", help="Bind address of the weight server"
    ),
    weights_port: int = typer.Option(
        0, "--weights-port", help="Port of the weight server (0: free)"
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override a recipe key: a.b=c"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Trainer for one policy (TRL GRPO family); serves its weight versions over HTTP."""
    import logging

    from cli.common import fail, load_recipe_or_exit

    if not token:
        fail("no run token: pass --token or set ASTRAFLOW_TOKEN")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    spec = load_recipe_or_exit(recipe, overrides)
    if policy not in spec.policies:
        fail(
            f"--policy {policy!r} is not defined in {recipe}; defined: {', '.join(sorted(spec.policies))}"
        )
    from astraflow.trainer.wiring import serve_trainer

    try:
        serve_trainer(spec, policy, join, token, run_dir or spec.run.run_dir, resume=resume,
                      weights_host=weights_host, weights_port=weights_port)  # fmt: skip
    except ValueError as exc:
        fail(str(exc))


@app.command("weight-cache")
def weight_cache(
    upstream: list[str] = typer.Option(
        ...,
        "--upstream",
        help="Trainer weight server as seen from here: URL (every policy) or POLICY=URL; repeat "
        "for several trainers",
    ),
    token: str = typer.Option(None, "--token", envvar="ASTRAFLOW_TOKEN", help="Run token"),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (nodes of the region)"),
    port: int = typer.Option(0, "--port", help="Port; 0 picks a free one"),
    cache_dir: Path = typer.Option(
        None, "--dir", help="Where cached files go (default: a temporary folder, removed on exit)"
    ),
    keep: int = typer.Option(32, "--keep", min=2, help="Files kept (snapshots and deltas)"),
    port_file: Path = typer.Option(
        None, "--port-file", help="Write http://host:port here once listening"
    ),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Region-local weight cache: one download per file from the trainer, shared by the region's
    nodes (start them with --weight-cache URL)."""
    import logging

    from cli.common import console, fail

    if not token:
        fail("no run token: pass --token or set ASTRAFLOW_TOKEN")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from astraflow.dataflow.server import run
    from astraflow.weights.cache import WeightCache, create_cache_app, parse_upstreams

    try:
        upstreams = parse_upstreams(upstream)
    except ValueError as exc:
        fail(str(exc))
    cache = WeightCache(upstreams, token, cache_dir, keep_files=keep)
    console.print(
        f"[bold]weight cache[/] for {upstreams} in {cache.root} on {host}:{port or '(free port)'}",
        highlight=False,
    )
    try:
        run(create_cache_app(cache), host, port, port_file, log_level="warning")
    finally:
        cache.close()
