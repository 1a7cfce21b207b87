"""The accelerator catalog: specs of known devices, shipped as ``data/catalog.yaml``.

Lookups accept the canonical name (``A100-80GB``) or any name a driver reports
(``NVIDIA A100-SXM4-80GB``), ignoring case, spaces, dashes and underscores. An unknown name
gets the generic spec of its kind with a warning, never a crash, so a new GPU still schedules.
A MIG slice is named by its GPU and profile (``A100-80GB/3g.40gb``, or the driver's
``NVIDIA A100-SXM4-80GB MIG 3g.40gb``): its GPU's spec scaled (``hetero.devices.mig``). A TPU
pod slice is asked for by its topology (``tpu_slice("v5p", "4x4x4")``, ``hetero.devices.tpu_pod``).

``compare`` ranks models by value for one dtype, each on the figure it really has for it, and
``best_for`` names the uses a model suits, by rules on its figures (``USE_CLASSES``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from hetero.devices.mig import MigLayout, profile_key, slice_spec, split_slice_name
from hetero.devices.spec import _DTYPE_FALLBACK, DeviceKind, DeviceSpec
from hetero.devices.tpu_pod import PodLayout, PodSlice
from hetero.errors import DeviceError

__all__ = [
    "USE_CLASSES",
    "Catalog",
    "CatalogComparison",
    "UseClass",
    "best_for",
    "figure_dtype",
    "get_catalog",
]

log = logging.getLogger("hetero.catalog")

_GIB = 1024**3
_GENERIC = {DeviceKind.CPU: "CPU", DeviceKind.GPU: "GPU"}


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.casefold())


def _shared_start(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` have in common."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def figure_dtype(spec: DeviceSpec, dtype: str) -> str | None:
    """The dtype whose figure ``spec.peak_tflops(dtype)`` gives: ``dtype`` itself when the vendor
    publishes it, else the format the device runs such work in (a T4 runs bf16 work as fp16);
    ``None`` when it publishes neither."""
    spec.peak_tflops(dtype)  # an unknown dtype is a ConfigError naming the known ones
    return next((d for d in (dtype, *_DTYPE_FALLBACK[dtype]) if spec.tflops.get(d)), None)


# --- use classes --------------------------------------------------------------------------------

#: Thresholds of the use classes (docs/catalog.md#best-for quotes them).
TRAINING_TFLOPS = 150.0  # dense 16-bit TFLOPS the device publishes (bf16 or fp16)
TRAINING_GIB = 32.0
TRAINING_LINK_GBS = 300.0  # device-to-device: NVLink, ICI, Infinity Fabric, RoCE on chip
LARGE_GIB = 80.0
LARGE_GBS = 2000.0
SMALL_GIB = 16.0
SMALL_GBS = 300.0
SMALL_TFLOPS = 50.0
BUDGET_PRICE = 1.0


def _tflops16(spec: DeviceSpec) -> float:
    # Training and serving run in bf16 or fp16, whichever the chip has: only published figures.
    return max(spec.tflops.get("bf16", 0.0), spec.tflops.get("fp16", 0.0))


def _gib(spec: DeviceSpec) -> float:
    return spec.memory_bytes / _GIB


@dataclass(frozen=True, slots=True)
class UseClass:
    """A use a device suits (``name``), the rule in words, and the rule as a test of a spec."""

    name: str
    rule: str
    test: Callable[[DeviceSpec], bool]


#: The uses ``best_for`` names, each a rule on published figures, not a label per device.
USE_CLASSES: tuple[UseClass, ...] = (
    UseClass(
        "training",
        f">= {TRAINING_TFLOPS:g} dense bf16/fp16 TFLOPS, >= {TRAINING_GIB:g} GiB and a "
        f"device-to-device link of >= {TRAINING_LINK_GBS:g} GB/s",
        lambda s: (
            _tflops16(s) >= TRAINING_TFLOPS
            and _gib(s) >= TRAINING_GIB
            and s.interconnect_gbs >= TRAINING_LINK_GBS
        ),
    ),
    UseClass(
        "inference-large",
        f">= {LARGE_GIB:g} GiB at >= {LARGE_GBS:g} GB/s (a 70B model's bf16 weights on two)",
        lambda s: _gib(s) >= LARGE_GIB and s.memory_bandwidth_gbs >= LARGE_GBS,
    ),
    UseClass(
        "inference-small",
        f">= {SMALL_GIB:g} and < {LARGE_GIB:g} GiB at >= {SMALL_GBS:g} GB/s and "
        f">= {SMALL_TFLOPS:g} dense bf16/fp16 TFLOPS",
        lambda s: (
            SMALL_GIB <= _gib(s) < LARGE_GIB
            and s.memory_bandwidth_gbs >= SMALL_GBS
            and _tflops16(s) >= SMALL_TFLOPS
        ),
    ),
    UseClass(
        "budget",
        f"<= ${BUDGET_PRICE:.2f} an hour on demand",
        lambda s: s.price_per_hour is not None and s.price_per_hour <= BUDGET_PRICE,
    ),
)


def best_for(spec: DeviceSpec) -> tuple[str, ...]:
    """The ``USE_CLASSES`` whose rule ``spec`` meets, in their order; ``()`` for none."""
    return tuple(use.name for use in USE_CLASSES if use.test(spec))


@dataclass(frozen=True, slots=True)
class CatalogComparison:
    """Value-for-money figures of one catalog model for one dtype.

    ``tflops`` is the figure of ``tflops_dtype``: the dtype asked for, or, when the vendor
    publishes none for it, the format the device runs that work in (``fallback`` is then true,
    and the row ranks after every model that has the dtype); ``None`` when it has neither.
    """

    model: str
    kind: str
    tflops: float
    tflops_dtype: str | None
    fallback: bool
    price_per_hour: float | None
    tdp_w: float
    memory_gib: float
    tflops_per_dollar: float | None
    tflops_per_watt: float | None
    gb_per_tflops: float | None
    best_for: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["best_for"] = list(self.best_for)
        return data


class Catalog:
    """An immutable set of ``DeviceSpec`` rows with name and alias lookup, the MIG layouts of
    the GPUs that have one (``mig``: model -> layout), whose slices it names too, and the pod
    layouts of the TPUs (``pods``: model -> layout)."""

    def __init__(
        self,
        specs: list[DeviceSpec],
        price_date: str = "",
        mig: Mapping[str, MigLayout] | None = None,
        pods: Mapping[str, PodLayout] | None = None,
    ) -> None:
        self.price_date = price_date
        self._specs: dict[str, DeviceSpec] = {}
        self._index: dict[str, str] = {}
        for spec in specs:
            if spec.model in self._specs:
                raise DeviceError(f"catalog: duplicate model {spec.model!r}")
            self._specs[spec.model] = spec
            for name in (spec.model, *spec.aliases):
                key = _normalize(name)
                owner = self._index.setdefault(key, spec.model)
                if owner != spec.model:
                    raise DeviceError(
                        f"catalog: name {name!r} used by both {owner} and {spec.model}"
                    )
        self._mig = dict(mig or {})
        self._slices: dict[tuple[str, str], DeviceSpec] = {}
        for model, layout in self._mig.items():
            if model not in self._specs:
                raise DeviceError(f"catalog: MIG layout for {model!r}, which has no row")
            for profile in layout.profiles:
                piece = slice_spec(
                    self._specs[model],
                    profile.name,
                    layout.share(profile),
                    profile.memory_bytes,
                    layout.source,
                )
                # Cores sit in SMs (a fixed number per SM): a slice has its SMs' share of them.
                self._slices[model, profile.name] = dataclasses.replace(
                    piece,
                    cuda_cores=_sm_share(piece.cuda_cores, profile.sms, layout.sms),
                    tensor_cores=_sm_share(piece.tensor_cores, profile.sms, layout.sms),
                )
        self._pods = dict(pods or {})
        for model in self._pods:
            if model not in self._specs:
                raise DeviceError(f"catalog: pod layout for {model!r}, which has no row")

    @classmethod
    def from_yaml(cls, text: str) -> Catalog:
        data = yaml.safe_load(text)
        rows = data["accelerators"]
        specs = [_spec_from_row(row) for row in rows]
        mig = {
            row["name"]: MigLayout.from_row(row["name"], row["mig"]) for row in rows if "mig" in row
        }
        pods = {
            row["name"]: PodLayout.from_row(row["name"], row["pod"]) for row in rows if "pod" in row
        }
        return cls(specs, price_date=str(data.get("price_date", "")), mig=mig, pods=pods)

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[DeviceSpec]:
        return iter(self._specs.values())

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if _normalize(name) in self._index:
            return True
        try:
            return self._slice(name) is not None
        except DeviceError:
            return False

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def get(self, name: str) -> DeviceSpec:
        """The spec named ``name`` (canonical or alias, or ``MODEL/PROFILE`` for a MIG slice);
        ``DeviceError`` naming close ones, or for a slice the profiles its GPU has."""
        model = self._index.get(_normalize(name))
        if model is not None:
            return self._specs[model]
        found = self._slice(name)
        if found is None:
            raise DeviceError(self._unknown(name))
        return found

    def why_unknown(self, name: str) -> str:
        """What ``get(name)`` says of a name the catalog lacks: the close names, or for a MIG
        slice its unknown GPU or the profiles its GPU has. Empty for a name it knows."""
        try:
            self.get(name)
        except DeviceError as exc:
            return str(exc)
        return ""

    def mig_layout(self, model: str) -> MigLayout | None:
        """How the catalog model ``model`` divides into MIG slices; ``None`` when unrecorded."""
        return self._mig.get(model)

    def pod_layout(self, model: str) -> PodLayout | None:
        """How the pod of TPU model ``model`` divides into slices; ``None`` when unrecorded."""
        return self._pods.get(model)

    def tpu_slice(self, name: str, topology: str) -> PodSlice:
        """The pod slice of the TPU ``name`` (any of its names: ``v5p``, ``TPU-v5p``) laid out
        as ``topology`` (``"4x4x4"``): its chips, hosts, HBM and TFLOPS. ``DeviceError`` for an
        unknown name, a model without a pod, or a topology the vendor does not publish (naming
        those it does)."""
        spec = self.get(name)
        layout = self._pods.get(spec.model)
        if layout is None:
            raise DeviceError(
                f"{spec.model} has no pod slices; models with pod slices: "
                f"{', '.join(self._pods) or 'none'}"
            )
        return layout.slice(spec, topology)

    def _unknown(self, name: str) -> str:
        close = self.closest(name)
        hint = f"; closest: {', '.join(close)}" if close else ""
        return f"unknown device model {name!r}{hint} (see `hetero catalog list`)"

    def _slice(self, name: str) -> DeviceSpec | None:
        """The MIG slice ``name`` names; ``None`` when it names none, ``DeviceError`` when its GPU
        is unknown or has no such profile."""
        parts = split_slice_name(name)
        if parts is None:
            return None
        parent, profile = parts
        model = self._index.get(_normalize(parent))
        if model is None:
            raise DeviceError(self._unknown(parent))
        layout = self._mig.get(model)
        if layout is None:
            raise DeviceError(
                f"the catalog has no MIG profiles for {model}; models with MIG profiles: "
                f"{', '.join(self._mig) or 'none'}"
            )
        found = self._slices.get((model, profile_key(profile)))
        if found is None:
            raise DeviceError(
                f"{model} has no MIG profile {profile!r}; allowed: {', '.join(layout.names)} "
                f"(e.g. {model}/{layout.names[-1]})"
            )
        return found

    def closest(self, name: str, n: int = 3) -> list[str]:
        """Canonical names that look most like ``name``.

        Names that begin with ``name``, or with what is left of it after its first words (the
        vendor or brand: ``nvidia-tesla-v100`` -> ``v100``), are what it means: a name that
        several models share (``A100``: 40 or 80 GB) lists them all, and nothing else. Without
        such names, the nearest spellings (``difflib``), those sharing a longer start first.
        """
        key = _normalize(name)
        words = [w for w in re.split(r"[\s_\-]+", name.casefold()) if w]
        tails = ["".join(words[i:]) for i in range(len(words))]

        def start(k: str) -> tuple[bool, int]:
            return max(
                ((k.startswith(t), _shared_start(t, k)) for t in tails),
                default=(False, 0),
            )

        candidates = [k for k in self._index if start(k)[0]] or difflib.get_close_matches(
            key, list(self._index), n=n * 3, cutoff=0.5
        )
        candidates.sort(
            key=lambda k: (start(k), difflib.SequenceMatcher(None, key, k).ratio()),
            reverse=True,
        )
        seen: list[str] = []
        for candidate in candidates:
            model = self._index[candidate]
            if model not in seen:
                seen.append(model)
        return seen[:n]

    def resolve(self, reported_name: str, kind: DeviceKind = DeviceKind.GPU) -> DeviceSpec:
        """The spec for a name a driver reported; an unknown name gets the generic spec, warned."""
        model = self._index.get(_normalize(reported_name))
        if model is not None:
            return self._specs[model]
        with contextlib.suppress(DeviceError):  # a slice of an unrecorded profile: generic
            found = self._slice(reported_name)
            if found is not None:
                return found
        generic = self._specs[_GENERIC.get(kind, "GPU")]
        log.warning(
            "device %r is not in the catalog; using the generic %s spec (%.1f fp32 TFLOPS). "
            "Closest known: %s",
            reported_name,
            generic.model,
            generic.peak_tflops("fp32"),
            ", ".join(self.closest(reported_name)) or "none",
        )
        return dataclasses.replace(generic, model=reported_name, kind=kind, aliases=())

    def compare(
        self,
        dtype: str = "bf16",
        kinds: set[DeviceKind] | None = None,
        by: str = "tflops_per_dollar",
    ) -> list[CatalogComparison]:
        """Models ranked by ``by`` (a ``CatalogComparison`` field), best first.

        A model ranks on what it really has: those that publish ``dtype`` come first, then
        those that run it in another format (``fallback``, their figure marked with it), then
        those without any figure; each group best first.
        """
        if by not in ("tflops_per_dollar", "tflops_per_watt", "gb_per_tflops"):
            raise ValueError(
                f"unknown ranking {by!r}; expected tflops_per_dollar, tflops_per_watt "
                "or gb_per_tflops"
            )
        rows = []
        for spec in self:
            if kinds and spec.kind not in kinds:
                continue
            tflops = spec.peak_tflops(dtype)
            used = figure_dtype(spec, dtype)
            gib = spec.memory_bytes / _GIB
            price = spec.price_per_hour
            rows.append(
                CatalogComparison(
                    model=spec.model,
                    kind=spec.kind.value,
                    tflops=tflops,
                    tflops_dtype=used,
                    fallback=used is not None and used != dtype,
                    price_per_hour=price,
                    tdp_w=spec.tdp_w,
                    memory_gib=round(gib, 1),
                    tflops_per_dollar=round(tflops / price, 2) if price and tflops else None,
                    tflops_per_watt=round(tflops / spec.tdp_w, 3)
                    if spec.tdp_w and tflops
                    else None,
                    gb_per_tflops=round(gib / tflops, 3) if tflops else None,
                    best_for=best_for(spec),
                )
            )
        # Rows that have the dtype, then fallbacks, then rows without the figure; higher first.
        return sorted(
            rows,
            key=lambda r: (getattr(r, by) is None, r.fallback, -(getattr(r, by) or 0.0)),
        )


def _spec_from_row(row: dict[str, Any]) -> DeviceSpec:
    return DeviceSpec(
        model=row["name"],
        kind=DeviceKind(row["kind"]),
        vendor=row["vendor"],
        tflops={k: float(v) for k, v in row["tflops"].items()},
        memory_bytes=round(float(row["memory_gib"]) * _GIB),
        memory_bandwidth_gbs=float(row["memory_bandwidth_gbs"]),
        interconnect=str(row.get("interconnect", "none")),
        interconnect_gbs=float(row.get("interconnect_gbs", 0.0)),
        tdp_w=float(row.get("tdp_w", 0.0)),
        price_per_hour=None if row.get("price_per_hour") is None else float(row["price_per_hour"]),
        capabilities=frozenset(row.get("capabilities", ())),
        aliases=tuple(row.get("aliases", ())),
        source=str(row.get("source", "")),
        notes=str(row.get("notes", "")),
        architecture=str(row.get("architecture", "")),
        compute_capability=str(row.get("compute_capability", "")),
        cuda_cores=_count(row, "cuda_cores"),
        tensor_cores=_count(row, "tensor_cores"),
        pod_chips=row["pod"]["chips"] if isinstance(row.get("pod"), dict) else None,
    )


def _sm_share(cores: int | None, sms: int, of: int) -> int | None:
    return None if cores is None else round(cores * sms / of)


def _count(row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeviceError(
            f"catalog: {row['name']}: {key}: expected a whole number >= 0, got {value!r}"
        )
    return value


@cache
def get_catalog() -> Catalog:
    """The catalog shipped with hetero (loaded once)."""
    text = resources.files("hetero.devices").joinpath("data/catalog.yaml").read_text("utf-8")
    return Catalog.from_yaml(text)
