"""Fit the length and time distributions of a (small, real) trace and generate a larger one
like it: ``rlsched trace gen --like imported.parquet``.

Why: an import of a few hundred real agent runs is too small to load a simulated cluster of
thousands of GPUs, but its *shape* -- how many turns, how long the tool outputs, how slow
the tools -- is what the scheduling comparison should inherit. So each distribution is
fitted with ``scipy.stats`` and sampled at the size the run needs.

Distributions (names used in the fit report):

- ``turns_per_trajectory``; ``task_prompt_tokens`` (turn 0: system + task prompt);
  ``prompt_tokens_per_turn`` (turns >= 1: tool output appended); ``output_tokens_per_turn``;
  ``env_seconds_per_turn``.

Method: each is fitted by maximum likelihood (location fixed at 0) with every family in
``FAMILIES`` -- lognormal, gamma, Weibull -- and the family with the smallest
Kolmogorov-Smirnov statistic against the data is kept. Integer data (turns, tokens) is
first spread uniformly over ``[x, x+1)`` (dequantisation with a seeded jitter) so a
continuous family can be fitted and tested, and samples are floored back to integers.
Environment time often has exact zeros (steps that ran nothing); they are kept as a point
mass (``zero_frac``) and the positive part is fitted. The KS p-values are nominal: the
parameters are estimated from the same data, which makes the test conservative (a
Lilliefors-type correction would give smaller p-values); read the KS statistic as the
largest gap between the fitted and the empirical CDF.

What the generated trace does *not* keep: correlations -- between the turns of one
trajectory, between length and truncation, and the task effect (hard tasks long for every
sample) beyond the shared task prompt; branching (imported logs have none). Truncation is
drawn per trajectory with the observed rate and rewards are resampled from the observed
per-trajectory rewards.

``GenParams`` (``traces/presets.py``) models every distribution as a lognormal without a
zero mass, so the sampler here is its own; :meth:`FittedTrace.gen_overrides` still gives the
closest ``GenParams`` overrides (lognormal moments of the data) for users of the presets.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from rlsched.cluster.errors import TraceError
from rlsched.traces.generate import check_seed
from rlsched.traces.schema import validate_trace

FAMILIES: tuple[str, ...] = ("lognorm", "gamma", "weibull_min")
#: Larger samples are fitted on a seeded random subset of this size (the KS test uses all).
MAX_FIT_VALUES = 20_000
DISTRIBUTIONS = ("turns_per_trajectory", "task_prompt_tokens", "prompt_tokens_per_turn",
                 "output_tokens_per_turn", "env_seconds_per_turn")


@dataclass(frozen=True)
class FittedDist:
    """One fitted distribution and how to sample it.

    ``family`` is a ``scipy.stats`` name with ``params`` (shape..., loc, scale), or
    ``constant`` (``params = (value,)``), or ``empty`` (no data; samples are 0).
    """

    name: str
    family: str
    params: tuple[float, ...]
    discrete: bool
    minimum: float
    zero_frac: float
    n: int
    log_median: float  # exp(mean(log x)) of the positive values: lognormal moments,
    log_sigma: float   # kept for GenParams overrides whatever family won

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.family == "empty":
            values = np.zeros(size)
        elif self.family == "constant":
            values = np.full(size, self.params[0], dtype=np.float64)
        else:
            values = getattr(stats, self.family)(*self.params).rvs(size=size, random_state=rng)
            if self.discrete:
                values = np.floor(values)
        if self.zero_frac > 0:
            values = np.where(rng.random(size) < self.zero_frac, 0.0, values)
        return np.maximum(values, self.minimum)


def _log_moments(x: np.ndarray) -> tuple[float, float]:
    pos = x[x > 0]
    if pos.size == 0:
        return 0.0, 0.0
    logs = np.log(pos)
    return float(np.exp(logs.mean())), float(logs.std())


def _fit_one(name: str, raw: np.ndarray, *, discrete: bool, minimum: float, zeros: bool,
             rng: np.random.Generator, families: tuple[str, ...]
             ) -> tuple[FittedDist, dict[str, object]]:
    x = np.asarray(raw, dtype=np.float64)
    n = int(x.size)
    log_median, log_sigma = _log_moments(x)
    zero_frac = float(np.mean(x <= 0)) if zeros and n else 0.0
    data = x[x > 0] if zeros else x
    row: dict[str, object] = {"distribution": name, "n": n, "zero_frac": round(zero_frac, 4)}
    if data.size == 0 or np.ptp(data) == 0:
        family = "empty" if data.size == 0 else "constant"
        params = () if data.size == 0 else (float(data[0]),)
        fitted = FittedDist(name, family, params, discrete, minimum, zero_frac, n, log_median,
                            log_sigma)
        row.update(family=family, params=", ".join(f"{p:g}" for p in params),
                   ks_stat=0.0 if data.size else math.nan,
                   p_value=1.0 if data.size else math.nan)
        return fitted, row
    if discrete:
        data = data + rng.random(data.size)  # dequantise: x -> uniform on [x, x+1)
    fit_on = data if data.size <= MAX_FIT_VALUES else rng.choice(data, MAX_FIT_VALUES,
                                                                  replace=False)
    best: tuple[float, float, str, tuple[float, ...]] | None = None
    for family in families:
        dist = getattr(stats, family)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                params = tuple(float(p) for p in dist.fit(fit_on, floc=0))
            except (ValueError, RuntimeError, FloatingPointError):
                continue
            if not all(math.isfinite(p) for p in params):
                continue
            res = stats.kstest(data, dist(*params).cdf)
        if best is None or res.statistic < best[0]:
            best = (float(res.statistic), float(res.pvalue), family, params)
    if best is None:
        raise TraceError(f"{name}: no distribution family in {', '.join(families)} could be "
                         f"fitted to {n} values — expected positive, varied values")
    ks, p, family, params = best
    fitted = FittedDist(name, family, params, discrete, minimum, zero_frac, n, log_median,
                        log_sigma)
    row.update(family=family, params=", ".join(f"{v:.4g}" for v in params), ks_stat=ks,
               p_value=p)
    return fitted, row


def distributions(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The five fitted quantities of a canonical trace, as arrays (see the module doc)."""
    traj, _ = pd.factorize(df["trajectory_id"])
    turn = df["turn"].to_numpy(dtype=np.int64)
    prompt = df["prompt_tokens"].to_numpy(dtype=np.float64)
    return {
        "turns_per_trajectory": np.bincount(traj).astype(np.float64),
        "task_prompt_tokens": prompt[turn == 0],
        "prompt_tokens_per_turn": prompt[turn > 0],
        "output_tokens_per_turn": df["output_tokens"].to_numpy(dtype=np.float64),
        "env_seconds_per_turn": df["env_seconds"].to_numpy(dtype=np.float64),
    }


@dataclass(frozen=True)
class FittedTrace:
    """The fitted distributions of a trace plus its truncation rate and rewards."""

    turns: FittedDist
    task_prompt: FittedDist
    prompt: FittedDist
    output: FittedDist
    env: FittedDist
    truncated_frac: float
    rewards: tuple[float, ...]  # observed per-trajectory rewards (empty: the trace had none)

    def generate(self, *, seed: int, tasks: int, samples: int) -> pd.DataFrame:
        """A canonical trace of ``tasks x samples`` trajectories drawn from the fits."""
        for name, value in (("tasks", tasks), ("samples", samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TraceError(f"generate_like: {name}={value!r} — expected a whole number "
                                 f">= 1")
        check_seed("generate_like", seed)
        rng = np.random.default_rng(seed)
        n_traj = tasks * samples
        lengths = self.turns.sample(rng, n_traj).astype(np.int64)
        lengths = np.maximum(lengths, 1)
        start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        n_rows = int(lengths.sum())
        traj_of_row = np.repeat(np.arange(n_traj), lengths)
        turn = np.arange(n_rows, dtype=np.int64) - start[traj_of_row]
        task_of = np.repeat(np.arange(tasks), samples)
        task_prompt = self.task_prompt.sample(rng, tasks).astype(np.int64)
        prompt = self.prompt.sample(rng, n_rows).astype(np.int64)
        first = turn == 0
        prompt[first] = task_prompt[task_of[traj_of_row[first]]]
        output = self.output.sample(rng, n_rows).astype(np.int64)
        env = np.round(self.env.sample(rng, n_rows), 3)
        truncated = rng.random(n_traj) < self.truncated_frac
        width = len(str(tasks - 1))
        task_names = np.array([f"t{k:0{width}d}" for k in range(tasks)], dtype=object)
        traj_names = np.array([f"{task_names[task_of[i]]}-s{i % samples}"
                               for i in range(n_traj)], dtype=object)
        data: dict[str, object] = {
            "task_id": pd.Series(task_names[task_of[traj_of_row]], dtype=object),
            "trajectory_id": pd.Series(traj_names[traj_of_row], dtype=object),
            "turn": turn,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "env_seconds": env,
            "truncated": truncated[traj_of_row],
        }
        if self.rewards:
            data["reward"] = rng.choice(np.asarray(self.rewards), n_traj)[traj_of_row]
        return validate_trace(pd.DataFrame(data), "generate_like")

    def gen_overrides(self) -> dict[str, float]:
        """Closest ``GenParams`` overrides: lognormal moments, no tail/slow/fork components.

        Use as ``generate_trace("longtail-small", seed=s, **fitted.gen_overrides())``. The
        zero mass of env time and non-lognormal shapes are lost; prefer :meth:`generate`.
        """
        def med(d: FittedDist) -> float:
            return max(d.log_median, 1e-3)

        out: dict[str, float] = {
            "turns_median": med(self.turns), "turns_sigma": self.turns.log_sigma,
            "long_frac": 0.0, "task_sigma": 0.0,
            "prompt_tokens_median": med(self.task_prompt),
            "prompt_tokens_sigma": self.task_prompt.log_sigma,
            "tool_tokens_median": med(self.prompt), "tool_tokens_sigma": self.prompt.log_sigma,
            "tool_tail_frac": 0.0,
            "output_tokens_median": med(self.output),
            "output_tokens_sigma": self.output.log_sigma,
            "env_seconds_median": med(self.env), "env_seconds_sigma": self.env.log_sigma,
            "env_slow_frac": 0.0, "branch_frac": 0.0,
        }
        if self.rewards:
            out["success_rate"] = float(np.clip(np.mean(self.rewards), 0.0, 1.0))
        return out


def fit_trace(df: pd.DataFrame, *, seed: int = 0,
              families: tuple[str, ...] = FAMILIES) -> tuple[FittedTrace, pd.DataFrame]:
    """Fit the distributions of a canonical trace.

    Returns the fitted sampler and a report with one row per distribution: ``n``,
    ``family``, ``params`` (scipy order: shape(s), loc, scale), ``zero_frac``, ``ks_stat``,
    ``p_value`` (nominal, see the module doc), the data's and the fit's median and p99,
    and a ``note`` (e.g. how many env values were themselves estimated at import).
    """
    for family in families:
        if not hasattr(stats, family):
            raise TraceError(f"unknown distribution family {family!r} — expected a "
                             f"scipy.stats name such as {', '.join(FAMILIES)}")
    if len(df) == 0:
        raise TraceError("fit_trace: the trace has no rows — expected at least one turn")
    check_seed("fit_trace", seed)
    rng = np.random.default_rng(seed)
    values = distributions(df)
    spec = {
        "turns_per_trajectory": (True, 1.0, False),
        "task_prompt_tokens": (True, 0.0, False),
        "prompt_tokens_per_turn": (True, 0.0, False),
        "output_tokens_per_turn": (True, 0.0, False),
        "env_seconds_per_turn": (False, 0.0, True),
    }
    fitted: dict[str, FittedDist] = {}
    rows = []
    for name in DISTRIBUTIONS:
        discrete, minimum, zeros = spec[name]
        dist, row = _fit_one(name, values[name], discrete=discrete, minimum=minimum,
                             zeros=zeros, rng=rng, families=families)
        check = dist.sample(np.random.default_rng(seed + 1), 20_000)
        data = values[name]
        row["data_p50"] = float(np.median(data)) if data.size else math.nan
        row["fit_p50"] = float(np.median(check))
        row["data_p99"] = float(np.percentile(data, 99)) if data.size else math.nan
        row["fit_p99"] = float(np.percentile(check, 99))
        row["note"] = ""
        fitted[name] = dist
        rows.append(row)
    if "env_estimated" in df.columns:
        est = int(df["env_estimated"].astype(bool).sum())
        if est:
            rows[-1]["note"] = f"{est} of {len(df)} values estimated at import (env_estimated)"
    traj, _ = pd.factorize(df["trajectory_id"])
    n_traj = int(traj.max()) + 1
    truncated = 0.0
    if "truncated" in df.columns:
        flags = df["truncated"].to_numpy(dtype=bool)
        truncated = float((np.bincount(traj, weights=flags, minlength=n_traj) > 0).mean())
    rewards: tuple[float, ...] = ()
    if "reward" in df.columns:
        first = np.unique(traj, return_index=True)[1]
        per_traj = df["reward"].to_numpy(dtype=np.float64)[first]
        per_traj = per_traj[~np.isnan(per_traj)]
        rewards = tuple(float(r) for r in per_traj)
    model = FittedTrace(
        turns=fitted["turns_per_trajectory"], task_prompt=fitted["task_prompt_tokens"],
        prompt=fitted["prompt_tokens_per_turn"], output=fitted["output_tokens_per_turn"],
        env=fitted["env_seconds_per_turn"], truncated_frac=truncated, rewards=rewards)
    columns = ["distribution", "n", "family", "params", "zero_frac", "ks_stat", "p_value",
               "data_p50", "fit_p50", "data_p99", "fit_p99", "note"]
    report = pd.DataFrame(rows)[columns].set_index("distribution")
    return model, report


def generate_like(df: pd.DataFrame, *, seed: int, tasks: int, samples: int) -> pd.DataFrame:
    """A synthetic trace of ``tasks x samples`` trajectories shaped like ``df``.

    Fits ``df`` with :func:`fit_trace` (fit seed 0, so the fit does not change with the
    generation seed) and draws from the fits with ``seed``.
    """
    model, _ = fit_trace(df)
    return model.generate(seed=seed, tasks=tasks, samples=samples)


def compare_distributions(real: pd.DataFrame, synthetic: pd.DataFrame) -> pd.DataFrame:
    """Two-sample KS statistic and p-value per distribution: how alike two traces are.

    For ``--like``: ``compare_distributions(imported, generate_like(imported, ...))``.
    """
    a, b = distributions(real), distributions(synthetic)
    rows = []
    for name in DISTRIBUTIONS:
        x, y = a[name], b[name]
        if x.size == 0 or y.size == 0:
            rows.append({"distribution": name, "n_real": x.size, "n_synthetic": y.size,
                         "ks_stat": math.nan, "p_value": math.nan})
            continue
        res = stats.ks_2samp(x, y)
        rows.append({"distribution": name, "n_real": int(x.size), "n_synthetic": int(y.size),
                     "ks_stat": float(res.statistic), "p_value": float(res.pvalue)})
    return pd.DataFrame(rows).set_index("distribution")
