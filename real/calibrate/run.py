"""``rlsched calibrate``: measure the live backend, fit the cost model, write the file.

The same code runs on this CPU host with the tiny model and on a GPU host with a real
checkpoint: everything comes from the run config a live run would use (``[cluster]`` and
``[live]``), so the calibrated constants describe exactly the engines, trainer, weight
path and environment that ``rlsched run --live --config`` will start.

Order (each step reuses what the previous one left, as a live run would):

1. publish the checkpoint's weights (a live run's engines load them at every boot);
2. switch to rollout: boot every engine group in parallel (timed for all of them: the
   row's ``gpus`` is the cluster's GPUs);
3. engine benchmarks on all engines at once (decode, prefill, prefix hits, KV), weight reloads;
4. switch to train: kill the engines, grow the trainer lane one engine's slots at a time;
5. trainer benchmarks at the full width, then at one rank; optimizer steps;
6. the switch round trip once more (offload, boot; kill, restore) for a second sample, and
   each round one group alone (elastic's move), so the per-GPU switch term can be fitted;
7. tool calls in the shipped environment.

This module only measures; fitting the simulator's cost model to the measurements is
:mod:`rlsched.sim.calibration`'s job, and :mod:`rlsched.calibration` joins the two (the
live backend never imports the simulator).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.errors import LiveBackendError
from rlsched.real.calibrate.bench import (
    BenchPlan,
    bench_engine,
    bench_optimizer,
    bench_sync,
    bench_tools,
    bench_train,
    checkpoint_state,
    machine_peaks,
)

Say = Callable[[str], None]


def model_shape(model_dir: Path, dtype_bytes: float) -> dict[str, float]:
    """The cost model's model fields from a Hugging Face checkpoint (config + tensors)."""
    from safetensors import safe_open

    cfg = json.loads((model_dir / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    params = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shape = st.get_slice(name).get_shape()
                n = 1
                for s in shape:
                    n *= int(s)
                params += n
    if params == 0:
        raise LiveBackendError(f"{model_dir}: no safetensors weights to count parameters from")
    return {
        "params": float(params), "layers": int(cfg["num_hidden_layers"]), "d_model": hidden,
        "kv_heads": int(cfg.get("num_key_value_heads", heads)),
        "head_dim": int(cfg.get("head_dim") or hidden // heads),
        "bytes_per_param": dtype_bytes, "kv_bytes_per_elem": dtype_bytes,
    }


def _dtype_bytes(model_dir: Path, on_gpus: bool) -> float:
    if not on_gpus:
        return 4.0  # the CPU engines and trainer run float32 (see real/run.py)
    cfg = json.loads((model_dir / "config.json").read_text())
    return {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}.get(str(cfg.get("torch_dtype")), 2.0)


class _Rig:
    """The live pieces calibration drives: a slot cluster, engine actors, a trainer lane."""

    def __init__(self, run: Any, settings: Any, model_dir: Path, seed: int, work: Path, say: Say) -> None:
        from rlsched.real.loop.ray_cluster import start_cluster
        from rlsched.real.rollout.engine import EngineSettings
        from rlsched.real.train.lane import TrainerLane
        from rlsched.real.train.weights import WeightStore

        self.run, self.s, self.say = run, settings, say
        self.cluster = start_cluster(run.gpus, object_store_mb=settings.object_store_mb)
        self.tied = bool(json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False))
        self.engine_settings = EngineSettings(
            str(model_dir), max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
            kv_cache_mb=settings.kv_cache_mb, threads=settings.engine_threads, seed=seed,
            tp=run.tp if self.cluster.gpus else 1, dtype="auto" if self.cluster.gpus else "float32",
        )
        self.weights = WeightStore(tied=self.tied)
        self.lane = TrainerLane(str(model_dir), seed=seed, lr=settings.lr, threads=settings.trainer_threads,
                                ckpt_dir=work, weights=self.weights)
        self.engines: list[Any] = []
        self.groups = [list(range(g, g + run.tp)) for g in range(0, run.gpus, run.tp)]

    def to_rollout(self) -> float:
        """Offload the trainer if it runs, then boot one engine per group in parallel, each
        loading the published weights; seconds until the last engine is ready."""
        t0 = time.perf_counter()
        if self.lane.group is not None:
            self.lane.set_slots([]).result()
        self.engines = self._boot(self.groups)
        return time.perf_counter() - t0

    def move_one(self) -> tuple[float, float]:
        """Elastic's move, timed alone (the whole-cluster switches cost more per GPU on a
        shared host): the last group leaves the trainer and boots its engine (to rollout),
        then the engine is killed and the group rejoins the trainer (to train)."""
        import ray

        grp = self.groups[-1]
        rest = sorted(g for other in self.groups[:-1] for g in other)
        t0 = time.perf_counter()
        self.lane.set_slots(rest).result()
        (actor,) = self._boot([grp])
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.kill(actor)
        self.lane.set_slots(sorted({*rest, *grp})).result()
        return up, time.perf_counter() - t0

    def _boot(self, groups: list[list[int]]) -> list[Any]:
        """One engine per group, booted in parallel with the published weights."""
        import ray

        from rlsched.real.calibrate.engine import bench_actor_class
        from rlsched.real.loop.ray_cluster import slots_options, wait_ready

        pub = self.weights.current
        cls = bench_actor_class()
        ids = [self.groups.index(g) for g in groups]
        engines = [cls.options(**slots_options(g, gpus=self.cluster.gpus)).remote(
            self.engine_settings, engine_id=e, version=pub.version if pub else 0)
            for e, g in zip(ids, groups, strict=True)]
        for e, g, actor in zip(ids, groups, engines, strict=True):
            wait_ready(actor.info.remote(), f"engine {e}", g, self.s.start_timeout_s)
        if pub is not None:
            ray.get([a.update_weights.remote(pub.ref, pub.version) for a in engines])
        return engines

    def to_train(self) -> float:
        """Kill the engines, then grow the trainer by one engine's slots at a time (the
        live driver's order: each drained engine joins the lane when it is gone)."""
        import ray

        t0 = time.perf_counter()
        slots: list[int] = []
        for actor, g in zip(self.engines, self.groups, strict=True):
            ray.kill(actor)
            slots = sorted({*slots, *g})
            self.lane.set_slots(list(slots)).result()
        self.engines = []
        return time.perf_counter() - t0

    def stop(self) -> None:
        from rlsched.real.loop.ray_cluster import stop_cluster

        try:
            self.lane.shutdown()
        finally:
            stop_cluster()


def calibrate(run: Any, settings: Any, *, seed: int = 0, plan: BenchPlan | None = None,
              say: Say = lambda _m: None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Measure everything; return the measurements (one row each) and host info, including
    ``base``: the cost-model fields known without fitting (model shape, machine peaks)."""
    from rlsched.real.loop.ray_cluster import check_capacity
    from rlsched.real.model.tiny import resolve_model
    from rlsched.real.run import make_env  # raises one line without the [live] extra

    plan = plan or BenchPlan()
    t_start = time.perf_counter()
    check_capacity(run.gpus, run.tp)
    model_dir = resolve_model(settings.model, settings.cache_path(), seed=seed)
    peaks = machine_peaks()
    say(f"machine: {peaks['peak_flops'] / 1e9:.1f} GFLOP/s matmul, {peaks['hbm_bw'] / 1e9:.1f} GB/s copy (1 thread)")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rlsched-calibrate-") as work:
        rig = _Rig(run, settings, model_dir, seed, Path(work), say)
        try:
            on_gpus = rig.cluster.gpus
            state = checkpoint_state(model_dir)
            rig.weights.publish(state, 1)
            secs = rig.to_rollout()
            rows.append({"component": "switch", "kind": "to_rollout", "seconds": secs, "gpus": run.gpus})
            say(f"switch to rollout ({len(rig.groups)} engines in parallel): {secs:.1f}s")
            import ray

            for a in rig.engines:
                rows.append({"component": "kv", **ray.get(a.kv_info.remote())})
            rows += bench_engine(rig.engines, plan, say)
            rows += bench_sync(rig.engines[0], state, rig.tied, plan, say)
            vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
            for k in range(plan.switch_rounds):
                if k:
                    secs = rig.to_rollout()
                    rows.append({"component": "switch", "kind": "to_rollout", "seconds": secs, "gpus": run.gpus})
                    say(f"switch to rollout: {secs:.1f}s")
                secs = rig.to_train()
                rows.append({"component": "switch", "kind": "to_train", "seconds": secs, "gpus": run.gpus})
                say(f"switch to train ({len(rig.groups)} groups joining one by one): {secs:.1f}s")
                if k == 0:
                    world = len(rig.lane.group.slots)
                    rows += bench_train(rig.lane, world, vocab, plan, seed)
                    if world > 1:
                        rig.lane.set_slots(rig.groups[0]).result()
                        rows += bench_train(rig.lane, len(rig.groups[0]), vocab, plan, seed + 1)
                        rig.lane.set_slots(sorted(g for grp in rig.groups for g in grp)).result()
                    rows += bench_optimizer(rig.lane, vocab, plan, seed)
                    say(f"train: {len(plan.train_shapes) * plan.repeats} micro-batches per width, optimizer steps")
                if len(rig.groups) > 1:  # one group alone: the per-GPU slope of a switch
                    up, down = rig.move_one()
                    one = len(rig.groups[-1])
                    rows.append({"component": "switch", "kind": "to_rollout", "seconds": up, "gpus": one})
                    rows.append({"component": "switch", "kind": "to_train", "seconds": down, "gpus": one})
                    say(f"switch of one group alone: to rollout {up:.1f}s, to train {down:.1f}s")
        finally:
            rig.stop()
    env_tasks = list(settings.tasks) or _env_tasks(lambda: make_env(settings))
    rows += bench_tools(lambda: make_env(settings), env_tasks, plan, say)
    table = pd.DataFrame(rows)
    base = {**_shape_fields(model_dir, on_gpus), **peaks, "max_num_seqs": settings.max_num_seqs}
    info = {
        "model_dir": str(model_dir), "on_gpus": bool(on_gpus), "gpus": run.gpus, "tp": run.tp,
        "machine_peaks": peaks, "base": base, "seconds": time.perf_counter() - t_start,
    }
    return table, info


def _shape_fields(model_dir: Path, on_gpus: bool) -> dict[str, float]:
    return model_shape(model_dir, _dtype_bytes(model_dir, on_gpus))


def _env_tasks(make: Callable[[], Any]) -> list[str]:
    env = make()
    try:
        return list(env.task_ids())
    finally:
        env.close()
