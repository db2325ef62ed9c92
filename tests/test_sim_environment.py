"""SimEnvironment (sim/timers.py) keeps SimPy's semantics: the simulator's event queue is its
own public heap, and SimPy's events, processes, ``run``, ``peek`` and failures behave on it
exactly as on ``simpy.Environment`` (same order, same clock, same errors)."""

from __future__ import annotations

import pytest
import simpy
from simpy.core import EmptySchedule, Infinity

from rlsched.sim.timers import NORMAL, Call, SimEnvironment


def _model(env: simpy.Environment) -> list[tuple[float, str]]:
    """Processes with ties, a condition, an interrupt and a defused failure."""
    log: list[tuple[float, str]] = []
    gate = env.event()

    def worker(name: str, delays: list[float]):
        for d in delays:
            yield env.timeout(d)
            log.append((env.now, f"{name}+{d}"))
        if name == "a":
            gate.succeed("open")

    def waiter():
        got = yield gate
        log.append((env.now, f"gate {got}"))
        yield env.all_of([env.timeout(1.5), env.timeout(0.5)])
        log.append((env.now, "all_of"))

    def sleeper():
        try:
            yield env.timeout(100)
        except simpy.Interrupt as i:
            log.append((env.now, f"interrupted {i.cause}"))

    def failing():
        bad = env.event()
        bad.fail(ValueError("x"))
        bad.defused = True
        try:
            yield bad
        except ValueError as e:
            log.append((env.now, f"caught {e}"))

    env.process(worker("a", [1.0, 2.0, 0.5]))
    env.process(worker("b", [3.0, 0.5]))
    env.process(waiter())
    s = env.process(sleeper())
    env.process(failing())

    def quick():
        log.append((env.now, "quick started"))
        yield env.timeout(0)

    def interrupter():
        yield env.timeout(2.0)
        t0 = env.timeout(0)  # NORMAL: after the URGENT start and interrupt below
        t0.callbacks.append(lambda _: log.append((env.now, "timeout 0")))
        env.process(quick())
        s.interrupt("now")

    env.process(interrupter())
    env.run(until=10)
    log.append((env.now, f"peek {env.peek()}"))
    return log


def test_simpy_processes_run_the_same_on_the_simulators_environment():
    assert _model(SimEnvironment()) == _model(simpy.Environment())


def test_an_undefused_failure_raises_as_in_simpy():
    for env in (SimEnvironment(), simpy.Environment()):
        ev = env.event()
        ev.fail(KeyError("k"))
        with pytest.raises(KeyError) as info:
            env.run()
        assert isinstance(info.value.__cause__, KeyError)


def test_timers_are_stepped_in_time_then_insertion_order():
    env = SimEnvironment(5.0)
    seen: list[tuple[float, str]] = []
    cbs = (lambda ev: seen.append((env.now, ev.a)),)
    for name, delay in (("late", 2.0), ("first", 0.0), ("tie1", 1.0), ("tie2", 1.0)):
        env.schedule(Call(cbs, None, name, None), NORMAL, delay)
    assert env.peek() == 5.0
    env.run()
    assert seen == [(5.0, "first"), (6.0, "tie1"), (6.0, "tie2"), (7.0, "late")]
    assert env.peek() == Infinity
    with pytest.raises(EmptySchedule):
        env.step()
