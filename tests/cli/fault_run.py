"""Run ``digenrl`` with a signal sent to the process itself inside a step (fault injection, no timing).

    python fault_run.py SIGNAL@STEP[xN] digenrl-args...          (colocated loop)
    python fault_run.py SIGNAL@publishV[xN] digenrl-args...      (Ray runtime)

Colocated: while step STEP (0-based) trains its first group (its transaction is open, gradients half
accumulated), the process sends itself SIGNAL (KILL, TERM, INT) N times (default 1), then goes on as the
signal lets it. Ray runtime: the controller process does the same when it starts publishing version V.
"""

import os
import signal
import sys

import torch

torch.set_num_threads(1)


def main() -> int:
    spec, argv = sys.argv[1], sys.argv[2:]
    name, rest = spec.split("@")
    step, _, times = rest.partition("x")
    sig, n = getattr(signal, f"SIG{name}"), int(times or 1)
    if step.startswith("publish"):
        from digenrl.runtime.cluster import ActorPools as Pools

        publish_refs, version = Pools.publish_refs, int(step[len("publish"):])

        def faulty_publish(self, v):
            if v == version:
                for _ in range(n):
                    os.kill(os.getpid(), sig)
            return publish_refs(self, v)

        Pools.publish_refs = faulty_publish
        from digenrl.cli import main as cli

        return cli(argv)
    at = int(step)
    from digenrl.train import loop

    train_group = loop.train_group

    def faulty(policy, group, **kw):
        tx_step = kw["record"].__self__.step
        if tx_step == at and not getattr(faulty, "sent", False):
            faulty.sent = True
            for _ in range(n):
                os.kill(os.getpid(), sig)
        return train_group(policy, group, **kw)

    loop.train_group = faulty
    from digenrl.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
