"""Run invariants, checked in tests and by ``--check`` at run time.

* no GPU in two roles: every rollout engine's GPUs have role ROLLOUT, every trainer GPU
  has role TRAIN, and no GPU is in both; a failed GPU (fault injection) is in no engine,
  not in the trainer and not switching (role IDLE);
* every trajectory of a finished run ends trained or dropped (``lost`` = 0);
* token conservation: every generated token is either kept in its trajectory or counted
  as wasted;
* monotone time (enforced by ``ClusterState.advance``) and staleness within the policy's
  bound (enforced by ``legality.check`` and re-checked here on the result);
* a policy that does not defer trained step s's batch at version s (enforced by
  ``legality.check`` at the command, from the trainer queue's count of optimizer steps
  ahead; re-checked here on the version each trajectory was trained at, faults and
  re-queued steps included);
* no trajectory ran faster than alone: from its first dispatch to its finish it took at
  least its solo seconds (``sim.run.solo_seconds``: its kept turns alone on an engine, the
  bound's critical path of a trajectory) -- a simulator that let one decode, prefill or
  finish a tool call sooner would break the bound's proof too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rlsched.cluster.errors import InvariantViolation
from rlsched.cluster.ids import Role, TrajStatus

if TYPE_CHECKING:
    from .driver import SimDriver, SimResult


def check_roles(driver: SimDriver) -> None:
    st = driver.state
    seen: dict[int, str] = {}
    for e, es in st.engines_.items():
        for g in es.gpus:
            if st.roles[g] is not Role.ROLLOUT:
                raise InvariantViolation(f"t={st.now:.3f}: GPU {g} serves engine {e} but has role {st.roles[g]}")
            seen[g] = f"engine {e}"
    for g in driver.training.trainer.gpus:
        if g in seen:
            raise InvariantViolation(f"t={st.now:.3f}: GPU {g} is in the trainer and in {seen[g]}")
        if st.roles[g] is not Role.TRAIN:
            raise InvariantViolation(f"t={st.now:.3f}: GPU {g} is in the trainer but has role {st.roles[g]}")
    for g in st.failed:
        if st.roles[g] is not Role.IDLE or g in seen or g in driver.training.trainer.gpus:
            raise InvariantViolation(
                f"t={st.now:.3f}: GPU {g} failed but has role {st.roles[g]} or serves {seen.get(g, 'the trainer')}"
            )


def lost_trajectories(result: SimResult) -> list[str]:
    done = (TrajStatus.TRAINED, TrajStatus.DROPPED)
    return [t for t, ts in result.state.trajs.items() if ts.status not in done]


def check_result(result: SimResult, driver: SimDriver, solo: Mapping[str, float] | None = None) -> None:
    """Every invariant above on a finished run; ``solo``: each trajectory's solo seconds
    (``sim.run.solo_seconds``; without it that one is not checked)."""
    check_roles(driver)
    driver.state.check_totals()
    lost = lost_trajectories(result)
    if lost:
        raise InvariantViolation(
            f"{len(lost)} trajectories neither trained nor dropped, e.g. {lost[0]!r} "
            f"({result.state.trajs[lost[0]].status})"
        )
    bound = driver.state.max_staleness
    promised = not driver.loop.defers
    for tid, ts in result.state.trajs.items():
        t = result.trajs[tid]
        kept = 0 if ts.status is TrajStatus.DROPPED else t.output_kept
        if t.generated != kept + t.wasted:
            raise InvariantViolation(
                f"{tid}: generated {t.generated} tokens but kept {kept} + wasted {t.wasted}"
            )
        if (
            ts.status is TrajStatus.TRAINED
            and ts.min_version >= 0
            and ts.trained_version - ts.min_version > bound
        ):
            raise InvariantViolation(
                f"{tid}: trained at version {ts.trained_version} from version {ts.min_version}, "
                f"over the staleness bound {bound}"
            )
        if promised and ts.status is TrajStatus.TRAINED and ts.trained_version != ts.step:
            raise InvariantViolation(
                f"{tid}: of step {ts.step}, trained at version {ts.trained_version} by a policy that does not defer"
            )
        if solo is not None and ts.finish_time >= 0 and ts.dispatches > 0:
            took, floor = ts.finish_time - ts.dispatch_time, solo.get(tid, 0.0)
            if took < floor - 1e-6 * max(1.0, floor):
                raise InvariantViolation(
                    f"{tid}: ran {took:.6f} s from its first dispatch to its finish, faster than its "
                    f"{ts.turns_done} kept turns alone on an engine ({floor:.6f} s)"
                )
