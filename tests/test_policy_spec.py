"""Policy spec parsing: an empty parameter list (``async:``) is refused in one line like any
other malformed spec, while ``async`` and ``async:key=value`` still parse."""

from __future__ import annotations

import pytest

from rlsched.cli import main
from rlsched.cluster.errors import PolicyError
from rlsched.policies import make_policy
from rlsched.policies.registry import parse_spec


@pytest.mark.parametrize("spec", ["async:", "async: ", " async :\t", "elastic:"])
def test_empty_parameter_list_is_refused(spec):
    with pytest.raises(PolicyError, match=r"empty parameter list after ':' — expected "
                                          r"\w+ or \w+:key=value,\.\.\."):
        parse_spec(spec)


def test_name_alone_and_with_parameters_still_parse():
    assert parse_spec("async") == ("async", {})
    assert parse_spec(" async ") == ("async", {})
    name, raw = parse_spec("elastic:tail=0.5")
    assert (name, raw) == ("elastic", {"tail": "0.5"})
    assert make_policy("async").name == "async"


def test_cli_refuses_it_in_one_line(capsys):
    code = main(["policy", "check", "async:"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == ["rlsched: error: policy spec 'async:': empty parameter list "
                                "after ':' — expected async or async:key=value,..."]


def test_a_name_with_control_characters_is_shown_escaped_on_one_line():
    """Found by the config fuzz (``--hypothesis-seed=375``): the name was echoed raw in the
    suggestion, so a carriage return in it split the error over two lines."""
    with pytest.raises(PolicyError) as err:
        parse_spec("0\r0:")
    assert len(str(err.value).splitlines()) == 1
    assert str(err.value).endswith("expected 0\\r0 or 0\\r0:key=value,...")


@pytest.mark.parametrize(("spec", "message"), [
    ("async:staleness=1_0", "parameter staleness='1_0': expected int"),
    ("elastic:micro=٣", "parameter micro='٣': expected int"),
    ("elastic:train_share=0_5", "parameter train_share='0_5': expected float"),
    ("elastic:train_share=٠.٥", "parameter train_share='٠.٥': expected float"),
])
def test_a_number_is_ascii_digits(spec, message):
    """Python's int() and float() read "1_0" as 10 and other scripts' digits ("٣") as 3: the
    session-19 audit saw ``staleness=1_0`` refused as "must be <= 8" and ``micro=٣`` run as 3
    (in a run folder named ``03-elastic_micro=``). A spec's numbers are ASCII."""
    with pytest.raises(PolicyError, match=message):
        make_policy(spec)


@pytest.mark.parametrize("spec", ["elastic:micro=3", "elastic:micro= +4 ", "elastic:train_share=.5",
                                  "elastic:train_share=5e-1", "elastic:train_share=0.25", "elastic:tail=1."])
def test_plain_numbers_still_parse(spec):
    make_policy(spec)
