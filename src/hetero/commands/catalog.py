"""``hetero catalog list|show|compare``: the accelerator catalog, its specs, prices and value,
and the slices of a TPU pod (``show v5p --slice 4x4x4``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from hetero._cli_util import JsonOpt, console, fail, parse_kinds, print_json
from hetero._format import count
from hetero._tables import FitTable
from hetero.devices.catalog import USE_CLASSES, best_for, get_catalog
from hetero.devices.spec import DTYPES, DeviceKind, DeviceSpec
from hetero.devices.tpu_pod import PodSlice
from hetero.errors import HeteroError
from hetero.units import format_size

__all__ = ["register"]

catalog_app = typer.Typer(
    help="The accelerator catalog: specs, prices and value for money.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    """Add the ``catalog`` group to ``app``."""
    app.add_typer(catalog_app, name="catalog")


def _kinds(kind: list[str] | None) -> set[DeviceKind] | None:
    if not kind:
        return None
    try:
        return parse_kinds(kind)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kind") from None


KindOpt = Annotated[list[str] | None, typer.Option("--kind", help="Only this kind (repeatable).")]


@catalog_app.command("list")
def catalog_list(kind: KindOpt = None, as_json: JsonOpt = False) -> None:
    """List every model in the catalog."""
    kinds = _kinds(kind)
    specs = [s for s in get_catalog() if not kinds or s.kind in kinds]
    if as_json:
        print_json([_spec_dict(s) for s in specs])
        return
    # Most telling columns first: on a narrow console the last ones are left out, and said.
    table = FitTable(
        title=f"{count(len(specs), 'accelerator')} (prices as of {get_catalog().price_date})",
        caption="bf16/fp16, fp8, fp32: dense TFLOPS; GB/s: memory bandwidth",
        caption_justify="left",
    )
    for col in (
        "model",
        "memory",
        "GB/s",
        "bf16/fp16",
        "fp8",
        "fp32",
        "$/h",
        "TDP W",
        "kind",
        "vendor",
    ):
        table.add_column(col, justify="left" if col in ("model", "kind", "vendor") else "right")
    for s in specs:
        fp8 = s.tflops.get("fp8")
        table.add_row(
            s.model,
            format_size(s.memory_bytes),
            f"{s.memory_bandwidth_gbs:,.0f}",
            f"{s.peak_tflops('bf16'):.1f}",
            f"{fp8:.0f}" if fp8 else "-",
            f"{s.peak_tflops('fp32'):.1f}",
            f"{s.price_per_hour:.2f}" if s.price_per_hour is not None else "-",
            f"{s.tdp_w:.0f}",
            s.kind.value,
            s.vendor,
        )
    console.print(table)


def _spec_dict(spec: DeviceSpec) -> dict[str, Any]:
    layout = get_catalog().pod_layout(spec.model)
    return {
        "model": spec.model,
        "kind": spec.kind.value,
        "vendor": spec.vendor,
        "architecture": spec.architecture or None,
        "compute_capability": spec.compute_capability or None,
        "cuda_cores": spec.cuda_cores,
        "tensor_cores": spec.tensor_cores,
        "aliases": list(spec.aliases),
        "tflops": dict(spec.tflops),
        "memory_bytes": spec.memory_bytes,
        "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
        "interconnect": spec.interconnect,
        "interconnect_gbs": spec.interconnect_gbs,
        "tdp_w": spec.tdp_w,
        "price_per_hour": spec.price_per_hour,
        "capabilities": sorted(spec.capabilities),
        "best_for": list(best_for(spec)),
        "pod_chips": spec.pod_chips,
        "pod_slices": layout.names if layout is not None else None,
        "source": spec.source,
        "notes": spec.notes,
    }


@catalog_app.command("show")
def catalog_show(
    name: Annotated[str, typer.Argument(help="Canonical name or a driver-reported name.")],
    slice_: Annotated[
        str | None,
        typer.Option(
            "--slice",
            metavar="TOPOLOGY",
            help="A TPU pod slice by its topology: its chips, hosts, HBM and TFLOPS in all. "
            "Example: hetero catalog show v5p --slice 4x4x4",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one model's full spec, or with --slice one slice of a TPU pod."""
    try:
        spec = get_catalog().get(name)
    except HeteroError as exc:
        fail(str(exc))
    if slice_ is not None:
        try:
            pod = get_catalog().tpu_slice(spec.model, slice_)
        except HeteroError as exc:
            fail(f"--slice {slice_}: {exc}")
        _show_slice(pod, as_json)
        return
    data = _spec_dict(spec)
    if as_json:
        print_json(data)
        return
    table = Table(title=spec.model, show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")  # a source URL has no space to wrap at
    for key, value in data.items():
        if key.startswith("pod_") and value is None:
            continue  # not a TPU
        if key == "memory_bytes":
            value = format_size(value)
        elif isinstance(value, dict):
            value = ", ".join(f"{k} {v:g}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(value) or "-"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        elif value is None:
            value = "-"
        table.add_row(key, str(value))
    console.print(table)


def _show_slice(pod: PodSlice, as_json: bool) -> None:
    if as_json:
        print_json(pod.to_dict())
        return
    table = Table(title=f"{pod.model} slice {pod.topology}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    hosts = pod.hosts_text + (" (part of one host)" if pod.hosts < 1 else "")
    for key, value in (
        ("topology", pod.topology),
        ("chips", f"{pod.chips:,} of a {pod.pod_chips:,}-chip pod"),
        ("hosts", hosts),
        ("HBM", format_size(pod.memory_bytes)),
        ("HBM bandwidth", f"{pod.memory_bandwidth_gbs:,.0f} GB/s"),
        ("dense TFLOPS", ", ".join(f"{k} {v:,.0f}" for k, v in pod.tflops.items())),
    ):
        table.add_row(key, value)
    console.print(table)


@catalog_app.command("compare")
def catalog_compare(
    dtype: Annotated[str, typer.Option(help=f"Number format: {', '.join(DTYPES)}.")] = "bf16",
    by: Annotated[
        str, typer.Option(help="Rank by tflops_per_dollar, tflops_per_watt or gb_per_tflops.")
    ] = "tflops_per_dollar",
    kind: KindOpt = None,
    models: Annotated[list[str] | None, typer.Option("--model", help="Only these models.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Rank models by TFLOPS per $/hour, TFLOPS per watt and GB of memory per TFLOPS."""
    if dtype not in DTYPES:
        raise typer.BadParameter(f"{dtype!r}; allowed: {', '.join(DTYPES)}", param_hint="--dtype")
    catalog = get_catalog()
    try:
        wanted = {catalog.get(m).model for m in models} if models else None
        rows = catalog.compare(dtype=dtype, kinds=_kinds(kind), by=by)
    except HeteroError as exc:
        fail(str(exc))
    except ValueError as exc:  # compare's only one: --by names no ranking
        raise typer.BadParameter(str(exc), param_hint="--by") from None
    rows = [r for r in rows if wanted is None or r.model in wanted]
    if as_json:
        print_json([r.to_dict() for r in rows])
        return
    legend = [f"TFLOPS: dense {dtype}"]
    if any(r.fallback for r in rows):
        # A device without the dtype would otherwise rank on another format's figure unmarked.
        legend[0] += (
            f". A format after the figure, as in 65 (fp16): the model publishes no {dtype} "
            f"figure, so this is the format it runs {dtype} work in; such rows rank after "
            f"every model that has {dtype}"
        )
    legend += [f"best for {u.name}: {u.rule}" for u in USE_CLASSES]
    table = FitTable(
        title=f"catalog compared on {dtype}, ranked by {by}",
        caption="\n".join(legend),
        caption_justify="left",
        key_columns=2,
    )
    for col in ("#", "model", "TFLOPS", "$/h", "TFLOPS/$", "TFLOPS/W", "GB/TFLOPS", "kind"):
        table.add_column(col, justify="left" if col in ("model", "kind") else "right")
    # Before the per-watt and per-memory figures: what a row is for reads at any width.
    table.add_wrapping_column("best for", width=24, priority=-4.5)

    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for rank, r in enumerate(rows, 1):
        tflops = f"{r.tflops:g}" + (f" ({r.tflops_dtype})" if r.fallback else "")
        table.add_row(
            str(rank),
            r.model,
            tflops,
            fmt(r.price_per_hour, ".2f"),
            fmt(r.tflops_per_dollar, ".1f"),
            fmt(r.tflops_per_watt, ".3f"),
            fmt(r.gb_per_tflops, ".3f"),
            r.kind,
            ", ".join(r.best_for) or "-",
        )
    console.print(table)
