"""Run an agent's shell commands in a sandboxed subprocess with its own work directory.

Why a sandbox: the agent's actions are text produced by a model under training -- an
optimiser that will meet every shortcut the sandbox leaves. They run real programs on the
training host, so they must not reach the network or the host's IPC, write outside their
episode's directory, read the hidden tests, outlive their command, or take the host down
by CPU, memory (shared memory included), disk or process count.

Isolation modes, strongest first (``Sandbox.isolation`` says which is active, chosen by
probing the host once per process; ``python -m rlsched.real.envs.sandbox`` prints it):

* ``bwrap`` (root, Debian's ``bubblewrap`` installed): every command runs in new user,
  PID, IPC, UTS, network and cgroup namespaces built by bubblewrap (``sandbox_bwrap.py``)
  under a uid of its own, over a minimal read-only root, with cgroup limits where the host
  allows them (``sandbox_cgroup.py``) and a size-limited tmpfs as the work directory.
* ``root`` (root, no bubblewrap): own network and mount namespaces by hand-written code,
  every mount read-only except the work directory, a dedicated uid, cgroups and quota as
  above; no PID or IPC namespace, user namespaces can be created inside.
* ``userns`` (non-root with unprivileged user namespaces): network and mounts as ``root``
  but the caller's uid, no cgroups.
* ``plain``: only the per-process limits below; for trusted tooling only.

In every mode: a fresh process per command with ``RLIMIT_CPU``, ``RLIMIT_AS``,
``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, no core files; a wall-clock limit
after which the command is killed; output capped at ``Limits.output_bytes``; a scrubbed
environment; shell commands sent to ``/bin/sh`` on standard input (never argv, so no
length or byte of them breaks the launch); agent file writes path-checked (no absolute
paths, no ``..``, no symlink escapes, no names the OS cannot hold) and done by a sandboxed
process; reading the work directory back never raises for what the agent left there.

The guarantees, as :func:`probe_guarantees` reports them -- the mode is probed by running a
command in it, cgroups and the quota by creating them, the rest follows from the mode. Each
is proved by a test in ``tests/test_sandbox_redteam.py`` (``_PROVED_BY`` names it; a test
keeps this table equal to the :class:`Guarantees` fields), which runs wherever the host
provides the mode and is skipped with the reason elsewhere:

| ``network_isolated`` | no route to the host's loopback, unix sockets (path or abstract) or the internet | bwrap, root, userns |
| ``read_only_host`` | no mount but the work directory (and bwrap's private ``/tmp``, ``/dev``) is writable | bwrap, root, userns |
| ``minimal_root`` | only ``/usr`` and the loader's ``/etc`` files exist; no ``/home``, ``/root``, host ``/tmp`` | bwrap |
| ``hidden_files`` | the task files (``hide=``) are not readable, even where their folder is mounted | bwrap, root, userns |
| ``pid_namespace`` | host processes invisible; bubblewrap's PID 1 reaps orphans | bwrap |
| ``ipc_namespace`` | SysV shared memory and host FIFOs unreachable; segments die with the command | bwrap |
| ``uts_namespace`` | own host name | bwrap |
| ``no_user_namespaces`` | creating a user namespace inside fails; no capabilities | bwrap |
| ``dedicated_uid`` | a uid of its own, reserved across processes and checked unused by accounts and processes | bwrap, root |
| ``background_killed`` | nothing a command starts outlives it (PID namespace, cgroup and uid sweeps) | bwrap, root |
| ``memory_cgroup`` | memory of all processes bounded, memfd, shm and tmpfs pages included | bwrap, root (if the host allows) |
| ``pids_cgroup`` | live processes bounded across the command; killed orphans do not count | bwrap, root (if the host allows) |
| ``cpu_cgroup`` | CPU time summed over all processes of a command bounded; rate capped at ``Limits.cpus`` | bwrap, root (if the host allows) |
| ``disk_quota`` | the work directory's total size bounded (a tmpfs of ``Limits.disk_bytes``) | bwrap, root (if the host allows) |

:data:`LIVE_MINIMUM` is what a live run with tools requires (:func:`require_guarantees`,
checked by the coding environment); ``RLSCHED_ACCEPT_WEAK_SANDBOX=1`` or
``accept_weak_sandbox=True`` is the explicit way to accept less.

What it does not guarantee in any mode: host files under ``/usr`` stay readable (bwrap)
or every world-readable file does (other modes); there is no seccomp filter beyond
bubblewrap's, so a kernel exploit is out of scope; in bwrap mode an exit status above 128
is reported as the matching signal (bubblewrap's PID 1 cannot tell them apart); a process
that dies with this one (no ``close``) leaves its tmpfs mount and cgroup directories
behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import pwd
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path, PurePosixPath

from rlsched.cluster.errors import LiveBackendError
from rlsched.real.envs import sandbox_cgroup, sandbox_exec
from rlsched.real.envs.sandbox_bwrap import bwrap_argv, bwrap_path

_EXEC_SCRIPT = str(Path(sandbox_exec.__file__).resolve())
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_MODES = ("bwrap", "root", "userns", "plain")
_ROOT_MODES = ("bwrap", "root")  # run by root: a dedicated uid, cgroups, a disk quota
# Dedicated uids for the root-run modes: far above any real account, one per sandbox,
# reserved by an O_EXCL file (across processes) and checked unused before use, so that
# "kill every process of this uid" can only hit this sandbox's processes.
_UID_BASE, _UID_SPAN = 1_000_000, 1 << 24
_UID_REGISTRY = ("/run/rlsched-sandbox-uids", os.path.join(tempfile.gettempdir(), "rlsched-sandbox-uids"))
# Longest path the agent may name: the kernel's limits (PATH_MAX, NAME_MAX) less room for
# the work directory itself, so a refused length is a PathRefused, never an OSError.
_MAX_REL_PATH, _MAX_NAME = 3072, 255
# Files and directories a quota'd work directory may hold; more files than this would only
# slow the copy to the grading sandbox down.
_MAX_INODES = 20_000


@dataclass(frozen=True)
class Limits:
    """Resource bounds for each command run in a sandbox.

    ``cpu_seconds`` bounds each process (``RLIMIT_CPU``) and, where a CPU cgroup exists,
    all processes of one command together; ``cpus`` is the rate (cores) a command may use
    at once; ``memory_bytes`` is per process (``RLIMIT_AS``) and, with a memory cgroup, for
    the whole sandbox including shared memory and tmpfs; ``disk_bytes`` is the size of the
    work directory (a tmpfs quota in the root-run modes) and of ``/tmp`` under bubblewrap.
    """

    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    processes: int = 64
    open_files: int = 256
    output_bytes: int = 16 << 10
    disk_bytes: int = 256 << 20
    cpus: float = 1.0


@dataclass(frozen=True)
class CommandResult:
    """What one sandboxed command did. ``seconds`` is measured wall time, setup included;
    ``limit`` names a sandbox-wide limit that stopped it (``"cpu"``, ``"memory"``)."""

    output: str
    exit_code: int | None
    signal: str | None
    timed_out: bool
    truncated: bool
    seconds: float
    limit: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.limit is None

    def status(self) -> str:
        """A short human/agent-readable account of how the command ended."""
        if self.timed_out:
            return f"killed: wall-clock limit ({self.seconds:.1f}s)"
        if self.limit == "cpu":
            return "killed: CPU time limit (all processes of the command)"
        if self.limit == "memory" and self.signal is not None:
            return f"killed by {self.signal} (memory limit)"
        if self.signal in ("SIGXCPU", "SIGKILL"):
            return f"killed by {self.signal} (CPU or memory limit)"
        if self.signal == "SIGXFSZ":
            return "killed: file size limit"
        if self.signal is not None:
            return f"killed by {self.signal}"
        return f"exit {self.exit_code}"


class PathRefused(ValueError):
    """An agent asked to touch a path outside its work directory (or one the OS cannot name)."""


def safe_relpath(path: str) -> str:
    """Normalise an agent-supplied relative path, refusing anything that could escape.

    Leading and trailing spaces are kept (a file may be named ``" "``); empty names, NUL,
    absolute paths, ``..`` and names longer than the kernel allows are refused.
    """
    text = path
    if not text.strip() or "\x00" in text:
        raise PathRefused(f"bad path {path[:80]!r}")
    pure = PurePosixPath(text)
    if pure.is_absolute():
        raise PathRefused(f"absolute path {text[:80]!r} refused: paths are relative to the work directory")
    if any(part == ".." for part in pure.parts):
        raise PathRefused(f"path {text[:80]!r} refused: '..' may not leave the work directory")
    parts = [p for p in pure.parts if p != "."]
    if not parts:
        raise PathRefused(f"path {text[:80]!r} names the work directory itself")
    rel = "/".join(parts)
    try:
        encoded = [p.encode("utf-8", "surrogateescape") for p in parts]
    except UnicodeEncodeError:
        raise PathRefused(f"path {text[:80]!r} refused: not encodable as a file name") from None
    if sum(len(p) + 1 for p in encoded) > _MAX_REL_PATH or max(len(p) for p in encoded) > _MAX_NAME:
        raise PathRefused(
            f"path {text[:80]!r}... refused: longer than {_MAX_REL_PATH} bytes or a name over {_MAX_NAME} bytes"
        )
    return rel


@dataclass(frozen=True)
class Guarantees:
    """What a sandbox mode provides on this host, as probed. Every field is proved by a test
    in ``tests/test_sandbox_redteam.py`` where the host provides it (skipped otherwise)."""

    mode: str
    network_isolated: bool  # no route to host or internet, own loopback only
    read_only_host: bool  # nothing outside the work directory (and private tmp) is writable
    minimal_root: bool  # only /usr and the loader's /etc files are visible
    hidden_files: bool  # named host directories (the task files) are masked
    pid_namespace: bool  # own PID 1 that reaps; host processes invisible
    ipc_namespace: bool  # SysV shm / queues private and freed with the command
    uts_namespace: bool
    no_user_namespaces: bool  # creating a user namespace inside fails
    dedicated_uid: bool  # a uid of its own, reserved and checked unused
    background_killed: bool  # nothing the command starts outlives it
    memory_cgroup: bool  # memory of all processes, shm/memfd/tmpfs included
    pids_cgroup: bool  # live processes counted across the command
    cpu_cgroup: bool  # CPU time across all processes of a command
    disk_quota: bool  # total size of the work directory

    def held(self) -> list[str]:
        return [f.name for f in fields(self) if f.name != "mode" and getattr(self, f.name)]

    def missing(self, required: tuple[str, ...]) -> list[str]:
        return [name for name in required if not getattr(self, name)]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# The least a live run with tools needs (an agent being optimised against the sandbox):
# no network, no writes outside, no hidden tests to read, a PID and IPC namespace, no user
# namespaces, its own uid, and memory and process count bounded across processes.
LIVE_MINIMUM = (
    "network_isolated", "read_only_host", "hidden_files", "pid_namespace", "ipc_namespace",
    "no_user_namespaces", "dedicated_uid", "background_killed", "memory_cgroup", "pids_cgroup",
)
ACCEPT_WEAK_ENV = "RLSCHED_ACCEPT_WEAK_SANDBOX"


def _command_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": _SAFE_PATH,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _launch(config: dict, argv: list[str], *, stdin: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", _EXEC_SCRIPT, "exec", json.dumps(config), "--", *argv],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={},
        close_fds=True,
        start_new_session=True,
    )


def _mode_available(mode: str) -> bool:
    if mode in _ROOT_MODES and os.geteuid() != 0:
        return False
    return not (mode == "bwrap" and bwrap_path() is None)


@functools.cache
def probe_isolation(root: str | None = None) -> str:
    """The strongest mode that works on this host (cached per process and root dir)."""
    for mode in _MODES[:-1]:
        if not _mode_available(mode):
            continue
        try:
            with Sandbox(isolation=mode, root=root, _probed=True) as box:
                result = box.run("echo ok", timeout=20)
        except LiveBackendError:
            continue
        if result.ok and result.output.strip() == "ok":
            return mode
    warnings.warn(
        "sandbox: no namespace isolation on this host (not root, no user namespaces); agent "
        "commands run with only resource limits and can reach the network",
        RuntimeWarning,
        stacklevel=2,
    )
    return "plain"


@functools.cache
def sandbox_meta(isolation: str = "auto", *, accept_weak: bool = False) -> dict[str, object]:
    """What the tools' sandbox guarantees on this host, for a live run's meta: the mode, each
    guarantee, which of :data:`LIVE_MINIMUM` are missing and whether less was accepted -- so a
    reader of the record can tell whether reward could have been hacked. (Cached probe.)"""
    g = probe_guarantees(None, isolation)
    return {**g.as_dict(), "live_minimum": list(LIVE_MINIMUM), "missing": g.missing(LIVE_MINIMUM),
            "accepted_weak": bool(accept_weak)}


def probe_guarantees(root: str | None = None, isolation: str = "auto") -> Guarantees:
    """Which guarantees hold for ``isolation`` on this host (cgroups and quota are tried)."""
    mode = probe_isolation(root) if isolation == "auto" else isolation
    with Sandbox(isolation=mode, root=root, _probed=mode != "auto") as box:
        group = box._group
        ns = mode in ("bwrap", "root", "userns")
        return Guarantees(
            mode=mode,
            network_isolated=ns,
            read_only_host=ns,
            minimal_root=mode == "bwrap",
            hidden_files=ns,
            pid_namespace=mode == "bwrap",
            ipc_namespace=mode == "bwrap",
            uts_namespace=mode == "bwrap",
            no_user_namespaces=mode == "bwrap",
            dedicated_uid=mode in _ROOT_MODES,
            background_killed=mode in _ROOT_MODES,
            memory_cgroup=group is not None and group.memory is not None,
            pids_cgroup=group is not None and group.pids is not None,
            cpu_cgroup=group is not None and group.cpu is not None,
            disk_quota=box._quota,
        )


def require_guarantees(
    guarantees: Guarantees, required: tuple[str, ...] = LIVE_MINIMUM, *, accept_weak: bool | None = None
) -> None:
    """Refuse (one line) unless ``required`` holds, or the caller accepts a weaker sandbox
    explicitly (``accept_weak=True`` or the environment variable ``RLSCHED_ACCEPT_WEAK_SANDBOX=1``)."""
    if accept_weak is None:
        accept_weak = os.environ.get(ACCEPT_WEAK_ENV, "") == "1"
    missing = guarantees.missing(required)
    if missing and not accept_weak:
        raise LiveBackendError(
            f"sandbox isolation {guarantees.mode!r} on this host lacks {', '.join(missing)}: an agent under "
            f"training could exploit it. Run as root with bubblewrap installed (apt-get install bubblewrap), "
            f"or set {ACCEPT_WEAK_ENV}=1 to accept a weaker sandbox"
        )


def _reserve_uid() -> tuple[int, str]:
    """A uid no account, process or other sandbox uses, with its reservation file."""
    folder = next((d for d in _UID_REGISTRY if _ensure_dir(d)), None)
    if folder is None:
        raise LiveBackendError(f"sandbox: no writable uid registry ({', '.join(_UID_REGISTRY)})")
    for _ in range(100):
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
        path = os.path.join(folder, str(uid))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        try:
            pwd.getpwuid(uid)
            taken = True
        except KeyError:
            taken = _has_processes(uid)
        if not taken:
            return uid, path
        os.unlink(path)
    raise LiveBackendError("sandbox: no unused uid found in 100 tries")


def _ensure_dir(path: str) -> bool:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
        return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and os.access(path, os.W_OK)
    except OSError:
        return False


_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


def _mount_quota(workdir: Path, size: int, uid: int) -> bool:
    """Mount a size-limited tmpfs on ``workdir`` (a disk quota for the sandbox); False if refused."""
    opts = f"size={size},nr_inodes={_MAX_INODES},mode=0700,uid={uid},gid={uid}".encode()
    flags = 2 | 4  # MS_NOSUID | MS_NODEV
    return _libc.mount(b"tmpfs", str(workdir).encode(), b"tmpfs", ctypes.c_ulong(flags), opts) == 0


class Sandbox:
    """One episode's work directory plus the means to run commands inside it.

    ``isolation="auto"`` takes the strongest mode the host offers; naming a mode fails if
    the host cannot provide it. In the root-run modes the work directory's parent (``root``,
    default: the system temp dir) must be traversable by other users, since commands run
    under an unprivileged uid. ``hide`` names host directories that must not be readable
    from inside (the task files). One command at a time per sandbox.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        isolation: str = "auto",
        root: str | os.PathLike[str] | None = None,
        hide: tuple[str, ...] = (),
        _probed: bool = False,
    ) -> None:
        self.limits = limits or Limits()
        root_dir = str(root) if root is not None else None
        if isolation == "auto":
            isolation = probe_isolation(root_dir)
        elif isolation not in _MODES:
            raise LiveBackendError(f"sandbox isolation {isolation!r}: expected auto, {', '.join(_MODES)}")
        elif not _mode_available(isolation):
            raise LiveBackendError(
                f"sandbox isolation {isolation!r} is not available on this host "
                f"({'needs root' if os.geteuid() != 0 else 'bubblewrap (bwrap) is not installed'})"
            )
        elif not _probed and isolation != "plain" and probe_isolation(root_dir) != isolation:
            # The probe tries modes strongest first, so asking for a weaker mode than the
            # host offers is allowed; asking for one it cannot provide is not.
            best = probe_isolation(root_dir)
            if _MODES.index(best) > _MODES.index(isolation):
                raise LiveBackendError(
                    f"sandbox isolation {isolation!r} is not available on this host (best: {best!r})"
                )
        self.isolation = isolation
        self.hide = tuple(str(Path(h).resolve()) for h in hide)
        self._closed = True
        self._uid_file: str | None = None
        self._group: sandbox_cgroup.CommandGroup | None = None
        self._quota = False
        if isolation in _ROOT_MODES:
            self.uid, self._uid_file = _reserve_uid()
        else:
            self.uid = os.getuid()
        self.gid = self.uid if isolation in _ROOT_MODES else os.getgid()
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix="rlsched-sbx-", dir=root_dir)).resolve()
        except BaseException:
            self._release_uid()
            raise
        self._closed = False
        try:
            os.chmod(self.workdir, 0o700)
            if isolation in _ROOT_MODES:
                self._quota = _mount_quota(self.workdir, self.limits.disk_bytes, self.uid)
                os.chown(self.workdir, self.uid, self.gid)
                lim = self.limits
                self._group = sandbox_cgroup.create(
                    memory_bytes=lim.memory_bytes, processes=lim.processes, cpus=lim.cpus
                )
        except BaseException:  # half-built: give back what was taken, then report
            self.close()
            raise
        self._bwrap = (
            bwrap_argv(bwrap_path() or "bwrap", str(self.workdir), tmp_bytes=self.limits.disk_bytes, hide=self.hide)
            if isolation == "bwrap"
            else None
        )

    # -- commands -------------------------------------------------------------------------

    def run(
        self, command: str | list[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run ``command`` in the work directory: a shell script (given to ``/bin/sh`` on its
        standard input, so no length or byte of it can break the launch), or an argv list
        (trusted callers only; ``stdin`` goes to it)."""
        if self._closed:
            raise RuntimeError("sandbox is closed")
        if isinstance(command, str):
            if stdin is not None:
                raise ValueError("Sandbox.run: a shell command is sent on stdin; pass an argv list to give stdin")
            argv = ["/bin/sh", "-s"]
            stdin = command.encode("utf-8", "surrogatepass") + b"\n"
        else:
            argv = list(command)
        config: dict[str, object] = {
            "mode": self.isolation,
            "workdir": str(self.workdir),
            "uid": self.uid,
            "gid": self.gid,
            "limits": {k: v for k, v in asdict(self.limits).items() if k not in ("disk_bytes", "cpus")},
            "env": _command_env(str(self.workdir)),
            "hide": list(self.hide),
            "cgroups": [str(d) for d in self._group.dirs()] if self._group is not None else [],
        }
        if self._bwrap is not None:
            config["bwrap_argv"] = self._bwrap
        wall = self.limits.wall_seconds if timeout is None else timeout
        group = self._group
        cpu0 = group.cpu_seconds() if group is not None else None
        mem0 = group.memory_events() if group is not None else 0
        cpu_cap = None if cpu0 is None else (cpu0 + self.limits.cpu_seconds)
        start = time.monotonic()
        proc = _launch(config, argv, stdin=stdin is not None)
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
        deadline = start + wall

        def over_cpu() -> bool:
            if cpu_cap is None or group is None:
                return False
            used = group.cpu_seconds()
            return used is not None and used > cpu_cap

        output, truncated, timed_out, cpu_hit = _collect(proc, deadline, self.limits.output_bytes, over_cpu)
        if not timed_out and not cpu_hit:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out or cpu_hit:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if group is not None:
                group.kill_all()
        returncode = proc.wait()
        self._sweep()
        seconds = time.monotonic() - start
        text = output.decode("utf-8", errors="replace")
        if (returncode == sandbox_exec.SETUP_FAILED and text.startswith("sandbox:")) or (
            returncode == 1 and self._bwrap is not None and text.startswith("bwrap: ")
        ):
            raise LiveBackendError(f"{text.strip()} (isolation {self.isolation!r}, workdir {self.workdir})")
        mem_hit = group is not None and group.memory_events() > mem0
        sig = signal.Signals(-returncode).name if returncode < 0 else None
        if sig is None and returncode > 128 and self.isolation == "bwrap":
            # bubblewrap's PID 1 reports a signalled command as exit 128 + signal
            with contextlib.suppress(ValueError):
                sig = signal.Signals(returncode - 128).name
        return CommandResult(
            output=text,
            exit_code=None if sig is not None else returncode,
            signal=sig,
            timed_out=timed_out,
            truncated=truncated,
            seconds=seconds,
            limit="cpu" if cpu_hit else ("memory" if mem_hit else None),
        )

    def write_file(self, path: str, content: str | bytes) -> CommandResult:
        """Write a file the way the agent would: path-checked, by a sandboxed process.

        Raises :class:`PathRefused` for paths that could leave the work directory. The write
        itself runs under the sandbox's uid and mounts, so even a symlink planted by an
        earlier command cannot redirect it outside the work directory.
        """
        rel = safe_relpath(path)
        self._refuse_symlink_escape(rel)
        data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        return self.run(["/bin/sh", "-c", script, "sh", "./" + rel], stdin=data)

    def put_files(self, files: dict[str, str | bytes]) -> None:
        """Write trusted files (task starters, hidden tests) straight from this process.

        Faster than :meth:`write_file` (no process per file); meant for setting up a
        directory before any agent command has run in it. Paths are still checked, and the
        final component is opened with ``O_NOFOLLOW``.
        """
        for path, content in files.items():
            rel = safe_relpath(path)
            self._refuse_symlink_escape(rel)
            target = self.workdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            with os.fdopen(os.open(target, flags, 0o644), "wb") as fh:
                fh.write(data)
            if self.isolation in _ROOT_MODES:
                for node in (target, *target.relative_to(self.workdir).parents):
                    os.chown(self.workdir / node, self.uid, self.gid)

    def _refuse_symlink_escape(self, rel: str) -> None:
        try:
            target = (self.workdir / rel).resolve()
        except (OSError, RuntimeError) as err:  # a symlink loop, a name the OS refuses
            raise PathRefused(f"path {rel[:80]!r} refused: {err.__class__.__name__}") from None
        if not target.is_relative_to(self.workdir):
            raise PathRefused(f"path {rel[:80]!r} refused: it resolves outside the work directory")

    def read_files(
        self, *, max_bytes: int = 4 << 20, max_files: int = 2000, skipped: list[str] | None = None
    ) -> dict[str, bytes]:
        """The regular files under the work directory (symlinks skipped), by relative path.

        Never raises for what the agent left there: a name or path the OS cannot open, a
        file that vanished, a tree too deep, and anything past ``max_bytes`` or ``max_files``
        in total is left out (and named in ``skipped`` when given).
        """
        files: dict[str, bytes] = {}
        total = 0
        skip = skipped if skipped is not None else []

        def refused(err: OSError) -> None:
            skip.append(f"{err.filename!s:.80}: {err.strerror}")

        for dirpath, dirnames, filenames in os.walk(self.workdir, onerror=refused):
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.workdir)
                try:
                    info = os.lstat(full)
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    if total + info.st_size > max_bytes or len(files) >= max_files:
                        skip.append(f"{rel[:80]}: over the {max_bytes}-byte / {max_files}-file total")
                        continue
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
                    with os.fdopen(fd, "rb") as fh:
                        data = fh.read(info.st_size)
                except OSError as err:
                    skip.append(f"{rel[:80]}: {err.strerror}")
                    continue
                files[rel] = data
                total += len(data)
        return files

    # -- lifetime -------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Kill whatever the last command left running (root-run modes: every process of our
        uid, and of our cgroups)."""
        if self.isolation not in _ROOT_MODES:
            return
        if self._group is not None:
            self._group.kill_all()
        # SIGKILL is delivered asynchronously and a fork bomb may still be forking, so
        # repeat until nothing of this uid is left running (bounded by RLIMIT_NPROC).
        for _ in range(50):
            if not _has_processes(self.uid):
                return
            subprocess.run(
                [sys.executable, "-I", "-S", _EXEC_SCRIPT, "kill", str(self.uid)],
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
            time.sleep(0.01)
        raise LiveBackendError(f"sandbox uid {self.uid}: processes survive SIGKILL sweeps")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sweep()
        finally:
            if self._group is not None:
                self._group.remove()
            if self._quota:
                _libc.umount2(str(self.workdir).encode(), _MNT_DETACH)
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._release_uid()

    def _release_uid(self) -> None:
        if self._uid_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._uid_file)
            self._uid_file = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_processes(uid: int) -> bool:
    """Whether ``uid`` owns a process that is not already dead (zombies wait for a reaper)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        state = fh.read().rpartition(b")")[2].split()[0]
                    if state not in (b"Z", b"X"):
                        return True
    return False


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None  # internal: stdin=PIPE was requested
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.write(data)
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.close()


def _collect(
    proc: subprocess.Popen[bytes], deadline: float, cap: int, over_cpu: object = None
) -> tuple[bytes, bool, bool, bool]:
    """Read merged stdout/stderr until EOF, ``deadline`` or ``over_cpu()``; keep at most ``cap`` bytes.

    Once the cap is reached the pipe is closed, so a runaway writer dies of SIGPIPE instead
    of filling the trainer's memory. If the command exits while a background child keeps
    the pipe open, reading stops shortly after (the sweep then kills that child).
    """
    assert proc.stdout is not None  # internal: stdout=PIPE was requested
    stream = proc.stdout
    chunks: list[bytes] = []
    size, truncated, timed_out, cpu_hit = 0, False, False, False
    exited_at: float | None = None
    next_cpu_check = 0.0
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if callable(over_cpu) and now >= next_cpu_check:
                next_cpu_check = now + 0.1
                if over_cpu():
                    cpu_hit = True
                    break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:
                break
            if not sel.select(timeout=min(0.05, deadline - now)):
                continue
            data = os.read(stream.fileno(), 65536)
            if not data:
                break
            keep = data[: cap - size]
            chunks.append(keep)
            size += len(keep)
            if size >= cap and len(data) > len(keep):
                truncated = True
                break
    stream.close()
    return b"".join(chunks), truncated, timed_out, cpu_hit


def main() -> int:
    """``python -m rlsched.real.envs.sandbox``: print the isolation mode and the guarantees that
    hold on this host, and whether a live run with tools would be accepted."""
    g = probe_guarantees(None)
    print(f"isolation: {g.mode}")
    for name, value in g.as_dict().items():
        if name != "mode":
            print(f"  {name:20} {'yes' if value else 'NO'}")
    missing = g.missing(LIVE_MINIMUM)
    print("live minimum: " + ("holds" if not missing else f"MISSING {', '.join(missing)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
