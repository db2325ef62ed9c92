"""The policy conformance kit: does a policy keep the contract?

Like Gymnasium's ``check_env`` for environments, :func:`check_policy` drives a policy --
shipped or third-party -- through scripted scenarios on the real simulator and reports
every way it breaks the contract:

* it declares ``name``, ``params`` (each a :class:`~rlsched.cluster.policy.Param` whose
  default parses), ``max_staleness`` and ``defers``, and can be built from defaults;
* every command it issues is legal (``legality.check``: no GPU in two roles, no
  training of unfinished trajectories, staleness within its own bound, step s's batch
  trained at version s unless it declares ``defers``, ...);
* it finishes every step of every scenario (never stalls) and loses no trajectory;
* the run's invariants hold (``--check``) and it never beats its own lower bound;
* it is deterministic: the same seed gives the same commands, in the same order.

The scenarios cover the situations a scheduler meets: a uniform batch, a long tail, tool
time that saturates the sandbox pool, KV pressure that forces queueing and eviction,
several steps, and tp > 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import InvariantViolation, PolicyError
from rlsched.cluster.policy import Policy
from rlsched.policies.plugins import PluginError, answer, params_defect
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

# Hand-sized cost model: 1 s per decode step, switches 1 s, training ~free.
_COST = CostModel(
    params=0.5e9, layers=1, d_model=1, kv_heads=1, head_dim=1, bytes_per_param=2.0,
    kv_bytes_per_elem=1e-9, hbm_bytes=10e9, hbm_bw=1e9, peak_flops=1e21, gpu_mem_util=0.9,
    decode_bw_eff=1.0, decode_compute_eff=1.0, decode_overhead_s=0.0, prefill_eff=1.0,
    train_mfu=1.0, sync_bw=1e21, sync_latency_s=0.5, kv_transfer_bw=1e9, switch_s=1.0,
    optimizer_step_s=0.5,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    rows: list[tuple[str, str, int, int, int, float]]
    steps: list[list[str]]
    config: RunConfig
    cost: CostModel = _COST


def _traj(task: str, tid: str, turns: int, out: int, env: float, prompt: int = 20) -> list:
    return [(task, tid, k, prompt, out, env) for k in range(turns)]


def scenarios() -> list[Scenario]:
    uniform = [r for i in range(8) for r in _traj(f"u{i // 4}", f"U{i}", 2, 3, 1.0)]
    tail = [r for i in range(8) for r in _traj(f"l{i // 4}", f"L{i}", 1 + 3 * (i == 7), 2 + 20 * (i == 6), 0.5)]
    tools = [r for i in range(6) for r in _traj("t", f"T{i}", 3, 1, 5.0)]
    kv = [r for i in range(6) for r in _traj("k", f"K{i}", 2, 2, 1.0, prompt=300)]
    many = [r for i in range(12) for r in _traj(f"m{i % 3}", f"M{i}", 1 + i % 3, 1 + i, float(i % 2))]
    tight = replace(_COST, kv_bytes_per_elem=0.5, gpu_mem_util=1.0, hbm_bytes=1e9 + 1300)
    ids = lambda p, n: [f"{p}{i}" for i in range(n)]  # noqa: E731
    return [
        Scenario("uniform", uniform, [ids("U", 8)], RunConfig(gpus=4, tp=1, steps=1)),
        Scenario("long-tail", tail, [ids("L", 4), ids("L", 8)[4:]], RunConfig(gpus=4, tp=1, steps=2)),
        Scenario("sandbox-saturated", tools, [ids("T", 6)], RunConfig(gpus=4, tp=1, steps=1, sandbox_slots=1)),
        Scenario("kv-pressure", kv, [ids("K", 6)], RunConfig(gpus=2, tp=1, steps=1), tight),
        Scenario("multi-step-tp2", many, [ids("M", 12)[s::4] for s in range(4)], RunConfig(gpus=8, tp=2, steps=4)),
    ]


@dataclass
class Report:
    policy: str
    problems: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines = [f"policy {self.policy}: {'conforms' if self.ok else 'DOES NOT conform'}"]
        lines += [f"  ok    {p}" for p in self.passed]
        lines += [f"  FAIL  {p}" for p in self.problems]
        return "\n".join(lines)


class _Recording:
    """Wraps a policy to log its commands (for the determinism check)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.log: list[tuple[float, str]] = []
        self.name = inner.name
        self.params = inner.params

    @property
    def max_staleness(self) -> int:
        return self.inner.max_staleness

    @property
    def defers(self) -> bool:
        return self.inner.defers

    def reset(self, view, rng) -> None:  # type: ignore[no-untyped-def]
        self.inner.reset(view, rng)

    def on_event(self, event, view):  # type: ignore[no-untyped-def]
        # (a policy that raises or answers None is reported as a FAIL line, not a traceback)
        cmds = answer(self.inner.on_event, f"policy {self.name}", self.name, event, view)
        self.log.extend((view.now, repr(c)) for c in cmds)
        return cmds


def check_policy(factory: Callable[[], Policy], *, seeds: tuple[int, ...] = (0, 1)) -> Report:
    """Run the kit; ``factory`` builds a fresh, configured policy object each call."""
    try:
        policy = factory()
    except Exception as exc:
        return Report("?", [f"cannot build the policy: {exc.__class__.__name__}: {exc}"])
    rep = Report(getattr(policy, "name", type(policy).__qualname__))
    for attr in ("name", "params", "max_staleness", "defers", "reset", "on_event"):
        if not hasattr(policy, attr):
            rep.problems.append(f"missing `{attr}` (see rlsched.cluster.policy.Policy)")
    if rep.problems:
        return rep
    defect = params_defect(policy.params)
    if defect:
        rep.problems.append(defect)
        return rep
    for p in policy.params:
        try:
            p.parse(p.default, policy=policy.name)
        except ValueError as err:
            rep.problems.append(f"parameter default does not parse: {err}")
    if not isinstance(policy.max_staleness, int) or policy.max_staleness < 0:
        rep.problems.append(f"max_staleness={policy.max_staleness!r}: expected an int >= 0")
    rep.passed.append("declares name, params, max_staleness, defers")
    defects: set[str] = set()
    for sc in scenarios():
        logs = []
        for seed in seeds[:1] * 2:
            rec = _Recording(factory())
            w = Workload.from_frame(pd.DataFrame(sc.rows, columns=[
                "task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens", "env_seconds"]))
            batches = [[(t, t) for t in s] for s in sc.steps]
            cfg = replace(sc.config, check=True, seed=seed)
            try:
                out = simulate(w, batches, rec, cfg, sc.cost)  # type: ignore[arg-type]
            except PluginError as err:  # a defect of the code, not of the scenario: said once
                if str(err) not in defects:
                    defects.add(str(err))
                    rep.problems.append(f"{sc.name}: {err}")
                break
            except (PolicyError, InvariantViolation) as err:
                rep.problems.append(f"{sc.name}: {err}")
                break
            if out.result.state.version != len(batches):
                rep.problems.append(f"{sc.name}: finished {out.result.state.version} of {len(batches)} steps")
                break
            if out.result.makespan < out.lower_bound_seconds - 1e-6:
                rep.problems.append(
                    f"{sc.name}: ran in {out.result.makespan:.3f}s, under its lower bound "
                    f"{out.lower_bound_seconds:.3f}s (a driver bug or an illegal shortcut)"
                )
                break
            logs.append(rec.log)
        else:
            if logs[0] != logs[1]:
                rep.problems.append(f"{sc.name}: two runs with the same seed issued different commands")
            else:
                rep.passed.append(f"{sc.name}: legal, complete, invariants hold, deterministic")
    return rep
