"""``rlsched cost``: the cost model's derived figures, so a user can check them against
their own cluster before trusting a comparison (``cost show``), and the presets there are
(``cost list``)."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from rlsched.cli.run import ConfigOpt, CostOpt, GpuOpt, ModelOpt
from rlsched.cluster.config import MAX_SLOTS
from rlsched.cluster.errors import ConfigError
from rlsched.sim.cost import field_bounds

#: The cost model's bound on ``train_seq_tokens`` (its own range, not a copy of it).
MAX_SEQ_TOKENS = field_bounds("train_seq_tokens")[1]

cost_app = typer.Typer(help="Inspect the cost model: presets and derived figures.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(cost_app, name="cost")


@cost_app.command("list")
def list_cmd() -> None:
    """The model and GPU presets, with their sources."""
    from rlsched.sim.presets import DEFAULT_PRESET, FLAT, GPUS, MODELS

    if DEFAULT_PRESET is not None:
        typer.echo(f"default: --model {DEFAULT_PRESET[0]} --gpu {DEFAULT_PRESET[1]}; "
                   f"--model {FLAT}: the flat historic model (no trainer floor, free resharding, "
                   "perfect scaling, one flat fabric)")
    typer.echo("models:")
    for m in MODELS.values():
        kind = (f"MoE {m.params / 1e9:g}B total / {m.active_params / 1e9:g}B active, "
                f"{m.experts} experts x {m.experts_per_token}" if m.experts else f"dense {m.params / 1e9:g}B")
        typer.echo(f"  {m.name:<16} {kind}\n      source: {m.source}")
    typer.echo("gpus:")
    for g in GPUS.values():
        typer.echo(f"  {g.name:<16} {g.hbm_bytes / 1e9:g} GB, {g.hbm_bw / 1e12:g} TB/s, "
                   f"{g.peak_flops / 1e12:g} TFLOPS, {g.gpus_per_node} per NVLink domain\n      source: {g.source}")


@cost_app.command("show")
def show_cmd(
    model_preset: ModelOpt = None,
    gpu_preset: GpuOpt = None,
    cost: CostOpt = None,
    config: ConfigOpt = None,
    tp: Annotated[int | None, typer.Option("--tp", help="GPUs per inference engine (default: the config's).")] = None,
    seq: Annotated[float | None, typer.Option("--seq", help="Trained sequence length in tokens (train_seq_tokens).")] = None,
    context: Annotated[float, typer.Option("--context", help="Context per sequence for the decode-step figures (capped by the engine's KV).")] = 32768.0,
) -> None:
    """Print the derived figures: KV capacity per engine, trainer floor and memory, sync,
    resharding and decode-step times."""
    from dataclasses import replace

    from rlsched.cli.run import resolve_settings

    if not (math.isfinite(context) and context >= 0):
        raise ConfigError(f"--context={context!r}: expected a finite number of tokens >= 0")
    if seq is not None and not (seq == 0 or (math.isfinite(seq) and 1 <= seq <= MAX_SEQ_TOKENS)):
        # (was "cost model: train_seq_tokens=-1.0: must be > 0": a field --help never
        # names, and "> 0" hid that 0 is accepted)
        raise ConfigError(f"--seq={seq!r}: expected 0 (trainer memory not modelled) or a "
                          f"sequence length in tokens from 1 to {MAX_SEQ_TOKENS:.0e}")
    # (the figures are per engine: a --tp the default cluster's 64 GPUs do not divide was
    # refused as "gpus=64 is not a multiple of tp=3", a flag this command does not have)
    gpus = 2 * tp if tp is not None and tp >= 1 and 64 % tp else None
    if gpus is not None and gpus > MAX_SLOTS:  # (was "run config: gpus=2000000", a flag it has not)
        raise ConfigError(f"--tp={tp}: expected at most {MAX_SLOTS // 2:,} (the figures are for "
                          f"a cluster of two engines, at most {MAX_SLOTS:,} GPUs)")
    _cfg, run, c = resolve_settings(config, cost, model_preset, gpu_preset, tp=tp, gpus=gpus)
    if seq is not None:
        c = replace(c, train_seq_tokens=float(seq))  # type: ignore[type-var]
    # (--seq 0 is the cost model's "trainer memory not modelled", as in bench/regime_map.py;
    # on a named preset it was printed as "not modelled (no preset)")
    why = "--seq 0" if seq == 0 else "no preset"
    for line in describe(c, run.tp, context, why):  # type: ignore[arg-type]
        typer.echo(line)


def describe(c: object, tp: int, context: float = 32768.0, why: str = "no preset") -> list[str]:
    """The lines of ``cost show`` (a function, so tests read the same figures)."""
    from rlsched.sim.cost import CostModel
    from rlsched.sim.memory import min_engine_gpus, reshard_s, train_job_s, train_layout

    assert isinstance(c, CostModel)
    out: list[str] = []
    gb = 1e9
    kind = (f"MoE: {c.params / 1e9:.4g}B total, {c.active_params / 1e9:.4g}B active "
            f"({c.experts} routed experts, {c.experts_per_token} per token)" if c.moe
            else f"dense: {c.params / 1e9:.4g}B")
    out.append(f"model      {kind}; {c.layers} layers; weights {c.weight_bytes / gb:.1f} GB served; "
               f"KV {c.kv_bytes_per_token / 1e3:.1f} kB per token")
    topo = (f"{c.gpus_per_node} GPUs per NVLink domain, NVLink {c.nvlink_bw / gb:g} GB/s, "
            f"NIC {c.fabric_bw / gb:g} GB/s, host {c.host_bw / gb:g} GB/s" if c.gpus_per_node
            else f"flat fabric: sync {c.sync_bw / gb:g} GB/s, KV transfer {c.kv_transfer_bw / gb:g} GB/s")
    out.append(f"gpu        {c.hbm_bytes / gb:g} GB HBM x {c.gpu_mem_util:g} usable, {c.hbm_bw / 1e12:g} TB/s, "
               f"{c.peak_flops / 1e12:g} TFLOPS; {topo}")
    fit = min_engine_gpus(c)
    cap = c.kv_capacity_tokens(tp)
    out.append(f"engine     tp={tp}: KV capacity {cap:,} tokens"
               + ("" if cap else f" -- the weights do not fit; smallest tp {fit}")
               + f" (smallest engine that holds the weights: {fit} GPUs)")
    if cap:
        spans = c.spans_nodes(0, tp)
        co = c.decode_coefficients(tp, spans)
        for b in (1, 32, c.max_num_seqs):
            ctx = min(b * context, float(cap))  # (b sequences of ``context`` tokens, as KV allows)
            step = co.step_s(b, ctx)
            out.append(f"decode     batch {b:>3}, {ctx:,.0f} context tokens: {step * 1e3:.2f} ms per step, "
                       f"{b / step:,.0f} tokens/s per engine"
                       + (f" (MoE: {1 - co.miss ** b:.0%} of experts touched)" if c.moe else ""))
    if c.gpus_per_node:
        out.append(f"sync       to one tp={tp} engine: {c.sync_s(tp, True):.2f} s within a domain, "
                   f"{c.sync_s(tp, False):.2f} s across domains")
    else:
        out.append(f"sync       {c.sync_s():.2f} s per engine (flat: latency + weights / sync_bw)")
    if cap:
        ctx = min(context, float(cap))
        near, far = c.migrate_s(tp, ctx, True), c.migrate_s(tp, ctx, False)

        def _way(m: tuple[float, bool]) -> str:
            return f"{m[0] * 1e3:.1f} ms ({'re-prefill' if m[1] else 'KV transfer'})"

        out.append(f"migrate    a {ctx:,.0f}-token context between tp={tp} engines: "
                   + (f"{_way(near)} within a domain, {_way(far)} across domains" if c.gpus_per_node
                      else f"{_way(far)} (flat: KV / kv_transfer_bw, or re-prefill)"))
    lay = train_layout(c)
    if lay.memory is None:
        out.append(f"trainer    memory not modelled ({why}): floor 1 GPU, grows by 1, free resharding, "
                   "perfect scaling")
        return out
    m = lay.memory
    out.append(f"trainer    floor {lay.min_gpus} GPUs = tp {lay.tp} x pp {lay.pp} x cp {lay.cp} x dp {lay.min_dp}; "
               f"grows by {lay.unit} GPUs; sized for {c.train_seq_tokens:,.0f}-token sequences")
    out.append(f"memory     per GPU at the floor: weights {m.weights / gb:.1f} + grads {m.grads / gb:.1f} + "
               f"optimizer {m.optimizer / gb:.1f} + activations {m.activations / gb:.1f} = {m.total / gb:.1f} "
               f"of {m.capacity / gb:.1f} GB")
    tokens = c.train_seq_tokens
    for k in (1, 2, 4, 8):
        g = lay.min_gpus * k
        spans = c.spans_nodes(0, g)
        f = c.train_flops(tokens) * g / lay.min_gpus  # one sequence per floor's worth of GPUs
        real = train_job_s(c, lay, f, tokens * g / lay.min_gpus, g, spans)
        out.append(f"train      {g:>5} GPUs: {real:8.1f} s per {g // lay.min_gpus} sequence(s) of "
                   f"{tokens:,.0f} tokens, {c.train_s(f, g) / real:.0%} of perfect scaling")
    g = lay.min_gpus
    out.append(f"reshard    grow {g}->{2 * g}: {reshard_s(c, lay, g, 2 * g, False):.2f} s; shrink {2 * g}->{g}: "
               f"{reshard_s(c, lay, 2 * g, g, False):.2f} s; onload/offload at {g}: "
               f"{reshard_s(c, lay, 0, g, False):.2f} s (across domains; within one: "
               f"{reshard_s(c, lay, g, 2 * g, True):.2f} s to grow)")
    return out

