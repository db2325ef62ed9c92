"""How big ``elastic``'s micro-batches are, without a driver (events in, commands out, on a
real ClusterState), and the meter's training rate they are sized by: every micro-batch pays
a fixed part (its gradient reduction) whatever its size, so the meter tells that part from
the rate, a micro-batch that ends before GPUs on their way to the trainer arrive takes more
than one trajectory, and one too small to be worth its fixed part waits while more of its
step is to come."""

import pytest
from test_policy_elastic import _finish, _rolling_out

from rlsched.cluster.commands import TrainMicroBatch
from rlsched.cluster.events import TrajectoryFinished
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.policies.meter import Meter

from simkit import sample_case


def _timed(m: Meter, gpus: int, tokens: int, seconds: float, start: float = 0.0) -> None:
    m.micro_batch_sent(gpus, tokens, start)
    m.micro_batch_done(start + seconds)


def test_the_meter_tells_a_micro_batchs_fixed_part_from_its_rate():
    # 16 GPUs: 0.5 s fixed (the gradient reduction) + 0.0006 GPU-s per token
    m = Meter()
    _timed(m, 16, 3200, 0.5 + 3200 * 0.0006 / 16)
    # one size timed: the marginal rate is that micro-batch's, no fixed part known
    assert m.micro_batch_s(16) == 0.0
    assert abs(m.marginal_gpu_s_per_token - 0.62 * 16 / 3200) < 1e-12  # (5x the true rate)
    _timed(m, 16, 96_000, 0.5 + 96_000 * 0.0006 / 16)
    assert abs(m.marginal_gpu_s_per_token - 0.0006) < 1e-9
    assert abs(m.micro_batch_s(16) - 0.5) < 1e-9
    # the trainer is sized by what its micro-batches took, fixed part and all: the newest
    assert abs(m.train_gpu_s_per_token - (0.5 * 16 / 96_000 + 0.0006)) < 1e-12
    assert m.micro_batch_s(8) == 0.0  # (not timed at that width)


def test_the_fixed_part_is_per_trainer_width_with_one_rate():
    # one replica (8 GPUs) reduces no gradient; two (16) do: the same rate, two intercepts
    m = Meter()
    for gpus, tokens, fixed in ((8, 2900, 0.0), (8, 23_200, 0.0), (16, 2900, 0.49), (16, 89_900, 0.49)):
        _timed(m, gpus, tokens, fixed + tokens * 0.00058 / gpus)
    assert abs(m.marginal_gpu_s_per_token - 0.00058) < 1e-9
    assert abs(m.micro_batch_s(8)) < 1e-9 and abs(m.micro_batch_s(16) - 0.49) < 1e-9


def test_a_line_that_curves_upward_has_no_fixed_part():
    # long trajectories cost more FLOPs per token (attention): seconds grow faster than
    # tokens, and the line through them crosses zero below zero seconds -- no fixed part,
    # the line's slope the rate (the larger micro-batch's, not the small one's)
    m = Meter()
    _timed(m, 8, 1000, 0.1)
    _timed(m, 8, 10_000, 2.0)
    assert m.micro_batch_s(8) == 0.0
    assert abs(m.marginal_gpu_s_per_token - 1.9 / 1125) < 1e-12


def _ready_on_a_trainer_with_gpus_coming(tokens: dict[str, int], fixed: float = 0.0) -> list:
    """Staleness 1, 8 engines of 1 GPU, the trainer on GPUs 6-7 and GPUs 0-1 on their way to
    it (sent at t=100, a switch measured 8 s, training 0.001 GPU-s per token plus ``fixed``
    seconds per micro-batch on 2 GPUs); at t=101 the trajectories of ``tokens`` have finished
    (the last of them reported): the commands."""
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1,micro=2", steps=3)  # (4 a micro-batch)
    m = pol._meter
    _timed(m, 2, 1000, fixed + 0.5)
    _timed(m, 2, 3000, fixed + 1.5)
    m.switch_s = 8.0
    pol._switches.to_train[(0, 1)] = 100.0
    st.roles[0] = st.roles[1] = Role.SWITCHING
    st.advance(101.0)
    for t, n in tokens.items():
        st.trajs[t].tokens = n
        _finish(st, t)
    return [c for c in pol.on_event(TrajectoryFinished(t, TrajStatus.DONE, 0), st)
            if isinstance(c, TrainMicroBatch)]


def test_while_gpus_come_a_micro_batch_takes_what_ends_before_they_arrive():
    # the GPUs arrive at t=108: 7 s on 2 GPUs is 14k tokens. Three of 4k end by then (6 s)
    # and go together; the fourth would end after: it waits for the next micro-batch
    (mb,) = _ready_on_a_trainer_with_gpus_coming({"T0": 4000, "T1": 4000, "T2": 4000, "T3": 4000})
    assert len(mb.trajectories) == 3
    # (until 2026-12 one trajectory at a time: three gradient reductions instead of one)
    # with a fixed part of 1.5 s per micro-batch only 11k tokens fit: two of 4k
    (mb,) = _ready_on_a_trainer_with_gpus_coming({"T0": 4000, "T1": 4000, "T2": 4000, "T3": 4000}, fixed=1.5)
    assert len(mb.trajectories) == 2
    # a trajectory longer than all the room still goes, alone (the trainer never idles on it)
    (mb,) = _ready_on_a_trainer_with_gpus_coming({"T0": 20_000, "T1": 4000})
    assert len(mb.trajectories) == 1


def _first_of_its_step_finishes(tokens: int, fixed: float) -> list:
    """Staleness 1, 8 engines of 1 GPU, the trainer on GPUs 6-7 with nothing on its way; the
    meter measured ``fixed`` seconds per micro-batch on 2 GPUs and 0.001 GPU-s per token.
    T0 (``tokens``) finishes first of its step: the commands."""
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1", steps=3)
    _timed(pol._meter, 2, 1000, fixed + 0.5)
    _timed(pol._meter, 2, 3000, fixed + 1.5)
    pol._meter.switch_s = 8.0  # (no move to the trainer can pay for one)
    st.advance(50.0)
    st.trajs["T0"].tokens = tokens
    _finish(st, "T0")
    return [c for c in pol.on_event(TrajectoryFinished("T0", TrajStatus.DONE, 0), st)
            if isinstance(c, TrainMicroBatch)]


def test_a_micro_batch_smaller_than_its_fixed_part_waits_while_more_of_its_step_is_to_come():
    # 400 tokens train in 0.2 s on 2 GPUs; a micro-batch costs 0.5 s more whatever its size:
    # the trainer waits for more of the step (on a trace with no length spread the step's
    # first trajectory went alone, one extra reduction a step)
    assert _first_of_its_step_finishes(400, fixed=0.5) == []
    # worth its fixed part: it starts at once
    assert len(_first_of_its_step_finishes(2000, fixed=0.5)) == 1
    # no fixed part measured: it starts at once whatever its size
    assert len(_first_of_its_step_finishes(400, fixed=0.0)) == 1


@pytest.mark.parametrize("case", [
    # (seed, tasks, samples, tp, engines, steps, turns scale): two of the three `uniform`
    # cases of bench/no_harm.py's seed-1 sample more than 1% behind colocated before
    # session 18 (+1.11% and +1.44%: the step's last engines reached the trainer 0.05 s
    # apart and a one-trajectory micro-batch started on the first); now +0.55% and +0.05%
    (619869, 4, 4, 8, 3, 3, 0.1),
    (661412, 8, 8, 8, 3, 6, 0.1),
])
def test_on_policy_elastic_keeps_up_with_colocated_on_uniform_traces(case):
    seconds = sample_case("uniform", *case)
    col, el = seconds("colocated"), seconds("elastic")
    assert el <= 1.01 * col, (el, col)
