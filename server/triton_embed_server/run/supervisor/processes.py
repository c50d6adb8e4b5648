"""The operating-system side: Python-backend stubs, stopping processes, /dev/shm, ports.

A Python-backend stub is recognised by its command line (:func:`stub_model_name`,
:func:`stub_parent_pid`, :func:`stub_shm_region`). :func:`child_stubs` finds a server's
stubs, :func:`tritonserver_below` the server a supervisor runs and :func:`leftover_stubs`
the stubs a dead server left behind; :func:`tree_rss_bytes` measures a process tree;
:func:`stop_processes` stops processes (SIGTERM, grace, SIGKILL), :func:`remove_shm_regions`
removes their shared-memory regions and :func:`busy_ports` tells whether a dead server's
ports are free.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

STUB_MARKER = "triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region"


def stub_model_name(cmdline: list[str]) -> str | None:
    """The model a Python-backend stub serves, from its command line.

    The stub's first argument is ``<repository>/<model>/<version>/model.py``.
    """
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 2:
        return None
    parts = Path(cmdline[1]).parts
    return parts[-3] if len(parts) >= 3 else None


def stub_parent_pid(cmdline: list[str]) -> int | None:
    """The tritonserver PID a Python-backend stub reports to (its fifth argument)."""
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 6:
        return None
    return int(cmdline[5]) if cmdline[5].isdigit() else None


def stub_shm_region(cmdline: list[str]) -> str | None:
    """The ``/dev/shm`` region a Python-backend stub shares with tritonserver."""
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 3:
        return None
    name = cmdline[2]
    return name if name.startswith(SHM_PREFIX) and "/" not in name else None


def stub_instance_name(cmdline: list[str]) -> str | None:
    """The model instance a Python-backend stub runs (its eighth argument, ``NAME_G_I``).

    The stub's arguments (python_backend ``StubLauncher::Launch``): model path, shm region,
    shm default and growth sizes, parent PID, Python library folder, IPC control handle,
    instance name, runtime model folder.
    """
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 9:
        return None
    return cmdline[8]


def live_descendants(pid: int) -> list[tuple[object, list[str]]]:
    """The live processes below ``pid`` (zombies and processes gone meanwhile left out).

    Returns:
        ``[(psutil.Process, command line)]``; empty when ``pid`` is gone.
    """
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.append((child, child.cmdline()))
        except psutil.Error:
            continue
    return out


def child_stubs(server_pid: int) -> dict[int, tuple[object, str, str | None]]:
    """The live stub processes below ``server_pid`` (zombies left out).

    Returns:
        ``{pid: (psutil.Process, model name, /dev/shm region)}``; empty when the server is
        gone.
    """
    out: dict[int, tuple[object, str, str | None]] = {}
    for child, cmdline in live_descendants(server_pid):
        model = stub_model_name(cmdline)
        if model:
            out[child.pid] = (child, model, stub_shm_region(cmdline))
    return out


def tritonserver_below(pid: int):
    """The live ``tritonserver`` process below ``pid`` (a supervisor), or None.

    Returns:
        A ``psutil.Process`` whose command is a ``tritonserver`` binary (zombies left out);
        None when there is none, or ``pid`` is gone.
    """
    for child, cmdline in live_descendants(pid):
        if cmdline and Path(cmdline[0]).name == "tritonserver":
            return child
    return None


def process_created_at(pid: int) -> float:
    """The creation time of process ``pid`` on psutil's clock, in seconds since the epoch.

    psutil derives creation times from the kernel's boot time (``btime`` in ``/proc/stat``,
    whole seconds) plus the process's start in clock ticks; on a host whose wall clock was
    stepped since boot (a restored VM, an NTP jump) that clock is seconds away from
    ``time.time()``. Creation times compared with each other must all come from here.
    Falls back to ``time.time()`` when the process is already gone.
    """
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return time.time()


def leftover_stubs(server_pid: int, started_at: float) -> dict[int, tuple[object, str | None]]:
    """The stub processes whose parent argument is ``server_pid``, started since its start.

    A stub that came up after the supervisor's last look at the server's children is found
    this way. Processes created more than a second before ``started_at`` are not candidates
    (a PID reused by an older server's stub).

    Args:
        server_pid: the PID of the tritonserver that exited.
        started_at: that server's :func:`process_created_at` (psutil's clock, not
            ``time.time()``: the two can differ by seconds).

    Returns:
        ``{pid: (psutil.Process, /dev/shm region)}``.
    """
    import psutil

    out: dict[int, tuple[object, str | None]] = {}
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = proc.info["cmdline"] or []
        if (
            stub_parent_pid(cmdline) == server_pid
            and (proc.info["create_time"] or 0) >= started_at - 1
        ):
            out[proc.pid] = (proc, stub_shm_region(cmdline))
    return out


def group_stub_regions(pgid: int) -> list[str]:
    """The ``/dev/shm`` regions of the live stub processes in process group ``pgid``.

    A server started in its own session (``start_new_session``) has its supervisor,
    tritonserver and every stub in one group: these regions are that server's, never
    another's (each region name is a UUID that only its stub's command line names).
    """
    import os

    import psutil

    regions = []
    for proc in psutil.process_iter(["cmdline"]):
        region = stub_shm_region(proc.info["cmdline"] or [])
        if region is None:
            continue
        try:
            if os.getpgid(proc.pid) == pgid:
                regions.append(region)
        except OSError:  # gone meanwhile
            pass
    return regions


def tree_rss_bytes(process) -> int:
    """RSS, bytes, of a ``psutil.Process`` and all its descendants (processes gone are skipped).

    Shared pages (a Python-backend region mapped by the server and a stub) count once per
    process that maps them.
    """
    import psutil

    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def is_running(proc) -> bool:
    """Whether ``proc`` (a ``psutil.Process``) still runs: not gone, not a zombie."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_processes(procs: Iterable, grace_s: float, log: Callable[[str], None]) -> list[int]:
    """SIGTERM ``procs`` (``psutil.Process``), give them ``grace_s`` seconds, then SIGKILL.

    A ``psutil.Process`` checks its creation time before each signal, so a PID reused by
    another process is never signalled. (A Triton 2.51 Python-backend stub catches SIGTERM
    and ignores it: the grace period is the time it gets to exit on its own, which it does
    within about a second of its tritonserver's death, or when Triton unloads it.)

    Returns:
        The PIDs that had to be killed.
    """
    import psutil

    def wait(live: list, timeout_s: float) -> list:
        deadline = time.monotonic() + timeout_s
        while True:
            live = [p for p in live if is_running(p)]
            if not live or time.monotonic() >= deadline:
                return live
            time.sleep(0.1)

    live = [p for p in procs if is_running(p)]
    for proc in live:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    killed = []
    for proc in wait(live, grace_s):
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            pass
    wait([p for p in live if p.pid in killed], 5.0)
    for pid in killed:
        log(f"killed process {pid}: still running {grace_s:.0f} s after SIGTERM")
    return killed


def remove_shm_regions(regions: Iterable[str | None], folder: Path = Path("/dev/shm")) -> list[str]:
    """Remove the shared-memory regions ``regions`` (names in ``folder``) that still exist.

    A stub that exits by itself removes its region; one that was killed leaves it behind.
    ``None`` entries (a stub whose region is unknown) are skipped.

    Returns:
        The names of the regions removed.
    """
    removed = []
    for region in regions:
        path = Path(folder, region) if region else None
        if path is not None and path.exists():
            try:
                path.unlink()
                removed.append(region)
            except OSError:
                pass
    return removed


def busy_ports(endpoints: Iterable[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The endpoints whose port cannot be bound now (another process listens on it).

    Binds with ``SO_REUSEADDR`` like tritonserver's HTTP and gRPC servers do, so connections
    in TIME_WAIT do not count as busy.
    """
    busy = []
    for name, address, port in endpoints:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                busy.append((name, address, port))
    return busy
