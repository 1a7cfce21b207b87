"""``DispatchOptions``: the dispatcher's settings, one default each, validated once."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import hetero
from hetero import HeteroConfig, SchedulerConfig, parse_config
from hetero.errors import ConfigError
from hetero.sched import Dispatcher, DispatchOptions, ManualClock
from hetero.sched.options import DEFAULT_MAX_QUEUE_SIZE, QUEUE_ORDERS
from hetero.sched.registry import make_policy
from tests.fleets import make_devices

#: The one setting the config file does not have: long runs (the simulator) turn it off.
NOT_IN_CONFIG = {"keep_finished"}

#: A value for every setting, none of them its default.
CHANGED: dict[str, Any] = {
    "max_queue_size": 7,
    "timeout": 3.0,
    "max_retries": 0,
    "preemption": True,
    "stealing": False,
    "queue_order": "fifo",
    "aging": 2.5,
    "max_bypass": 30.0,
    "late_after": 1.5,
    "keep_finished": False,
}


def dispatcher(**kwargs: Any) -> Dispatcher:
    return Dispatcher(make_devices([1.0, 2.0]), make_policy("round_robin"), ManualClock(), **kwargs)


def test_changed_covers_every_setting_with_a_value_other_than_its_default() -> None:
    defaults = DispatchOptions()
    assert set(CHANGED) == set(DispatchOptions.names())
    for name, value in CHANGED.items():
        assert getattr(defaults, name) != value, name


def test_the_config_defaults_are_the_options_defaults_field_by_field() -> None:
    defaults = DispatchOptions()
    config = SchedulerConfig()
    shared = set(DispatchOptions.names()) - NOT_IN_CONFIG
    # Every setting but keep_finished is in the config file: a new one must be added there too.
    assert shared <= set(SchedulerConfig.model_fields)
    for name in sorted(shared):
        assert getattr(config, name) == getattr(defaults, name), name
        assert SchedulerConfig.model_fields[name].default == getattr(defaults, name), name
    assert defaults.max_queue_size == DEFAULT_MAX_QUEUE_SIZE == 1000
    assert (defaults.timeout, defaults.max_retries, defaults.queue_order) == (None, 2, "size")
    assert (defaults.preemption, defaults.stealing, defaults.keep_finished) == (False, True, True)
    assert (defaults.aging, defaults.max_bypass) == (10.0, None)


def test_a_default_dispatcher_reads_its_settings_from_the_default_options() -> None:
    d = dispatcher()
    assert d.options == DispatchOptions()
    for name in DispatchOptions.names():
        assert getattr(d, name) == getattr(d.options, name), name


def test_the_config_still_exports_the_queue_bound_and_refuses_what_the_options_refuse() -> None:
    import hetero.config

    assert hetero.config.DEFAULT_MAX_QUEUE_SIZE == DEFAULT_MAX_QUEUE_SIZE
    with pytest.raises(ConfigError, match=r"scheduler\.queue_order"):
        parse_config({"devices": [{"type": "cpu"}], "scheduler": {"queue_order": "lifo"}})
    assert QUEUE_ORDERS == ("size", "fifo")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_queue_size", 0, "must be >= 1, got 0"),
        ("max_queue_size", -3, "must be >= 1, got -3"),
        ("timeout", 0.0, "must be finite seconds > 0 or None, got 0.0"),
        ("timeout", -1.0, "must be finite seconds > 0 or None, got -1.0"),
        ("timeout", float("inf"), "must be finite seconds > 0 or None, got inf"),
        ("timeout", float("nan"), "must be finite seconds > 0 or None, got nan"),
        ("max_retries", -1, "must be >= 0, got -1"),
        ("queue_order", "lifo", "unknown order 'lifo'; allowed: size, fifo"),
        ("aging", -1.0, "must be a finite number >= 0, got -1.0"),
        ("aging", float("inf"), "must be a finite number >= 0, got inf"),
        ("aging", float("nan"), "must be a finite number >= 0, got nan"),
        ("max_bypass", 0.0, "must be > 0 seconds or None, got 0.0"),
        ("max_bypass", float("inf"), "must be > 0 seconds or None, got inf"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_field_and_value(
    field: str, value: object, message: str
) -> None:
    for build in (
        lambda: DispatchOptions(**{field: value}),
        lambda: dispatcher(**{field: value}),
        lambda: dispatcher(options=DispatchOptions(), **{field: value}),
    ):
        with pytest.raises(ConfigError) as info:
            build()
        assert info.value.problems == [(field, message)]
        assert isinstance(info.value, ValueError)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        DispatchOptions(
            max_queue_size=0,
            timeout=-1,
            max_retries=-1,
            queue_order="lifo",  # type: ignore[arg-type]
            aging=-1,
            max_bypass=-1,
        )
    fields = [path for path, _ in info.value.problems]
    assert fields == [
        "max_queue_size",
        "timeout",
        "max_retries",
        "queue_order",
        "aging",
        "max_bypass",
    ]


def test_the_options_are_frozen_and_keyword_only() -> None:
    options = DispatchOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_retries = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        DispatchOptions(5)  # type: ignore[misc]
    with pytest.raises(ConfigError, match="max_retries"):
        dataclasses.replace(options, max_retries=-1)  # replace validates again


def test_an_unknown_keyword_is_refused_with_the_allowed_names() -> None:
    allowed = ", ".join(DispatchOptions.names())
    with pytest.raises(ConfigError) as info:
        dispatcher(max_queue=5, timeout=2.0)
    assert info.value.problems == [("max_queue", f"unknown dispatcher setting; allowed: {allowed}")]
    with pytest.raises(ConfigError) as info:
        dispatcher(options=DispatchOptions(), colour="red", stealing=False)
    assert [path for path, _ in info.value.problems] == ["colour"]
    assert "allowed: max_queue_size, timeout, max_retries" in str(info.value)


def test_keywords_alone_work_as_before() -> None:
    d = dispatcher(max_queue_size=5, timeout=2.0)
    assert (d.max_queue_size, d.timeout) == (5, 2.0)
    assert d.options == DispatchOptions(max_queue_size=5, timeout=2.0)
    assert d.max_retries == 2 and d.stealing  # the rest stay the defaults


def test_options_alone_set_every_attribute() -> None:
    options = DispatchOptions(**CHANGED)
    d = dispatcher(options=options)
    assert d.options is options
    for name, value in CHANGED.items():
        assert getattr(d, name) == value, name


def test_keywords_override_the_options_they_name() -> None:
    options = DispatchOptions(max_retries=5, timeout=9.0, queue_order="fifo")
    d = dispatcher(options=options, timeout=2.0, stealing=False)
    assert d.options == dataclasses.replace(options, timeout=2.0, stealing=False)
    assert (d.timeout, d.stealing) == (2.0, False)  # overridden
    assert (d.max_retries, d.queue_order) == (5, "fifo")  # kept from the options
    assert options.timeout == 9.0  # the caller's options are not changed


def config_with_every_setting() -> HeteroConfig:
    scheduler = {k: v for k, v in CHANGED.items() if k not in NOT_IN_CONFIG}
    return parse_config(
        {
            "devices": [{"type": "gpu", "model": "T4", "emulate": True, "count": 2}],
            "scheduler": {"strategy": "round_robin", **scheduler},
        }
    )


def test_from_config_passes_every_setting_through() -> None:
    d = Dispatcher.from_config(config_with_every_setting(), clock=ManualClock())
    expected = DispatchOptions(**{k: v for k, v in CHANGED.items() if k not in NOT_IN_CONFIG})
    assert d.options == expected
    for name in DispatchOptions.names():
        assert getattr(d, name) == getattr(expected, name), name
    assert d.keep_finished  # not a config setting: the default


def test_from_config_overrides_win_over_the_config() -> None:
    d = Dispatcher.from_config(
        config_with_every_setting(), clock=ManualClock(), max_retries=4, keep_finished=False
    )
    assert (d.max_retries, d.keep_finished) == (4, False)
    assert (d.timeout, d.queue_order, d.max_bypass) == (3.0, "fifo", 30.0)  # from the config
    with pytest.raises(ConfigError, match="unknown dispatcher setting"):
        Dispatcher.from_config(config_with_every_setting(), clock=ManualClock(), retries=1)


def test_dispatch_options_is_public() -> None:
    assert hetero.DispatchOptions is DispatchOptions
    assert "DispatchOptions" in hetero.sched.__all__
