"""A private Ray cluster on loopback started with ``ray start`` (head + extra nodes), for the cluster tests.

Every node runs ``ray start --block`` in its own session with a private ``--temp-dir`` and explicit free ports,
and token authentication on (``RAY_AUTH_MODE=token`` + a random ``RAY_AUTH_TOKEN``, so no token file of this
machine is read or written). ``stop`` ends only what this object started: SIGTERM to each ``ray start``
process (which takes its node down), then SIGKILL to anything left in those sessions or still naming the temp
dir. ``ray stop`` is never used: it would take down every Ray instance of the machine.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def free_port_range(width: int) -> tuple[int, int]:
    """``width`` consecutive free ports (worker ports of one node)."""
    for _ in range(200):
        lo = secrets.randbelow(20000) + 30000
        try:
            socks = []
            for p in range(lo, lo + width):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return lo, lo + width - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class NodeExited(RuntimeError):
    """A ``ray start`` of the cluster exited while it came up."""


class LoopbackCluster:
    def __init__(self, num_cpus: int = 2):
        self.tmp = Path(tempfile.mkdtemp(prefix="dgr-ray-", dir="/tmp"))  # short: Ray's socket paths are limited
        self.token = secrets.token_hex(16)
        self.num_cpus = num_cpus
        self.procs: list[subprocess.Popen] = []
        self.address: str | None = None

    def client_env(self, with_token: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["HOME"] = str(self.tmp / "home")  # no ~/.ray/auth_token of this machine
        (self.tmp / "home").mkdir(exist_ok=True)
        if with_token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
        return env

    def _start(self, args: list[str]) -> None:
        ports = free_ports(8)
        lo, hi = free_port_range(40)
        cmd = [RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
               f"--num-cpus={self.num_cpus}", f"--object-manager-port={ports[0]}",
               f"--node-manager-port={ports[1]}", f"--dashboard-agent-listen-port={ports[2]}",
               f"--dashboard-agent-grpc-port={ports[3]}", f"--runtime-env-agent-port={ports[4]}",
               f"--metrics-export-port={ports[5]}", f"--min-worker-port={lo}", f"--max-worker-port={hi}",
               "--object-store-memory=200000000", *args]
        log = open(self.tmp / f"node{len(self.procs)}.log", "wb")
        self.procs.append(subprocess.Popen(cmd, env=self.client_env(), stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        return ports

    def start_head(self, resources: str = "{}") -> str:
        gcs, client, dash = free_ports(3)  # (the head runs a dashboard process even without the UI: own port)
        self._start([f"--resources={resources}", "--head", f"--port={gcs}", f"--ray-client-server-port={client}",
                     f"--dashboard-port={dash}", "--include-dashboard=false",
                     f"--temp-dir={self.tmp / 'ray'}"])
        self.address = f"127.0.0.1:{gcs}"
        return self.address

    def add_node(self, resources: str = "{}") -> None:
        self._start([f"--resources={resources}", f"--address={self.address}"])

    def wait_nodes(self, n: int, timeout_s: float = 300.0) -> None:
        """Block until ``n`` nodes are alive (checked from a client process with the token). On a loaded 2-core
        machine two ``ray start`` take minutes and a probe can hang while the head comes up: a probe that
        times out is retried until the deadline."""
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level=40, log_to_driver=False); "
                 "print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise NodeExited(f"ray start of node {i} exited with {p.returncode}; its log ends:\n"
                                     f"{self.log_tail(i)}")
            try:
                out = subprocess.run([sys.executable, "-c", probe, self.address], env=self.client_env(),
                                     capture_output=True, text=True, timeout=max(1.0, min(90.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                continue
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(1.0)
        raise TimeoutError(f"{n} Ray nodes not up after {timeout_s} s ({self.tmp})")

    def log_tail(self, i: int, chars: int = 3000) -> str:
        try:
            return (self.tmp / f"node{i}.log").read_text(errors="replace")[-chars:]
        except OSError as e:
            return f"(no log: {e})"

    @classmethod
    def started(cls, head: str, nodes: list[str], num_cpus: int = 2, attempts: int = 3) -> LoopbackCluster:
        """A cluster whose head (``head``: its resources) and extra nodes (``nodes``) are all alive. The head is
        up before a node joins it. The ports are probed free and then released, so another process can take one
        before Ray binds it: a ``ray start`` that exits while the cluster comes up is retried on fresh ports, up to
        ``attempts`` clusters (each failure's log tail is in the final error)."""
        errors = []
        for _ in range(attempts):
            c = cls(num_cpus=num_cpus)
            try:
                c.start_head(resources=head)
                c.wait_nodes(1)
                for r in nodes:
                    c.add_node(resources=r)
                c.wait_nodes(1 + len(nodes))
                return c
            except NodeExited as e:
                errors.append(str(e))
                c.stop()
            except BaseException:
                c.stop()
                raise
        raise RuntimeError(f"the loopback cluster did not come up in {attempts} attempts:\n" + "\n\n".join(errors))

    def leftovers(self) -> list[int]:
        """PIDs of live processes in this cluster's sessions or naming its temp dir."""
        import psutil

        sids = {p.pid for p in self.procs}
        out = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid == os.getpid():
                    continue
                mine = os.getsid(proc.pid) in sids or str(self.tmp) in " ".join(proc.info["cmdline"] or [])
                if mine and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc.pid)
            except (psutil.Error, ProcessLookupError):
                continue
        return out

    def stop(self) -> None:
        for p in reversed(self.procs):  # workers first, then the head
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
