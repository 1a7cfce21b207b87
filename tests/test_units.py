from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.units import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GB", 8 * 10**9),
        ("8GiB", 8 * 2**30),
        ("512MB", 512 * 10**6),
        ("512 MiB", 512 * 2**20),
        ("1.5TB", 15 * 10**11),
        ("64mb", 64 * 10**6),
        ("1024", 1024),
        ("2k", 2000),
        ("100 B", 100),
        (4096, 4096),
        ("1e3MB", 10**9),
    ],
)
def test_parse_size_accepts_common_spellings(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "GB", "8 XB", "-5GB", "eight GB", "8 G B", "1.2.3GB", True, None]
)
def test_parse_size_rejects_with_value_and_allowed(bad: object) -> None:
    with pytest.raises(ValueError, match="invalid size") as info:
        parse_size(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
    assert "GiB" in str(info.value)


UNITS = ["B", "kB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"]


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(UNITS))
def test_round_trip_integer_amounts(amount: int, unit: str) -> None:
    factor = parse_size(f"1{unit}")
    assert parse_size(f"{amount}{unit}") == amount * factor
    assert parse_size(str(parse_size(f"{amount}{unit}"))) == amount * factor


@given(st.integers(min_value=0, max_value=2**62))
def test_bytes_round_trip_through_str(n: int) -> None:
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n


@given(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.sampled_from(UNITS),
)
def test_monotonic_in_amount(a: float, b: float, unit: str) -> None:
    lo, hi = sorted((a, b))
    assert parse_size(f"{lo!r}{unit}") <= parse_size(f"{hi!r}{unit}")


@given(st.integers(min_value=0, max_value=10**4))
def test_monotonic_in_unit(amount: int) -> None:
    ordered = ["B", "kB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB"]
    values = [parse_size(f"{amount}{u}") for u in ordered]
    assert values == sorted(values)


@given(st.integers(min_value=0, max_value=2**60))
def test_format_size_parses_back_within_rounding(n: int) -> None:
    text = format_size(n)
    assert abs(parse_size(text.replace(" ", "")) - n) <= max(1, n * 0.005)


def test_format_size_examples() -> None:
    assert format_size(8 * 2**30) == "8 GiB"
    assert format_size(512) == "512 B"
    assert format_size(1_500_000_000, binary=False) == "1.5 GB"
