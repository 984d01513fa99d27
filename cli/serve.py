"""`astraflow serve dataflow|rollout|trainer`.

TLS: servers take ``--tls-cert``/``--tls-key`` (or ``$ASTRAFLOW_TLS_CERT``/``_KEY``, or the recipe's
``[security]`` files), clients ``--ca-file`` (or ``$ASTRAFLOW_CA_FILE``). Tokens: the dataflow
service needs the run secret; a node runs with a node token, a trainer with a trainer token (the
secret works for both, as before role tokens existed).
"""

from __future__ import annotations

from pathlib import Path

import typer

from astraflow.engine_kinds import CHECKPOINT_ENGINE_KINDS, ENGINE_KINDS

app = typer.Typer(help="Run one AstraFlow service.", no_args_is_help=True)

_CERT_HELP = "Serve HTTPS with this certificate chain (PEM; with --tls-key)"
_KEY_HELP = "Private key of --tls-cert (PEM)"
_CA_HELP = "CA certificate to verify https:// services against"
_LOG_HELP = "debug | info | warning | error (default: the recipe's logging.level)"
_LOG_LEVELS = ("debug", "info", "warning", "error")


def _configure_logging(flag: str | None, spec) -> str:
    """Set this service's log level: ``--log-level``, else the recipe's ``logging.level``, else
    info. Every astraflow module logs through the root logger; httpx stays at warning (one line
    per request drowns the log). Returns the level, for uvicorn."""
    import logging

    from astraflow.cli.common import fail

    level = (flag or (spec.logging.level if spec is not None else "info")).lower()
    if level not in _LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(_LOG_LEVELS)}, got {flag!r}")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return level


def _server_tls(cert: Path | None, key: Path | None, spec, what: str):
    """Checked TLS settings of a server: flags (or their variables) first, then the recipe's
    ``[security]`` files; an error names the file and where it came from."""
    from astraflow.cli.common import fail

    from astraflow.protocol.tls import ServerTLS, TLSConfigError

    flags = ("--tls-cert", "--tls-key")
    sec = spec.security if spec is not None else None
    if not cert and not key and sec is not None and sec.tls:
        if sec.cert_file is None:
            fail(
                f"security.tls = true, but {what} has no certificate: pass --tls-cert and "
                "--tls-key (`astraflow certs create` makes them), set security.cert_file and "
                "security.key_file, or start the run with `astraflow train`, which creates them"
            )
        cert, key, flags = sec.cert_file, sec.key_file, ("security.cert_file", "security.key_file")
    try:
        return ServerTLS.resolve(cert, key, cert_flag=flags[0], key_flag=flags[1])
    except TLSConfigError as exc:
        fail(str(exc))


def _ca_file(ca_file: Path | None, spec) -> Path | None:
    """The CA file a client verifies against (flag or variable, then the recipe's), checked."""
    from astraflow.cli.common import fail

    from astraflow.protocol.tls import TLSConfigError, ca_path

    flag = "--ca-file"
    if not ca_file and spec is not None and spec.security.ca_file is not None:
        ca_file, flag = spec.security.ca_file, "security.ca_file"
    try:
        return ca_path(ca_file, flag=flag) if ca_file else None
    except TLSConfigError as exc:
        fail(str(exc))


def _default_weights_host(dataflow_host: str) -> str:
    """Nodes fetch weights from the URL the weight server announces, so by default it listens
    where they reach the dataflow service: ``dataflow.host`` when that is an address of this
    machine (a wildcard cannot be announced, and a trainer started on another machine cannot
    bind there), else loopback as before."""
    import socket

    if dataflow_host in ("0.0.0.0", "::", "", "127.0.0.1", "localhost"):
        return "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in dataflow_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((dataflow_host, 0))
    except OSError:
        return "127.0.0.1"
    return dataflow_host


def _check_token(token: str | None, command: str, accepted: tuple[str, ...]) -> None:
    """Fail fast on a role token this service cannot work with (not after minutes of start-up)."""
    from astraflow.cli.common import fail

    from astraflow.protocol.auth import token_role

    if not token:
        fail("no run token: pass --token or set ASTRAFLOW_TOKEN")
    role = token_role(token)
    if role is not None and role not in accepted:
        wanted = "".join(f"a {r} token or " for r in accepted) + "the run secret"
        fail(
            f"`astraflow serve {command}` needs {wanted}, got a {role} token"
            + (f" (`astraflow token --role {accepted[0]}` prints one)" if accepted else "")
        )


@app.command()
def dataflow(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="TOML recipe of the run"),
    host: str = typer.Option(None, "--host", help="Bind address (default: recipe dataflow.host)"),
    port: int = typer.Option(
        None, "--port", min=0, max=65535, help="Port; 0 picks a free one (default: recipe)"
    ),
    store: Path = typer.Option(None, "--store", help="SQLite file (default: run_dir/dataflow.db)"),
    token: str = typer.Option(
        None,
        "--token",
        envvar="ASTRAFLOW_TOKEN",
        help="Run secret; clients present it or a role token derived from it",
    ),
    port_file: Path = typer.Option(
        None, "--port-file", help="Write http(s)://host:port here once listening"
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override a recipe key: a.b=c"),
    synchronous: str = typer.Option(
        "FULL", "--synchronous", help="SQLite synchronous mode: FULL (fsync each commit) or NORMAL"
    ),
    tls_cert: Path = typer.Option(None, "--tls-cert", envvar="ASTRAFLOW_TLS_CERT", help=_CERT_HELP),
    tls_key: Path = typer.Option(None, "--tls-key", envvar="ASTRAFLOW_TLS_KEY", help=_KEY_HELP),
    log_level: str = typer.Option(None, "--log-level", help=_LOG_HELP),
) -> None:
    """Dataflow service: tasks, leases, buffers, dataflow policies."""
    from astraflow.cli.common import console, fail, load_recipe_or_exit

    _check_token(token, "dataflow", ())
    if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
        fail(f"--synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
    spec = load_recipe_or_exit(recipe, overrides)
    log_level = _configure_logging(log_level, spec)
    tls = _server_tls(tls_cert, tls_key, spec, "the dataflow service")
    from astraflow.tasks.catalog import load_task_set

    from astraflow.dataflow.main import DataflowOptions, build_app, run_dataflow
    from astraflow.dataflow.policies import PolicyConfigError

    host = host or spec.dataflow.host
    port = spec.dataflow.port if port is None else port
    opts = DataflowOptions(recipe=spec, token=token, task_source=load_task_set, host=host,
                           port=port, store=store, port_file=port_file,
                           synchronous=synchronous.upper(), log_level=log_level, tls=tls)  # fmt: skip
    try:
        app_ = build_app(opts)
    except (PolicyConfigError, ValueError, KeyError) as exc:
        fail(f"{recipe}: {exc}")

    def listening(url: str) -> None:  # the bound port, also for --port 0
        console.print(
            f"[bold]dataflow[/] run {spec.run.name!r} store {app_.state.service.store.path} on "
            f"{url}",
            highlight=False,
        )

    run_dataflow(opts, app_, on_listening=listening)


@app.command()
def rollout(
    join: str = typer.Option(
        ..., "--join", help="Dataflow service URL, e.g. http://10.0.0.5:8700 or https://..."
    ),
    token: str = typer.Option(
        None, "--token", envvar="ASTRAFLOW_TOKEN", help="Node token (or the run secret)"
    ),
    ca_file: Path = typer.Option(None, "--ca-file", envvar="ASTRAFLOW_CA_FILE", help=_CA_HELP),
    recipe: Path = typer.Option(
        None, "--recipe", "-r", help="Recipe file (default: fetched from the dataflow service)"
    ),
    policies: list[str] = typer.Option([], "--policies", help="Serve only these policies"),
    engine: str = typer.Option(None, "--engine", help="Override the engine kind of every policy"),
    concurrency: int = typer.Option(None, "--concurrency", min=1, help="Episodes in flight"),
    device: str = typer.Option(None, "--device", help="auto | cpu | cuda | cuda:N"),
    name: str = typer.Option("", "--name", help="Node name shown in status"),
    replace: bool = typer.Option(
        False,
        "--replace",
        help="Restarting a crashed node of this --name: its leases go back to the queue now",
    ),
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
    log_level: str = typer.Option(None, "--log-level", help=_LOG_HELP),
) -> None:
    """Rollout node: engines, workflows, envs; joins a running job (and may leave at any time)."""
    from astraflow.cli.common import fail, load_recipe_or_exit

    from astraflow.protocol.auth import ADMIN, NODE

    _check_token(token, "rollout", (NODE, ADMIN))
    if engine is not None and engine not in ENGINE_KINDS:
        fail(f"--engine must be one of {', '.join(ENGINE_KINDS)}, got {engine!r}")
    spec = load_recipe_or_exit(recipe) if recipe else None
    _configure_logging(log_level, spec)
    ca = _ca_file(ca_file, spec)
    from astraflow.protocol.client import AuthError, ServiceUnreachable, TLSError
    from astraflow.rollout.main import NodeOptions, run_node

    opts = NodeOptions(join=join, token=token, policies=policies, engine=engine,
                       concurrency=concurrency, device=device, name=name, replace=replace,
                       region=region,
                       torch_threads=threads, drain_timeout_s=drain_timeout,
                       env_workers=env_workers, env_timeout_s=env_timeout,
                       ca_file=str(ca) if ca else None,
                       weight_cache=weight_cache, recipe=spec)  # fmt: skip
    try:
        code = run_node(opts)
    except AuthError:
        fail(f"the dataflow service at {join} rejected the run token (wrong --token?)")
    except ServiceUnreachable as exc:
        fail(f"cannot reach the dataflow service at {join}: {exc}")
    except TLSError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@app.command()
def trainer(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="Recipe file"),
    policy: list[str] = typer.Option(
        ...,
        "--policy",
        help="Policy this trainer trains; repeat it for several LoRA adapter policies of one "
        "base, trained in this one process",
    ),
    join: str = typer.Option(..., "--join", help="Dataflow service URL"),
    token: str = typer.Option(
        None, "--token", envvar="ASTRAFLOW_TOKEN", help="Trainer token (or the run secret)"
    ),
    run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (default: the recipe's)"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint"),
    weights_host: str = typer.Option(
        None,
        "--weights-host",
        help="Address of the weight server, which nodes fetch from (default: the recipe's "
        "dataflow.host when it is one address, else 127.0.0.1)",
    ),
    weights_port: int = typer.Option(
        0, "--weights-port", help="Port of the weight server (0: free)"
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override a recipe key: a.b=c"),
    tls_cert: Path = typer.Option(
        None, "--tls-cert", envvar="ASTRAFLOW_TLS_CERT", help=_CERT_HELP + " (weight server)"
    ),
    tls_key: Path = typer.Option(None, "--tls-key", envvar="ASTRAFLOW_TLS_KEY", help=_KEY_HELP),
    ca_file: Path = typer.Option(None, "--ca-file", envvar="ASTRAFLOW_CA_FILE", help=_CA_HELP),
    log_level: str = typer.Option(None, "--log-level", help=_LOG_HELP),
) -> None:
    """Trainer for one policy (TRL GRPO family), or for several LoRA adapter policies of one
    base; serves their weight versions over HTTP(S)."""
    from astraflow.cli.common import fail, load_recipe_or_exit

    from astraflow.protocol.auth import ADMIN, TRAINER

    _check_token(token, "trainer", (TRAINER, ADMIN))
    spec = load_recipe_or_exit(recipe, overrides)
    _configure_logging(log_level, spec)
    for name in policy:
        if name not in spec.policies:
            fail(
                f"--policy {name!r} is not defined in {recipe}; defined: "
                f"{', '.join(sorted(spec.policies))}"
            )
    tls = _server_tls(tls_cert, tls_key, spec, "the trainer's weight server")
    ca = _ca_file(ca_file, spec)
    if weights_host is None:
        weights_host = _default_weights_host(spec.dataflow.host)
    from astraflow.protocol.client import DataflowClientError
    from astraflow.trainer.main import TrainerOptions, run_trainer

    opts = TrainerOptions(recipe=spec, policies=list(policy), join=join, token=token,
                          run_dir=run_dir or spec.run.run_dir, resume=resume,
                          weights_host=weights_host, weights_port=weights_port, tls=tls,
                          ca_file=str(ca) if ca else None)  # fmt: skip
    try:
        run_trainer(opts)
    except (ValueError, DataflowClientError) as exc:
        fail(str(exc))


@app.command("weight-cache")
def weight_cache(
    upstream: list[str] = typer.Option(
        [],
        "--upstream",
        help="Trainer weight server as seen from here: URL (every policy) or POLICY=URL; repeat "
        "for several trainers (with --join: the first guess, followed when it moves)",
    ),
    join: str = typer.Option(
        None,
        "--join",
        help="The run's dataflow URL: each policy's weight server is read from its version "
        "table and followed across trainer restarts (the token is then a node token)",
    ),
    ca_file: Path = typer.Option(
        None, "--ca-file", help="CA bundle for https:// dataflow and weight servers"
    ),
    token: str = typer.Option(None, "--token", envvar="ASTRAFLOW_TOKEN", help="Run token"),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (nodes of the region)"),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port; 0 picks a free one"),
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

    from astraflow.cli.common import console, fail

    if not token:
        fail("no run token: pass --token or set ASTRAFLOW_TOKEN")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from astraflow.protocol.http_server import run
    from astraflow.weights.cache import WeightCache, create_cache_app, parse_upstreams

    try:
        upstreams = parse_upstreams(upstream, required=join is None)
    except ValueError as exc:
        fail(str(exc))
    cache = WeightCache(
        upstreams, token, cache_dir, keep_files=keep, dataflow=join,
        ca_file=str(ca_file) if ca_file else None,
    )  # fmt: skip
    following = f" following {join}" if join else ""

    def listening(url: str) -> None:  # the bound port, also for --port 0
        console.print(
            f"[bold]weight cache[/] for {upstreams or '(from the version table)'}{following} in "
            f"{cache.root} on {url}",
            highlight=False,
        )

    try:
        run(create_cache_app(cache), host, port, port_file, log_level="warning",
            on_listening=listening)  # fmt: skip
    finally:
        cache.close()


@app.command()
def policy(
    model: str = typer.Argument(
        ...,
        help="builtin:NAME, a checkpoint directory, a run directory (its latest checkpoint) "
        "or a Hugging Face id",
    ),
    engine: str = typer.Option(
        "transformers", "--engine", help=" | ".join(CHECKPOINT_ENGINE_KINDS)
    ),
    name: str = typer.Option(
        None, "--name", help="Model name clients pass as `model` (default: MODEL as given)"
    ),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar="ASTRAFLOW_API_KEY",
        help="Bearer key clients must send (default: a fresh one, printed at start)",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port; 0 picks a free one"),
    port_file: Path = typer.Option(
        None, "--port-file", help="Write http://host:port here once listening"
    ),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
    threads: int = typer.Option(1, "--threads", min=1, help="torch threads for this process"),
    engine_arg: list[str] = typer.Option(
        [], "--engine-arg", help="KEY=VALUE passed to the engine (repeatable; VALUE read as JSON)"
    ),
    tool_parser: str = typer.Option(
        "auto",
        "--tool-parser",
        help="How the model writes tool calls: hermes | llama3_json | mistral | pythonic | auto "
        "(from its chat template)",
    ),
    log_level: str = typer.Option("warning", "--log-level"),
    max_body_mb: float = typer.Option(
        4.0, "--max-body-mb", min=0.001, help="Largest request body (MiB); larger ones get 413"
    ),
    max_prompt_tokens: int = typer.Option(
        None,
        "--max-prompt-tokens",
        min=1,
        help="Longest prompt (tokens); longer ones get 413 (default: the model's context)",
    ),
    max_n: int = typer.Option(16, "--max-n", min=1, max=256, help="Most completions per request"),
    max_inflight_per_client: int = typer.Option(
        32,
        "--max-inflight-per-client",
        min=1,
        help="Completions (n each) one client address may have running; more get 429",
    ),
) -> None:
    """OpenAI-compatible server for one policy: /v1/models, /v1/chat/completions (streaming),
    /v1/completions (text or token ids in, token ids and log-probs out). Requests are bounded
    (body, prompt tokens, n, sampling values) and each client address gets a share of the
    engine, so one client cannot fail or starve the others."""
    import asyncio
    import secrets

    from astraflow.cli.common import console, fail
    from astraflow.cli.eval import parse_engine_args

    if engine not in CHECKPOINT_ENGINE_KINDS:
        fail(f"--engine must be one of {', '.join(CHECKPOINT_ENGINE_KINDS)}, got {engine!r}")
    try:
        args = parse_engine_args(engine_arg)
    except ValueError as exc:
        fail(str(exc))
    from astraflow.tools.parsers import AUTO, tool_parsers

    parsers = tool_parsers()
    if tool_parser != AUTO and tool_parser not in parsers:
        fail(f"--tool-parser: {parsers.unknown_message(tool_parser)} (or 'auto')")
    generated = not api_key
    api_key = api_key or secrets.token_urlsafe(24)
    from astraflow.protocol.http_server import serve
    from astraflow.rollout.engines.openai_server import ServerLimits, create_app
    from astraflow.rollout.policy_server import PolicyServerOptions, build_engine

    opts = PolicyServerOptions(
        model=model, api_key=api_key, engine=engine, served_name=name, device=device,
        torch_threads=threads, engine_args=args, tool_parser=tool_parser,
    )  # fmt: skip

    async def main() -> None:
        try:
            served = build_engine(opts)
        except (FileNotFoundError, ValueError) as exc:
            fail(str(exc))
        served_name = name or model

        def listening(url: str) -> None:  # the bound port, also for --port 0
            console.print(
                f"[bold]policy[/] {model!r} ({engine}, weights v{served.version}) as model "
                f"{served_name!r} on {url}/v1",
                highlight=False,
            )
            if generated:
                console.print(f"api key: {api_key}", highlight=False)

        try:
            limits = ServerLimits(
                max_body_bytes=int(max_body_mb * (1 << 20)),
                max_prompt_tokens=max_prompt_tokens,
                max_n=max_n,
                max_inflight_per_client=max_inflight_per_client,
            )
            app_ = create_app(
                served, served_name, api_key, tool_parser=opts.tool_parser, limits=limits
            )
            await serve(app_, host, port, port_file, log_level, on_listening=listening)
        finally:
            await served.close()

    asyncio.run(main())
