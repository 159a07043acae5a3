"""Run a list of picklable jobs on a Ray cluster, one task per job (one CPU each), results in input order.

The address is what `ray.init(address=...)` takes ("auto", "HOST:PORT", "ray://HOST:PORT"), or "local":
a private Ray instance on this machine, started for the call and shut down after it. Ray is an optional
extra (`pip install 'kvadmit[ray]'`) imported only here. A local instance's workers run this Python;
a remote cluster's workers must be able to import the jobs' code, so kvadmit must be installed there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

LOCAL = "local"
INSTALL_HINT = "pip install 'kvadmit[ray]'"
CONNECT_TIMEOUT_S = 5.0  # for the TCP probe of HOST:PORT before Ray is asked to connect
# Bounds on Ray's own retries when connecting to a cluster (by default it tries for over ten minutes),
# set only where the user has not set them: seconds per attempt, read when ray is imported, and
# attempts, read by ray.init (and, when it starts a local instance, the wait for its GCS: left alone).
RAY_IMPORT_ENV = {"RAY_py_gcs_connect_timeout_s": "10"}
RAY_CONNECT_ENV = {"RAY_gcs_server_port_wait_time_s": "1"}


class RayError(RuntimeError):
    """Ray is not installed, the address is malformed, or the cluster cannot be reached: one line."""


def _call(fn: Callable[[object], object], item: object) -> object:
    return fn(item)


def host_port(address: str) -> tuple[str, int] | None:
    """The host and port a connection to `address` goes to first; None for "auto" and "local" (Ray finds
    those). Raises RayError when the address is not one Ray takes."""
    if address in ("auto", LOCAL):
        return None
    inner = address.removeprefix("ray://")
    host, _, port = inner.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayError(f"{address!r} is not a Ray address: give auto, local, HOST:PORT or ray://HOST:PORT")
    return host, int(port)


def _probe(address: str) -> None:
    """Fail in seconds, with the reason, where nothing answers at the address (Ray would retry for long)."""
    target = host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise RayError(f"cannot connect to the Ray cluster at {address}: {reason}") from None


@contextlib.contextmanager
def _env_defaults(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` where unset, for the duration (Ray's children do not inherit them)."""
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _import_ray() -> Any:
    try:
        with _env_defaults(RAY_IMPORT_ENV):
            import ray
    except ImportError:
        raise RayError(f"Ray is not installed: {INSTALL_HINT}") from None
    return ray


def _connect(ray: Any, address: str) -> None:
    _probe(address)
    options: dict[str, object] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address == LOCAL:
        options["include_dashboard"] = False
    try:
        with _env_defaults({} if address == LOCAL else RAY_CONNECT_ENV):
            ray.init(address=address, **options)
    except Exception as e:  # ray raises ConnectionError, RuntimeError, ValueError, … depending on the step
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = (
            "start a local Ray instance" if address == LOCAL else f"connect to the Ray cluster at {address}"
        )
        raise RayError(f"cannot {where}: {first}") from None


def _missing_module(error: BaseException) -> str | None:
    """The module a task could not import, where that is what failed (Ray wraps the ImportError in a
    RayTaskError, its cause, and a RaySystemError, its client_exc)."""
    pending: list[object] = [error]
    for _ in range(8):  # the wrapping is two or three deep
        if not pending:
            break
        e = pending.pop(0)
        if isinstance(e, ImportError):
            return e.name or str(e)
        pending += [getattr(e, a) for a in ("cause", "client_exc", "__cause__") if getattr(e, a, None)]
    return None


def ray_map(
    fn: Callable[[object], object],
    items: Sequence[object],
    address: str,
    on_connect: Callable[[int], None] | None = None,
) -> list[object]:
    """fn over items as Ray tasks, results in input order. If this process is already connected to Ray
    that connection is used (and left open); otherwise this call connects to `address` and shuts Ray
    down afterwards. on_connect gets the cluster's CPU count once connected."""
    host_port(address)  # a malformed address is an error even where a connection is reused
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        _connect(ray, address)
    try:
        if on_connect is not None:
            on_connect(int(ray.cluster_resources().get("CPU", 0)))
        task = ray.remote(num_cpus=1)(_call)
        fn_ref = ray.put(fn)
        try:
            return list(ray.get([task.remote(fn_ref, item) for item in items]))
        except ray.exceptions.RayError as e:
            missing = _missing_module(e)
            if missing is None:
                raise
            raise RayError(
                f"the Ray workers cannot import {missing!r}: install kvadmit (this version) on every node "
                "of the cluster, or pass it in a runtime_env"
            ) from None
    finally:
        if started:
            ray.shutdown()
