"""Config values that would pass a type check and then break the run: non-finite or absurd
numbers, sizes too large for any machine, YAML whose aliases expand without bound, fleets larger
than anything hetero runs. Each is refused while the file is read, naming the field, the bad
value and what is allowed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hetero import ConfigError, load_config, parse_config
from hetero.units import parse_size


def problems(data: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def emulated(**fields: Any) -> dict[str, Any]:
    return {"type": "gpu", "model": "A100-80GB", "emulate": True, **fields}


@pytest.mark.parametrize(
    ("speed", "allowed"),
    [
        (float("inf"), "Input should be a finite number"),
        (float("nan"), "Input should be a finite number"),
        (1e308, "Input should be less than or equal to 1000000"),
        (1e7, "Input should be less than or equal to 1000000"),
        (1e-308, "Input should be greater than or equal to 0.000001"),
        (1e-7, "Input should be greater than or equal to 0.000001"),
    ],
)
def test_a_speed_that_is_not_finite_or_absurd_is_refused(speed: float, allowed: str) -> None:
    found = problems(
        {
            "devices": [emulated(speed=speed)],
            "replicas": [{"url": "http://127.0.0.1:8000", "speed": speed}],
        }
    )
    assert found == [
        ("devices[0].speed", f"{allowed} (got {speed!r})"),
        ("replicas[0].speed", f"{allowed} (got {speed!r})"),
    ]


@pytest.mark.parametrize("speed", [1e-6, 0.008, 500.0, 1e6])
def test_speeds_from_a_slow_cpu_to_far_past_a_wafer_scale_chip_are_allowed(speed: float) -> None:
    assert parse_config({"devices": [emulated(speed=speed)]}).devices[0].speed == speed


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("timeout", float("inf"), "finite"),
        ("timeout", 1e300, "less than or equal to 31536000"),
        ("max_bypass", 1e300, "less than or equal to 31536000"),
        ("monitoring_interval", 1e300, "less than or equal to 86400"),
    ],
)
def test_seconds_that_no_timer_can_wait_are_refused(field: str, value: float, allowed: str) -> None:
    ((path, message),) = problems({"devices": [{"type": "cpu"}], "scheduler": {field: value}})
    assert path == f"scheduler.{field}"
    assert allowed in message and repr(value) in message


def test_a_timeout_of_a_year_is_allowed() -> None:
    config = parse_config({"devices": [{"type": "cpu"}], "scheduler": {"timeout": 31_536_000}})
    assert config.scheduler.timeout == 31_536_000


@pytest.mark.parametrize("size", ["1e400GB", "1e30GB", 1e308, 2**63, "8192PiB"])
@pytest.mark.parametrize(
    "where",
    [
        ("devices", 0, "memory_limit"),
        ("communication", None, "buffer_size"),
    ],
)
def test_a_size_larger_than_any_machine_is_refused_naming_the_field(
    size: object, where: tuple[str, int | None, str]
) -> None:
    section, index, field = where
    data: dict[str, Any] = {"devices": [emulated()]}
    if index is None:
        data[section] = {field: size}
    else:
        data[section][index][field] = size
    ((path, message),) = problems(data)
    assert path == f"{section}{'' if index is None else f'[{index}]'}.{field}"
    assert repr(size) in message
    assert "at most 2**63 - 1 bytes" in message


def test_a_memory_limit_too_large_for_a_real_device_is_refused_too() -> None:
    ((path, message),) = problems({"devices": [{"type": "cpu", "memory_limit": "1e400GB"}]})
    assert path == "devices[0].memory_limit"
    assert "'1e400GB'" in message


def test_the_largest_size_is_still_a_size() -> None:
    assert parse_size(2**63 - 1) == 2**63 - 1
    assert parse_size("8191PiB") == 8191 * 1024**5


@pytest.mark.parametrize(
    "text",
    ["1e999999999GB", "1e" + "9" * 5000, "9" * 5000, "1." + "0" * 100_000 + "1GB"],
)
def test_a_size_with_a_huge_exponent_or_digit_count_is_refused_at_once(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ValueError, match="invalid size") as info:
        parse_size(text)
    assert time.perf_counter() - started < 0.5
    assert text[:20] in str(info.value)


@pytest.mark.parametrize("text", ["1e-999999999GB", "0e999999999GB", "0.0000000000001B"])
def test_a_size_far_below_a_byte_is_zero_at_once(text: str) -> None:
    started = time.perf_counter()
    assert parse_size(text) == 0
    assert time.perf_counter() - started < 0.5


def test_more_devices_in_all_than_hetero_runs_are_refused_with_the_count() -> None:
    found = problems({"devices": [emulated(count=100_000) for _ in range(3)]})
    assert found == [("devices", "300000 devices in all (3 entries); allowed: at most 100000")]


# --- the YAML loader --------------------------------------------------------------------------


def billion_laughs(levels: int = 9, width: int = 10) -> str:
    """A YAML of about 600 bytes whose aliases expand to ``width ** levels`` values."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"devices: [{{type: cpu, tags: *a{levels}}}]")
    return "\n".join(lines) + "\n"


def test_yaml_aliases_that_expand_to_a_billion_values_are_refused_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert time.perf_counter() - started < 2
    ((where, message),) = info.value.problems
    assert where == ""
    assert message == (
        f"{path}: invalid YAML: it holds more than 1000000 values once its aliases are"
        " expanded; allowed: at most 1000000"
    )


def test_yaml_aliases_that_repeat_a_few_values_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(billion_laughs(levels=3, width=3))
    with pytest.raises(ConfigError, match=r"devices\[0\]\.tags"):  # a list of lists, not strings
        load_config(path)


def test_a_yaml_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cycle.yaml"
    path.write_text("devices: &d [{type: cpu, tags: *d}]\n")
    with pytest.raises(
        ConfigError, match=r"line 1, column 10: this value holds an alias of itself"
    ):
        load_config(path)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_nested_too_deeply_is_a_config_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"deep{suffix}"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(json.dumps({"devices": [{"type": "cpu"}]})[:-1] + f', "x": {deep}}}')
    with pytest.raises(ConfigError, match=r"nested more deeply than hetero reads"):
        load_config(path)
