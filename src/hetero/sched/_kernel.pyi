# The placement hot path in C (_kernel.c); FleetView calls it, numpy being its fallback; and
# the engine fit's update (engine_fit.LinearFit), engine_fit._step being its fallback; and the
# slo strategy's usual pick and derived targets (policies/slo.py), its numpy path being the
# fallback.

import numpy as np
import numpy.typing as npt

_Floats = npt.NDArray[np.float64]
_Ints = npt.NDArray[np.int64]

def note_queued(
    sums: _Floats,
    rows: _Ints,
    index: int,
    size_class: int,
    cost: float,
    sign: int,
    /,
) -> None: ...
def delay(
    out: _Floats,
    base: _Floats,
    inv: _Floats,
    sums: _Floats | None,
    k: int,
    minus: _Floats | None,
    parallel: _Ints | None,
    in_flight: _Ints,
    cost: float,
    weight: float,
    /,
) -> int: ...
def fit_step(
    a: list[list[float]],
    b: list[float],
    add: tuple[list[float], float, float] | None,
    drop: tuple[list[float], float, float] | None,
    first: tuple[int, ...] | None,
    /,
) -> tuple[list[list[float]], list[float], list[float], tuple[int, ...]] | None: ...
def slo_pick(
    ttft_base: _Floats,
    per_token: _Floats,
    step_base: _Floats,
    per_kv: _Floats,
    prefill: _Floats,
    decay: _Floats,
    ttft_gate: _Floats,
    tpot_gate: _Floats,
    kv_room: _Floats,
    usable: npt.NDArray[np.bool_],
    uncached: _Floats | float,
    ttft_slo: float,
    tpot_slo: float,
    kv_feature: float,
    need: float,
    /,
) -> tuple[int, float, float] | None: ...
def slo_targets(
    lone_ttft: _Floats,
    per_token: _Floats,
    lone_step: _Floats,
    per_kv: _Floats,
    n: int,
    prompt_feature: float,
    kv_feature: float,
    /,
) -> tuple[float, float]: ...
