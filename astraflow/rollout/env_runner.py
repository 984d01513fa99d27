"""Env calls off the rollout node's event loop: a bounded pool for sync envs, a timeout for all.

Why: a node runs hundreds of episodes on one asyncio loop. A sync env call made on that loop (a
``Code-v0`` step runs its sandbox for up to 30 s, a database env waits on a query) stops every
other episode's generation, every push and every heartbeat for as long as it takes; the service
then sees a silent node and its leases expire. So workflows never touch an env directly: they get
an :class:`AsyncEnv` from :meth:`EnvRunner.make` and ``await`` its ``reset``/``step``/``close``.

- An env that offers the async protocol (``areset(seed=, options=)``, ``astep(action)``,
  ``aclose()``; typically one whose tools are I/O-bound) is awaited natively on the loop: no thread.
- Every other call (and env construction) runs in the runner's bounded pool of ``workers`` threads.
- Every call is bounded by ``timeout_s`` (recipe key ``rollout.env_timeout_s``), counted from the
  moment the call starts running, not from when it was queued for a free thread. Past it the call
  raises :class:`EnvCallTimeout`, which the node records as an episode with
  ``finish_reason="env_timeout"``.

What happens to a call that timed out. A Python thread cannot be killed, so the runner kills the
*resource* instead: it calls the env's ``close()`` in a fresh thread of its own (the pool may be
full of stuck calls), and envs that run external work make ``close()`` kill it from any thread
(the code env's sandbox kills its running process, which makes the stuck ``step`` return). The
pool writes the stuck thread off at once: it no longer counts against ``workers`` and a
replacement thread serves queued calls, so a hung call never leaves the pool short. When the stuck
call returns (normally right after the kill) its thread exits; a call that never returns (pure
Python stuck in a loop that ``close`` cannot reach) keeps one idle daemon thread until the process
ends, counted in :attr:`EnvRunner.stuck_threads` and logged. Pool threads are daemon threads so
that such a thread cannot hold the node's process open at exit.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from astraflow.errors import AstraFlowError

log = logging.getLogger("astraflow.rollout.env")

#: The recipe key that sets the per-call limit (named in every timeout message).
TIMEOUT_KEY = "rollout.env_timeout_s"
#: How long the runner waits for a kill (the env's close after a timeout) before moving on.
KILL_GRACE_S = 10.0


class EnvCallTimeout(AstraFlowError, RuntimeError):
    """An env call ran past ``rollout.env_timeout_s``; the env has been closed to kill its work."""

    def __init__(self, call: str, limit_s: float, env_id: str | None = None):
        self.call = call
        self.limit_s = limit_s
        self.env_id = env_id
        where = f" (env {env_id})" if env_id else ""
        super().__init__(
            f"{call} took longer than {TIMEOUT_KEY} = {limit_s:g}s{where}; the env was closed to "
            f"stop it (raise {TIMEOUT_KEY} if such calls are legitimately this slow)"
        )


class _EnvPool(Executor):
    """A bounded pool of daemon threads that can write off a stuck thread.

    Why not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at interpreter exit
    (a hung env call would keep the node process alive forever) and a stuck thread counts against
    ``max_workers`` for good. Here at most ``max_workers`` *healthy* threads exist; :meth:`abandon`
    moves a stuck one out of that count (a replacement may start) and makes it exit once its call
    returns.
    """

    def __init__(self, max_workers: int, name: str = "env"):
        if max_workers < 1:
            raise ValueError(f"env pool needs at least 1 worker, got {max_workers}")
        self.max_workers = max_workers
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._healthy = 0  # threads counted against max_workers
        self._idle = 0  # healthy threads waiting in (or about to enter) queue.get()
        self._pending = 0  # calls queued and not yet taken by a thread
        self._abandoned: set[int] = set()  # idents of threads written off, still in their call
        self._shutdown = False
        self._serial = 0
        self.submitted = 0

    @property
    def threads(self) -> int:
        """Healthy threads (at most ``max_workers``)."""
        return self._healthy

    @property
    def stuck(self) -> int:
        """Written-off threads still inside the call that timed out."""
        return len(self._abandoned)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the env runner is shut down; no more env calls are accepted")
            self.submitted += 1
            self._pending += 1
            self._queue.put((future, fn, args, kwargs))
            self._grow()
        return future

    def _grow(self) -> None:  # with self._lock held
        """Start a thread when queued calls outnumber waiting threads and the bound allows."""
        while self._pending > self._idle and self._healthy < self.max_workers:
            self._healthy += 1
            self._idle += 1  # it goes straight to queue.get()
            self._serial += 1
            threading.Thread(
                target=self._work, name=f"{self.name}-{self._serial}", daemon=True
            ).start()

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
                if item is None:  # shutdown
                    self._healthy -= 1
                    return
                self._pending -= 1
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the caller, never lost
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs, item
            with self._lock:
                if me in self._abandoned:
                    self._abandoned.discard(me)
                    log.info("env thread %s came back after its call timed out; it exits", me)
                    return
                if self._shutdown:
                    self._healthy -= 1
                    return
                self._idle += 1

    def abandon(self, ident: int | None) -> None:
        """Write off the thread ``ident`` (stuck in a call that timed out); queued calls get a
        replacement thread."""
        if ident is None:
            return
        with self._lock:
            if ident in self._abandoned:
                return
            self._abandoned.add(ident)
            self._healthy -= 1
            if not self._shutdown:
                self._grow()

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        self._pending -= 1
                        # an error, not a cancellation: the awaiting episode was not cancelled
                        if item[0].set_running_or_notify_cancel():
                            item[0].set_exception(
                                RuntimeError("the env runner shut down before this env call ran")
                            )
            for _ in range(self._idle):  # wake the waiting threads; busy ones exit after
                self._queue.put(None)


class EnvRunner:
    """One per node: creates envs and runs their calls off the event loop, each within a limit.

    ``make_env(env_id, kwargs)`` is the plain (sync) factory, e.g. the env registry's ``make``.
    ``workers`` bounds the threads running sync env calls at once (recipe ``rollout.env_workers``);
    ``timeout_s`` bounds each call (``rollout.env_timeout_s``; None = unbounded).
    """

    def __init__(
        self,
        make_env: Callable[[str, dict[str, Any]], Any],
        *,
        workers: int = 32,
        timeout_s: float | None = 60.0,
    ):
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"{TIMEOUT_KEY} must be > 0 (or None for no limit), got {timeout_s}")
        self._make_env = make_env
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool = _EnvPool(workers)
        #: calls that ran past the limit (for the node's metrics)
        self.timeouts = 0

    # ------------------------------------------------------------------ public
    async def make(self, env_id: str, kwargs: dict[str, Any]) -> AsyncEnv:
        """Construct ``env_id`` in the pool (constructors may connect to databases or probe a
        sandbox engine) and wrap it."""

        def close_late(env: Any) -> None:  # the constructor finished after its timeout
            _close_quietly(env, env_id)

        env = await self.call(
            "make_env", self._make_env, env_id, dict(kwargs), env_id=env_id, on_late=close_late
        )
        return AsyncEnv(env, self, env_id)

    def shutdown(self) -> None:
        """Stop accepting calls, cancel queued ones, let idle threads exit (stuck ones are
        daemon threads and die with the process)."""
        self._pool.shutdown()
        if self._pool.stuck:
            log.warning(
                "env runner shut down with %d thread(s) still stuck in env calls",
                self._pool.stuck,
            )

    @property
    def threads(self) -> int:
        """Pool threads counted against ``workers``."""
        return self._pool.threads

    @property
    def stuck_threads(self) -> int:
        """Threads written off after a timeout that have not returned yet."""
        return self._pool.stuck

    @property
    def sync_calls(self) -> int:
        """Calls run in the pool so far (env constructions included)."""
        return self._pool.submitted

    # ------------------------------------------------------------------ internals
    async def call(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        env_id: str | None = None,
        on_late: Callable[[Any], None] | None = None,
    ) -> Any:
        """Run ``fn(*args)`` in the pool; raise :class:`EnvCallTimeout` past ``timeout_s``.

        ``on_late`` receives the result of a call that completes after it timed out (so that,
        e.g., an env constructed too late is still closed)."""
        loop = asyncio.get_running_loop()
        started = loop.create_future()
        ident: list[int] = []

        def mark_started() -> None:
            if not started.done():
                started.set_result(None)

        def run() -> Any:
            ident.append(threading.get_ident())
            try:
                loop.call_soon_threadsafe(mark_started)
            except RuntimeError:  # the loop is gone: nobody waits for this call any more
                pass
            return fn(*args)

        cf = self._pool.submit(run)
        fut = asyncio.wrap_future(cf, loop=loop)
        # A result or error that arrives after we stopped waiting must not be reported as
        # "never retrieved".
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self.timeout_s is None:
            return await fut
        # Wait for a free thread first: the limit is about the call, not the queue in front of it.
        try:
            await asyncio.wait({started, fut}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cf.cancel()  # still queued: never runs
            raise
        if fut.done():
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except TimeoutError:
            if cf.done():  # finished in the same instant (its loop callback not run yet)
                return cf.result()
            self.timeouts += 1
            self._pool.abandon(ident[0] if ident else None)
            if on_late is not None:
                cf.add_done_callback(
                    lambda f: (
                        on_late(f.result()) if not f.cancelled() and not f.exception() else None
                    )
                )
            raise EnvCallTimeout(name, self.timeout_s, env_id) from None

    async def kill(self, env: Any, env_id: str | None) -> None:
        """Close ``env`` after a timed-out call, in a fresh thread (the pool may be exhausted),
        waiting up to ``KILL_GRACE_S`` for it."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def close() -> None:
            try:
                _close_quietly(env, env_id)
            finally:
                try:
                    loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
                except RuntimeError:
                    pass

        threading.Thread(target=close, name=f"env-kill-{env_id}", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), KILL_GRACE_S)
        except TimeoutError:
            log.warning(
                "closing env %s after a timeout did not finish within %.0fs", env_id, KILL_GRACE_S
            )


def _close_quietly(env: Any, env_id: str | None) -> None:
    close = getattr(env, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception as exc:  # the env is being discarded; its close failing changes nothing
        log.warning("closing env %s failed: %s: %s", env_id, type(exc).__name__, exc)


class AsyncEnv:
    """An env as workflows see it: ``await env.reset/step/close``, never blocking the loop.

    Uses the env's own ``areset``/``astep``/``aclose`` when it has them (awaited on the loop,
    bounded by the runner's timeout), else its sync method in the runner's pool. After a call
    times out the env is closed (its running work killed) and every later call is refused.
    """

    def __init__(self, env: Any, runner: EnvRunner, env_id: str | None = None):
        self.env = env
        self.env_id = env_id
        self._runner = runner
        self._closed = False
        self._dead: EnvCallTimeout | None = None

    def __repr__(self) -> str:
        return f"AsyncEnv({self.env!r})"

    async def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[Any, dict]:
        areset = getattr(self.env, "areset", None)
        if areset is not None:
            return await self._native("env.reset", areset(seed=seed, options=options))
        return await self._sync(
            "env.reset", functools.partial(self.env.reset, seed=seed, options=options)
        )

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        astep = getattr(self.env, "astep", None)
        if astep is not None:
            return await self._native("env.step", astep(action))
        return await self._sync("env.step", functools.partial(self.env.step, action))

    @property
    def saves_state(self) -> bool:
        """Whether the env takes part in the optional state contract (``state_dict`` and
        ``load_state_dict``, see :class:`astraflow.envs.base.StateMixin`), through wrappers that declare
        ``state_passthrough`` (they hold no episode state of their own)."""
        return _state_holder(self.env) is not None

    async def state_dict(self) -> dict | None:
        """The env's state between turns (plain JSON), or None when it cannot save one. Runs in
        the pool, bounded like every call."""
        holder = _state_holder(self.env)
        if holder is None:
            return None
        return await self._sync("env.state_dict", holder.state_dict)

    async def load_state_dict(self, state: dict) -> None:
        """Put this (fresh, never reset) env into a saved state; raises when it cannot."""
        holder = _state_holder(self.env)
        if holder is None:
            raise RuntimeError(f"env {self.env_id} cannot load a saved state (no load_state_dict)")
        await self._sync("env.load_state_dict", functools.partial(holder.load_state_dict, state))

    async def close(self) -> None:
        """Release the env. Idempotent. A close that runs past the limit is logged, not raised:
        the episode's data is complete by then, and the env is written off either way."""
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self.env, "aclose", None)
        try:
            if aclose is not None:
                await self._bounded("env.close", aclose())
            elif getattr(self.env, "close", None) is not None:
                await self._runner.call("env.close", self.env.close, env_id=self.env_id)
        except EnvCallTimeout as exc:
            log.warning("%s", exc)

    # ------------------------------------------------------------------ internals
    def _check(self, name: str) -> None:
        if self._dead is not None:
            raise RuntimeError(f"{name} on env {self.env_id} after it was killed: {self._dead}")
        if self._closed:
            raise RuntimeError(f"{name} on env {self.env_id} after it was closed")

    async def _bounded(self, name: str, coro) -> Any:
        timeout = self._runner.timeout_s
        if timeout is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            self._runner.timeouts += 1
            raise EnvCallTimeout(name, timeout, self.env_id) from None

    async def _native(self, name: str, coro) -> Any:
        try:
            self._check(name)
        except RuntimeError:
            coro.close()
            raise
        try:
            return await self._bounded(name, coro)
        except EnvCallTimeout as exc:
            await self._die(exc)
            raise

    async def _sync(self, name: str, fn: Callable[[], Any]) -> Any:
        self._check(name)
        try:
            return await self._runner.call(name, fn, env_id=self.env_id)
        except EnvCallTimeout as exc:
            await self._die(exc)
            raise

    async def _die(self, exc: EnvCallTimeout) -> None:
        """Kill what the timed-out call was running: the async close when the env has one
        (bounded), else its sync close in a fresh thread."""
        self._dead = exc
        if self._closed:
            return
        self._closed = True
        log.warning("%s", exc)
        aclose = getattr(self.env, "aclose", None)
        if aclose is not None:
            try:
                await asyncio.wait_for(aclose(), KILL_GRACE_S)
                return
            except TimeoutError:
                log.warning("aclose of env %s did not finish after a timeout", self.env_id)
            except Exception as exc2:
                log.warning(
                    "aclose of env %s failed: %s: %s", self.env_id, type(exc2).__name__, exc2
                )
            if getattr(self.env, "close", None) is None:
                return
        await self._runner.kill(self.env, self.env_id)


def _state_holder(env: Any) -> Any | None:
    """The object whose ``state_dict``/``load_state_dict`` save ``env``'s episode: the env itself,
    or the env under wrappers that declare ``state_passthrough = True``; None when there is
    none."""
    seen = 0
    while env is not None and seen < 16:
        if callable(getattr(env, "state_dict", None)) and callable(
            getattr(env, "load_state_dict", None)
        ):
            return env
        if not getattr(type(env), "state_passthrough", False):
            return None
        env = getattr(env, "env", None)
        seen += 1
    return None
