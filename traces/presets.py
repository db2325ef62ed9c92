"""Parameters of the synthetic trace generator and the named presets.

Every number here is either taken from a published statistic of agent rollouts or is an
assumption; ``traces/SOURCES.md`` says which, per field and preset. Distributions are
lognormal bodies (``median``, ``sigma`` of the log) with a second lognormal or Pareto
component for the tail, because every published length/time distribution of agent runs is
right-skewed with a few very long runs ("long tail").
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

from rlsched.cluster.errors import ConfigError


class GenParamError(ConfigError):
    """A generator parameter out of range. The message names it as ``GenParams.<field>``;
    ``field``, ``value`` and ``why`` let a command line name the flag that set it instead
    (``trace gen``), without parsing the message."""

    def __init__(self, field: str, value: object, why: str) -> None:
        super().__init__(f"GenParams.{field}={value!r} — {why}")
        self.field, self.value, self.why = field, value, why

#: The most trajectories a generated trace may hold (``--tasks 99999999999999999999`` was a
#: NumPy ValueError deep in the generator; ten million is beyond any RL run's rollouts).
MAX_TRAJECTORIES = 10_000_000


def check_trajectory_count(tasks: int, samples: int) -> None:
    """The one bound on a generated trace's size (presets and ``trace gen --like``)."""
    if tasks * samples > MAX_TRAJECTORIES:
        raise ConfigError(f"--tasks x --samples = {tasks} x {samples}: expected at most "
                          f"{MAX_TRAJECTORIES:,} trajectories")


@dataclass(frozen=True)
class GenParams:
    """Knobs of :func:`~rlsched.traces.generate.generate_trace` (units in the names).

    Turns per trajectory: a task factor (lognormal, shared by the group: hard tasks are long
    for every sample) times a two-component lognormal mixture; ``long_frac`` of the
    trajectories come from the long component. Drawn lengths above ``max_turns`` are cut
    and marked truncated (the agent's step limit).

    Tokens: turn 0 appends the task prompt (``prompt_tokens_median``); later turns append a
    tool observation (lognormal body plus a Pareto tail of ``tool_tail_frac`` huge outputs
    such as file dumps or test logs, capped at ``tool_tokens_cap`` as agent scaffolds
    truncate observations). Each turn generates ``output_tokens`` (lognormal, capped).

    Environment time after each turn: lognormal (``env_seconds_median``) plus a slow
    component (``env_slow_frac`` of calls, e.g. test-suite runs, ``env_slow_median``).

    Limits: a trajectory whose context would exceed ``max_context_tokens`` or whose summed
    env time would exceed ``max_env_seconds`` stops after the last turn that fits
    (``truncated=True``, reward 0) -- it keeps the turns it finished.

    Branching: within a group, each sample after the first is, with probability
    ``branch_frac``, a fork of an earlier sample of the same group at a turn drawn uniformly
    from ``1 .. parent_turns-1``; its rows before that turn are copies of the parent's.

    Rewards: a task's success probability is Beta-distributed around ``success_rate``
    (``success_concentration`` small = most tasks all-pass or all-fail, as observed);
    reward is 0/1 on every row of the trajectory.

    ``turns_scale`` and ``tokens_scale`` multiply the turn counts and all token counts
    (handy to shrink or stretch a preset without editing it).

    ``growth`` makes episodes grow over the run, as a learning policy's do: the turn counts
    of task k (file order, which is the order a run's steps draw tasks in) are multiplied
    by a factor rising linearly from 1 for the first task to ``growth`` for the last (1:
    no drift). Size the pool to the run (tasks = steps x tasks per step): a run that
    wraps around the pool starts over at short episodes.
    """

    tasks: int = 64
    samples: int = 8
    turns_median: float = 30.0
    turns_sigma: float = 0.6
    long_frac: float = 0.15
    long_turns_median: float = 100.0
    long_turns_sigma: float = 0.5
    task_sigma: float = 0.3
    max_turns: int = 250
    prompt_tokens_median: float = 3000.0
    prompt_tokens_sigma: float = 0.4
    tool_tokens_median: float = 500.0
    tool_tokens_sigma: float = 1.0
    tool_tail_frac: float = 0.03
    tool_tail_min: float = 4000.0
    tool_tail_alpha: float = 1.5
    tool_tokens_cap: int = 32_000
    output_tokens_median: float = 200.0
    output_tokens_sigma: float = 0.9
    output_tokens_cap: int = 16_384
    env_seconds_median: float = 1.0
    env_seconds_sigma: float = 1.2
    env_slow_frac: float = 0.03
    env_slow_median: float = 30.0
    env_slow_sigma: float = 1.0
    env_seconds_cap: float = 1800.0
    max_context_tokens: int = 131_072
    max_env_seconds: float = 4 * 3600.0
    branch_frac: float = 0.25
    success_rate: float = 0.35
    success_concentration: float = 1.0
    turns_scale: float = 1.0
    tokens_scale: float = 1.0
    growth: float = 1.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise GenParamError(f.name, value, "expected a number")
            if value != value or value in (float("inf"), float("-inf")):
                raise GenParamError(f.name, value, "expected a finite number")
        for name in ("tasks", "samples", "max_turns", "tool_tokens_cap", "output_tokens_cap",
                     "max_context_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise GenParamError(name, value, "expected a whole number >= 1")
        check_trajectory_count(self.tasks, self.samples)
        for name in ("long_frac", "tool_tail_frac", "env_slow_frac", "branch_frac",
                     "success_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise GenParamError(name, value, "expected a fraction in [0, 1]")
        for name in ("turns_median", "long_turns_median", "prompt_tokens_median",
                     "tool_tokens_median", "output_tokens_median", "env_seconds_median",
                     "env_slow_median", "tool_tail_min", "tool_tail_alpha", "env_seconds_cap",
                     "max_env_seconds", "success_concentration", "turns_scale",
                     "tokens_scale", "growth"):
            value = getattr(self, name)
            if value <= 0:
                raise GenParamError(name, value, "expected a number > 0")
        for name in ("turns_sigma", "long_turns_sigma", "task_sigma", "prompt_tokens_sigma",
                     "tool_tokens_sigma", "output_tokens_sigma", "env_seconds_sigma",
                     "env_slow_sigma"):
            value = getattr(self, name)
            if value < 0:
                raise GenParamError(name, value, "expected a sigma >= 0")

    def replace(self, **overrides: float) -> GenParams:
        """A copy with some fields changed; unknown names fail with a suggestion."""
        names = [f.name for f in dataclasses.fields(self)]
        for key in overrides:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown generator parameter {key!r}{hint} — expected one "
                                  f"of the GenParams fields")
        return dataclasses.replace(self, **overrides)


PRESETS: dict[str, GenParams] = {
    # The shipped sample (traces/data/longtail-small.parquet): SWE-bench-like single-repo
    # fixes: tens of turns, a 128k context window, tool calls of seconds to minutes.
    "longtail-small": GenParams(),
    # Seed scale: enough tasks for 48 steps x 64 tasks x 8 samples; the long component has a
    # median of ~300 turns and the longest contexts approach 1M tokens; hours per trajectory.
    "swe-seed": GenParams(
        tasks=3072,
        samples=8,
        turns_median=60.0,
        turns_sigma=0.6,
        long_frac=0.3,
        long_turns_median=300.0,
        long_turns_sigma=0.45,
        task_sigma=0.3,
        max_turns=1000,
        tool_tokens_median=600.0,
        env_seconds_median=2.0,
        env_slow_frac=0.05,
        env_slow_median=60.0,
        env_seconds_cap=3600.0,
        max_context_tokens=1_000_000,
        max_env_seconds=8 * 3600.0,
    ),
    # Drift: the long-tail shape, with episodes (turns) growing 3x from the first task to
    # the last, as response lengths grow during RL training (traces/SOURCES.md); its limits
    # (turns, context) are 3x longtail-small's so that the growth is not cut off. 192
    # tasks: 12 steps of 16 tasks x 8 samples without wrapping around the pool.
    "longtail-growing": GenParams(tasks=192, growth=3.0, max_turns=750, max_context_tokens=393_216),
    # Every trajectory identical in length, tokens and time; no branching, no truncation.
    # Useful where colocated and asynchronous schedules must tie.
    "uniform": GenParams(
        turns_median=20.0,
        turns_sigma=0.0,
        long_frac=0.0,
        task_sigma=0.0,
        prompt_tokens_median=2000.0,
        prompt_tokens_sigma=0.0,
        tool_tokens_median=500.0,
        tool_tokens_sigma=0.0,
        tool_tail_frac=0.0,
        output_tokens_median=200.0,
        output_tokens_sigma=0.0,
        env_seconds_median=2.0,
        env_seconds_sigma=0.0,
        env_slow_frac=0.0,
        branch_frac=0.0,
        success_rate=0.5,
    ),
    # Tool time dominates: slow builds and test suites (e.g. compiled languages, big repos).
    "tool-heavy": GenParams(
        env_seconds_median=5.0,
        env_seconds_sigma=1.0,
        env_slow_frac=0.15,
        env_slow_median=120.0,
        env_slow_sigma=0.8,
        env_seconds_cap=3600.0,
    ),
}


def get_preset(preset: str | GenParams) -> GenParams:
    """Resolve a preset name (or pass a GenParams through); unknown names fail clearly."""
    if isinstance(preset, GenParams):
        return preset
    if preset in PRESETS:
        return PRESETS[preset]
    close = difflib.get_close_matches(str(preset), list(PRESETS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown trace preset {preset!r}{hint} — expected one of "
                      f"{', '.join(PRESETS)}")
