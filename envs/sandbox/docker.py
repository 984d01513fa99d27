"""The ``docker`` backend: one throwaway container per run, from our locally built image.

Each container has no network (``network_mode="none"``), a read-only root, tmpfs ``/tmp`` and
``/work``, memory (swap included), pids and CPU limits, the ``nobody`` uid, an init process
(``--init``) that reaps zombies, every capability dropped and ``no-new-privileges``. The wall clock
is enforced from here with ``kill``; the container is removed whatever happens.

Files and stdin reach the container through environment variables read by a tiny boot script
(``python3 -I -c BOOT``) that writes them into the tmpfs work dir and then ``exec``s the command:
``put_archive`` cannot write into a read-only root or a tmpfs that exists only once started.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Mapping

from astraflow.envs.sandbox.base import (
    SANDBOX_WORKDIR,
    Limits,
    RunResult,
    Sandbox,
    SandboxError,
    prepare_run,
)
from astraflow.envs.sandbox.image import IMAGE, docker_client, image_exists

LABEL = "astraflow.sandbox"
#: Seconds to wait for an engine to answer a ping (selection must stay fast when none runs).
PING_TIMEOUT_S = 3
#: Seconds for ordinary API calls (create, kill, remove) on a busy engine.
API_TIMEOUT_S = 60
#: Largest payload (files + stdin, base64) passed through the environment.
MAX_PAYLOAD = 1_500_000
CHUNK = 100_000
BOOT = r"""
import base64, json, os
n = int(os.environ.pop("AF_CHUNKS"))
data = json.loads(base64.b64decode("".join(os.environ.pop(f"AF_P{i}") for i in range(n))))
for name, b64 in data["files"].items():
    path = os.path.join("/work", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(base64.b64decode(b64))
with open("/tmp/.stdin", "wb") as fh:
    fh.write(base64.b64decode(data["stdin"]))
fd = os.open("/tmp/.stdin", os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
os.remove("/tmp/.stdin")
os.execvp(data["argv"][0], data["argv"])
"""


def _payload_env(files: dict[str, bytes], stdin: bytes, argv: list[str]) -> dict[str, str]:
    doc = {
        "files": {k: base64.b64encode(v).decode() for k, v in files.items()},
        "stdin": base64.b64encode(stdin).decode(),
        "argv": argv,
    }
    blob = base64.b64encode(json.dumps(doc).encode()).decode()
    if len(blob) > MAX_PAYLOAD:
        raise ValueError(
            f"sandbox payload is {len(blob)} bytes encoded; the docker backend accepts "
            f"at most {MAX_PAYLOAD}"
        )
    chunks = [blob[i : i + CHUNK] for i in range(0, len(blob), CHUNK)] or [""]
    env = {f"AF_P{i}": c for i, c in enumerate(chunks)}
    env["AF_CHUNKS"] = str(len(chunks))
    return env


class DockerSandbox(Sandbox):
    name = "docker"
    isolated = True

    def __init__(self, image: str = IMAGE, client=None):
        try:
            probe = client or docker_client(timeout=PING_TIMEOUT_S)
            probe.ping()
            if client is None:
                probe.close()
            self.client = client or docker_client(timeout=API_TIMEOUT_S)
        except Exception as exc:  # docker raises several unrelated types when no engine answers
            raise SandboxError(f"no Docker engine answers ({type(exc).__name__}: {exc})") from exc
        if not image_exists(self.client, image):
            raise SandboxError(
                f"Docker image {image!r} is missing; build it with "
                "`astraflow envs build-sandbox-image` (no registry is reachable)"
            )
        self.image = image

    def close(self) -> None:
        super().close()  # running containers are killed first (their runs poll the abort event)
        self.client.close()

    def run(
        self,
        program: str | None = None,
        *,
        files: Mapping[str, str | bytes] | None = None,
        command: list[str] | None = None,
        stdin: str | bytes = b"",
        limits: Limits | None = None,
    ) -> RunResult:
        import docker.errors

        req = prepare_run(program, files, command, stdin, limits)
        limits = req.limits
        environment = {
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            "HOME": SANDBOX_WORKDIR,
            **_payload_env(req.files, req.stdin, req.argv),
        }
        fsize = limits.file_size_mb * 1024 * 1024
        work_mb = max(limits.file_size_mb * 4, 16)
        # Registered before the container exists: a close() while it is being created (a second
        # or more on a busy engine) finds the run and kills the container once it starts.
        abort = self.begin_run()
        try:
            container = self._create(req, limits, environment, fsize, work_mb)
        except BaseException:
            self.end_run(abort)
            raise
        try:
            return self._run_container(container, limits, abort)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the sandbox container failed to run: {exc}") from exc
        finally:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException:
                time.sleep(0.2)
                container.remove(force=True)
            finally:
                self.end_run(abort)

    def _create(self, req, limits: Limits, environment: dict[str, str], fsize: int, work_mb: int):
        import docker.errors
        from docker.types import Ulimit

        try:
            return self.client.containers.create(
                self.image,
                command=["python3", "-I", "-c", BOOT],
                environment=environment,
                working_dir=SANDBOX_WORKDIR,
                user="65534:65534",
                network_mode="none",
                read_only=True,
                tmpfs={
                    "/tmp": "rw,nosuid,nodev,size=16m,mode=1777",
                    SANDBOX_WORKDIR: f"rw,nosuid,nodev,exec,size={work_mb}m,mode=1777",
                },
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",
                pids_limit=limits.pids,
                nano_cpus=int(limits.cpus * 1e9),
                init=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                ulimits=[
                    Ulimit(name="fsize", soft=fsize, hard=fsize),
                    Ulimit(name="nofile", soft=256, hard=256),
                    Ulimit(name="core", soft=0, hard=0),
                ],
                ipc_mode="private",
                log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
                labels={LABEL: "1"},
                hostname="sandbox",
                detach=True,
            )
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not create a sandbox container: {exc}") from exc

    def _run_container(self, container, limits: Limits, abort: threading.Event) -> RunResult:
        import docker.errors

        if abort.is_set():  # closed while the container was being created: never start it
            return RunResult(
                exit_code=None, stdout="", stderr="", killed_reason="closed", backend=self.name,
                details={"container": container.short_id, "image": self.image},
            )  # fmt: skip
        cap = limits.output_bytes
        bufs = {1: bytearray(), 2: bytearray()}
        truncated = {1: False, 2: False}
        overflow = threading.Event()
        stream = container.attach(stdout=True, stderr=True, stream=True, demux=True, logs=True)

        def _drain() -> None:
            try:
                for out, err in stream:
                    for fd, chunk in ((1, out), (2, err)):
                        if not chunk:
                            continue
                        room = cap - len(bufs[fd])
                        if room > 0:
                            bufs[fd] += chunk[:room]
                        if len(chunk) > room:
                            truncated[fd] = True
                            overflow.set()
            except Exception:  # the stream ends abruptly when the container is killed
                pass

        reader = threading.Thread(target=_drain, daemon=True)
        reader.start()
        start = time.monotonic()
        container.start()
        deadline = start + limits.wall_time_s
        reason: str | None = None
        timed_out = False
        while True:
            container.reload()
            if container.status not in ("created", "running"):
                break
            if overflow.is_set():
                reason = "output_limit"
                break
            if abort.is_set():  # the sandbox is being closed (e.g. an env call timed out)
                reason = "closed"
                break
            if time.monotonic() >= deadline:
                timed_out, reason = True, "timeout"
                break
            time.sleep(0.02)
        if reason is not None:
            try:
                container.kill()
            except docker.errors.APIError:
                pass
        state = container.wait(timeout=30)
        duration = time.monotonic() - start
        reader.join(2.0)
        try:
            stream.close()
        except Exception:
            pass
        container.reload()
        info = container.attrs.get("State", {})
        oom = bool(info.get("OOMKilled"))
        code = state.get("StatusCode")
        if oom and reason is None:
            reason = "oom"
        elif reason is None and code is not None and code > 128:
            import signal

            try:
                reason = f"signal:{signal.Signals(code - 128).name}"
            except ValueError:
                pass
        stderr = bufs[2].decode("utf-8", errors="replace")
        if "MemoryError" in stderr[-4000:]:
            oom = True
        return RunResult(
            exit_code=code,
            stdout=bufs[1].decode("utf-8", errors="replace")
            + ("\n[... output truncated ...]" if truncated[1] else ""),
            stderr=stderr + ("\n[... output truncated ...]" if truncated[2] else ""),
            timed_out=timed_out,
            oom=oom,
            killed_reason=reason,
            duration_s=duration,
            backend=self.name,
            stdout_truncated=truncated[1],
            stderr_truncated=truncated[2],
            details={"container": container.short_id, "image": self.image},
        )
