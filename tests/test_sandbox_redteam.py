"""The sandbox tried as a hostile agent would (issue 26): one test per attack class and per
promise of ``real/envs/sandbox.py``'s guarantee table, each asserting the outcome.

Everything runs real processes in real sandboxes. Tests of a guarantee that only the
bubblewrap mode gives (it needs root and the ``bubblewrap`` package) are skipped with the
reason on a host that offers less; CI runs as root with bubblewrap installed, so there
they all run. The crash-input and grading tests need no isolation and run everywhere.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import secrets
import socket
import stat
import subprocess
import threading
from dataclasses import fields, replace
from pathlib import Path

import pytest

from rlsched.cluster.errors import InvariantViolation, LiveBackendError
from rlsched.real.envs import sandbox as sbx
from rlsched.real.envs.base import Guarded, StepResult, make_environment
from rlsched.real.envs.coding_tasks import TASKS_DIR, load_tasks
from rlsched.real.envs.grader import decide, plan_tests
from rlsched.real.envs.sandbox import Guarantees, Limits, Sandbox, probe_guarantees, probe_isolation

FAST = Limits(cpu_seconds=2, wall_seconds=15, memory_bytes=256 << 20, file_bytes=4 << 20, processes=32)
FACTORIAL = "def factorial(n):\n    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n"


@pytest.fixture
def bwrap():
    if probe_isolation(None) != "bwrap":
        pytest.skip(f"host offers {probe_isolation(None)!r} isolation; this guarantee needs 'bwrap' (root + bubblewrap)")
    with Sandbox(limits=FAST, hide=(str(TASKS_DIR),)) as box:
        yield box


@pytest.fixture(scope="module")
def env():
    environment = make_environment("coding", limits=FAST, max_turns=8, accept_weak_sandbox=True)
    yield environment
    environment.close()


def _py(code: str) -> str:
    """A shell line running ``code`` with python3 (quoted for sh)."""
    return "python3 -c '" + code.replace("'", "'\"'\"'") + "'"


# ------------------------------------------------------------------ crash inputs (never raise)


def test_nul_byte_in_a_command_is_an_observation(env):
    env.reset("fix-factorial", seed=0)
    result = env.step("RUN: echo a\x00b")
    assert not result.done and "NUL byte" in result.observation and "\x00" not in result.observation
    assert result.tool_failures == ("RUN refused: NUL byte",)


def test_a_command_over_the_argv_limit_runs_over_stdin(env):
    env.reset("fix-factorial", seed=0)
    payload = "x" * (300 << 10)  # far over MAX_ARG_STRLEN (128 KiB)
    result = env.step(f"RUN: echo {payload} | wc -c")
    assert not result.done and str(len(payload) + 1) in result.observation, result.observation[-300:]
    assert result.tool_failures == ()


def test_odd_file_names_before_submit_do_not_stop_grading(env):
    env.reset("fix-factorial", seed=0)
    env.step("RUN: touch ' ' '  ' \"$(printf 'bad\\377name')\" -- -n")
    result = env.step(f"WRITE mathx.py\n{FACTORIAL}END\nSUBMIT")
    assert result.done and result.reward == 1.0, result.observation


def test_reserved_grader_names_as_directories_do_not_stop_grading(env):
    env.reset("fix-factorial", seed=0)
    env.step("RUN: mkdir -p _rlsched_hidden_tests.py/x _rlsched_runner.py && touch _rlsched_hidden_tests.py/x/y")
    result = env.step(f"WRITE mathx.py\n{FACTORIAL}END\nSUBMIT")
    assert result.done and result.reward == 1.0, result.observation
    assert "reserved for the grader" in result.observation


def test_paths_longer_than_the_os_allows_are_observations(env):
    env.reset("fix-factorial", seed=0)
    result = env.step("WRITE " + "a" * 300 + "/b.py\nx = 1\nEND\nWRITE " + "d/" * 3000 + "f.py\nx\nEND")
    assert not result.done and result.observation.count("error:") == 2
    assert len(result.tool_failures) == 2
    # a tree deeper than PATH_MAX, built by the agent's own shell, then SUBMIT
    deep = 'i=0; while [ $i -lt 60 ]; do mkdir ' + "n" * 100 + ' && cd ' + "n" * 100 + ' || break; i=$((i+1)); done; echo x > leaf'
    env.step("RUN: " + deep)
    # a file whose own path is just over PATH_MAX though its folder's is not
    env.step("RUN: " + deep.replace("-lt 60", "-lt 40").replace("echo x > leaf", "echo x > " + "f" * 120))
    final = env.step(f"WRITE mathx.py\n{FACTORIAL}END\nSUBMIT")
    assert final.done and final.reward == 1.0, final.observation


def test_any_text_encoding_is_an_observation(env):
    env.reset("fix-factorial", seed=0)
    result = env.step("RUN: echo \ud800 \udcff \U0010ffff\nWRITE s\udcff.py\n\ud800\nEND")
    assert not result.done
    result.observation.encode("utf-8")  # lone surrogates never reach the tokenizer
    assert all(f.encode("utf-8") for f in result.tool_failures)


def test_a_sandbox_failure_mid_episode_is_a_recorded_tool_failure(env):
    env.reset("fix-factorial", seed=0)
    box = env.inner._box
    if box._quota:
        subprocess.run(["umount", "-l", str(box.workdir)], check=True)
    subprocess.run(["rm", "-rf", "--", str(box.workdir)], check=True)  # the work directory vanishes
    result = env.step("RUN: ls")
    assert not result.done and result.tool_failures and "failed in the environment" in result.tool_failures[0]
    final = env.step("SUBMIT")  # grading still ends the episode with a reward
    assert final.done and final.reward == 0.0


class FakeBrokenEnvironment:
    """A fake environment whose reset or step raises: the logic under test is Guarded's."""

    def __init__(self, fail_in: str) -> None:
        self.fail_in, self.closed = fail_in, False

    def task_ids(self) -> list[str]:
        return ["t"]

    def reset(self, task_id: str, *, seed: int) -> str:
        if self.fail_in == "reset":
            raise LiveBackendError("sandbox: cannot start")
        return "prompt"

    def step(self, action_text: str) -> StepResult:
        if self.fail_in == "bug":
            raise InvariantViolation("step without reset")
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        self.closed = True


def test_guarded_turns_environment_failures_into_ended_episodes():
    broken = Guarded(FakeBrokenEnvironment("reset"))
    assert "environment failed to start" in broken.reset("t", seed=0)
    result = broken.step("RUN: ls")
    assert result.done and result.reward == 0.0 and "cannot start" in result.tool_failures[0]
    inner = FakeBrokenEnvironment("step")
    failing = Guarded(inner)
    failing.reset("t", seed=0)
    result = failing.step("RUN: ls")
    assert result.done and "No space left" in result.tool_failures[0] and inner.closed
    with pytest.raises(InvariantViolation):  # a driver bug is still raised, not hidden
        Guarded(FakeBrokenEnvironment("bug")).step("x")


# ------------------------------------------------------------- rewards: read or forge


def test_hidden_tests_are_not_readable_from_inside(bwrap):
    probe = f"cat {TASKS_DIR}/fix_clamp.toml; ls {TASKS_DIR}; ls /work /root /home; cat /etc/passwd"
    result = bwrap.run(probe)
    assert "clamp(42" not in result.output and "solution" not in result.output
    assert "No such file" in result.output


@pytest.mark.parametrize("mode", ["bwrap", "root", "userns"])
def test_hidden_files_are_masked_in_the_namespaced_modes(mode):
    order = ("bwrap", "root", "userns", "plain")
    best = probe_isolation(None)
    if order.index(best) > order.index(mode) or not sbx._mode_available(mode):
        pytest.skip(f"host offers {best!r} isolation, not {mode!r}")
    # even a folder that *is* mounted (under /usr, or anywhere in root/userns modes) is masked
    with Sandbox(limits=FAST, isolation=mode, hide=("/usr/share/doc", str(TASKS_DIR))) as box:
        result = box.run(f"ls /usr/share/doc | wc -l; cat {TASKS_DIR}/fix_clamp.toml")
    assert result.output.splitlines()[0].strip() == "0" and "clamp(42" not in result.output


def test_the_grading_sandbox_never_holds_the_expected_values():
    for task in load_tasks().values():
        assert "assert" not in task.plan.source, task.task_id
        for check in task.plan.checks:
            if check.kind == "eq" and isinstance(check.expected, (int, str)) and len(str(check.expected)) > 3:
                assert repr(check.expected) not in task.plan.source, (task.task_id, check)


def test_a_forged_verdict_earns_nothing(env):
    forge = """
import json, os
class Anything:
    def __eq__(self, other): return True
    def __bool__(self): return True
def factorial(n):
    return Anything()
lines = [json.dumps({"kind": "value", "check": i, "repr": r}) for i in range(10) for r in ("True", "1", "120")]
lines += [json.dumps({"kind": "done", "test": t}) for t in ("test_zero", "test_five", "test_ten")]
lines += ["RLSCHED-0000 pass test_zero", "pass test_five"]
for fd in range(1, 30):
    try:
        os.write(fd, ("\\n".join(lines) + "\\n").encode())
    except OSError:
        pass
"""
    env.reset("fix-factorial", seed=0)
    result = env.step(f"WRITE mathx.py\n{forge}\nEND\nSUBMIT")
    assert result.done and result.reward == 0.0, result.observation
    honest = env.inner.evaluate({"mathx.py": FACTORIAL})
    assert honest.reward == 1.0


def test_the_grader_trusts_no_line_of_the_report():
    plan = plan_tests("t.toml", "import m\ndef test_a():\n    assert m.f() == [1, 2]\ndef test_b():\n    assert not m.g()\n")
    ok = '{"kind": "value", "check": 0, "repr": "[1, 2]"}\n{"kind": "done", "test": "test_a"}\n'
    assert decide(plan, ok).passed == ("test_a",)
    for bad in (
        '{"kind": "value", "check": 0, "repr": "(1, 2)"}',  # a tuple is not the list expected
        '{"kind": "value", "check": 0, "repr": "__import__(\'os\')"}',  # never evaluated
        '{"kind": "value", "check": 0, "repr": "' + "[" * 5000 + '"}',
        '{"kind": "value", "check": 0, "repr": "[1, 2]"}\n{"kind": "value", "check": 0, "repr": "[3]"}',
        '[' * 100000,
    ):
        assert decide(plan, bad + '\n{"kind": "done", "test": "test_a"}\n').passed == ()
    assert decide(plan, '{"kind": "value", "check": 0, "repr": "[1, 2]"}\n').passed == ()  # never finished


def test_tasks_whose_verdict_would_be_decided_in_the_sandbox_are_refused():
    from rlsched.cluster.errors import ConfigError

    for source in ("def test_a():\n    assert f() < 3\n", "def test_a():\n    assert f() == g()\n",
                   "def test_a():\n    assert f() and g()\n", "def test_a():\n    f()\n"):
        with pytest.raises(ConfigError, match="field 'tests' line"):
            plan_tests("t.toml", source)


# ------------------------------------------------------------------------- isolation


def test_no_write_reaches_any_mount_but_the_work_directory_and_private_tmp(bwrap):
    script = (
        "import os\n"
        "ok = []\n"
        "for line in open('/proc/self/mountinfo'):\n"
        "    point = line.split()[4]\n"
        "    try:\n"
        "        p = os.path.join(point, '.rlsched-probe'); open(p, 'w').close(); os.unlink(p); ok.append(point)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(sorted(set(ok)))\n"
    )
    result = bwrap.run(_py(script))
    writable = set(ast.literal_eval(result.output.strip()))
    assert writable <= {str(bwrap.workdir), "/tmp", "/dev", "/dev/shm"}, writable
    assert "Read-only file system" in bwrap.run("touch /usr/x /etc/x /x").output


def test_network_and_host_ipc_are_unreachable(bwrap, tmp_path):
    os.chmod(tmp_path, 0o777)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o666)
    path_sock = socket.socket(socket.AF_UNIX)
    path_sock.bind(str(tmp_path / "sock"))
    os.chmod(tmp_path / "sock", 0o777)
    path_sock.listen()
    abstract = socket.socket(socket.AF_UNIX)
    name = "\0rlsched-redteam-" + secrets.token_hex(4)
    abstract.bind(name)
    abstract.listen()
    tcp = socket.create_server(("127.0.0.1", 0))
    port = tcp.getsockname()[1]
    got: list[str] = []
    def accept(server: socket.socket) -> None:
        with contextlib.suppress(OSError):  # closed when the test ends: nothing connected
            got.append(str(server.accept()))

    for server in (path_sock, abstract, tcp):
        threading.Thread(target=accept, args=(server,), daemon=True).start()
    script = (
        "import socket\n"
        f"for fam, addr in ((socket.AF_UNIX, {str(tmp_path / 'sock')!r}), (socket.AF_UNIX, {name!r}),"
        f" (socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_INET, ('1.1.1.1', 53))):\n"
        "    try:\n"
        "        s = socket.socket(fam); s.settimeout(2); s.connect(addr); print('REACHED', addr)\n"
        "    except OSError as e:\n"
        "        print('refused', e)\n"
        f"open({str(fifo)!r}, 'w').write('x')\n"
    )
    try:
        result = bwrap.run(_py(script), timeout=10)
    finally:
        for s in (path_sock, abstract, tcp):
            s.close()
    assert "REACHED" not in result.output and not got, result.output
    assert "No such file" in result.output  # the host FIFO is not even visible


def test_no_privilege_and_no_user_namespaces(bwrap):
    result = bwrap.run(
        "id -u; " + _py("import os\ntry:\n    os.setuid(0); print('ROOT')\nexcept OSError as e: print('setuid', e)")
        + "; unshare -U true && echo USERNS; unshare -r true && echo USERNS; grep CapEff /proc/self/status"
    )
    lines = result.output.splitlines()
    assert lines[0] == str(bwrap.uid) and "ROOT" not in result.output and "USERNS" not in result.output
    assert "CapEff:\t0000000000000000" in result.output


def test_cpu_across_all_processes_of_a_command_is_bounded(bwrap):
    if bwrap._group is None or bwrap._group.cpu is None:
        pytest.skip("no CPU cgroup on this host")
    result = bwrap.run("for i in 1 2 3 4 5 6; do (while :; do :; done) & done; wait", timeout=30)
    assert result.limit == "cpu" and not result.ok and result.seconds < 15, result
    assert "CPU time limit" in result.status()


def test_shared_memory_is_bounded_and_freed(bwrap):
    if bwrap._group is None or bwrap._group.memory is None:
        pytest.skip("no memory cgroup on this host")
    size = 192 << 20  # the attack: 192 MiB of shared memory against a 128 MiB limit
    small = replace(FAST, memory_bytes=128 << 20)
    before = Path("/proc/sysvipc/shm").read_text().count("\n")
    with Sandbox(limits=small) as box:
        sysv = box.run(_py(
            "import ctypes, ctypes.util\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.shmat.restype = ctypes.c_void_p\n"
            f"sid = libc.shmget(0, {size}, 0o1600)\n"
            "addr = libc.shmat(sid, None, 0)\n"
            f"ctypes.memset(addr, 1, {size}); print('FILLED')\n"
        ))
        memfd = box.run(_py(
            "import os\n"
            "fd = os.memfd_create('x')\n"
            f"for _ in range({size >> 20}): os.write(fd, b'x' * (1 << 20))\n"
            "print('FILLED')\n"
        ))
        tmp = box.run(f"head -c {size} /dev/zero > /dev/shm/f && echo FILLED")
    for result in (sysv, memfd, tmp):
        assert "FILLED" not in result.output and not result.ok, result
    assert Path("/proc/sysvipc/shm").read_text().count("\n") == before  # nothing outlives the sandbox


def test_processes_are_bounded_and_orphans_do_not_accumulate(bwrap):
    bomb = bwrap.run(_py("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"), timeout=2)
    assert not bomb.ok
    for _ in range(3):  # each command's orphans die with its PID namespace, so the budget is whole again
        result = bwrap.run(f"for i in $(seq {FAST.processes - 8}); do sleep 30 & done; echo spawned")
        assert result.ok and "spawned" in result.output, result.output[-300:]
    assert not sbx._has_processes(bwrap.uid)


def test_nothing_started_in_the_background_outlives_its_command(bwrap):
    assert bwrap.run("sleep 60 & setsid sh -c 'sleep 60 &' & nohup sleep 60 >/dev/null 2>&1 & echo ok").ok
    assert not sbx._has_processes(bwrap.uid)
    assert bwrap.run("echo kept > mine; echo gone > /tmp/t").ok
    assert bwrap.run("cat mine; cat /tmp/t").output.startswith("kept\ncat: /tmp/t: No such file")


def test_the_host_is_not_visible(bwrap, monkeypatch):
    monkeypatch.setenv("RLSCHED_SECRET", "leak")
    result = bwrap.run("env; hostname; ls /proc | grep -c '^[0-9]'; ls /")
    assert "RLSCHED_SECRET" not in result.output and "sandbox" in result.output.splitlines()
    processes = int(next(line for line in result.output.splitlines() if line.isdigit()))
    assert processes <= 6  # bwrap's init, sh, ls, grep: no host process
    assert set(bwrap.run("ls /").output.split()) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                                                      "sbin", "tmp", "usr"}


def test_the_work_directory_has_a_disk_quota(bwrap):
    if not bwrap._quota:
        pytest.skip("the host refused a tmpfs quota")
    small = replace(FAST, disk_bytes=8 << 20, file_bytes=64 << 20)
    with Sandbox(limits=small) as box:
        result = box.run("head -c 20000000 /dev/zero > big")
        assert not result.ok and "No space left" in result.output
        assert box.run("du -sk . | cut -f1").output.strip().isdigit()


def test_sandbox_identities_are_unique_and_checked(bwrap, monkeypatch):
    other = subprocess.Popen(["sleep", "30"], user=sbx._UID_BASE + 7, stdin=subprocess.DEVNULL)
    try:
        def draw(*offsets: int) -> None:
            it = iter(offsets)
            monkeypatch.setattr(sbx.secrets, "randbelow", lambda n: next(it))

        draw(7, 7, 8)  # 7 belongs to a live process: skipped however often it is drawn
        uid, path = sbx._reserve_uid()
        assert uid == sbx._UID_BASE + 8 and os.path.exists(path)
        draw(8)  # 8 is reserved now: drawing it again is refused (and the draws run out)
        with pytest.raises(StopIteration):
            sbx._reserve_uid()
        os.unlink(path)
    finally:
        monkeypatch.undo()
        other.kill()
        other.wait()
    with Sandbox(limits=FAST) as a, Sandbox(limits=FAST) as b:
        assert a.uid != b.uid and a.uid != bwrap.uid
        a_file = a._uid_file
        assert a_file is not None and stat.S_ISREG(os.stat(a_file).st_mode)
    assert not os.path.exists(a_file)  # released at close


def test_close_releases_cgroups_quota_and_workdir(bwrap):
    box = Sandbox(limits=FAST)
    dirs = box._group.dirs() if box._group is not None else []
    box.run("sleep 5 &")
    box.close()
    assert not box.workdir.exists() and all(not d.exists() for d in dirs)
    assert str(box.workdir) not in Path("/proc/self/mountinfo").read_text()


# ------------------------------------------------------------- the guarantee table


def test_the_docstring_table_names_exactly_the_probed_guarantees():
    rows = re.findall(r"^\| ``(\w+)`` \|", sbx.__doc__ or "", flags=re.M)
    assert rows == [f.name for f in fields(Guarantees) if f.name != "mode"]
    for name in rows:  # and each has a test here that proves it
        assert name in _PROVED_BY and _PROVED_BY[name] in globals(), name


def test_this_host_reports_what_the_suite_proves():
    g = probe_guarantees(None)
    if g.mode == "bwrap":
        assert g.missing(sbx.LIVE_MINIMUM) == []
    assert g.mode == probe_isolation(None)


def test_a_live_run_is_refused_below_the_minimum_unless_accepted(monkeypatch):
    weak = Guarantees("plain", *([False] * (len(fields(Guarantees)) - 1)))
    monkeypatch.delenv(sbx.ACCEPT_WEAK_ENV, raising=False)
    with pytest.raises(LiveBackendError, match="RLSCHED_ACCEPT_WEAK_SANDBOX=1"):
        sbx.require_guarantees(weak)
    sbx.require_guarantees(weak, accept_weak=True)
    monkeypatch.setenv(sbx.ACCEPT_WEAK_ENV, "1")
    sbx.require_guarantees(weak)


_PROVED_BY = {
    "network_isolated": "test_network_and_host_ipc_are_unreachable",
    "read_only_host": "test_no_write_reaches_any_mount_but_the_work_directory_and_private_tmp",
    "minimal_root": "test_the_host_is_not_visible",
    "hidden_files": "test_hidden_tests_are_not_readable_from_inside",
    "pid_namespace": "test_the_host_is_not_visible",
    "ipc_namespace": "test_shared_memory_is_bounded_and_freed",
    "uts_namespace": "test_the_host_is_not_visible",
    "no_user_namespaces": "test_no_privilege_and_no_user_namespaces",
    "dedicated_uid": "test_sandbox_identities_are_unique_and_checked",
    "background_killed": "test_nothing_started_in_the_background_outlives_its_command",
    "memory_cgroup": "test_shared_memory_is_bounded_and_freed",
    "pids_cgroup": "test_processes_are_bounded_and_orphans_do_not_accumulate",
    "cpu_cgroup": "test_cpu_across_all_processes_of_a_command_is_bounded",
    "disk_quota": "test_the_work_directory_has_a_disk_quota",
}
