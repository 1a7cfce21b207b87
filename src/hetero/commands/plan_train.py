"""``hetero plan-train``: how to lay out training of a model on a fleet you have — how many
data-parallel replicas of a pipeline, which devices in each, each one's layers and share of
the batch — and why (``hetero.train.fleet_layout.choose_layout``).

Exit codes: 0 with a layout; 1 for errors (unknown model or device, bad values, a model that
fits no layout of the fleet); 2 for malformed command lines (typer's usage errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hetero._cli_util import HfConfigOpt, JsonOpt, console, fail, print_json, print_problems
from hetero.devices.spec import REFERENCE_TFLOPS, Device
from hetero.errors import ConfigError, HeteroError
from hetero.plan.match import DEFAULT_COMPUTE_EFFICIENCY
from hetero.plan.memory import DEFAULT_CONTEXT_BYTES
from hetero.plan.models import ModelShape
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.train.stages import PipelineRank

__all__ = ["register"]

_EPILOG = (
    "Examples:\n\n"
    "  hetero plan-train llama-3-8b --fleet A100-80GB:2,V100-32GB:2,T4:4\n\n"
    "  hetero plan-train llama-3.2-1b --fleet examples/train_fleet.yaml --seq 2048 "
    "--global-batch 64 --micro-batch 2 --bandwidth 12.5\n\n"
    "  hetero plan-train 8B --fleet A100-80GB:4,V100-32GB:4 --seq 2048 --global-batch 64 --json"
)

# The options a library field is given by, to name in errors.
_OPTION = {
    "model": "MODEL",
    "seq": "--seq",
    "dtype": "--dtype",
    "compute_efficiency": "--compute-efficiency",
    "global_batch": "--global-batch",
    "micro_batch_size": "--micro-batch",
    "schedule": "--schedule",
    "bandwidth": "--bandwidth",
    "ranks": "--fleet",
}


def plan_train(
    fleet: Annotated[
        str,
        typer.Option(
            help="The devices, one rank each in this order: catalog names with counts, e.g. "
            "--fleet A100-80GB:2,V100-32GB:2,T4:4, or a fleet config file, e.g. --fleet "
            "examples/train_fleet.yaml.",
            show_default=False,
        ),
    ],
    model: Annotated[
        str | None,
        typer.Argument(
            metavar="MODEL",
            help="Built-in model name or Hugging Face id, any case (see `hetero fit --list`), or "
            "a parameter count as a dense Llama-style shape, e.g. llama-3-8b or 70B. Leave out "
            "when using --config.",
            show_default=False,
        ),
    ] = None,
    config: HfConfigOpt = None,
    global_batch: Annotated[
        int,
        typer.Option(
            min=1, help="Sequences a step, all replicas together, e.g. --global-batch 64."
        ),
    ] = 32,
    micro_batch: Annotated[
        int,
        typer.Option(
            min=1, help="Sequences a micro-batch; must divide --global-batch, e.g. --micro-batch 2."
        ),
    ] = 1,
    seq: Annotated[
        int,
        typer.Option("--seq", "--seq-len", min=1, help="Tokens a sequence, e.g. --seq 2048."),
    ] = 4096,
    schedule: Annotated[
        str, typer.Option(help="Pipeline schedule: 1f1b or gpipe, e.g. --schedule gpipe.")
    ] = "1f1b",
    bandwidth: Annotated[
        float | None,
        typer.Option(
            min=1e-9,
            help="GB/s each rank sends (and receives) in the gradients' all-reduce (default: "
            "PCIe Gen3-5 between sockets one way for the fleet's devices, at most a 100 Gb/s "
            "network across nodes), e.g. --bandwidth 12.5.",
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights and compute: bf16 or fp16 (mixed precision, 16 bytes of state a "
            "parameter) or fp32, e.g. --dtype fp16."
        ),
    ] = "bf16",
    compute_efficiency: Annotated[
        float,
        typer.Option(
            help="Share of peak TFLOPS a device reaches, in (0, 1], e.g. --compute-efficiency 0.4."
        ),
    ] = DEFAULT_COMPUTE_EFFICIENCY,
    as_json: JsonOpt = False,
) -> None:
    """Lay out training of a model on a mixed fleet: data × pipeline replicas, each device's
    layers and share of the batch, and every layout tried and why it lost.

    Each layer's time is its FLOPs (6 × parameters × tokens, plus attention's) at each
    device's catalog TFLOPS for --dtype; its memory is `hetero fit --train`'s (weights,
    gradients and AdamW states, activations, logits), each device's less a 1 GiB CUDA
    context."""
    from hetero.train.fleet_layout import choose_layout
    from hetero.train.fleet_ranks import default_bandwidth, pipeline_ranks
    from hetero.train.model_costs import training_layer_costs

    try:
        shape = _model(model, config)
        devices = _fleet(fleet)
        costs = training_layer_costs(
            shape, seq=seq, dtype=dtype, compute_efficiency=compute_efficiency
        )
        ranks = pipeline_ranks(devices, dtype=dtype)
        rate, source = default_bandwidth(devices) if bandwidth is None else (bandwidth * 1e9, None)
        layout = choose_layout(
            costs,
            ranks,
            global_batch=global_batch,
            micro_batch_size=micro_batch,
            schedule=schedule,
            bandwidth=rate,
        )
    except ConfigError as exc:
        print_problems(_as_options(exc), "error: ")
        raise typer.Exit(1) from None
    except HeteroError as exc:
        fail(str(exc))
    notes = _notes(shape, devices, seq, dtype, source)
    if as_json:
        print_json(
            {
                "model": {"name": shape.name, "source": shape.source, "params": shape.params},
                "seq": seq,
                "dtype": dtype,
                "global_batch": global_batch,
                "micro_batch": micro_batch,
                "schedule": schedule,
                "compute_efficiency": compute_efficiency,
                "bandwidth_source": source or "--bandwidth",
                "ranks": [
                    {**_device(d), "speed": r.speed, "memory": r.memory}
                    for d, r in zip(devices, ranks, strict=True)
                ],
                "layers": [
                    {
                        "name": c.name,
                        "seconds": c.seconds,
                        "state_bytes": c.state_bytes,
                        "activation_bytes": c.activation_bytes,
                        "parameter_bytes": c.parameter_bytes,
                    }
                    for c in costs
                ],
                "layout": layout.to_dict(),
                "notes": notes,
            }
        )
        return
    state = sum(c.state_bytes for c in costs)
    activations = sum(c.activation_bytes for c in costs)
    console.print(
        f"[bold]{escape(shape.name)}[/] ({shape.params / 1e9:.2f}B parameters, {len(costs)} "
        "layers): "
        f"{format_size(state)} of weights, gradients and AdamW states, {format_size(activations)} "
        f"of activations a sequence of {seq:,} tokens; {dtype}, a global batch of "
        f"{global_batch} in micro-batches of {micro_batch}, {schedule}",
        highlight=False,
    )
    console.print(_rank_table(devices, ranks))
    console.print(
        f"speed: peak {dtype} TFLOPS / {REFERENCE_TFLOPS:g} (or the fleet file's speed); "
        "memory: the device's (or its memory_limit) less "
        f"{format_size(DEFAULT_CONTEXT_BYTES)} of CUDA context",
        highlight=False,
        style="dim",
    )
    console.print(layout.explain(), markup=False, highlight=False, soft_wrap=True)
    for note in notes:
        console.print(f"note: {note}", highlight=False, style="dim")


def _model(name: str | None, config: Path | None) -> ModelShape:
    """MODEL (a name, Hugging Face id or parameter count, as ``hetero plan --model``) or
    ``--config``'s config.json: one of them."""
    from hetero.plan.models import get_model, load_hf_config, parse_params
    from hetero.plan.serving_spec import resolve_model

    if (name is None) == (config is None):
        got = " (got both)" if name is not None else ""
        raise ConfigError(
            [
                (
                    "model",
                    "give a built-in model name, a parameter count such as 70B or --config "
                    f"path/to/config.json: one of them{got}",
                )
            ]
        )
    if config is not None:
        return load_hf_config(config)
    assert name is not None
    # get_model's error names the closest built-in models; resolve_model's does not.
    return resolve_model(name) if parse_params(name) is not None else get_model(name)


def _fleet(text: str) -> list[Device]:
    """The devices of ``--fleet``: a fleet config file, or catalog names with counts."""
    from hetero.config import load_config
    from hetero.devices.fleet import build_fleet
    from hetero.sim.run import devices_from_names

    path = Path(text)
    if path.suffix.lower() not in (".yaml", ".yml", ".json") and not path.is_file():
        return devices_from_names(text)
    try:
        return build_fleet(load_config(path))
    except ConfigError as exc:
        raise ConfigError(
            [(f"--fleet {text}" + (f": {p}" if p else ""), m) for p, m in exc.problems]
        ) from None


def _as_options(exc: ConfigError) -> ConfigError:
    """``exc`` with the library's field names replaced by the options the user typed."""
    return ConfigError([(_OPTION.get(path, path), message) for path, message in exc.problems])


def _device(device: Device) -> dict[str, Any]:
    return {"device": device.id, "model": device.model, "node": device.node}


def _rank_table(devices: Sequence[Device], ranks: Sequence[PipelineRank]) -> Table:
    table = Table(title="ranks")
    for name in ("rank", "device", "node", "speed", "memory"):
        table.add_column(name, justify="right" if name in ("rank", "speed", "memory") else "left")
    for d, r in zip(devices, ranks, strict=True):
        table.add_row(
            str(r.rank), f"{d.id} ({d.model})", d.node, f"{r.speed:g}", format_size(r.memory)
        )
    return table


def _notes(
    shape: ModelShape, devices: Sequence[Device], seq: int, dtype: str, source: str | None
) -> list[str]:
    from hetero.train.fleet_ranks import dtype_fallbacks

    notes = []
    if source is not None:
        notes.append(
            f"the all-reduce's bandwidth is hetero's default, {source}: --bandwidth gives yours"
        )
    if shape.max_positions and seq > shape.max_positions:
        notes.append(
            f"--seq {seq:,} is beyond the model's max_position_embeddings {shape.max_positions:,}"
        )
    fallbacks = dtype_fallbacks(devices, dtype)
    if fallbacks:
        fp16 = " (without bf16 arithmetic they train in fp16: --dtype fp16)"
        notes.append(
            f"{', '.join(fallbacks)}: no {dtype} TFLOPS in the catalog, the closest format's "
            f"stand in{fp16 if dtype == 'bf16' else ''}"
        )
    return notes


def register(app: typer.Typer) -> None:
    """Add ``plan-train`` to ``app``."""
    app.command("plan-train", epilog=_EPILOG)(plan_train)
