"""The sandbox's launcher: set up isolation in a fresh process, then exec the command.

Run by :mod:`rlsched.real.envs.sandbox` as ``python -I -S sandbox_exec.py exec CONFIG -- ARGV``
(or ``kill UID``). It is a separate program rather than a ``preexec_fn`` because the
trainer and the engines run in multithreaded processes (Ray, vLLM, torch), where running
Python code between ``fork`` and ``exec`` can deadlock; a fresh interpreter has no such
hazard. It imports only the standard library (``-I -S``: no site-packages, no user paths).

Isolation modes (chosen and probed by the parent):

``bwrap``  the parent builds a bubblewrap command line (``sandbox_bwrap.py``); this
           launcher joins the sandbox's cgroups, sets the rlimits, drops to the sandbox's
           dedicated uid/gid (no groups, ``no_new_privs``) and execs bubblewrap with the
           command after it, so every namespace is new and owned by that uid.
``root``   new network namespace (only a downed loopback: no network at all), new mount
           namespace in which every mount except the work directory is remounted
           read-only, then the process drops to a dedicated unprivileged uid/gid with no
           supplementary groups and ``no_new_privs`` (setuid binaries cannot regain root).
``userns`` the same namespaces created inside a new user namespace, for non-root hosts
           where unprivileged user namespaces are enabled; the process keeps its uid.
``plain``  no namespaces: only the resource limits, the scrubbed environment and the
           parent's timeouts apply.

Every mode sets ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``,
``RLIMIT_NOFILE`` and ``RLIMIT_CORE`` and starts in the work directory. A setup failure
prints one line starting with ``sandbox:`` and exits with :data:`SETUP_FAILED`.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys

SETUP_FAILED = 125

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_BWRAP_PROCESSES = 3  # bubblewrap's own processes: the outer monitor, PID 1, the command
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None) -> None:
    src = source.encode() if source is not None else None
    kind = fstype.encode() if fstype is not None else None
    _check(_libc.mount(src, target.encode(), kind, ctypes.c_ulong(flags), None), f"mount {target}")


def _hide(paths: list[str]) -> None:
    """Mask each existing directory in ``paths`` with an empty read-only tmpfs."""
    for path in paths:
        if os.path.isdir(path):
            _mount("none", path, _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "tmpfs")


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def _read_only_except(workdir: str) -> None:
    """Make every mount read-only in this (private) mount namespace except ``workdir``.

    The work directory is first bind-mounted onto itself so that it is a mount point of
    its own whose rw flag survives the remount of the filesystem that contains it.
    """
    _mount(None, "/", _MS_REC | _MS_PRIVATE)
    _mount(workdir, workdir, _MS_BIND | _MS_REC)
    with open("/proc/self/mountinfo") as fh:
        entries = [line.split() for line in fh]
    for fields in entries:
        point, options = _unescape(fields[4]), fields[5].split(",")
        if point == workdir or "ro" in options:
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        flags |= _MS_NOSUID if "nosuid" in options else 0
        flags |= _MS_NODEV if "nodev" in options else 0
        flags |= _MS_NOEXEC if "noexec" in options else 0
        if _libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:
                continue  # unmounted since mountinfo was read (another sandbox closing): nothing to protect
            raise SetupError(f"mount {point}: {os.strerror(err)}")


def _enter_user_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET), "unshare(user)")
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"{gid} {gid} 1")


def _processes_of(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def _set_limits(limits: dict[str, int], existing_processes: int) -> None:
    cpu = limits["cpu_seconds"]
    # Soft limit sends SIGXCPU, the hard limit one second later SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # RLIMIT_NPROC counts every process of the real uid on the host, so when the uid is
    # shared with other work (userns/plain modes) the budget is added to what exists.
    nproc = limits["processes"] + existing_processes
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _which(name: str, path: str) -> str:
    if "/" in name:
        return name
    for folder in path.split(":"):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SetupError(f"{name}: command not found on PATH {path}")


def _join_cgroups(dirs: list[str]) -> None:
    for folder in dirs:
        with open(os.path.join(folder, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))


def _exec(config: dict, argv: list[str]) -> None:
    mode, workdir = config["mode"], config["workdir"]
    _join_cgroups(config.get("cgroups", []))
    if mode == "bwrap":
        if not os.path.isdir(workdir):
            raise SetupError(f"work directory {workdir} is gone")
        bwrap = config["bwrap_argv"]
        program = bwrap[0]
        limits = dict(config["limits"])
        limits["processes"] += _BWRAP_PROCESSES
        _set_limits(limits, 0)
        os.setgroups([])
        os.setgid(config["gid"])
        os.setuid(config["uid"])
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
        os.execve(program, [*bwrap, *argv], config["env"])
    if mode == "root":
        _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET), "unshare(net, mount)")
        _read_only_except(workdir)
        _hide(config.get("hide", []))
    elif mode == "userns":
        _enter_user_namespace()
        _read_only_except(workdir)
        _hide(config.get("hide", []))
    elif mode != "plain":
        raise SetupError(f"unknown mode {mode!r}")
    os.chdir(workdir)
    # Resolve the program now: after the uid drop this interpreter may no longer be able to
    # read its own standard library (e.g. under a 0700 home), so nothing may import later.
    program = _which(argv[0], config["env"].get("PATH", ""))
    existing = 0 if mode == "root" else _processes_of(os.getuid())
    _set_limits(config["limits"], existing)
    if mode == "root":
        os.setgroups([])
        os.setgid(config["gid"])
        os.setuid(config["uid"])
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    os.execve(program, argv, config["env"])


def _kill_uid(uid: int) -> None:
    """Become ``uid`` and SIGKILL every process it owns (this one included)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.kill(-1, signal.SIGKILL)


def main(args: list[str]) -> int:
    try:
        if len(args) >= 4 and args[0] == "exec" and args[2] == "--":
            _exec(json.loads(args[1]), args[3:])
        elif len(args) == 2 and args[0] == "kill":
            _kill_uid(int(args[1]))
            return 0
        else:
            raise SetupError("usage: exec CONFIG -- ARGV | kill UID")
    except (SetupError, OSError, ValueError, KeyError) as err:
        print(f"sandbox: {err}", file=sys.stderr, flush=True)
    return SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
