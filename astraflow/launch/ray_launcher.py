"""The Ray launcher: the services of a recipe as Ray actors placed across a cluster.

It is the local launcher with one thing changed: where a service's process runs. Each service
(the dataflow service, one trainer per trainable policy, the rollout nodes) is a Ray actor
(:class:`astraflow.launch.ray_actor.ServiceProcess`) that runs the same command line the local
launcher builds (``LocalLauncher._dataflow``, ``_trainer``, ``_node``: one function per kind of
service, shared), placed by the resources and node labels of the recipe's ``[ray]`` section. The
run directory, logs, metrics, live view, supervision (restart budget, ``restarts.jsonl``, the
trainer resuming from its checkpoint, the dataflow reopening its store on the same node and port)
and the stop order are the local launcher's. The run directory must be reachable at the same path
on every host of the cluster (a shared filesystem), as the services write their logs,
checkpoints and store there.

Ray is imported only here, when a recipe asks for it: the base install does not need it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraflow.launch.local import LaunchError, LocalLauncher, RunHandle
from astraflow.launch.processes import Service
from astraflow.launch.ray_actor import NODE_IP, PYTHON, ray_service_actor
from astraflow.launch.trainer_command import trainer_service_policy
from astraflow.recipe import Recipe
from astraflow.recipe.schema import RayPlacement

RAY_EXTRA_HINT = (
    'run.launcher = "ray" needs Ray, which is not installed: pip install "astraflow[ray]" '
    '(from a checkout: pip install -e ".[ray]")'
)
#: Exit code reported for a service whose actor died (killed, or its host lost).
ACTOR_DIED = -9
_WILDCARDS = ("0.0.0.0", "::", "")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
log = logging.getLogger(__name__)


def require_ray() -> Any:
    """The ``ray`` module, or a :class:`LaunchError` naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise LaunchError(RAY_EXTRA_HINT) from exc
    return ray


def actor_options(place: RayPlacement) -> dict[str, Any]:
    """Ray actor options for one service's placement (only what the recipe set)."""
    opts: dict[str, Any] = {}
    if place.num_cpus is not None:
        opts["num_cpus"] = place.num_cpus
    if place.num_gpus is not None:
        opts["num_gpus"] = place.num_gpus
    if place.memory_gb is not None:
        opts["memory"] = int(place.memory_gb * 2**30)
    if place.resources:
        opts["resources"] = dict(place.resources)
    if place.labels:
        opts["label_selector"] = dict(place.labels)
    return opts


def trainer_bundle(place: RayPlacement, processes: int) -> dict[str, float]:
    """The one placement-group bundle of a trainer with ``processes`` ranks.

    ``num_cpus``/``num_gpus``/``memory_gb`` of a trainer's placement are per rank; torchrun
    starts every rank on the actor's host (``--standalone``), so the ranks' resources form one
    bundle on one host. Custom resources mark a kind of host and are asked once."""
    bundle: dict[str, float] = {"CPU": (1.0 if place.num_cpus is None else place.num_cpus)}
    bundle["CPU"] *= processes
    if place.num_gpus:
        bundle["GPU"] = place.num_gpus * processes
    if place.memory_gb is not None:
        bundle["memory"] = float(int(place.memory_gb * 2**30) * processes)
    bundle.update(place.resources)
    return bundle


def bundle_actor_options(bundle: dict[str, float]) -> dict[str, Any]:
    """Actor options that take a whole bundle (the actor's process tree uses all of it)."""
    opts: dict[str, Any] = {"num_cpus": bundle["CPU"]}
    if "GPU" in bundle:
        opts["num_gpus"] = bundle["GPU"]
    if "memory" in bundle:
        opts["memory"] = int(bundle["memory"])
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
    if custom:
        opts["resources"] = custom
    return opts


@dataclass
class RayService:
    """A service running inside a Ray actor, with the interface of a local :class:`Service`
    (``alive``, ``returncode``, ``stop``, ``tail``), so supervision and the live view are shared."""

    name: str
    argv: list[str]
    log_path: Path
    actor: Any
    info: dict = field(default_factory=dict)
    proc: None = None  # no local process: the launcher's process waits do not apply
    started_at: float = field(default_factory=time.time)
    _code: int | None = None
    _exited: bool = False

    @property
    def pid(self) -> int | None:
        return self.info.get("pid")

    @property
    def actor_pid(self) -> int | None:
        return self.info.get("actor_pid")

    def returncode(self) -> int | None:
        if self._exited:
            return self._code
        import ray

        try:
            code = ray.get(self.actor.poll.remote(), timeout=30.0)
        except ray.exceptions.GetTimeoutError:
            return None  # busy or briefly unreachable: asked again on the next check
        except ray.exceptions.RayActorError:
            code = ACTOR_DIED
        if code is not None:
            self._exited, self._code = True, code
        return code

    def alive(self) -> bool:
        return self.returncode() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """The process stopped as locally (SIGTERM, wait, SIGKILL its group), then the actor."""
        import ray

        code = self._code
        if not self._exited:
            try:
                code = ray.get(self.actor.stop.remote(timeout), timeout=timeout + 15.0)
            except ray.exceptions.RayActorError:
                code = ACTOR_DIED
            except ray.exceptions.GetTimeoutError:
                code = None
            self._exited, self._code = True, code
        self.release()
        return code

    def terminate(self) -> None:
        """(The actor's stop both signals and waits: :meth:`wait_stopped` does it all.)"""

    def wait_stopped(self, timeout: float = 20.0) -> int | None:
        return self.stop(timeout)

    def drain(self) -> None:
        """A rollout node asked to leave by the autoscaler: one SIGTERM to its process on its
        host, not awaited (the actor stays free to answer :meth:`returncode`)."""
        import ray

        try:
            self.actor.drain.remote()
        except ray.exceptions.RayActorError:
            pass

    def release(self) -> None:
        """Kill the actor (and with it anything its process left)."""
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            pass

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class RayLauncher(LocalLauncher):
    """``run.launcher = "ray"``: :class:`LocalLauncher` whose services are Ray actors."""

    def __init__(self, recipe: Recipe, run_dir: Path, resume: bool = False, **kw: Any):
        super().__init__(recipe, run_dir, resume=resume, **kw)
        self.ray = require_ray()
        self._actor_cls: Any = None
        self._started_cluster = False
        self.cluster_address = ""
        #: placement groups of multi-process trainers, by service name: kept across restarts,
        #: so a restarted trainer finds its devices reserved on the same host
        self._groups: dict[str, Any] = {}

    # ------------------------------------------------------------------ cluster
    def connect(self) -> None:
        """Join ``run.ray_address`` ("" starts a local cluster, stopped with the run)."""
        if self.ray.is_initialized():
            return
        address = self.recipe.run.ray_address or "local"
        try:
            ctx = self.ray.init(
                address=address,
                namespace=self.recipe.ray.namespace,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="warning",
                configure_logging=True,
                runtime_env={"env_vars": self._python_path_env()},
            )
        except Exception as exc:  # ConnectionError, a bad address, a version mismatch
            raise LaunchError(
                f"run.ray_address = {self.recipe.run.ray_address!r}: could not join the Ray "
                f"cluster: {exc}"
            ) from exc
        self._started_cluster = address == "local"
        self.cluster_address = getattr(ctx, "address_info", {}).get("gcs_address", address)
        self._actor_cls = ray_service_actor()

    @staticmethod
    def _python_path_env() -> dict[str, str]:
        """This checkout first on the actors' ``PYTHONPATH``, so they run the same code."""
        root = str(Path(__file__).resolve().parents[2])
        parts = [root, *[p for p in os.environ.get("PYTHONPATH", "").split(":") if p]]
        return {"PYTHONPATH": ":".join(dict.fromkeys(parts))}

    def start(self) -> RunHandle:
        self.make_plan()  # an over-subscribed plan fails before a cluster is joined or started
        self.connect()
        return super().start()

    # ------------------------------------------------------------------ services
    def _placement(self, name: str) -> RayPlacement:
        ray_cfg = self.recipe.ray
        if name == "dataflow":
            return ray_cfg.dataflow
        if name.startswith("trainer-"):
            return ray_cfg.trainer_for(trainer_service_policy(name))
        return ray_cfg.node_for(int(name.removeprefix("node-")))

    def _start(self, svc: Service) -> RayService:  # type: ignore[override]
        """Start ``svc``'s command in an actor placed as the recipe asks."""
        role = "dataflow" if svc.name == "dataflow" else svc.name.split("-", 1)[0]
        # the plan's CUDA_VISIBLE_DEVICES of a GPU service is RAY_GPUS: the actor fills in the
        # GPUs Ray reserved for it (ray_actor.ServiceProcess)
        env = self._service_env(svc.name)
        # only what the launcher sets travels; the host's own environment is the rest
        sent = {k: v for k, v in env.items() if os.environ.get(k) != v}
        sent.update(self._python_path_env())
        unset = [k for k in os.environ if k not in env]
        argv = [PYTHON if a == sys.executable else a for a in svc.argv]
        if role == "trainer" and self.recipe.dataflow.host not in _LOOPBACK:
            argv += ["--weights-host", NODE_IP]  # nodes fetch from the trainer's host
        opts = actor_options(self._placement(svc.name))
        if role == "trainer":
            opts = self._trainer_group_options(svc.name, opts)
        previous = self._previous(svc.name)
        if svc.name == "dataflow" and previous is not None and previous.info.get("node_id"):
            # back on the same host, so the URL every service holds stays valid
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                previous.info["node_id"], soft=False
            )
        if previous is not None:
            previous.release()
        actor = self._actor_cls.options(max_restarts=0, **opts).remote(
            svc.name, argv, str(svc.log_path), sent, unset
        )
        rs = RayService(svc.name, argv, svc.log_path, actor)
        try:
            rs.info = self.ray.get(actor.info.remote(), timeout=self.recipe.ray.startup_timeout_s)
        except self.ray.exceptions.GetTimeoutError as exc:
            rs.release()
            raise LaunchError(self._unplaceable(svc.name, opts)) from exc
        except self.ray.exceptions.RayActorError as exc:
            rs.release()
            raise LaunchError(f"{svc.name}: its Ray actor failed to start: {exc}") from exc
        return rs

    def _trainer_group_options(self, name: str, opts: dict[str, Any]) -> dict[str, Any]:
        """A trainer with several ranks runs in a placement group reserving all of them.

        Why a group rather than a bigger actor: the reservation outlives the actor, so when the
        trainer dies and is restarted (from its checkpoint) no other work can take its devices
        meanwhile, and it comes back on the same host."""
        policy = trainer_service_policy(name)
        processes = self.recipe.policies[policy].trainer.processes
        if processes <= 1:
            return opts
        from ray.util import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        place = self._placement(name)
        bundle = trainer_bundle(place, processes)
        group = self._groups.get(name)
        if group is None:
            group = placement_group(
                [bundle],
                strategy="STRICT_PACK",
                name=f"{self.recipe.run.name}-{name}",
                bundle_label_selector=[dict(place.labels)] if place.labels else None,
            )
            try:
                self.ray.get(group.ready(), timeout=self.recipe.ray.startup_timeout_s)
            except self.ray.exceptions.GetTimeoutError as exc:
                self._remove_group(name, group)
                raise LaunchError(
                    self._unplaceable(name, {"placement_group": [bundle], **opts})
                ) from exc
            self._groups[name] = group
        out = bundle_actor_options(bundle)
        out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0
        )
        return out

    def _remove_group(self, name: str, group: Any) -> None:
        from ray.util import remove_placement_group

        try:
            remove_placement_group(group)
        except Exception as exc:  # the cluster is going away anyway
            log.warning("could not remove the placement group of %s: %s", name, exc)
        self._groups.pop(name, None)

    def _previous(self, name: str) -> RayService | None:
        if self.handle is None:
            return None
        found = [s for s in self.handle.services if s.name == name]
        return found[0] if found and isinstance(found[0], RayService) else None

    def _unplaceable(self, name: str, opts: dict[str, Any]) -> str:
        asked = {k: v for k, v in opts.items() if k != "scheduling_strategy"} or "Ray defaults"
        nodes = [
            {"resources": n.get("Resources", {}), "labels": n.get("Labels", {})}
            for n in self.ray.nodes()
            if n.get("Alive")
        ]
        return (
            f"{name}: no node of the Ray cluster could take its actor within "
            f"{self.recipe.ray.startup_timeout_s:.0f}s (ray.startup_timeout_s). It asks for "
            f"{asked} (recipe [ray] section); the cluster's live nodes: {nodes}"
        )

    def _wait_for_url(self, url_file: Path, svc: Service) -> str:
        """The dataflow's URL; a wildcard bind address becomes its host's address."""
        url = super()._wait_for_url(url_file, svc)
        if self.recipe.dataflow.host in _WILDCARDS and isinstance(svc, RayService):
            scheme, rest = url.split("://", 1)
            port = rest.rsplit(":", 1)[1]
            url = f"{scheme}://{svc.info.get('node_ip', '127.0.0.1')}:{port}"
        return url

    def _write_pids(self) -> None:
        """``pids.json`` as locally (service processes) plus ``actors.json``: each service's
        actor process, host and Ray node, for people and for tests that kill an actor."""
        super()._write_pids()
        assert self.handle
        actors = {s.name: s.info for s in self.handle.services if isinstance(s, RayService)}
        (self.run_dir / "actors.json").write_text(json.dumps(actors))

    # ------------------------------------------------------------------ stop
    def stop(self, interrupted: bool = False) -> dict[str, int | None]:
        try:
            return super().stop(interrupted)
        finally:
            for name, group in list(self._groups.items()):
                self._remove_group(name, group)
            if self.ray.is_initialized():
                self.ray.shutdown()  # a cluster started for this run stops with it
