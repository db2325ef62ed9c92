"""Per-sandbox control groups: memory (shared memory included), process count and CPU
across every process of a command, where the host lets us create them.

Why cgroups on top of rlimits: ``RLIMIT_AS`` is per process and does not count memfd or
SysV shared memory, ``RLIMIT_CPU`` is per process (64 busy children get 64 times the
budget), and ``RLIMIT_NPROC`` counts processes that are already dead but not yet reaped.
A memory cgroup charges every page the sandbox's processes touch (tmpfs, shm, memfd), a
pids cgroup counts live tasks, and ``cpuacct`` sums CPU time over all of them.

Both layouts are handled: cgroup v2 (one unified tree) and v1 (one tree per controller,
as on this project's hosts). Each sandbox gets its own group below the group this process
is in, so a host-imposed limit still applies above it. ``probe`` says which controllers
could be created and limited; nothing here raises for a host that allows none.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str:
    """This process's group in ``controller`` (v1) or the unified tree (``""``)."""
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as fh:
        for line in fh:
            _, names, path = line.rstrip("\n").split(":", 2)
            if (controller == "" and names == "") or (controller and set(controller.split(",")) <= set(names.split(","))):
                return path
    return "/"


def _v2() -> bool:
    return (_ROOT / "cgroup.controllers").is_file()


@dataclass
class CommandGroup:
    """The cgroup directories of one sandbox (``None`` where a controller is unavailable)."""

    memory: Path | None
    pids: Path | None
    cpu: Path | None  # holds the CPU-time counter (cpuacct on v1, cpu.stat on v2)
    v2: bool

    def dirs(self) -> list[Path]:
        return list(dict.fromkeys(p for p in (self.memory, self.pids, self.cpu) if p is not None))

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process that ever ran in the group."""
        if self.cpu is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            if self.v2:
                for line in (self.cpu / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
            return int((self.cpu / "cpuacct.usage").read_text()) / 1e9
        return None

    def memory_events(self) -> int:
        """How often the memory limit was hit (v1 failcnt, v2 ``max`` + ``oom_kill`` events)."""
        if self.memory is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            if self.v2:
                ev = dict(line.split() for line in (self.memory / "memory.events").read_text().splitlines())
                return int(ev.get("oom_kill", 0)) + int(ev.get("max", 0))
            return int((self.memory / "memory.failcnt").read_text())
        return 0

    def procs(self) -> list[int]:
        pids: set[int] = set()
        for d in self.dirs():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return sorted(pids)

    def kill_all(self) -> None:
        """SIGKILL every process in the group, until it is empty (bounded)."""
        for _ in range(100):
            procs = self.procs()
            if not procs:
                return
            if self.v2 and self.memory is not None and (self.memory / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.memory / "cgroup.kill").write_text("1")
            for pid in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy: a killed task not yet gone
                    time.sleep(0.02)


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def create(*, memory_bytes: int, processes: int, cpus: float) -> CommandGroup:
    """A new group with the limits set; controllers that fail are left out (``None``)."""
    name = f"rlsched-sbx-{os.getpid()}-{secrets.token_hex(4)}"
    if _v2():
        base = _ROOT / _own_path("").lstrip("/")
        group = base / name
        try:
            group.mkdir()
        except OSError:
            return CommandGroup(None, None, None, True)
        mem = group if _write(group / "memory.max", str(memory_bytes)) else None
        if mem is not None:
            _write(group / "memory.swap.max", "0")
        pids = group if _write(group / "pids.max", str(processes)) else None
        period = 100_000
        _write(group / "cpu.max", f"{int(cpus * period)} {period}")
        cpu = group if (group / "cpu.stat").is_file() else None
        return CommandGroup(mem, pids, cpu, True)

    def v1(controller: str, settings: dict[str, str]) -> Path | None:
        top = _ROOT / controller
        if not top.is_dir():
            return None
        group = top / _own_path(controller).lstrip("/") / name
        try:
            group.mkdir()
        except OSError:
            return None
        if all(_write(group / k, v) for k, v in settings.items()):
            return group
        with contextlib.suppress(OSError):
            group.rmdir()
        return None

    memory = v1("memory", {"memory.limit_in_bytes": str(memory_bytes)})
    if memory is not None and (memory / "memory.memsw.limit_in_bytes").exists():
        _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))  # no escape into swap
    pids = v1("pids", {"pids.max": str(processes)})
    period = 100_000
    quota = {"cpu.cfs_period_us": str(period), "cpu.cfs_quota_us": str(int(cpus * period))}
    combined = v1("cpu,cpuacct", quota)
    if combined is not None:
        return CommandGroup(memory, pids, combined, False)
    return _V1Group(memory, pids, v1("cpuacct", {}), False, extra=v1("cpu", quota))


@dataclass
class _V1Group(CommandGroup):
    """v1 with ``cpu`` and ``cpuacct`` mounted separately: one more directory to join."""

    extra: Path | None = None

    def dirs(self) -> list[Path]:
        return [*super().dirs(), *([self.extra] if self.extra is not None else [])]
