"""Do no harm: elastic (its defaults) is never slower than colocated at staleness 0, nor
than the best asynchronous split at staleness 1, beyond 1%, on random small long-tailed
traces (the shapes elastic exists for: the shipped long-tail preset and the tool-heavy
one), every policy on the same tasks, cost model and trained tokens.

Known exceptions, stated in the README: on traces with *no* length spread (the
``uniform`` preset, not drawn here) at a handful of engines and steps, staleness-1 elastic
lost up to ~7% to the best fixed split in an earlier session's search (its moves cost
switches that a tail-less workload never repays; a fixed split is optimal there; ``hold``,
session 11, is elastic holding a fixed split once it measures that regime, but it holds
half the engines, not the best split, and only when a step's training is lighter than two
switches: in session 12, 18 of 40 random ``uniform`` cases were still more than 1% behind
at k=1, up to 10.9%, and 2 of 40 at k=0, up to 1.7%; session 13, the side rounded up, the
test on what a move saves, a held trainer giving back what is above its side, and ``join``
waiting for any measured saving: 11, 7 and 8 of three samples of 40 at k=1, up to 7.4%,
13.5% and 6.5% -- what is left is mostly the first step, rolled out beside the quarter
reserved before anything was measured, and the switches into the held split -- and none at
k=0 (worst 0.62%); three cases it closed are pinned below). The small long-tailed cases the
slow search found (up to 5.0% behind) are pinned below at the 1% tolerance with their
measured figures, but three, pinned at their measured gaps (their docstrings say why):
tool-heavy on 2 single-GPU engines, 2.4% behind colocated at k=0, and two found in session
12 (1.02% -- 2.6% before session 13 -- and 1.06% behind the best async at k=1). Two of five
slow-search runs on an intermediate session-12 version found those two; six runs on its
final code found nothing. The default-suite test draws a fixed set of
examples (derandomized), so it is not flaky; the slow one searches.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace

FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)
TOLERANCE = 1.01


def _case(seed: int, preset: str, tasks: int, samples: int, tp: int, engines: int, steps: int,
          turns_scale: float):
    df = generate_trace(preset, seed=seed, tasks=tasks * steps, samples=samples, turns_scale=turns_scale)
    w, b = Workload.from_frame(df), draw_batches(df, steps, tasks)
    cfg = RunConfig(gpus=tp * engines, tp=tp, steps=steps)

    def seconds(spec: str) -> tuple[float, int]:
        r = simulate(w, b, make_policy(spec), cfg, CostModel()).result
        assert r.complete, spec
        return r.makespan, sum(s["trained_tokens"] for s in r.steps)

    return seconds


def _check(seconds) -> None:
    col, tok = seconds("colocated")
    el0, tok0 = seconds("elastic")
    assert tok0 == tok  # the same trajectories, whole
    assert el0 <= TOLERANCE * col, f"elastic {el0:.1f} s vs colocated {col:.1f} s"
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    el1, tok1 = seconds("elastic:staleness=1")
    assert tok1 == tok
    assert el1 <= TOLERANCE * best, f"elastic k=1 {el1:.1f} s vs best async {best:.1f} s"


cases = st.tuples(
    st.integers(0, 10**6),
    st.sampled_from(["longtail-small", "tool-heavy"]),
    st.sampled_from([4, 6, 8]),  # tasks per step
    st.sampled_from([2, 4, 8]),  # samples per task
    st.sampled_from([1, 2, 4]),  # tp
    st.sampled_from([2, 3, 4, 8]),  # engines
    st.sampled_from([0.1, 0.3]),  # turns scale (short: fast)
)


@settings(max_examples=6, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_elastic_never_loses_on_small_long_tailed_traces(case):
    seed, preset, tasks, samples, tp, engines, scale = case
    _check(_case(seed, preset, tasks, samples, tp, engines, 3, scale))


def test_known_counterexample_stays_within_its_measured_gap_and_closes_without_a_reserve():
    """The slow search's counterexample (longtail-small, seed 16, 4 tasks x 2 samples per step,
    tp 4, 4 engines, turns x0.1, 6 steps): the best async takes 405.1 s. Elastic k=1 with its
    defaults was 414.3 s, 2.3% slower, until session 11 (``hold=false``: it reserves a quarter
    of the GPUs for a trainer before anything has finished, ``train_share`` 0.25, then moves
    engines between the roles every step, each move a switch that 8 trajectories a step never
    repay). With ``hold`` (session 11) a step's measured training, under two switches on half
    the GPUs, makes it hold a fixed half split from the first optimizer step on: 409.1 s, 0.98%
    behind -- what is left is the first step, rolled out beside the quarter reserved before
    anything was measured (``isolate=false``: 408.3 s). With the trainer forming from freed
    engines (``train_share=0``, and ``train_within=0.4``) it is 396.3 s, 2.2% ahead; not the
    default: on the regime map's training-heavy points those measured up to 23% slower
    (README, elastic bench). Session 12: 408.4 s, 0.8% behind."""
    seconds = _case(16, "longtail-small", 4, 2, 4, 4, 6, 0.1)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best
    assert seconds("elastic:staleness=1,isolate=false")[0] <= TOLERANCE * best
    assert seconds("elastic:staleness=1,train_share=0,train_within=0.4")[0] <= TOLERANCE * best


def test_a_flat_tail_on_two_engines_does_not_starve_the_trainer():
    """Found by the slow search with the trainer starting empty (``train_share=0``):
    longtail-small, seed 244, 4 tasks x 2 samples, tp 1, 2 engines, turns x0.1, 3 steps.
    Neither engine emptied until the batch was nearly over, so nothing trained: elastic k=1
    478.5 s vs the best async 453.8 s (5.4% behind). With ``hedge`` an engine goes to the
    empty trainer once as much has finished as still runs: 390.2 s. (Session 12: capping the
    last batch's placement at the spread of the work in flight even with no engine on its way
    made it queue behind a trainer that kept its engine, 466.3 s -- so that cap applies only
    while engines are coming.)"""
    seconds = _case(244, "longtail-small", 4, 2, 1, 2, 3, 0.1)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1,train_share=0")[0] <= TOLERANCE * best
    assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best  # (the default reserves one)


def test_known_counterexample_stays_within_its_measured_gap():
    """Found by the slow search (longtail-small, seed 1, 4 tasks x 2 samples per step, tp 2,
    4 engines, turns x0.1, 6 steps): the best async rolls out on one engine and trains on three
    (rollout_fraction 0.25: 348.9 s; 353.7 s at 0.5). Elastic k=1 was 352.5 s, 1.0% slower,
    until session 11 (``hold=false,join=false``): with 8 trajectories a step there is almost no
    tail, and every move of an engine between the roles costs a switch that a fixed split never
    pays, and the step's last trajectory trained on the quarter reserved while three more
    engines switched to the trainer. Now 339.2 s, 2.8% ahead: ``hold`` keeps a half split from
    the first optimizer step (``hold=false``: 352.5 s). Session 12: 342.3 s, 1.9% ahead;
    session 13 (``hold`` tests what a move would save; ``join`` waits for any saving):
    336.5 s, 3.6% ahead."""
    seconds = _case(1, "longtail-small", 4, 2, 2, 4, 6, 0.1)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best


@pytest.mark.slow  # a search: it still finds cases like the one pinned above (1 in 5 runs in session 9)
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.sampled_from([3, 6]))
def test_elastic_never_loses_on_long_tailed_traces_slow(case, steps):
    seed, preset, tasks, samples, tp, engines, scale = case
    _check(_case(seed, preset, tasks, samples, tp, engines, steps, scale))


def test_known_counterexample_on_eight_engines_stays_within_its_measured_gap():
    """Found by a 25-case random sample of the slow search's strategy (session 10):
    longtail-small, seed 643550, 4 tasks x 2 samples per step, tp 4, 8 engines, turns x0.1,
    6 steps. The best async (rollout_fraction 0.375) takes 605.1 s. Elastic k=1 was 617.2 s,
    2.0% slower, until session 11 (``hold=false``). Why: two trajectories of 350 s dominate;
    each step's last one was trained on the trainer's reserved quarter (8 GPUs: 11.5 s for
    53k tokens, against 3.6 s for the whole batch on async's 20), and that delay ran down the
    chain of optimizer steps to the release of the batch holding the second long one, which
    then finished 11 s later. With ``hold`` the trainer holds half the GPUs from the first
    optimizer step on: 603.6 s, 0.2% ahead."""
    seconds = _case(643550, "longtail-small", 4, 2, 4, 8, 6, 0.1)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best


def test_a_late_switch_report_no_longer_starves_the_trainer():
    """Found by the slow search on session 11's first ``hold`` (longtail-small, seed 1285,
    4 tasks x 2 samples per step, tp 4, 8 engines, turns x0.3, 6 steps): the best async
    (rollout_fraction 0.25) takes 1048.7 s; elastic k=1 took 1087.9 s, 3.7% behind. Engines
    coming back to rollout were idle on arrival and went on to the trainer before the
    driver's RolesChanged(rollout) reached the policy, which then ended their switch to the
    trainer too: the meter measured a 0 s switch and the trainer, expecting no GPUs, started a
    244k-token micro-batch on its 4. With a late report ending only the switch to its own
    role: 1046.6 s, 0.2% ahead (``hold=false``: 1043.7 s). Session 13 (``hold`` tests what a
    move would save): 1031.6 s, 1.6% ahead; 1029.2 s, 1.9%, since a held trainer at its side
    trains what is ready in one micro-batch (session 14)."""
    seconds = _case(1285, "longtail-small", 4, 2, 4, 8, 6, 0.3)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best


def test_known_tool_heavy_counterexamples_on_three_gpus_stay_within_their_measured_gaps():
    """Found by the slow search on session 11's final code, and there before it: tool-heavy,
    seed 105, 6 tasks x 8 samples per step, tp 1, 3 steps.

    On 3 engines the best async (rollout_fraction 0.5 to 0.75) takes 11,405.8 s; elastic k=1
    took 11,973.9 s, 5.0% behind, until session 12: the run's last batch was released when
    the one before it had finished, and the one engine up took 47 of its 48 trajectories
    (its cap still counted two batches, k+1) while the engine coming back from the trainer
    got one and went back. With the engines up taking only their share of the work in
    flight while others come back (``policies/elastic/split.py``): 9,836.9 s, 13.8% ahead -- at the
    1% tolerance now.

    On 2 engines (turns x0.1) elastic **k=0** takes 7,309.7 s against colocated's 7,137.2 s,
    2.4% behind, pinned at that gap: engines come back from the trainer one at a time and the
    first to open takes its cap in queue order -- three whole groups, one of them the long
    task's 8 samples, which then hold that engine to the step's end (colocated spreads each
    group 4/4; when the other engine empties it goes to the trainer). Spreading a task's
    samples over engines closes it (6,688.8 s, 6.3% ahead; tried in session 12, not
    shipped), but on the elastic bench it was mixed: 0.1-0.5% slower at
    three k=0 points and 0.9% at one k=1 point than main, faster at the other eight."""
    seconds = _case(105, "tool-heavy", 6, 8, 1, 3, 3, 0.3)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best
    seconds = _case(105, "tool-heavy", 6, 8, 1, 2, 3, 0.1)
    assert seconds("elastic")[0] <= 1.03 * seconds("colocated")[0]


def test_cases_found_in_session_12_stay_within_their_measured_gaps():
    """Found by the slow search in session 12 (two of five runs on an intermediate version), both
    there before it with the same figures (main 116442f: 406.6 s and 18,442.0 s), pinned at
    their measured gaps so that they cannot grow unnoticed (and pass the day they close).

    Longtail-small, seed 71764, 4 tasks x 2 samples, tp 2, 8 engines, turns x0.1, 3 steps:
    the best async (rollout_fraction 0.25: 2 engines roll out, 12 GPUs train) takes 396.3 s,
    elastic k=1 406.6 s (2.6% behind; ``hold=false`` 403.3 s). In the first two batches'
    tail four engines idle for 125-190 s while the reserved quarter (4 GPUs) trains each
    trajectory as it finishes (none of the moves on offer repays a switch), and the last
    batch waits 8 s for the engines the held split sends back to rollout. Session 13: 400.4 s
    (1.02% behind) once ``join`` waits for any measured saving (no margin of half a switch).

    Tool-heavy, seed 4869, 4 tasks x 8 samples, tp 1, 2 engines, turns x0.3, 6 steps: every
    async split is one engine each way (18,249.1 s); elastic k=1 takes 18,442.0 s (1.06%
    behind; not analysed)."""
    seconds = _case(71764, "longtail-small", 4, 2, 2, 8, 3, 0.1)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= 1.011 * best
    seconds = _case(4869, "tool-heavy", 4, 8, 1, 2, 6, 0.3)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
    assert seconds("elastic:staleness=1")[0] <= 1.011 * best


def test_an_on_policy_step_end_does_not_start_training_on_the_first_engine_back():
    """Found by a random sample of ``uniform`` traces (session 12; no length spread):
    seed 1861, 4 tasks x 2 samples, tp 1, 3 engines, turns x0.3, 6 steps. Every trajectory
    ends within a second of the others; one engine empties first and goes to the trainer,
    whose micro-batch of one trajectory (3.4 s on its 1 GPU) then held back the two GPUs
    arriving a second later: elastic k=0 took 445.6 s against colocated's 438.2 s (1.7%
    behind) while ``join`` waited only for savings of more than half a switch. Waiting for
    any measured saving: 439.4 s (0.3% behind)."""
    seconds = _case(1861, "uniform", 4, 2, 1, 3, 6, 0.3)
    assert seconds("elastic")[0] <= TOLERANCE * seconds("colocated")[0]


def test_uniform_cases_with_the_held_split_at_its_side_stay_within_tolerance():
    """Traces with no length spread (the ``uniform`` preset), found in session 12's 40-case
    sample, where ``hold`` engaged (or should have) and elastic k=1 lost to the best async.

    Seed 439460 (8 tasks x 8 samples, tp 4, 4 engines, turns x0.1, 6 steps): the best async
    (two engines each way) takes 110.1 s; elastic k=1 took 118.4 s, 7.5% behind. Its held
    split (two engines each way) was right, but after step 0 the trainer held three engines,
    and the rollout of one batch (12.4 s) was shorter than two switches, so ``_reclaim``
    left batches 2 and 3 on the one engine up (19.7 s each) beside a trainer of three.
    Session 13: a held trainer gives back what is above its side even then: 109.8 s.

    Seed 861126 (6 tasks x 2 samples, tp 2, 3 engines, turns x0.3, 6 steps): the best async
    trains on two engines (193.2 s; one: 214.5 s). Elastic k=1 took 206.5 s, 6.9% behind:
    the half split rounded down held the trainer on one engine (21.4 s a step, 10.2 s on
    two), and ``hold`` did not even engage -- a step took 20.4 s on that side, over two 8 s
    switches, though a move to every GPU would have saved only 13.6 s of it. Session 13: the
    side rounded up and the test on what a move saves: 189.9 s, 1.7% ahead."""
    for case in ((439460, "uniform", 8, 8, 4, 4, 6, 0.1), (861126, "uniform", 6, 2, 2, 3, 6, 0.3)):
        seconds = _case(*case)
        best = min(seconds(f"async:rollout_fraction={f},staleness=1")[0] for f in FRACTIONS)
        assert seconds("elastic:staleness=1")[0] <= TOLERANCE * best, case
