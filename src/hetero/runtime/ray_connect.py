"""The driver's connection to a Ray cluster: the address checked first (an address nobody
answers is an error at once, not a long wait inside ``ray.init``), then ``ray.init``, asked
again when Ray Client refuses, and every failure a ``HeteroError`` naming the address."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from hetero.errors import HeteroError

__all__ = ["connect"]

log = logging.getLogger("hetero.runtime")


def connect(ray: Any, address: str | None, timeout: float) -> bool:
    """Connect this process to the Ray cluster at ``address`` (``"auto"``, ``"local"``,
    ``"host:port"``, ``"ray://host:port"``; ``None``: ``RAY_ADDRESS``, else a running cluster
    if there is one, else a local Ray instance started here), waiting ``timeout`` seconds at
    most for the address to answer. Returns whether it started a local Ray instance."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address not in (None, "auto", "local"):
        _check_reachable(address, timeout)
    options: dict[str, Any] = {"logging_level": logging.WARNING, "include_dashboard": False}
    try:
        if address is None:
            try:
                ray.init(address="auto", **options)
            except ConnectionError:
                ray.init(address="local", **options)
                return True
        elif address.startswith("ray://"):
            _init_client(ray, address, options)
        else:
            ray.init(address=address, **options)
            return address == "local"
    except HeteroError:
        raise
    except Exception as exc:
        # Leave this process as it was: a half-made connection (a Ray Client one above all)
        # would make every later ray.init fail.
        with contextlib.suppress(Exception):
            ray.shutdown()
        where = address or "a local Ray instance"
        raise HeteroError(
            f"cannot connect to the Ray cluster at {where}: {type(exc).__name__}: {exc}"
        ) from None
    return False


def _init_client(ray: Any, address: str, options: dict[str, Any]) -> None:
    """Connect through Ray Client, asking up to three times: a client server sometimes fails to
    start the process that would serve this client (Ray's proxy then answers, after its own
    30 s wait, that starting it failed), and another one usually starts."""
    for attempt in range(3):
        try:
            ray.init(address=address, **options)
            return
        except ConnectionAbortedError:
            if attempt == 2:
                raise
            log.warning("Ray Client at %s refused this client; asking again", address)
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(1.0)


def _check_reachable(address: str, timeout: float) -> None:
    """A ``HeteroError`` now, rather than ``ray.init`` waiting on an address nobody answers."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    host, port = parts.hostname, parts.port
    if not host or not port:
        raise HeteroError(
            f"Ray address {address!r} is not host:port, ray://host:port, 'auto' or 'local'"
        )
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        waited = time.monotonic() - started
        raise HeteroError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (after "
            f"{waited:.1f} s); is `ray start --head` running there, and is the port open?"
        ) from None
