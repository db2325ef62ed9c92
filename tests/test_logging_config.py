"""The ``[logging]`` table and ``--logger``: which dashboards a live run writes to, every
mistake one ConfigError line naming the field (issue #27 item 5)."""

from __future__ import annotations

import pytest

from rlsched.cluster.config import LoggingConfig
from rlsched.cluster.errors import ConfigError
from rlsched.config import parse_config


def test_logging_table_parses_name_or_list() -> None:
    cfg = parse_config({"logging": {"logger": "tensorboard", "dir": "tb", "project": "p"}}, source="c.toml")
    assert cfg.logging == LoggingConfig(logger=("tensorboard",), dir="tb", project="p")
    both = parse_config({"logging": {"logger": ["tensorboard", "wandb", "tensorboard"]}}).logging
    assert both.backends == ("tensorboard", "wandb")  # repeats once, order kept
    assert parse_config({}).logging.backends == ()  # no table: no logger
    assert parse_config({"logging": {"logger": "none"}}).logging.backends == ()


@pytest.mark.parametrize(("table", "words"), [
    ({"logger": "tensorbord"}, "did you mean 'tensorboard'"),
    ({"loger": "tensorboard"}, "unknown key 'loger' (did you mean 'logger'?)"),
    ({"logger": 3}, "expected a name or a list of names"),
    ({"logger": ["wandb", 1]}, "expected a list of names"),
    ({"dir": ""}, "[logging] dir=''"),
    ({"project": 7}, "[logging] project=7"),
])
def test_bad_logging_table_is_one_line(table, words) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"logging": table}, source="c.toml")
    msg = str(err.value)
    assert words in msg and msg.startswith("c.toml: ") and "\n" not in msg


def test_logging_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"c.toml: \[logging\] must be a table"):
        parse_config({"logging": "tensorboard"}, source="c.toml")


def test_logger_option() -> None:
    assert LoggingConfig.parse("tensorboard,wandb").backends == ("tensorboard", "wandb")
    assert LoggingConfig.parse("none").backends == ()
    for bad, words in (("tb", "unknown logger"), ("tensorboard,", "empty name")):
        with pytest.raises(ConfigError, match=words):
            LoggingConfig.parse(bad)


def test_logger_flag_is_for_live_runs(tmp_path, capsys) -> None:
    from rlsched.cli import main

    code = main(["run", "--policy", "colocated", "--steps", "1", "--out", str(tmp_path / "o"), "--logger", "tensorboard"])
    err = capsys.readouterr().err
    assert code == 2 and "--logger applies to --live runs only" in err and err.strip().count("\n") == 0
