"""What a run is doing before and between its steps, on stderr: start-up, model load, calibration, evals.

``phase(cfg, "loading the model")`` is a context manager: on a terminal a live line with a spinner and the
seconds so far (rich), replaced by ``digenrl: loading the model: 12.3 s`` when it ends; elsewhere (a log file,
CI) the line ``digenrl: loading the model ...`` when it starts and the same end line. ``log.progress=false``
silences it (the per-step lines on stdout are ``log.print_every``'s). A phase that raises prints nothing more:
the error says what happened.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator


def line(text: str, err: bool = True) -> None:
    """A line on stderr (``err``) or stdout that a tqdm progress bar on the terminal does not overwrite."""
    from tqdm import tqdm

    out = sys.stderr if err else sys.stdout
    tqdm.write(text, file=out)
    out.flush()


@contextmanager
def phase(cfg, what: str) -> Iterator[None]:
    """Say that ``what`` is running, and how long it took."""
    if cfg is not None and not cfg.log.progress:
        yield
        return
    t0 = time.monotonic()
    live = sys.stderr.isatty()
    if live:
        from rich.console import Console

        with Console(stderr=True).status(f"digenrl: {what} ...", spinner="dots"):
            yield
    else:
        line(f"digenrl: {what} ...")
        yield
    line(f"digenrl: {what}: {time.monotonic() - t0:.1f} s")


def eval_text(cfg) -> str:
    steps = cfg.sampler.eval_num_steps or cfg.sampler.num_steps
    return f"up to {cfg.eval.num_prompts} eval prompts x {steps} ODE steps"
