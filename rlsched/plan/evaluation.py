"""One simulator evaluation as a picklable job, and the runners that execute them.

A :class:`Job` names a scenario (which trace variant, how many GPUs), a policy spec and how
many of the run's steps to simulate (a prefix: the planner's low-fidelity rungs). Workers
receive the :class:`PlanSetup` once and build each scenario's workload and batches on first
use, so a job crossing a process boundary is a few strings. Every evaluation is a pure
function of (setup, job) -- the simulator is deterministic for a seed -- which is why
results can be cached by job and why the planner's output does not depend on how many
workers ran it.

Runners: :class:`LocalRunner` (in-process for one worker, else a process pool on this
machine) and :class:`RayRunner` (an existing Ray cluster; ``ray`` is imported lazily).
"""

from __future__ import annotations

import hashlib
import math
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from multiprocessing import get_context
from typing import Any, Protocol

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError, LiveBackendError, PolicyError
from rlsched.cluster.ids import TrajStatus
from rlsched.sim.cost import CostModel

BUSY_STATES = ("generate", "train")


@dataclass(frozen=True)
class Scenario:
    """A variant of the planned run: ``kind`` is ``base``, ``bootstrap`` (tasks resampled
    with ``seed``), ``tail-cut`` or ``tail-x2`` (the 5% longest trajectories removed or
    doubled); ``gpus`` overrides the cluster size (0: the run's)."""

    name: str
    kind: str = "base"
    gpus: int = 0
    seed: int = 0


BASE = Scenario("base")


@dataclass(frozen=True)
class PlanSetup:
    """Everything a worker needs; sent once per worker."""

    trace: pd.DataFrame
    run: RunConfig  # steps and tasks_per_step resolved
    cost: CostModel
    tail_fraction: float = 0.05

    @property
    def token(self) -> str:
        """Identifies the setup in long-lived workers (Ray) that may serve several plans."""
        h = hashlib.sha1(pd.util.hash_pandas_object(self.trace, index=False).to_numpy().tobytes())
        h.update(repr((self.run, self.cost, self.tail_fraction)).encode())
        return h.hexdigest()


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    spec: str
    steps: int


@dataclass(frozen=True)
class Evaluation:
    """What the planner keeps of one simulation."""

    job: Job
    gpus: int
    makespan: float
    steps_per_hour: float
    trained_tokens: int
    max_staleness: int
    utilization: float  # (generate + train GPU-seconds) / (gpus * makespan)
    lower_bound: float
    complete: bool
    wall_seconds: float
    error: str = ""  # the policy failed (e.g. stalled): the configuration is rejected

    @property
    def gap_to_bound_pct(self) -> float:
        if not self.lower_bound > 0:
            return math.nan
        return 100.0 * (self.makespan / self.lower_bound - 1.0)


# ----------------------------------------------------------------- worker side

_SETUP: PlanSetup | None = None
_SETUP_TOKEN: str | None = None
_CONTEXTS: dict[Scenario, tuple[Any, Any, RunConfig]] = {}


def init_worker(setup: PlanSetup) -> None:
    """Process-pool initializer: remember the setup, forget any earlier scenarios."""
    global _SETUP, _SETUP_TOKEN
    _SETUP, _SETUP_TOKEN = setup, None
    _CONTEXTS.clear()


def scenario_trace(setup: PlanSetup, sc: Scenario) -> pd.DataFrame:
    from rlsched.traces.variants import bootstrap_tasks, double_tail, drop_tail

    if sc.kind == "base":
        return setup.trace
    if sc.kind == "bootstrap":
        return bootstrap_tasks(setup.trace, sc.seed)
    if sc.kind == "tail-cut":
        return drop_tail(setup.trace, setup.tail_fraction)
    if sc.kind == "tail-x2":
        return double_tail(setup.trace, setup.tail_fraction)
    raise ValueError(f"unknown scenario kind {sc.kind!r}")


def _context(setup: PlanSetup, sc: Scenario) -> tuple[Any, Any, RunConfig]:
    if sc not in _CONTEXTS:
        from rlsched.sim.workload import Workload
        from rlsched.traces import draw_batches

        df = scenario_trace(setup, sc)
        run = setup.run if not sc.gpus else replace(setup.run, gpus=sc.gpus)
        batches = draw_batches(df, run.steps, run.tasks_per_step, run.samples_per_task)
        _CONTEXTS[sc] = (Workload.from_frame(df), batches, run)
    return _CONTEXTS[sc]


def evaluate_with(setup: PlanSetup, job: Job) -> Evaluation:
    """Simulate ``job`` (the first ``job.steps`` steps of its scenario's batches)."""
    from rlsched.policies import make_policy
    from rlsched.sim.run import simulate

    workload, batches, run = _context(setup, job.scenario)
    cfg = replace(run, steps=job.steps)
    t0 = time.perf_counter()
    try:
        out = simulate(workload, batches[: job.steps], make_policy(job.spec), cfg, setup.cost)
    except PolicyError as err:
        # A configuration that deadlocks its policy is a result, not a crash of the plan:
        # it is rejected with the policy's own message (and reported in trials.csv).
        return Evaluation(job, cfg.gpus, math.inf, 0.0, 0, 0, 0.0, math.nan, False,
                          time.perf_counter() - t0, str(err))
    r = out.result
    span = r.makespan
    busy = sum(r.gpu_seconds.get(s, 0.0) for s in BUSY_STATES)
    return Evaluation(
        job=job,
        gpus=cfg.gpus,
        makespan=span,
        steps_per_hour=3600.0 * job.steps / span if span > 0 and r.complete else 0.0,
        trained_tokens=int(sum(s["trained_tokens"] for s in r.steps)),
        max_staleness=trained_staleness(r.state),
        utilization=busy / (cfg.gpus * span) if span > 0 else 0.0,
        lower_bound=float(out.lower_bound_seconds),
        complete=bool(r.complete),
        wall_seconds=time.perf_counter() - t0,
    )


def trained_staleness(state: Any) -> int:
    """The largest staleness of a trained trajectory, counting only those that kept a
    generated token (``min_version >= 0``), as ``compare`` (analysis.metrics.staleness)
    does. A trajectory cut before its first turn finished has no token of any version;
    the simulator's per-step ``max_staleness`` counted its ``-1`` as version -1, so a
    ``partial:...,mode=train`` run was listed with staleness 4 here and 0 by compare."""
    trained = TrajStatus.TRAINED
    return max((t.trained_version - t.min_version for t in state.trajs.values()
                if t.status is trained and t.min_version >= 0), default=0)


def evaluate(job: Job) -> Evaluation:
    """Process-pool entry point (the setup came with :func:`init_worker`)."""
    if _SETUP is None:
        raise RuntimeError("plan worker used before init_worker")
    return evaluate_with(_SETUP, job)


def _ray_evaluate(setup: PlanSetup, token: str, job: Job) -> Evaluation:
    global _SETUP_TOKEN
    if token != _SETUP_TOKEN:  # a long-lived Ray worker may have served another plan
        init_worker(setup)
        _SETUP_TOKEN = token
    return evaluate_with(setup, job)


# ----------------------------------------------------------------- runners

Done = Callable[[Evaluation], None]


class Runner(Protocol):
    workers: int

    def map(self, jobs: Sequence[Job], on_done: Done | None = None) -> list[Evaluation]: ...

    def close(self) -> None: ...


#: Simulator processes on one machine (``--workers 99999999999999999999`` was an
#: OverflowError from the process pool's semaphore).
MAX_WORKERS = 1024


class LocalRunner:
    """Jobs in this process (``workers <= 1``) or in a spawned process pool."""

    def __init__(self, setup: PlanSetup, workers: int) -> None:
        if not 1 <= workers <= MAX_WORKERS:
            raise ConfigError(f"--workers={workers}: expected an integer from 1 to {MAX_WORKERS}")
        self.setup = setup
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            # spawn, not fork: the parent holds a rich live display thread, and a forked
            # child of a threaded process may inherit a held lock.
            self._pool = ProcessPoolExecutor(
                workers, mp_context=get_context("spawn"), initializer=init_worker,
                initargs=(setup,),
            )
        else:
            init_worker(setup)

    def map(self, jobs: Sequence[Job], on_done: Done | None = None) -> list[Evaluation]:
        if self._pool is None:
            out = []
            for job in jobs:
                ev = evaluate_with(self.setup, job)
                if on_done:
                    on_done(ev)
                out.append(ev)
            return out
        futures = {self._pool.submit(evaluate, job): i for i, job in enumerate(jobs)}
        results: list[Evaluation | None] = [None] * len(jobs)
        for fut in as_completed(futures):
            ev = fut.result()
            results[futures[fut]] = ev
            if on_done:
                on_done(ev)
        return [r for r in results if r is not None]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


#: Seconds a Ray address (``host:port``) has to accept a connection before --ray gives up.
RAY_CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse, in seconds, a ``host:port`` (or ``ray://host:port``) that nothing answers at:
    ``ray.init`` retried one for many minutes (``--ray bogus:1234`` ran past 6.5 minutes,
    logging a retry every few seconds), deaf to Ctrl-C while it waited inside Ray's own
    client. ``auto``, ``local`` and forms other than host:port are left to Ray."""
    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    host = host.strip("[]")  # (an IPv6 address in brackets)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, OverflowError, ValueError) as exc:  # (a port past 65535: OverflowError)
        reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__
        raise LiveBackendError(f"--ray {address}: cannot connect to a Ray cluster (nothing answers at "
                               f"{host}:{port}: {reason}); expected 'auto', 'local' or the address "
                               "of a running Ray head") from None


class RayRunner:
    """Jobs as Ray tasks on an existing cluster (``address``: ``auto`` or ``host:port``),
    or on a private two-CPU cluster started for this plan (``local``).

    The cluster's workers must have rlsched installed in the same version; the setup
    (trace, run config, cost model) travels once through Ray's object store.
    """

    def __init__(self, setup: PlanSetup, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise LiveBackendError(
                "--ray needs the ray package: pip install -e '.[live]' (or pip install 'ray[default]')"
            ) from None
        _check_reachable(address)
        kw: dict[str, Any] = {}
        if address == "local":  # a private cluster for this plan only (tests, one machine)
            kw = {"num_cpus": 2, "include_dashboard": False}
        try:
            ray.init(address=address, ignore_reinit_error=True, logging_level="WARNING",
                     log_to_driver=False, **kw)
        except Exception as exc:  # ray raises ConnectionError, ValueError, RuntimeError...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LiveBackendError(f"--ray {address}: cannot connect to a Ray cluster ({first})") from None
        self._ray = ray
        self._remote = ray.remote(_ray_evaluate)
        self._setup_ref = ray.put(setup)
        self._token = setup.token
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, jobs: Sequence[Job], on_done: Done | None = None) -> list[Evaluation]:
        refs = [self._remote.remote(self._setup_ref, self._token, job) for job in jobs]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Evaluation | None] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = self._ray.wait(pending, num_returns=1)
            ev = self._ray.get(ready[0])
            results[index[ready[0]]] = ev
            if on_done:
                on_done(ev)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self._ray.shutdown()


class CachedRunner:
    """Runs each distinct job once: a re-suggested configuration costs nothing."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.workers = inner.workers
        self.cache: dict[Job, Evaluation] = {}
        self.simulations = 0
        self.sim_seconds = 0.0  # summed wall time of the simulations themselves
        self.steps_simulated = 0

    def map(self, jobs: Sequence[Job], on_done: Done | None = None) -> list[Evaluation]:
        todo = list(dict.fromkeys(j for j in jobs if j not in self.cache))
        for ev in self.inner.map(todo, on_done):
            self.cache[ev.job] = ev
            self.simulations += 1
            self.sim_seconds += ev.wall_seconds
            self.steps_simulated += ev.job.steps
        return [self.cache[j] for j in jobs]

    def seconds_per_step(self) -> float:
        """Measured simulation cost of one step of the run so far (reflects machine load)."""
        return self.sim_seconds / self.steps_simulated if self.steps_simulated else 0.0

    def close(self) -> None:
        self.inner.close()


def make_runner(setup: PlanSetup, workers: int, ray: str | None) -> CachedRunner:
    inner: Runner = RayRunner(setup, ray) if ray else LocalRunner(setup, workers)
    return CachedRunner(inner)
