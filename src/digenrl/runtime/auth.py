"""Joining an existing Ray cluster (``runtime.address``), token authentication included.

Since Ray 2.5x ``ray start --head`` turns on token authentication whenever a token is available on the head
(``~/.ray/auth_token``, written by any earlier local ``ray.init()``, or ``RAY_AUTH_TOKEN``). A driver that
joins with an explicit address must then opt in itself (Ray never sends a token to an explicit address on its
own): ``RAY_AUTH_MODE=token`` plus the cluster's token, as ``RAY_AUTH_TOKEN``, a file named by
``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token`` (``ray get-auth-token`` on the head prints it). Without
them Ray retries with InvalidAuthToken warnings and ends in a generic connection error; ``join_cluster``
turns every failure to join into one ``ConfigError`` line naming ``runtime.address`` and these settings.
"""

from __future__ import annotations

import os

from digenrl.config import ConfigError

AUTH_HELP = ("if the cluster uses token authentication (the default of `ray start --head` when a token "
             "exists), set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
             "~/.ray/auth_token; `ray get-auth-token` on the head prints it)")


def join_cluster(address: str, **init_kwargs) -> None:
    """``ray.init(address=...)``; any failure to join becomes one ``ConfigError`` naming the setting."""
    import ray

    try:
        ray.init(address=address, **init_kwargs)
    except Exception as e:  # ConnectionError, AuthenticationError, ValueError (bad address), ...
        ray.shutdown()
        chain, c = [], e
        while c is not None and len(chain) < 5:
            chain.append(c)
            c = c.__cause__ or c.__context__
        auth = any(type(x).__name__ == "AuthenticationError" for x in chain)
        token_mode = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
        what = "authentication failed" if auth else f"{type(e).__name__}: {_first_line(e)}"
        hint = (AUTH_HELP if not token_mode else
                "RAY_AUTH_MODE=token is set: check that the token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
                "~/.ray/auth_token) is the cluster's (`ray get-auth-token` on the head prints it)")
        raise ConfigError(f"runtime.address: cannot join the Ray cluster at {address!r} ({what}); {hint}") from None


def _first_line(e: BaseException, n: int = 200) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= n else line[: n - 3] + "..."
