"""``hetero fit``: will a model fit on a device, and what are the largest batch and context?

Exit codes: 0 whenever an estimate was made, whether or not it fits (the verdict is printed, and
is ``fits`` in ``--json``); 1 for errors (unknown model or device, bad config.json, bad values);
2 for malformed command lines (typer's usage errors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hetero._cli_util import HfConfigOpt, JsonOpt, console, fail, print_json, print_problems
from hetero.errors import ConfigError, HeteroError
from hetero.plan.memory import (
    DEFAULT_FRAGMENTATION,
    DTYPE_BYTES,
    FitRequest,
    MemoryFit,
    fit_memory,
    kv_bytes_per_token,
)
from hetero.plan.models import (
    MAX_PARAMS,
    MIN_PARAMS,
    ModelShape,
    builtin_models,
    get_model,
    load_hf_config,
    parse_params,
    shape_for_params,
)
from hetero.units import format_size, parse_size

__all__ = ["register"]

_FORMATS = ", ".join(DTYPE_BYTES)


def register(app: typer.Typer) -> None:
    """Add ``fit`` to ``app``."""
    app.command("fit")(fit)


def fit(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Built-in model name or Hugging Face id, any case (see --list), "
            "e.g. llama-3-8b or Qwen/Qwen2.5-72B. Leave out when using --config or --params.",
            show_default=False,
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            "-d",
            help="Catalog device (see `hetero catalog list`), e.g. --device A100-80GB.",
            show_default=False,
        ),
    ] = None,
    seq: Annotated[
        int, typer.Option(help="Context length in tokens (prompt + output), e.g. --seq 8192.")
    ] = 4096,
    batch: Annotated[
        int,
        typer.Option(help="Sequences per device (the micro-batch when training), e.g. --batch 16."),
    ] = 1,
    dtype: Annotated[
        str | None,
        typer.Option(
            help=f"Weight format: {_FORMATS}; default the model's own, e.g. --dtype int4.",
            show_default=False,
        ),
    ] = None,
    kv_dtype: Annotated[
        str | None,
        typer.Option(
            "--kv-dtype",
            help=f"KV-cache format: {_FORMATS}; default the compute format (bf16 for "
            "quantized weights), e.g. --kv-dtype fp8.",
            show_default=False,
        ),
    ] = None,
    train: Annotated[
        bool,
        typer.Option(
            "--train",
            help="Training with mixed-precision Adam instead of inference, e.g. --train --zero 2.",
        ),
    ] = False,
    zero: Annotated[
        int,
        typer.Option(
            help="ZeRO stage with --train: 1 shards optimizer states, 2 also gradients, 3 also "
            "weights over --devices, e.g. --zero 3."
        ),
    ] = 0,
    devices: Annotated[
        int,
        typer.Option(
            help="Training: data-parallel devices that ZeRO shards over, e.g. --devices 8. "
            "Inference: devices one replica is split over (tensor parallel, 1-8); the figures "
            "are per device, e.g. --devices 4.",
        ),
    ] = 1,
    checkpointing: Annotated[
        bool,
        typer.Option(
            help="With --train: full activation checkpointing (keep only each layer's input), "
            "e.g. --checkpointing."
        ),
    ] = False,
    prefill_chunk: Annotated[
        int | None,
        typer.Option(
            help="Inference: tokens one forward pass prefills at most, as with chunked prefill "
            "in vLLM or SGLang (default: the whole --seq x --batch at once), "
            "e.g. --prefill-chunk 8192.",
            show_default=False,
        ),
    ] = None,
    config: HfConfigOpt = None,
    params: Annotated[
        str | None,
        typer.Option(
            "--params",
            help="A model known only by its parameter count, as a dense Llama-style shape of "
            "that size (1B to 10T), instead of MODEL, e.g. --params 70B.",
            show_default=False,
        ),
    ] = None,
    context_memory: Annotated[
        str,
        typer.Option(
            help="Per-device runtime overhead: CUDA context, workspaces, communication "
            "buffers, e.g. --context-memory 600MiB.",
        ),
    ] = "1GiB",
    fragmentation: Annotated[
        float,
        typer.Option(
            help="Allocator fragmentation as a fraction of the per-step temporaries "
            "(activations and logits), e.g. --fragmentation 0.1.",
        ),
    ] = DEFAULT_FRAGMENTATION,
    list_models: Annotated[
        bool, typer.Option("--list", help="List the built-in models and exit, e.g. --list --json.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Estimate the memory a model needs on a device, for inference or training.

    Prints a breakdown (weights, KV cache or gradients and optimizer states, activations,
    logits, overhead), whether it fits, the largest batch that fits at --seq and the longest
    context that fits at --batch.

    Example: hetero fit llama-3-8b --device A100-80GB --seq 8192 --batch 16
    """
    if list_models:
        _list(as_json)
        return
    try:
        shape = _model(model, config, params)
        if device is None:
            raise ConfigError([("--device", "required, e.g. --device A100-80GB")])
        try:
            context_bytes = parse_size(context_memory)
        except ValueError as exc:
            raise ConfigError([("--context-memory", str(exc))]) from exc
        request = FitRequest(
            seq=seq,
            batch=batch,
            dtype=dtype,
            kv_dtype=kv_dtype,
            train=train,
            zero=zero,
            devices=devices,
            checkpointing=checkpointing,
            prefill_chunk=prefill_chunk,
            context_bytes=context_bytes,
            fragmentation=fragmentation,
        )
        result = fit_memory(shape, device, request)
    except ConfigError as exc:
        print_problems(exc, "error: ")
        raise typer.Exit(1) from None
    except HeteroError as exc:
        fail(str(exc))
    if as_json:
        print_json(result.to_dict())
        return
    _show(result)
    if params is not None:
        m = result.model
        console.print(
            f"note: {m.name} is {m.source} ({m.layers} layers, {m.hidden} wide, {m.kv_heads} KV "
            "heads): weights follow the count closely, the KV cache only roughly",
            highlight=False,
            style="dim",
        )


def _model(name: str | None, config: Path | None, params: str | None) -> ModelShape:
    choices = (("MODEL", name), ("--config", config), ("--params", params))
    given = [what for what, value in choices if value is not None]
    if len(given) != 1:
        got = f" (got {' and '.join(given)})" if given else ""
        raise ConfigError(
            [
                (
                    "model",
                    "give a built-in model name or --config path/to/config.json or --params "
                    f"70B: one of them, not both{got}",
                )
            ]
        )
    if params is not None:
        return _params_shape(params)
    return load_hf_config(config) if config is not None else get_model(str(name))


def _params_shape(text: str) -> ModelShape:
    """The dense shape of ``--params``: a count such as 70B, 1.5B, 500M or 7e9."""
    count = parse_params(text)
    if count is None:
        raise ConfigError(
            [("--params", f"expected a parameter count such as 70B, 1.5B or 7e9, got {text!r}")]
        )
    if not MIN_PARAMS <= count <= MAX_PARAMS:
        raise ConfigError(
            [("--params", f"a parameter count must be from 1B to 10T, got {text!r} ({count:,.0f})")]
        )
    return shape_for_params(count)


def _list(as_json: bool) -> None:
    models = builtin_models()
    if as_json:
        print_json(
            [
                {
                    "name": m.name,
                    "source": m.source,
                    "params": m.params,
                    "active_params": m.active_params,
                    "layers": m.layers,
                    "hidden": m.hidden,
                    "heads": m.heads,
                    "kv_heads": m.kv_heads,
                    "attention": "mla" if m.is_mla else "gqa",
                    "kv_bytes_per_token_bf16": kv_bytes_per_token(m, "bf16"),
                    "max_positions": m.max_positions,
                    "weights_dtype": m.weights_dtype,
                }
                for m in models
            ]
        )
        return
    table = Table(title=f"{len(models)} built-in models (any other: --config config.json)")
    for col in ("name", "Hugging Face id", "params", "active", "layers", "KV/token bf16", "dtype"):
        table.add_column(col, justify="right" if col in ("params", "active", "layers") else "left")
    for m in models:
        table.add_row(
            m.name,
            m.source,
            f"{m.params / 1e9:.2f}B",
            f"{m.active_params / 1e9:.2f}B",
            str(m.layers),
            format_size(kv_bytes_per_token(m, "bf16")),
            m.weights_dtype,
        )
    console.print(table)


def _split(devices: int) -> str:
    return f", tensor parallel over {devices} devices (per device)" if devices > 1 else ""


def _show(result: MemoryFit) -> None:
    r = result.request
    mode = (
        f"training, ZeRO-{r.zero} over {r.devices} device(s)"
        + (", checkpointing" if r.checkpointing else "")
        if r.train
        else f"inference{_split(r.devices)}, KV cache {r.kv_dtype}"
        + (f", prefill in chunks of {r.prefill_chunk:,} tokens" if r.prefill_chunk else "")
    )
    console.print(
        f"[bold]{result.model.name}[/] on [bold]{result.device}[/]: seq {r.seq:,} × batch "
        f"{r.batch}, {r.dtype} weights, {mode}",
        highlight=False,
    )
    table = Table()
    table.add_column("component")
    table.add_column("memory", justify="right")
    table.add_column("share", justify="right")
    total = result.total_bytes
    for name, size in result.breakdown.items():
        table.add_row(name.replace("_", " "), format_size(size), f"{100 * size / total:.1f}%")
    table.add_section()
    table.add_row("total", format_size(total), "")
    table.add_row("device", format_size(result.device_bytes), "")
    console.print(table)
    if result.fits:
        console.print(
            f"[bold green]fits[/]: {format_size(result.headroom_bytes)} free", highlight=False
        )
    else:
        console.print(
            f"[bold red]does not fit[/]: {format_size(-result.headroom_bytes)} short",
            highlight=False,
        )
    positions = result.model.max_positions
    limit = f" (model trained to {positions:,})" if positions else ""
    console.print(
        f"largest batch at seq {r.seq:,}: {result.max_batch:,}\n"
        f"longest context at batch {r.batch}: {result.max_seq:,} tokens{limit}",
        highlight=False,
    )
    for note in result.notes:
        console.print(f"note: {note}", highlight=False, style="dim")
