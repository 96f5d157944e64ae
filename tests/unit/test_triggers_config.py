"""Triggers' options and the trigger file's format (issue #17): every bad
value is one clear ConfigError / ValueError before anything runs."""

from __future__ import annotations

import signal

import pytest

from fastprof import ConfigError, Triggers
from fastprof.profiler.drivers.triggers import parse_request


def test_defaults_and_variables() -> None:
    t = Triggers(env={})
    assert t.signal_number == signal.SIGUSR2 and t.file and t.steps == 5 and t.anomaly
    assert t.flight_events == {"trigger", "anomaly", "exception", "oom", "sigterm"}
    env = {
        "FASTPROF_TRIGGERS_SIGNAL": "usr1",
        "FASTPROF_TRIGGERS_STEPS": "7",
        "FASTPROF_TRIGGERS_FLIGHT_ON": "sigterm, exception",
        "FASTPROF_TRIGGERS_ANOMALY": "0",
    }
    t = Triggers(env=env)
    assert t.signal_number == signal.SIGUSR1 and t.steps == 7 and not t.anomaly
    assert t.flight_events == {"sigterm", "exception"}
    assert Triggers(signal="off", env={}).signal_number is None
    assert Triggers(signal=int(signal.SIGUSR1), env={}).signal_number == signal.SIGUSR1
    assert Triggers(flight_on="none", env={}).flight_events == set()
    # An argument wins over its variable.
    assert Triggers(steps=3, env={"FASTPROF_TRIGGERS_STEPS": "9"}).steps == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"signal": "SIGKILL"}, "cannot be caught"),
        ({"signal": "SIGTERM"}, "ends jobs"),
        ({"signal": "SIGNOPE"}, "not a signal name"),
        ({"signal": "999"}, "out of range"),
        ({"steps": 0}, "steps"),
        ({"poll_s": 0.0}, "poll_s"),
        ({"anomaly_factor": 1.0}, "anomaly_factor"),
        ({"anomaly_window": 2}, "anomaly_window"),
        ({"flight_on": "trigger,lunch"}, "unknown lunch"),
        ({"folder": "rank{nope}/flight"}, r"^Triggers: invalid folder .*nope"),
    ],
)
def test_bad_options_are_one_config_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Triggers(env={}, **kwargs)


def test_a_bad_variable_names_itself() -> None:
    with pytest.raises(ConfigError, match="FASTPROF_TRIGGERS_STEPS"):
        Triggers(env={"FASTPROF_TRIGGERS_STEPS": "many"})


def test_the_trigger_file_format() -> None:
    assert parse_request("", "T") == {}
    assert parse_request("  \n", "T") == {}
    assert parse_request('{"steps": 4, "flight": false, "id": "abc"}', "T") == {
        "steps": 4,
        "flight": False,
        "id": "abc",
    }
    for text, match in (
        ("steps=4", "T: not JSON \\(line 1 column 1"),
        ("[1, 2]", "expected a JSON object"),
        ('{"steps": 0}', "steps must be an integer from 1 to 10000"),
        ('{"steps": true}', "steps must be an integer"),
        ('{"flight": "yes"}', "flight must be true or false"),
        ('{"colour": 1}', "unknown key\\(s\\) colour"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_request(text, "T")
