"""The run meta says what the tools' sandbox guaranteed, and ``[live] accept_weak_sandbox``
is the named, typed way to accept less."""

from __future__ import annotations

import pytest

from rlsched.cluster.errors import ConfigError
from rlsched.real.config import LiveSettings
from rlsched.real.envs.sandbox import LIVE_MINIMUM, probe_guarantees, sandbox_meta


def test_meta_lists_every_guarantee_and_what_is_missing() -> None:
    m = sandbox_meta("auto", accept_weak=True)
    g = probe_guarantees(None, "auto")
    assert {k: m[k] for k in g.as_dict()} == g.as_dict()
    assert m["live_minimum"] == list(LIVE_MINIMUM)
    assert m["missing"] == [name for name in LIVE_MINIMUM if not getattr(g, name)]
    assert m["accepted_weak"] is True


def test_accept_weak_sandbox_is_a_typed_live_setting() -> None:
    assert LiveSettings.from_config({}).accept_weak_sandbox is False
    assert LiveSettings.from_config({"accept_weak_sandbox": True}).accept_weak_sandbox is True
    with pytest.raises(ConfigError, match=r"accept_weak_sandbox='yes': expected true or false"):
        LiveSettings.from_config({"accept_weak_sandbox": "yes"})
