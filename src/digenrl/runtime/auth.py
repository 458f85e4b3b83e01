"""Joining an existing Ray cluster (``runtime.address``), token authentication included.

Since Ray 2.5x ``ray start --head`` turns on token authentication whenever a token is available on the head, and
a driver that joins an explicit address must opt in itself: ``RAY_AUTH_MODE=token`` plus the cluster's token
(``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); without them Ray retries and ends in a
generic connection error. ``join_cluster`` opts in by itself when the head asks for a token and this machine
has one (``local_token``), saying so in one line; otherwise every failure to join is one ``ConfigError`` line
naming ``runtime.address`` and these settings."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager

from digenrl.config import ConfigError

AUTH_HELP = ("if the cluster uses token authentication (the default of `ray start --head` when a token "
             "exists), set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
             "~/.ray/auth_token; `ray get-auth-token` on the head prints it)")


def join_cluster(address: str, **init_kwargs) -> None:
    """``ray.init(address=...)``; any failure to join becomes one ``ConfigError`` naming the setting.

    Ray's C++ client logs a warning per retry (~20 lines over ~20 s when the token is missing); they are
    held back while joining and shown only if the join succeeds. Without ``RAY_AUTH_MODE=token`` one direct
    probe of the GCS first tells a missing token apart in about a second.
    """
    import ray

    token_mode = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    with _held_stderr() as notes:
        if not token_mode and "://" not in address and address != "auto" and _needs_token(address):
            where = local_token()
            if where is None:
                raise ConfigError(_message(address, "authentication failed: the cluster requires a token",
                                           token_mode))
            os.environ["RAY_AUTH_MODE"] = token_mode = "token"  # the head asks for one and this machine has one
            _reload_auth_config()
            notes.append(f"digenrl: runtime.address: the cluster at {address} asks for a token; using {where} "
                         "(RAY_AUTH_MODE=token)")
        try:
            ray.init(address=address, **init_kwargs)
        except Exception as e:  # ConnectionError, AuthenticationError, ValueError (bad address), ...
            ray.shutdown()
            what = "authentication failed" if _is_auth(e) else f"{type(e).__name__}: {_first_line(e)}"
            raise ConfigError(_message(address, what, token_mode)) from None


def _reload_auth_config() -> None:
    """Make Ray read ``RAY_AUTH_MODE`` again: the probe above loaded its config (auth off) into this process.
    The same two calls as Ray's own ``ray._private.authentication_test_utils.reset_auth_token_state``."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def local_token() -> str | None:
    """Where this machine has a Ray token (what Ray itself would send with ``RAY_AUTH_MODE=token``), or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    for name, path in (("RAY_AUTH_TOKEN_PATH", os.environ.get("RAY_AUTH_TOKEN_PATH")),
                       ("~/.ray/auth_token", os.path.expanduser("~/.ray/auth_token"))):
        try:
            if path and open(path).read().strip():
                return name if name == "~/.ray/auth_token" else f"RAY_AUTH_TOKEN_PATH ({path})"
        except OSError:
            continue
    return None


def _message(address: str, what: str, token_mode: bool) -> str:
    hint = (AUTH_HELP if not token_mode else
            "RAY_AUTH_MODE=token is set: check that the token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
            "~/.ray/auth_token) is the cluster's (`ray get-auth-token` on the head prints it)")
    return f"runtime.address: cannot join the Ray cluster at {address!r} ({what}); {hint}"


def _is_auth(e: BaseException) -> bool:
    chain = []
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return any(type(x).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(x) for x in chain)


def _needs_token(address: str) -> bool:
    """One connection attempt to the GCS at ``address`` without a token: refused for lack of one?"""
    try:
        from ray._raylet import GcsClient  # Ray's own client (no public one-shot probe exists)

        GcsClient(address=address)
    except Exception as e:
        return _is_auth(e)
    return False


def _first_line(e: BaseException, n: int = 200) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= n else line[: n - 3] + "..."


@contextmanager
def _held_stderr():
    """Redirect file descriptor 2 (C++ logs included) to a temp file; only if the block ends without an error,
    replay it, then the lines the block added to the yielded list (shown once the join succeeded)."""
    notes: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield notes
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read().decode(errors="replace"))
        for line in notes:
            print(line, file=sys.stderr, flush=True)
