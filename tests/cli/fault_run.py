"""Run ``digenrl`` with a signal sent to the process itself inside a step (fault injection, no timing).

    python fault_run.py SIGNAL@STEP[xN] digenrl-args...          (in-process: one colocated worker)
    python fault_run.py SIGNAL@publishV[xN] digenrl-args...      (Ray runtime)
    python fault_run.py SIGNAL@stopped[xN] digenrl-args...       (Ray runtime)
    python fault_run.py SIGNAL@write digenrl-args...             (Ray runtime)

In-process: while step STEP (0-based) trains its first chunk (its transaction is open, gradients half
accumulated), the process sends itself SIGNAL (KILL, TERM, INT) N times (default 1), then goes on as the
signal lets it. Ray runtime: the controller process does the same when it starts publishing version V; with
N > 1 it sends the first there and the others while the controller stops (checkpointing after the first).
``stopped``: the first once one of the process's descendants is stopped (a worker that SIGSTOPped itself,
``DIGENRL_TEST_HOOKS=inject_failure=<worker>@<step>:stall``), so the others arrive while that worker is still held.
``write``: the signal lands inside the first ``tqdm.write`` (a step line), in its ``get_lock`` before the lock is
taken: the handler's exception then breaks tqdm's ``finally``, which raises its own error over it.
"""

import os
import signal
import sys

import torch

torch.set_num_threads(1)


def _signal_when_stopped(sig, timeout_s: float = 120.0) -> None:
    """Send ``sig`` to this process once one of its descendants is stopped (state T in /proc)."""
    import time

    def stat(pid: str) -> list[str]:  # state, ppid, ...
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        procs = {}
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                procs[int(d)] = stat(d)
            except (OSError, IndexError):
                pass
        mine, grew = {os.getpid()}, True
        while grew:  # this process's descendants
            new = {p for p, st in procs.items() if int(st[1]) in mine} - mine
            mine, grew = mine | new, bool(new)
        if any(procs[pid][0] == "T" for pid in mine - {os.getpid()}):
            os.kill(os.getpid(), sig)
            return
        time.sleep(0.1)


def _signal_inside_tqdm_write(sig) -> None:
    """Send ``sig`` from inside the first ``tqdm.get_lock`` that ``tqdm.write`` calls; the handler runs there."""
    from tqdm import tqdm

    get_lock = tqdm.get_lock.__func__

    def signalled(cls):
        if sys._getframe(1).f_code.co_name == "external_write_mode" and not getattr(signalled, "sent", False):
            signalled.sent = True
            os.kill(os.getpid(), sig)  # (the handler runs at the next bytecode, before the lock exists)
        return get_lock(cls)

    tqdm.get_lock = classmethod(signalled)


def main() -> int:
    spec, argv = sys.argv[1], sys.argv[2:]
    name, rest = spec.split("@")
    step, _, times = rest.partition("x")
    sig, n = getattr(signal, f"SIG{name}"), int(times or 1)
    if step.startswith("publish") or step in ("stopped", "write"):
        if step == "write":
            _signal_inside_tqdm_write(sig)
        elif step == "stopped":
            import threading

            threading.Thread(target=_signal_when_stopped, args=(sig,), daemon=True).start()
        else:
            from digenrl.runtime.cluster import ActorPools as Pools

            publish_refs, version = Pools.publish_refs, int(step[len("publish"):])

            def faulty_publish(self, v):
                if v == version:
                    os.kill(os.getpid(), sig)  # (a handler that raises at once would stop a loop of several here)
                return publish_refs(self, v)

            Pools.publish_refs = faulty_publish
        if n > 1:
            from digenrl.runtime import driver

            on_stop = driver._Controller._checkpoint_on_stop

            def faulty_stop(self):
                for _ in range(n - 1):
                    os.kill(os.getpid(), sig)
                return on_stop(self)

            driver._Controller._checkpoint_on_stop = faulty_stop
        from digenrl.cli import main as cli

        return cli(argv)
    at = int(step)
    from digenrl.runtime.trainer import TrainerWorker

    train = TrainerWorker.train

    def faulty(self, chunk, *args):  # (in-process: the worker's call runs in this process)
        if chunk.step == at and not getattr(faulty, "sent", False):
            faulty.sent = True
            for _ in range(n):
                os.kill(os.getpid(), sig)
        return train(self, chunk, *args)

    TrainerWorker.train = faulty
    from digenrl.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
