"""The dataflow process (``astraflow serve dataflow``): the run's one dataflow service over HTTP(S).

The process is the service's HTTP API (:func:`astraflow.dataflow.http.app.create_app`, which opens
the SQLite store) served by uvicorn (:mod:`astraflow.protocol.http_server`) until SIGINT/SIGTERM.
The service's background work (lease expiry, task feeding) starts with the server and stops with it.
The launcher starts it with ``port = 0`` and a port file, and reads the URL from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.protocol.tls import ServerTLS
from astraflow.recipe import Recipe

if TYPE_CHECKING:
    from fastapi import FastAPI

    from astraflow.dataflow.ops.task_feeder import TaskSource


@dataclass
class DataflowOptions:
    recipe: Recipe
    #: the run secret (clients present it or a role token derived from it)
    token: str
    #: loads the recipe's task sets (the CLI passes ``astraflow.tasks.catalog.load_task_set``)
    task_source: TaskSource
    host: str = "127.0.0.1"
    #: 0 picks a free port (written to ``port_file`` once listening)
    port: int = 0
    #: SQLite file (None: the recipe's ``dataflow.store``, else ``run_dir/dataflow.db``)
    store: Path | None = None
    port_file: Path | None = None
    #: SQLite synchronous mode: FULL (fsync each commit), NORMAL or EXTRA
    synchronous: str = "FULL"
    log_level: str = "warning"
    tls: ServerTLS | None = None


def build_app(opts: DataflowOptions) -> FastAPI:
    """The service as an ASGI app; its store opens now. A recipe the service cannot run raises
    here (``PolicyConfigError``, ``ValueError``, ``KeyError``), before any socket is bound."""
    from astraflow.dataflow.http.app import create_app

    return create_app(
        opts.recipe,
        opts.store,
        opts.token,
        task_source=opts.task_source,
        synchronous=opts.synchronous,
    )


def run_dataflow(
    opts: DataflowOptions,
    app: FastAPI | None = None,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve the dataflow service until the process is stopped. ``app`` is one :func:`build_app`
    already made (the CLI builds it first to report recipe errors and the store path)."""
    from astraflow.protocol.http_server import run

    app = app if app is not None else build_app(opts)
    quiet_garbage_collector()
    run(app, opts.host, opts.port, opts.port_file, opts.log_level, opts.tls, on_listening)


def quiet_garbage_collector() -> None:
    """Keep Python's cyclic garbage collector from pausing the service for tens of milliseconds.

    Every request allocates (bodies, models, rows) and a full collection walks every object the
    process holds: measured under the load bench, 5 full collections in 15 s took 37 ms each
    with the GIL held, stalling the store's writer and every reply, which showed as the push
    latency's p99. The objects that exist once the app is built (modules, schemas, the recipe) live
    as long as the process, so they are frozen out of collections, and the youngest generation is
    collected every 10,000 allocations instead of 700 (the service's garbage is short-lived and
    mostly freed by reference counting)."""
    import gc

    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(10_000, gen1, gen2)
