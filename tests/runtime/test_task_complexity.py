"""``complexity=``: a task says which tier of the ``tiered`` strategy its calls belong to (seed
000: long sequences to the A100s, short ones to the V100s), from its arguments or per call."""

from __future__ import annotations

import pytest

import hetero
from hetero.config import HeteroConfig, parse_config
from hetero.errors import ConfigError
from hetero.runtime.tasks import make_options


def tiered_fleet() -> HeteroConfig:
    """An A100 above a V100; work of complexity 1024 or more belongs on the A100. No stealing
    and no overflow, so where an item runs is where its tier sent it."""
    return parse_config(
        {
            "devices": [
                {"type": "gpu", "model": "A100-80GB", "emulate": True, "name": "big"},
                {"type": "gpu", "model": "V100-32GB", "emulate": True, "name": "small"},
            ],
            "scheduler": {
                "strategy": "tiered",
                "options": {"thresholds": [1024], "tiers": [["small"], ["big"]], "saturation": 100},
                "stealing": False,
            },
        }
    )


def test_a_tasks_complexity_picks_its_tier() -> None:
    @hetero.task(complexity=lambda tokens: tokens)
    def where(tokens: int) -> str:
        return hetero.get_current_device().id

    with hetero.Context(tiered_fleet()) as ctx:
        long = [ctx.submit(where, 4096) for _ in range(3)]
        short = [ctx.submit(where, 16) for _ in range(3)]
        assert [f.result(timeout=60) for f in long] == ["big"] * 3
        assert [f.result(timeout=60) for f in short] == ["small"] * 3
        # Per call: a number wins over the function; without one the tier is the cost's (1).
        assert ctx.run(where.with_options(complexity=2048), 16) == "big"
        assert ctx.run(where.with_options(complexity=None), 4096) == "small"
        # A map's batch is as complex as its most complex item.
        assert list(ctx.map(where, [16, 16], batch_size=2)) == ["small", "small"]
        assert list(ctx.map(where, [16, 4096], batch_size=2)) == ["big", "big"]


def test_complexity_must_be_a_finite_number_or_a_function() -> None:
    for bad in ("long", float("nan"), True):
        with pytest.raises(ConfigError, match=r"complexity: must be a"):
            make_options(complexity=bad)  # type: ignore[arg-type]
    options = make_options(complexity=lambda n: "long")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match=r"complexity: must return a number, got 'long'"):
        options.complexity_of((1,), {})
    assert make_options(complexity=lambda n, scale=2: n * scale).complexity_of((3,), {}) == 6.0
    assert make_options().complexity_of((3,), {}) is None
