"""The sandbox really bounds what an agent's command can do (real subprocesses, no fakes).

Tests of a guarantee that only the namespaced modes give (network, read-only host, uid
sweep) are skipped with the reason when the host offers only weaker isolation.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from rlsched.cluster.errors import LiveBackendError
from rlsched.real.envs.sandbox import Limits, PathRefused, Sandbox, probe_isolation, safe_relpath

FAST = Limits(cpu_seconds=1, wall_seconds=10, memory_bytes=256 << 20, file_bytes=1 << 20, processes=16)


@pytest.fixture
def box():
    # Default root (the system temp dir): pytest's tmp_path sits under a 0700 directory
    # that the sandbox's unprivileged uid could not enter.
    with Sandbox(limits=FAST) as sandbox:
        yield sandbox


def _needs(mode: str) -> None:
    order = ("bwrap", "root", "userns", "plain")
    best = probe_isolation(None)
    if order.index(best) > order.index(mode):
        pytest.skip(f"host offers only {best!r} isolation, this guarantee needs {mode!r}")


def test_runs_in_its_own_workdir_with_a_scrubbed_env(box, monkeypatch):
    monkeypatch.setenv("RLSCHED_TEST_SECRET", "leak")
    result = box.run("pwd; echo HOME=$HOME; env")
    assert result.ok, result.output
    assert result.output.splitlines()[0] == str(box.workdir)
    assert f"HOME={box.workdir}" in result.output
    assert "RLSCHED_TEST_SECRET" not in result.output
    assert result.seconds > 0


def test_exit_codes_and_output_are_reported(box):
    result = box.run("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3 and not result.ok
    assert "out" in result.output and "err" in result.output
    assert result.status() == "exit 3"


def test_network_is_unreachable_even_on_loopback(box):
    _needs("userns")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3); print(\"CONNECTED\")'"
    try:
        result = box.run(probe)
    finally:
        server.close()
    assert not result.ok
    assert "CONNECTED" not in result.output
    outside = box.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=3)'")
    assert not outside.ok and "unreachable" in outside.output.lower()


def test_write_outside_workdir_is_refused(box, tmp_path):
    with pytest.raises(PathRefused):
        box.write_file("../escape.txt", "x")
    with pytest.raises(PathRefused):
        box.write_file(str(tmp_path / "escape.txt"), "x")
    assert not (box.workdir.parent / "escape.txt").exists()
    assert box.run("ln -s .. up").ok
    with pytest.raises(PathRefused):
        box.write_file("up/escape.txt", "x")
    assert box.write_file("sub/ok.txt", "fine").ok
    assert (box.workdir / "sub" / "ok.txt").read_text() == "fine"
    assert not (tmp_path / "escape.txt").exists()


def test_shell_writes_outside_workdir_fail(box, tmp_path):
    _needs("userns")
    sibling = box.workdir.parent / f"{box.workdir.name}-escape.txt"
    for command in (f"echo x > ../{sibling.name}", "touch /escape.txt", f"touch {tmp_path}/escape.txt"):
        box.run(command)  # under bubblewrap ../ is the sandbox's private /tmp: allowed, not the host's
    assert not box.run(f"touch {tmp_path}/escape.txt").ok
    assert "Read-only file system" in box.run("touch /escape.txt").output
    assert not sibling.exists()
    assert not (tmp_path / "escape.txt").exists()
    assert box.run("echo inside > mine.txt").ok


def test_infinite_loop_is_killed_by_the_cpu_limit(box):
    result = box.run("while :; do :; done")
    assert not result.ok and not result.timed_out
    assert result.signal in ("SIGXCPU", "SIGKILL")


def test_wall_clock_limit_kills_a_sleeper(box):
    result = box.run("sleep 30", timeout=1.0)
    assert result.timed_out and not result.ok
    assert result.seconds < 5


def test_memory_bomb_is_stopped(box):
    bomb = "python3 -c 'a = []\nwhile True: a.append(bytearray(10**7))'"
    result = box.run(bomb)
    assert not result.ok
    assert "MemoryError" in result.output or result.signal is not None


def test_file_size_limit(box):
    result = box.run("head -c 3000000 /dev/zero > big.bin")
    assert not result.ok
    assert (box.workdir / "big.bin").stat().st_size <= FAST.file_bytes


def test_output_is_capped():
    with Sandbox(limits=Limits(output_bytes=1000, wall_seconds=10)) as sandbox:
        result = sandbox.run("yes")
    assert result.truncated and len(result.output) <= 1000


def test_background_and_forked_processes_do_not_survive(box):
    _needs("root")
    from rlsched.real.envs.sandbox import _has_processes

    assert box.run("sleep 60 & echo started").ok
    assert not _has_processes(box.uid)
    bomb = box.run("python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'", timeout=1.5)
    assert not bomb.ok
    assert not _has_processes(box.uid)


def test_close_removes_the_workdir():
    sandbox = Sandbox(limits=FAST)
    sandbox.put_files({"a/b.txt": "x"})
    assert sandbox.read_files() == {"a/b.txt": b"x"}
    sandbox.close()
    assert not sandbox.workdir.exists()
    with pytest.raises(RuntimeError):
        sandbox.run("true")


def test_unknown_isolation_is_a_one_line_error():
    with pytest.raises(LiveBackendError, match="expected auto"):
        Sandbox(isolation="chroot")


@pytest.mark.parametrize(
    ("path", "expected"), [("a.py", "a.py"), ("./d/e.py", "d/e.py"), ("d//f.txt", "d/f.txt")]
)
def test_safe_relpath_accepts(path, expected):
    assert safe_relpath(path) == expected


@pytest.mark.parametrize("path", ["", ".", "/etc/passwd", "../x", "a/../../x", "a/..", "x\x00y"])
def test_safe_relpath_refuses(path):
    with pytest.raises(PathRefused):
        safe_relpath(path)


def test_probe_reports_a_known_mode():
    assert probe_isolation(None) in ("bwrap", "root", "userns", "plain")
    if os.geteuid() == 0:
        assert probe_isolation(None) in ("bwrap", "root")
