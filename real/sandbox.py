"""Run an agent's shell commands in a sandboxed subprocess with its own work directory.

Why a sandbox: the agent's actions are text produced by a model under training; they run
real programs on the training host, so they must not reach the network, write outside
their episode's directory, or take the host down by CPU, memory, disk or process count.

What it guarantees, by isolation mode (see ``sandbox_exec.py``; ``Sandbox.isolation`` says
which one is active, chosen by probing the host once per process):

* every mode: a fresh process per command with ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_AS``
  (address space), ``RLIMIT_FSIZE`` (largest file), ``RLIMIT_NPROC`` (processes),
  ``RLIMIT_NOFILE``, no core files; a wall-clock timeout after which the whole process
  session is killed; output capped at ``Limits.output_bytes``; a scrubbed environment
  (``PATH``, ``HOME`` = ``TMPDIR`` = the work directory, locale; nothing inherited from
  the trainer); file writes requested by the agent are path-checked (no absolute paths,
  no ``..``, no symlink escapes) and performed by a sandboxed process too.
* ``root`` (the host runs us as root, e.g. a container): no network (own network
  namespace with a downed loopback), every mount except the work directory read-only
  (own mount namespace, so ``/tmp`` and ``/dev/shm`` too), an unprivileged uid of its own
  per sandbox with ``no_new_privs`` (cannot signal or ptrace other processes, cannot
  regain root through setuid binaries, and ``RLIMIT_NPROC`` counts only its processes),
  and after every command all processes of that uid are killed, so nothing the agent
  starts in the background outlives its command.
* ``userns`` (non-root, unprivileged user namespaces enabled): no network and read-only
  mounts as above, but the commands keep the caller's uid, so background processes that
  leave the command's process session are not hunted down after the command.
* ``plain`` (neither available): limits, environment scrub, timeouts and path checks
  only -- the agent can reach the network and write wherever the caller can. Use it
  only for trusted tooling; ``Sandbox(isolation="root")`` refuses to start without it.

What it does not guarantee in any mode: disk use inside the work directory is bounded
only per file (``RLIMIT_FSIZE``), not in total; other processes on the host stay visible
in ``/proc`` (no PID namespace); reading world-readable host files is allowed; there is
no seccomp filter, so a kernel exploit is out of scope.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
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
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from rlsched.cluster.errors import LiveBackendError

from . import sandbox_exec

_EXEC_SCRIPT = str(Path(sandbox_exec.__file__).resolve())
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_MODES = ("root", "userns", "plain")
# Dedicated uids for root mode: far above any real account, one per sandbox, so that
# "kill every process of this uid" can only hit this sandbox's processes.
_UID_BASE, _UID_SPAN = 1_000_000, 1 << 24


@dataclass(frozen=True)
class Limits:
    """Resource bounds for each command run in a sandbox."""

    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    processes: int = 64
    open_files: int = 256
    output_bytes: int = 16 << 10


@dataclass(frozen=True)
class CommandResult:
    """What one sandboxed command did. ``seconds`` is measured wall time, setup included."""

    output: str
    exit_code: int | None
    signal: str | None
    timed_out: bool
    truncated: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def status(self) -> str:
        """A short human/agent-readable account of how the command ended."""
        if self.timed_out:
            return f"killed: wall-clock limit ({self.seconds:.1f}s)"
        if self.signal in ("SIGXCPU", "SIGKILL"):
            return f"killed by {self.signal} (CPU or memory limit)"
        if self.signal == "SIGXFSZ":
            return "killed: file size limit"
        if self.signal is not None:
            return f"killed by {self.signal}"
        return f"exit {self.exit_code}"


class PathRefused(ValueError):
    """An agent asked to touch a path outside its work directory."""


def safe_relpath(path: str) -> str:
    """Normalise an agent-supplied relative path, refusing anything that could escape."""
    text = path.strip()
    if not text or "\x00" in text:
        raise PathRefused(f"bad path {path!r}")
    pure = PurePosixPath(text)
    if pure.is_absolute():
        raise PathRefused(f"absolute path {text!r} refused: paths are relative to the work directory")
    if any(part == ".." for part in pure.parts):
        raise PathRefused(f"path {text!r} refused: '..' may not leave the work directory")
    parts = [p for p in pure.parts if p != "."]
    if not parts:
        raise PathRefused(f"path {text!r} names the work directory itself")
    return "/".join(parts)


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


@functools.cache
def probe_isolation(root: str | None = None) -> str:
    """The strongest mode that works on this host (cached per process and root dir)."""
    for mode in _MODES[:-1]:
        if mode == "root" and os.geteuid() != 0:
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


class Sandbox:
    """One episode's work directory plus the means to run commands inside it.

    ``isolation="auto"`` takes the strongest mode the host offers; naming a mode fails if
    the host cannot provide it. In ``root`` mode the work directory's parent (``root``,
    default: the system temp dir) must be traversable by other users, since commands run
    under an unprivileged uid. One command at a time per sandbox.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        isolation: str = "auto",
        root: str | os.PathLike[str] | None = None,
        _probed: bool = False,
    ) -> None:
        self.limits = limits or Limits()
        root_dir = str(root) if root is not None else None
        if isolation == "auto":
            isolation = probe_isolation(root_dir)
        elif isolation not in _MODES:
            raise LiveBackendError(f"sandbox isolation {isolation!r}: expected auto, {', '.join(_MODES)}")
        elif not _probed and isolation != "plain" and probe_isolation(root_dir) != isolation:
            # The probe tries modes strongest first, so asking for a weaker mode than the
            # host offers is allowed; asking for one it cannot provide is not.
            best = probe_isolation(root_dir)
            if _MODES.index(best) > _MODES.index(isolation):
                raise LiveBackendError(
                    f"sandbox isolation {isolation!r} is not available on this host (best: {best!r})"
                )
        self.isolation = isolation
        self.uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if isolation == "root" else os.getuid()
        self.gid = self.uid if isolation == "root" else os.getgid()
        self.workdir = Path(tempfile.mkdtemp(prefix="rlsched-sbx-", dir=root_dir)).resolve()
        os.chmod(self.workdir, 0o700)
        if isolation == "root":
            os.chown(self.workdir, self.uid, self.gid)
        self._closed = False

    # -- commands -------------------------------------------------------------------------

    def run(
        self, command: str | list[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run ``command`` (a shell line, or an argv list) in the work directory."""
        if self._closed:
            raise RuntimeError("sandbox is closed")
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        config = {
            "mode": self.isolation,
            "workdir": str(self.workdir),
            "uid": self.uid,
            "gid": self.gid,
            "limits": asdict(self.limits),
            "env": _command_env(str(self.workdir)),
        }
        wall = self.limits.wall_seconds if timeout is None else timeout
        start = time.monotonic()
        proc = _launch(config, argv, stdin=stdin is not None)
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
        deadline = start + wall
        output, truncated, timed_out = _collect(proc, deadline, self.limits.output_bytes)
        if not timed_out:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        returncode = proc.wait()
        self._sweep()
        seconds = time.monotonic() - start
        text = output.decode("utf-8", errors="replace")
        if returncode == sandbox_exec.SETUP_FAILED and text.startswith("sandbox:"):
            raise LiveBackendError(f"{text.strip()} (isolation {self.isolation!r}, workdir {self.workdir})")
        sig = signal.Signals(-returncode).name if returncode < 0 else None
        return CommandResult(
            output=text,
            exit_code=None if returncode < 0 else returncode,
            signal=sig,
            timed_out=timed_out,
            truncated=truncated,
            seconds=seconds,
        )

    def write_file(self, path: str, content: str | bytes) -> CommandResult:
        """Write a file the way the agent would: path-checked, by a sandboxed process.

        Raises :class:`PathRefused` for paths that could leave the work directory. The write
        itself runs under the sandbox's uid and mounts, so even a symlink planted by an
        earlier command cannot redirect it outside the work directory.
        """
        rel = safe_relpath(path)
        self._refuse_symlink_escape(rel)
        data = content.encode() if isinstance(content, str) else content
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        return self.run(["/bin/sh", "-c", script, "sh", rel], stdin=data)

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
            data = content.encode() if isinstance(content, str) else content
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            with os.fdopen(os.open(target, flags, 0o644), "wb") as fh:
                fh.write(data)
            if self.isolation == "root":
                for node in (target, *target.relative_to(self.workdir).parents):
                    os.chown(self.workdir / node, self.uid, self.gid)

    def _refuse_symlink_escape(self, rel: str) -> None:
        target = (self.workdir / rel).resolve()
        if not target.is_relative_to(self.workdir):
            raise PathRefused(f"path {rel!r} refused: it resolves outside the work directory")

    def read_files(self, *, max_bytes: int = 4 << 20) -> dict[str, bytes]:
        """The regular files under the work directory (symlinks skipped), by relative path."""
        files: dict[str, bytes] = {}
        total = 0
        for dirpath, dirnames, filenames in os.walk(self.workdir):
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                info = os.lstat(full)
                if not stat.S_ISREG(info.st_mode) or total + info.st_size > max_bytes:
                    continue
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as fh:
                    data = fh.read(info.st_size)
                files[os.path.relpath(full, self.workdir)] = data
                total += len(data)
        return files

    # -- lifetime -------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Kill whatever the last command left running (root mode: every process of our uid)."""
        if self.isolation != "root":
            return
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
        self._sweep()
        shutil.rmtree(self.workdir, ignore_errors=True)

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


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bool, bool]:
    """Read merged stdout/stderr until EOF or ``deadline``; keep at most ``cap`` bytes.

    Once the cap is reached the pipe is closed, so a runaway writer dies of SIGPIPE instead
    of filling the trainer's memory. If the command exits while a background child keeps
    the pipe open, reading stops shortly after (the sweep then kills that child).
    """
    assert proc.stdout is not None  # internal: stdout=PIPE was requested
    stream = proc.stdout
    chunks: list[bytes] = []
    size, truncated, timed_out = 0, False, False
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
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
    return b"".join(chunks), truncated, timed_out
