"""Network namespaces, an emulated WAN link and TCP relays for the cross-region benchmark.

Why a packet-level link rather than a TCP proxy: a proxy that delays and drops *chunks* of a byte
stream terminates TCP at both ends, so the kernel's congestion control never sees the 100 ms RTT nor
a single lost segment, and a "lossy" transfer runs at full speed. Here the link between the home
(root) namespace and a region namespace is a pair of TUN devices with this module's ``wan`` process
between them (the kernel has no netem): every IP packet read from one side is written to the other
after the one-way delay (RTT / 2), or dropped with the loss probability (independent per packet and
direction), or dropped while the link is partitioned. Bandwidth is a ``tbf`` qdisc on each TUN
device's egress (both directions). So real kernel TCP (the host's congestion control, e.g. BBR or
CUBIC) runs end to end over real delay, loss and a real bottleneck, and retransmits, stalls and
recovers as it would across a WAN. The ``wan`` process counts the IP bytes it carries per
root-side TCP port and direction, and appends cumulative counters to a JSON-lines file.

Topology made by :class:`RemoteRegion` (names carry the bench's PID; every namespace, device and
process is removed on exit, also on failure)::

    root ns (home: dataflow, trainer, local nodes)          region ns R            nat ns N
    10.A.B.1 tunH ==[wan: delay, loss, partition]== tunR 10.A.B.2
                      + tbf rate on tunH and tunR            10.A.C.1 vethR ---- vethN 10.A.C.2

The NAT-like namespace N has no route to anything but R's veth subnet, R does not forward, and the
root namespace has no route to N at all: nothing outside R can open a connection into N. A node in N
reaches the home services only through a TCP relay in R (``relay`` sub-command), which is what a
NAT gateway gives a host at the TCP level: its connections leave from the gateway's address.

Commands (``python bench/_netns.py wan|relay ...``) run as child processes of the bench, in
the namespace they serve (``ip netns exec``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


# ----------------------------------------------------------------------------- availability


def unavailable_reason() -> str | None:
    """Why namespaces and the emulated link cannot be made here (None when they can)."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or in CI)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if shutil.which("tc") is None:
        return "iproute2's `tc` is not installed (apt-get install iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no TUN support for the emulated link)"
    probe = f"afprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return done


# ----------------------------------------------------------------------------- the WAN link


def _setns(path: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def _port_of(pkt: bytes, which: str) -> int | None:
    """Source or destination port of an IPv4 TCP/UDP packet (None for anything else)."""
    if len(pkt) < 20 or pkt[0] >> 4 != 4 or pkt[9] not in (6, 17):
        return None
    ihl = (pkt[0] & 0x0F) * 4
    off = ihl if which == "src" else ihl + 2
    if len(pkt) < off + 2:
        return None
    return int.from_bytes(pkt[off : off + 2], "big")


def wan_main(args: argparse.Namespace) -> None:
    """Bridge TUN ``home`` (this namespace) and TUN ``far`` (namespace ``--ns``)."""
    own = "/proc/self/ns/net"
    home_fd = _open_tun(args.home)
    own_ns = os.open(own, os.O_RDONLY)
    _setns(f"/var/run/netns/{args.ns}")
    far_fd = _open_tun(args.far)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.setns(own_ns, CLONE_NEWNET)
    os.close(own_ns)

    rng = random.Random(args.seed)
    delay = args.delay_ms / 1000.0
    state = {"partitioned": False}
    counters: dict[str, dict[str, int]] = {"down": {}, "up": {}}
    drops = {"loss": 0, "partition": 0}
    packets = {"down": 0, "up": 0}
    stats = open(args.stats, "a", buffering=1) if args.stats else None

    def record(event: str | None = None) -> None:
        if stats is None:
            return
        line = {"t": time.time(), "down": counters["down"], "up": counters["up"],
                "drops": drops, "packets": packets, "partitioned": state["partitioned"]}  # fmt: skip
        if event:
            line["event"] = event
        stats.write(json.dumps(line) + "\n")

    loop = asyncio.new_event_loop()

    def pump(src: int, dst: int, direction: str, port_side: str) -> None:
        # "down" = home -> region (the home side's port is the source), "up" = the reverse
        while True:
            try:
                pkt = os.read(src, 65535)
            except BlockingIOError:
                return
            except OSError:
                return
            if state["partitioned"]:
                drops["partition"] += 1
                continue
            if args.loss > 0 and rng.random() < args.loss:
                drops["loss"] += 1
                continue
            packets[direction] += 1
            port = str(_port_of(pkt, port_side))  # the home side's port: which service
            bucket = counters[direction]
            bucket[port] = bucket.get(port, 0) + len(pkt)
            loop.call_later(delay, _write, dst, pkt)

    def _write(fd: int, pkt: bytes) -> None:
        try:
            os.write(fd, pkt)
        except OSError:
            pass  # the far side's device is not up yet or is gone: a lost packet

    def partition(on: bool) -> None:
        state["partitioned"] = on
        record("partition" if on else "heal")

    def tick() -> None:
        record()
        loop.call_later(args.stats_every, tick)

    loop.add_reader(home_fd, pump, home_fd, far_fd, "down", "src")
    loop.add_reader(far_fd, pump, far_fd, home_fd, "up", "dst")
    loop.add_signal_handler(signal.SIGUSR1, partition, True)
    loop.add_signal_handler(signal.SIGUSR2, partition, False)
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    loop.add_signal_handler(signal.SIGINT, loop.stop)
    loop.call_soon(tick)
    print("ready", flush=True)
    try:
        loop.run_forever()
    finally:
        record("stop")
        os.close(home_fd)
        os.close(far_fd)


# ----------------------------------------------------------------------------- TCP relay


async def _relay_pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def relay_main(args: argparse.Namespace) -> None:
    """Accept on ``--listen HOST:PORT``; connect each client to ``--to HOST:PORT``; copy bytes."""
    lhost, lport = args.listen.rsplit(":", 1)
    thost, tport = args.to.rsplit(":", 1)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(thost, int(tport))
        except OSError:
            cw.close()
            return
        await asyncio.gather(_relay_pipe(cr, uw), _relay_pipe(ur, cw))

    async def main() -> None:
        server = await asyncio.start_server(handle, lhost, int(lport), reuse_address=True)
        port = server.sockets[0].getsockname()[1]
        print(f"ready {port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()

    asyncio.run(main())


# ----------------------------------------------------------------------------- orchestration


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(
    argv: list[str], log: Path, ns: str | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """A child in its own session (dies with this process), output to ``log``, optionally inside
    namespace ``ns``."""
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else argv
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb", buffering=0) as fh:
        return subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=REPO_ROOT, start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Stop one child we started, by its PID: ``sig``, then SIGKILL after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(5)


def wait_ready(proc: subprocess.Popen, log: Path, timeout: float = 20.0) -> str:
    """The ``ready ...`` line a ``wan``/``relay`` child prints once it works."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        for line in text.splitlines():
            if line.startswith("ready"):
                return line
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited ({proc.returncode}):\n{text[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args} not ready within {timeout:.0f}s")


@dataclass
class LinkSpec:
    rtt_ms: float = 100.0
    rate_mbit: float = 50.0
    loss: float = 0.01
    seed: int = 0


@dataclass
class RemoteRegion:
    """A region namespace behind an emulated WAN link, plus a NAT-like namespace inside it.

    Use as a context manager; :meth:`counters` and :func:`bytes_between` read the link's byte
    counters (per home-side TCP port, so per service)."""

    workdir: Path
    link: LinkSpec = field(default_factory=LinkSpec)
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")

    def __post_init__(self) -> None:
        # 10.<200-249>.<b>.x, b from the PID: distinct runs on one machine do not collide
        n = os.getpid()
        a, b = 200 + n % 50, (n // 50) % 127 * 2
        self.home_ip, self.region_ip = f"10.{a}.{b}.1", f"10.{a}.{b}.2"
        self.gw_ip, self.nat_ip = f"10.{a}.{b + 1}.1", f"10.{a}.{b + 1}.2"
        self.ns, self.nat_ns = f"afreg{self.tag}", f"afnat{self.tag}"
        self.tun_home, self.tun_far = f"afwh{self.tag}", f"afwr{self.tag}"
        self.veth_gw, self.veth_nat = f"afvg{self.tag}", f"afvn{self.tag}"
        self.nat_subnet = f"10.{a}.{b + 1}.0/24"
        self._routes: list[str] = []
        self.stats_path = self.workdir / "wan.jsonl"
        self.wan: subprocess.Popen | None = None
        self.procs: list[subprocess.Popen] = []

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> RemoteRegion:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stats_path.unlink(missing_ok=True)
        # Nothing in the home namespace may reach the NAT-like namespace, and no test packet may
        # leave through the host's default route: an explicit "unreachable" route for its subnet.
        sh("ip", "route", "add", "unreachable", self.nat_subnet)
        self._routes.append(self.nat_subnet)
        for ns in (self.ns, self.nat_ns):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
            sh("sysctl", "-qw", "net.ipv4.ip_forward=0", ns=ns)
        # the NAT-like namespace: a veth to the region, a route to that subnet only
        sh("ip", "link", "add", self.veth_gw, "netns", self.ns, "type", "veth",
           "peer", "name", self.veth_nat, "netns", self.nat_ns)  # fmt: skip
        sh("ip", "addr", "add", f"{self.gw_ip}/24", "dev", self.veth_gw, ns=self.ns)
        sh("ip", "addr", "add", f"{self.nat_ip}/24", "dev", self.veth_nat, ns=self.nat_ns)
        sh("ip", "link", "set", self.veth_gw, "up", ns=self.ns)
        sh("ip", "link", "set", self.veth_nat, "up", ns=self.nat_ns)
        # the WAN: two TUN devices bridged by the wan process
        argv = [sys.executable, __file__, "wan", "--ns", self.ns, "--home", self.tun_home,
                "--far", self.tun_far, "--delay-ms", str(self.link.rtt_ms / 2),
                "--loss", str(self.link.loss), "--seed", str(self.link.seed),
                "--stats", str(self.stats_path)]  # fmt: skip
        log = self.workdir / "wan.log"
        self.wan = spawn(argv, log)
        wait_ready(self.wan, log)
        rate = f"{self.link.rate_mbit}mbit"
        for dev, ip, peer, ns in ((self.tun_home, self.home_ip, self.region_ip, None),
                                  (self.tun_far, self.region_ip, self.home_ip, self.ns)):  # fmt: skip
            sh("ip", "addr", "add", ip, "peer", peer, "dev", dev, ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)
            # a bottleneck queue of about one bandwidth-delay product
            sh("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kb",
               "latency", f"{max(20, int(self.link.rtt_ms))}ms", ns=ns)  # fmt: skip

    def close(self) -> None:
        for p in reversed(self.procs):
            stop(p, timeout=5)
        self.procs.clear()
        stop(self.wan, timeout=5)
        for ns in (self.nat_ns, self.ns):
            sh("ip", "netns", "del", ns, check=False)
        for route in self._routes:
            sh("ip", "route", "del", "unreachable", route, check=False)
        self._routes.clear()
        # TUN devices vanish with the wan process; a veth with its namespace

    # -------------------------------------------------------------- use
    def start(self, name: str, argv: list[str], ns: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen:  # fmt: skip
        """A child process in ``ns`` (default: the region), stopped when the region closes."""
        proc = spawn(argv, self.workdir / "logs" / f"{name}.log", ns or self.ns, env)
        self.procs.append(proc)
        return proc

    def relay(self, name: str, listen: str, to: str, ns: str | None = None) -> int:
        """A TCP relay ``listen`` -> ``to`` in ``ns`` ("" = root namespace); returns its port."""
        argv = [sys.executable, __file__, "relay", "--listen", listen, "--to", to]
        log = self.workdir / "logs" / f"{name}.log"
        proc = spawn(argv, log, ns if ns is not None else self.ns)
        self.procs.append(proc)
        return int(wait_ready(proc, log).split()[1])

    def partition(self, on: bool) -> float:
        """Cut (``on``) or heal the WAN link; returns the time it happened."""
        assert self.wan is not None
        self.wan.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        return time.time()

    def counters(self) -> list[dict]:
        """The wan process's cumulative counters, one record per tick/event."""
        if not self.stats_path.exists():
            return []
        out = []
        for line in self.stats_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def qdisc_drops(self) -> dict[str, int]:
        """Packets the bottleneck queues dropped (tbf overflow) per device."""
        out = {}
        for dev, ns in ((self.tun_home, None), (self.tun_far, self.ns)):
            text = sh("tc", "-s", "qdisc", "show", "dev", dev, ns=ns, check=False).stdout
            for part in text.split("dropped")[1:2]:
                out[dev] = int(part.strip().split()[0].rstrip(","))
        return out


def bytes_between(records: list[dict], t0: float, t1: float, ports: set[int] | None = None) -> int:
    """IP bytes the link carried (both directions) between ``t0`` and ``t1``, to or from the
    home-side ``ports`` (every port when None). Counters are sampled every half second."""
    wanted = None if ports is None else {str(p) for p in ports}

    def total(r: dict) -> int:
        return sum(
            n
            for d in ("down", "up")
            for k, n in r.get(d, {}).items()
            if wanted is None or k in wanted
        )

    before = [r for r in records if r["t"] <= t0]
    upto = [r for r in records if r["t"] <= t1]
    start = total(before[-1]) if before else 0
    end = total(upto[-1]) if upto else 0
    return max(0, end - start)


@contextlib.contextmanager
def region_or_skip(workdir: Path, **kw) -> Iterator[RemoteRegion | str]:
    """The region, or the reason it cannot be made (for benches and tests that skip cleanly)."""
    reason = unavailable_reason()
    if reason:
        yield reason
        return
    with RemoteRegion(workdir, **kw) as region:
        yield region


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wan", help="bridge two TUN devices with delay, loss and partitions")
    w.add_argument("--ns", required=True)
    w.add_argument("--home", required=True)
    w.add_argument("--far", required=True)
    w.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay")
    w.add_argument("--loss", type=float, default=0.0, help="drop probability per packet")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--stats", default=None)
    w.add_argument("--stats-every", type=float, default=0.5)
    r = sub.add_parser("relay", help="TCP relay")
    r.add_argument("--listen", required=True)
    r.add_argument("--to", required=True)
    args = ap.parse_args()
    {"wan": wan_main, "relay": relay_main}[args.cmd](args)


if __name__ == "__main__":
    main()
