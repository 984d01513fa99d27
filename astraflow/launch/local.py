"""The local launcher: every service of a recipe as a subprocess on this machine.

The launcher owns no training logic. It writes the resolved recipe into the run directory, starts
the dataflow service, then the trainers and rollout nodes pointed at it, shows a live view read from
``GET /status``, and stops everything in order when the run is done or the user presses Ctrl-C.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.errors import AstraFlowError
from astraflow.launch.plan import LaunchPlan, PlanError, build_plan, dataflow_argv, node_argv
from astraflow.launch.processes import Service, service_env
from astraflow.launch.scaling import AutoscaleLog, PoolScaler
from astraflow.launch.security import RunSecurity
from astraflow.launch.stall import Stall, StallWatch
from astraflow.launch.supervision import RestartBudget, RestartLog
from astraflow.launch.tracking import Tracker, TrackerUnavailable, open_tracker
from astraflow.launch.trainer_command import (
    check_trainer_launch,
    trainer_argv,
    trainer_service_name,
    trainer_service_policy,
)
from astraflow.protocol.client import DataflowClientError, SyncDataflowClient
from astraflow.protocol.status import DataflowStatus
from astraflow.recipe import Recipe, load_recipe, recipe_to_toml


class LaunchError(AstraFlowError, RuntimeError):
    pass


def next_free_run_dir(base: Path) -> Path:
    """``base`` if unused, else ``base-2``, ``base-3``: re-running a recipe never clobbers a run."""
    if not base.exists():
        return base
    i = 2
    while (p := base.with_name(f"{base.name}-{i}")).exists():
        i += 1
    return p


@dataclass
class RunHandle:
    run_dir: Path
    url: str
    token: str
    services: list[Service] = field(default_factory=list)

    def by_prefix(self, prefix: str) -> list[Service]:
        return [s for s in self.services if s.name.startswith(prefix)]


class LocalLauncher:
    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        resume: bool = False,
        startup_timeout_s: float = 120.0,
        eval_grace_s: float = 300.0,
        plan: LaunchPlan | None = None,
    ):
        self.recipe = recipe
        #: every process of the run, its devices and environment (astraflow.launch.plan); made
        #: and checked at start() unless given
        self.plan = plan
        self.run_dir = run_dir
        self.resume = resume
        self.startup_timeout_s = startup_timeout_s
        self.eval_grace_s = eval_grace_s
        self.token = ""  # the run secret (admin token), from run_dir/run.secret at start()
        self.security: RunSecurity | None = None
        self.handle: RunHandle | None = None
        self.restarts = RestartBudget(recipe.run.max_restarts, recipe.run.restart_backoff_s)
        self.restart_log = RestartLog(run_dir / "restarts.jsonl")
        self._env: dict[str, str] = {}
        #: forwards metrics.jsonl to the recipe's [logging] backends (None: no backends)
        self.tracker: Tracker | None = None
        self._client: SyncDataflowClient | None = None
        #: why :meth:`wait` returned "stalled"
        self.stall: Stall | None = None
        #: the autoscaler's control loop (``[autoscale] enabled``), else None
        self.scaler: PoolScaler | None = None
        if recipe.autoscale.enabled:
            self.scaler = PoolScaler(
                recipe, AutoscaleLog(run_dir / "autoscale.jsonl"), self._grow_node
            )

    # ------------------------------------------------------------------ start
    def make_plan(self) -> LaunchPlan:
        """The run's launch plan, checked: an over-subscribed device (or a device or model the
        plan cannot find) fails the run before anything is written or started."""
        if self.plan is None:
            try:
                self.plan = build_plan(self.recipe, self.run_dir)
            except PlanError as exc:
                raise LaunchError(str(exc)) from exc
        try:
            self.plan.check()
        except PlanError as exc:
            raise LaunchError(str(exc)) from exc
        return self.plan

    def start(self) -> RunHandle:
        rd = self.run_dir
        self.make_plan()
        # a trainer that cannot start fails the run before anything is written or started
        for policy in self.recipe.trainable_policies():
            try:
                check_trainer_launch(self.recipe, policy)
            except ValueError as exc:
                raise LaunchError(str(exc)) from exc
        rd.mkdir(parents=True, exist_ok=True)
        (rd / "logs").mkdir(exist_ok=True)
        recipe_path = rd / "recipe.toml"
        recipe_path.write_text(recipe_to_toml(self.recipe))
        (rd / "run.json").write_text(json.dumps({"started": time.time(), "resume": self.resume}))
        threads = self.recipe.run.torch_threads
        # role tokens and TLS: each kind of service gets its own environment (security.py)
        try:
            self.security = RunSecurity.prepare(self.recipe, rd)
        except (ValueError, OSError) as exc:  # a missing or unusable certificate file
            raise LaunchError(f"[security]: {exc}") from exc
        self.token = self.security.secret
        try:
            self.tracker = open_tracker(self.recipe, rd)
        except TrackerUnavailable as exc:
            raise LaunchError(str(exc)) from exc
        self._env = service_env(self.token, threads)
        url_file = rd / "dataflow.url"
        url_file.unlink(missing_ok=True)
        dataflow = self._start(self._dataflow(self.recipe.dataflow.port))
        handle = RunHandle(rd, "", self.token, [dataflow])
        self.handle = handle
        handle.url = self._wait_for_url(url_file, dataflow)
        self._wait_healthy(handle.url, dataflow)
        for group in self.recipe.trainer_processes():
            handle.services.append(self._start(self._trainer(group[0], self.resume)))
        for i in range(self.recipe.rollout.nodes):
            handle.services.append(self._start(self._node(i)))
        self._write_pids()
        return handle

    # The services of a run, as started first and as restarted after a crash.
    def _start(self, svc: Service) -> Service:
        """Start ``svc`` with the environment of its role (its token, the TLS files) and its
        devices from the plan (``CUDA_VISIBLE_DEVICES``)."""
        return svc.start(self._service_env(svc.name))

    def _service_env(self, name: str) -> dict[str, str]:
        assert self.security and self.plan
        role = "dataflow" if name == "dataflow" else name.split("-", 1)[0]
        env = self.security.env(role, self._env)
        env.update(self.plan.env_for(name))
        return env

    def _dataflow(self, port: int) -> Service:
        rd = self.run_dir
        argv = dataflow_argv(self.recipe, rd, port)
        return Service("dataflow", argv, rd / "logs" / "dataflow.log")

    def _trainer(self, policy: str, resume: bool) -> Service:
        assert self.handle
        rd = self.run_dir
        try:
            argv = trainer_argv(self.recipe, rd / "recipe.toml", policy, self.handle.url, rd,
                                resume=resume)  # fmt: skip
        except ValueError as exc:
            raise LaunchError(str(exc)) from exc
        name = trainer_service_name(self.recipe, policy)
        return Service(name, argv, rd / "logs" / f"{name}.log")

    def _node(self, i: int, replace: bool = False) -> Service:
        assert self.handle and self.plan
        rd = self.run_dir
        on_gpu = bool(self.plan.env_for(f"node-{i}").get("CUDA_VISIBLE_DEVICES"))
        argv = node_argv(self.recipe, rd, self.handle.url, i, on_gpu=on_gpu, replace=replace)
        return Service(f"node-{i}", argv, rd / "logs" / f"node-{i}.log")

    def _grow_node(self, i: int) -> Service:
        """Start node ``i`` for the autoscaler, as the launcher starts its own."""
        assert self.handle
        svc = self._start(self._node(i))
        self.handle.services.append(svc)
        self._write_pids()
        return svc

    def _restart(self, name: str) -> None:
        """Start ``name`` again: the dataflow on the same address (the others keep its URL and
        retry), a trainer from its newest checkpoint, a node fresh."""
        assert self.handle
        if name == "dataflow":
            port = int(self.handle.url.rsplit(":", 1)[1].split("/")[0])
            svc = self._dataflow(port)
        elif name.startswith("trainer-"):
            svc = self._trainer(trainer_service_policy(name), resume=True)
        else:
            self._retire_node(name)
            svc = self._node(int(name.removeprefix("node-")), replace=True)
        started = self._start(svc)  # (the Ray launcher's is another object than svc)
        self.handle.services = [s for s in self.handle.services if s.name != name] + [started]
        self.restart_log.write("restart", name, pid=started.pid, restarts=self.restarts.used[name])
        self._write_pids()

    def _retire_node(self, name: str) -> None:
        """Deregister a crashed node's registration (as the run's admin) before its successor
        starts: the new process lacks the old one's node key, so its ``--replace`` cannot retire
        it, and the dead node would hold its leases until they time out. Best effort: a
        registration left behind still leaves at its lease timeout."""
        try:
            st = self.status()
            for node in st.nodes if st is not None else []:
                if node.name == name and node.state != "left":
                    self.dataflow().deregister(node.id)
        except DataflowClientError:
            pass

    def _write_pids(self) -> None:
        """Record child PIDs so tools (and tests) can check that nothing outlives the run."""
        assert self.handle
        pids = {s.name: s.pid for s in self.handle.services}
        (self.run_dir / "pids.json").write_text(json.dumps(pids))

    def _wait_for_url(self, url_file: Path, svc: Service) -> str:
        deadline = time.time() + self.startup_timeout_s
        while time.time() < deadline:
            if url_file.exists() and url_file.read_text().strip():
                return url_file.read_text().strip()
            if not svc.alive():
                raise LaunchError(f"dataflow service exited during start-up:\n{svc.tail()}")
            time.sleep(0.1)
        raise LaunchError(
            f"dataflow service did not report its URL within {self.startup_timeout_s:.0f}s"
        )

    def _wait_healthy(self, url: str, svc: Service) -> None:
        deadline = time.time() + self.startup_timeout_s
        while time.time() < deadline:
            try:
                self.dataflow().healthz()
                return
            except DataflowClientError:
                pass
            if not svc.alive():
                raise LaunchError(f"dataflow service exited during start-up:\n{svc.tail()}")
            time.sleep(0.2)
        raise LaunchError(
            f"dataflow service at {url} not healthy within {self.startup_timeout_s:.0f}s"
        )

    def dataflow(self) -> SyncDataflowClient:
        """The launcher's client of the run's dataflow service (run secret, the run's CA). One
        attempt per call: the watch loop calls again anyway."""
        assert self.handle and self.security
        if self._client is None:
            self._client = SyncDataflowClient(
                self.handle.url,
                self.token,
                timeout=5.0,
                retries=0,
                ca_file=self.security.client_ca_file,
            )
        return self._client

    # ------------------------------------------------------------------ watch
    def status(self, wait_done_s: float = 0.0) -> DataflowStatus | None:
        """The service's status (None while it cannot be had); with ``wait_done_s``, answered as
        soon as the run is done."""
        assert self.handle
        try:
            return self.dataflow().status(wait_done_s)
        except DataflowClientError:
            return None

    def wait(
        self,
        on_status: Callable[[DataflowStatus | None, list[Service]], None] | None = None,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> str:
        """Block until the run is done. Returns 'done', 'failed:<service>', 'timeout' or
        'stalled' (no training progress while every episode fails or every group is dropped;
        :attr:`stall` says why, see :mod:`astraflow.launch.stall`).

        A service that crashes is restarted (see :mod:`astraflow.launch.supervision`); the run
        fails only when one crashes more often than ``run.max_restarts``."""
        assert self.handle
        start = time.time()
        trained_at: float | None = None
        watch = StallWatch(self.recipe.run.stall_s, first_transcript=self.first_transcript)
        while True:
            st = self.status()
            if self.tracker is not None:
                self.tracker.poll()
            if on_status:
                on_status(st, self.handle.services)
            self.stall = watch.check(st, time.time())
            if self.stall is not None:
                return "stalled"
            failed = self._supervise(trained_at is not None)
            if failed:
                return f"failed:{failed}"
            if self.scaler is not None and trained_at is None:
                self.scaler.step(st, self.handle.by_prefix("node-"), set(self.restarts.due))
            trainers = self.handle.by_prefix("trainer-")
            trained = all(t.returncode() == 0 for t in trainers)
            if trained and trained_at is None:
                trained_at = time.time()
            nodes = self.handle.by_prefix("node-")
            # Training is over once the trainers exit; the run is over once the final evaluations
            # ran too (the service then says done and the nodes leave), or after a grace period.
            if trained and ((st and st.done) or (nodes and all(not n.alive() for n in nodes))):
                return "done"
            if trained_at is not None and time.time() - trained_at > self.eval_grace_s:
                return "done"
            if timeout_s is not None and time.time() - start > timeout_s:
                return "timeout"
            due = self.restarts.next_due()
            pause = poll_s
            if due is not None:
                pause = max(0.05, min(pause, due - time.monotonic()))
            if self.scaler is not None:
                pause = max(0.05, min(pause, self.scaler.next_at - time.monotonic()))
            self._pause(st, trainers, pause)

    def first_transcript(self) -> str | None:
        """One kept episode as a line (``'prompt' -> 'answer'``), for the stall message."""
        from astraflow.launch.transcripts import Decoders
        from astraflow.protocol.transcripts import short

        try:
            records = self.dataflow().transcripts(failed=False, limit=1).transcripts
        except DataflowClientError:
            return None
        if not records:
            return None
        return short(Decoders(self.recipe).decode(records[0]).turns)

    def _supervise(self, trained: bool) -> str | None:
        """Schedule restarts of crashed services and start those due; the name of a service
        whose restart budget is spent, if any. The dataflow exiting at all before the run ends is
        a crash; after training, a node that dies is not replaced (there is nothing left to do)."""
        assert self.handle
        now = time.monotonic()
        for svc in self.handle.services:
            rc = svc.returncode()
            if rc is None or svc.name in self.restarts.due:
                continue
            if rc == 0 and svc.name != "dataflow":
                continue
            if self.scaler is not None and svc.name in self.scaler.retired:
                continue  # asked to leave by the autoscaler: never restarted
            if trained and svc.name.startswith("node-"):
                continue
            self.restart_log.write("crash", svc.name, returncode=rc, pid=svc.pid)
            if not self.restarts.schedule(svc.name, now):
                return svc.name
        for name in self.restarts.ready(now):
            self._restart(name)
        return None

    def _pause(self, st: DataflowStatus | None, trainers: list[Service], poll_s: float) -> None:
        """Until the next thing that can end the run, at most ``poll_s`` (the live view's refresh
        and the crash checks run at least that often). Before the service says done, that is a
        long poll it answers the moment the run is done; after, the trainers' exits (a process
        wait, not a timer)."""
        alive = [t for t in trainers if t.alive() and t.proc is not None]
        if not (st and st.done):
            t0 = time.time()
            if self.status(wait_done_s=poll_s) is None:  # service unreachable: plain pause
                time.sleep(max(0.0, poll_s - (time.time() - t0)))
        elif alive:
            try:
                alive[0].proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(poll_s)  # done, trainers gone: waiting on the grace period or the nodes

    # ------------------------------------------------------------------ stop
    def stop(self, interrupted: bool = False) -> dict[str, int | None]:
        """Stop in dependency order: nodes, trainers, then the dataflow service (each with
        SIGTERM, all of one kind at once, SIGKILL only past a timeout); then forward the last
        metrics records to the trackers and close them. ``interrupted`` (Ctrl-C): nodes release
        their in-flight leases at once instead of finishing them (a second SIGTERM), so the run
        stops in seconds; acknowledged work is durable either way."""
        codes: dict[str, int | None] = {}
        if self.handle:
            for prefix, timeout in (("node-", 30.0), ("trainer-", 20.0), ("dataflow", 20.0)):
                phase = self.handle.by_prefix(prefix)
                for svc in phase:
                    svc.terminate()
                if interrupted and prefix == "node-":
                    time.sleep(0.2)  # let each node install its drain before the second signal
                    for svc in phase:
                        svc.terminate()
                for svc in phase:
                    codes[svc.name] = svc.wait_stopped(timeout)
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        if self._client is not None:
            self._client.close()
            self._client = None
        return codes


def prepare_run(recipe_path: Path, overrides: list[str], resume: bool) -> tuple[Recipe, Path]:
    """Resolve the recipe and run directory; ``resume`` reuses the run's saved recipe."""
    recipe = load_recipe(recipe_path, overrides)
    base = recipe.run.run_dir
    if resume:
        if not (base / "recipe.toml").exists():
            raise LaunchError(f"--resume: no run to resume at {base} (no recipe.toml there)")
        saved = load_recipe(base / "recipe.toml", overrides)
        return saved, base
    run_dir = next_free_run_dir(base)
    if run_dir != base:
        recipe = recipe.model_copy(
            update={"run": recipe.run.model_copy(update={"name": run_dir.name})}
        )
    return recipe, run_dir


def install_sigint(launcher: LocalLauncher) -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
