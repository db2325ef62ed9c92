"""The bubblewrap command line that builds one sandboxed command's world.

Why bubblewrap: the namespace, mount and capability set-up of a sandbox is exactly the
code that is easy to get subtly wrong (stacked mounts remounted by path, user namespaces
left creatable, no reaping init); bubblewrap (Debian package ``bubblewrap``) is a small,
widely audited tool that does it. This module only decides *what* the sandbox sees; the
launcher (``sandbox_exec.py``) joins the cgroups, sets the rlimits, drops to the
sandbox's own uid and then execs the argv built here.

The world, for every command (all namespaces new: user, PID, IPC, UTS, network, cgroup):

* ``/usr`` read-only, with ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as on the host (links
  or read-only binds); ``/usr/local`` masked by an empty tmpfs unless the interpreter lives
  there -- nothing else of the host file system is mounted (no ``/home``, ``/root``,
  ``/work``, ``/run``, ``/var``, no host ``/tmp`` or ``/dev/shm``), and any ``hide`` path
  that would still be visible (for example task files installed under ``/usr``) is masked;
* ``/etc``: only the dynamic loader's files and the time zone (read-only);
* a fresh ``/proc`` of the new PID namespace, a minimal ``/dev`` (null, zero, random, tty,
  an empty ``shm``), a size-limited ``/tmp`` tmpfs, the root itself remounted read-only;
* the work directory bound read-write at the same path, and the command started there;
* ``--disable-userns``: no user namespace can be created inside; bubblewrap's PID 1 reaps
  orphans and, when the command exits, takes every process of the namespace with it
  (``--die-with-parent``); ``--new-session`` so the command cannot push input to a terminal.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BWRAP = "bwrap"
_ROOT_LINKS = ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")


def bwrap_path() -> str | None:
    """The bwrap binary, if installed."""
    return shutil.which(BWRAP, path="/usr/bin:/bin:/usr/local/bin:/usr/sbin")


def _interpreter_dirs() -> set[str]:
    """Where ``python3`` and ``sh`` really live, so masking ``/usr/local`` cannot hide them."""
    dirs = set()
    for name in ("python3", "sh"):
        found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if found:
            dirs.add(str(Path(found).resolve().parent))
    return dirs


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def bwrap_argv(
    bwrap: str,
    workdir: str,
    *,
    tmp_bytes: int,
    hide: tuple[str, ...] = (),
    hostname: str = "sandbox",
) -> list[str]:
    """The bwrap options (up to and including ``--``) for one command in ``workdir``."""
    argv = [
        bwrap,
        "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent", "--new-session",
        "--hostname", hostname,
        "--ro-bind", "/usr", "/usr",
    ]
    mounted = ["/usr"]
    if not any(_under(d, "/usr/local") for d in _interpreter_dirs()) and os.path.isdir("/usr/local"):
        argv += ["--tmpfs", "/usr/local", "--remount-ro", "/usr/local"]
    for path in _ROOT_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
            mounted.append(path)
    for path in _ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(tmp_bytes), "--tmpfs", "/tmp",
        "--bind", workdir, workdir,
    ]
    for path in hide:
        real = str(Path(path).resolve())
        if any(_under(real, m) for m in mounted) and os.path.isdir(real):
            argv += ["--tmpfs", real, "--remount-ro", real]
    argv += ["--remount-ro", "/", "--chdir", workdir, "--"]
    return argv
