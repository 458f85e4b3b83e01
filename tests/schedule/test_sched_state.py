"""State compression for the BTS memo: equal situations share an entry, different ones do not."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from digenrl.schedule import BTS, BTSConfig, Snapshot
from sched_helpers import LinCost, make_plan

COST = LinCost({"denoise": (0.0, 1.0), "train_chunk": (0.1, 0.1), "allreduce": (0.2, 0), "optimizer": (0.1, 0),
                "publish": (0.3, 0), "tag_switch": (0.2, 0)})
PLAN = make_plan("gap_tsp_tag", prompts=4, generations=4, fragment_size=2, S=2, T=2, cg=2, cs=1, n_gen=2,
                 n_train=3)
# Generate(2) = 2 * 1.0 * 2 = 4 s; quantum = 1/4 of the shortest op (Train(2 cells) = 0.3 s) = 0.075 s


def snap(now=10.0, step=1, shift=0):
    """Groups 0 done; group 1 in flight on both generators; groups 2, 3 pending; rank 0 idle, rank 1 trains
    until now+0.3, rank 2 runs a TAG fragment of group 1 until now+1."""
    return Snapshot(now=now, step=step,
                    pending=((2 + shift, 2), (2 + shift, 2), (3 + shift, 2), (3 + shift, 2)),
                    generators=((now + 2.0, 1 + shift), (now + 3.0, 1 + shift)),
                    ranks=((now, (), False), (now + 0.3, (), False), (now + 1.0, (1 + shift,), True)),
                    idle=(0,), ready=(2,), incomplete=(1 + shift, 2 + shift, 3 + shift))


def test_equal_situations_compress_equally():
    bts = BTS(PLAN, COST)
    c = bts.ticks.compress
    base = c(snap())
    assert c(snap(now=1234.5, step=7)) == base          # shift of time and step
    moved = replace(snap(), generators=((12.0 + 0.02, 1), (13.0, 1)))  # < quantum / 2
    assert c(moved) == base


def test_different_situations_compress_differently():
    bts = BTS(PLAN, COST)
    c = bts.ticks.compress
    base = c(snap())
    variants = [
        replace(snap(), generators=((12.5, 1), (13.0, 1))),                       # a generator 0.5 s later
        replace(snap(), pending=snap().pending[1:], incomplete=(1, 2, 3)),         # one fragment less pending
        replace(snap(), ready=(1,)),                                               # one ready chunk less
        replace(snap(), ranks=((10.0, (), True),) + snap().ranks[1:]),             # idle rank is in gen mode
        replace(snap(), ranks=((10.0, (), False), (10.0, (), False), snap().ranks[2]), idle=(0, 1)),
        replace(snap(), ranks=snap().ranks[:2] + ((11.0, (1, 2), True),)),         # the TAG gang spans 2 groups
    ]
    keys = [c(v) for v in variants]
    assert all(k != base for k in keys)
    assert len(set(keys)) == len(keys)


def test_equal_states_share_a_memo_entry():
    bts = BTS(PLAN, COST, BTSConfig(depth=1))
    d1 = bts.decide(snap())
    misses = bts.stats.memo_lookups - bts.stats.memo_hits
    d2 = bts.decide(snap(now=500.0, step=3))
    assert d2.k == d1.k
    assert bts.stats.memo_lookups - bts.stats.memo_hits == misses   # the second decision only hit
    assert bts.stats.memo_hits > 0
    bts.decide(replace(snap(), ready=(1,)))
    assert bts.stats.memo_lookups - bts.stats.memo_hits > misses    # a different state misses


def test_schedule_imports_neither_torch_nor_ray():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'ray'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import digenrl.schedule, digenrl.schedule.audit\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'numpy')]\n"
        "assert not bad, bad\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
