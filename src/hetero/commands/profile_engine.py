"""``hetero profile-engine URL``: fit the engine model to short probes of a running engine and
save the profile (``hetero.plan.engine_profile``).

Exit codes: 0 when a profile was made; 1 when the engine could not be profiled (unreachable,
not an OpenAI-compatible server, a probe refused or timed out); 2 for bad arguments (an unknown
model shape or device, a bad value; typer's usage errors too).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from hetero._cli_util import JsonOpt, ProgressBars, console, fail, print_json, print_problems
from hetero.errors import ConfigError, HeteroError

if TYPE_CHECKING:
    from hetero.plan.engine_profile import EngineProfile

__all__ = ["register"]

# The library's names of the arguments, as the command line spells them.
_OPTIONS = {
    "model_shape": "--model-shape",
    "device": "--device",
    "tensor_parallel": "--tensor-parallel",
    "max_num_batched_tokens": "--max-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "repeats": "--repeats",
    "timeout": "--timeout",
}
_EPILOG = (
    "Examples:\n\n"
    "  hetero profile-engine http://gpu-box:8000 --model-shape llama-3-8b --device L4 "
    "--out l4.json\n\n"
    "  hetero profile-engine http://127.0.0.1:8000 --model-shape ./my-model/config.json "
    "--device A100-80GB --tensor-parallel 2 --max-batched-tokens 2048 --repeats 1 --json"
)


def register(app: typer.Typer) -> None:
    """Add ``profile-engine`` to ``app``."""
    app.command("profile-engine", epilog=_EPILOG)(profile_engine)


def profile_engine(
    url: Annotated[
        str,
        typer.Argument(
            metavar="URL",
            help="Base URL of a running OpenAI-compatible engine (vLLM, SGLang, ...), e.g. "
            "http://127.0.0.1:8000.",
            show_default=False,
        ),
    ],
    model_shape: Annotated[
        str,
        typer.Option(
            "--model-shape",
            metavar="SHAPE",
            help="The model it serves, as the emulator knows it: a built-in name (`hetero fit "
            "--list`) or a path to its Hugging Face config.json.",
            show_default=False,
        ),
    ],
    device: Annotated[
        str,
        typer.Option(
            "--device",
            metavar="GPU",
            help="The accelerator it runs on, a catalog name (`hetero catalog list`).",
            show_default=False,
        ),
    ],
    tensor_parallel: Annotated[
        int,
        typer.Option(
            "--tensor-parallel",
            metavar="K",
            min=1,
            help="Devices one replica spans (vLLM's --tensor-parallel-size).",
        ),
    ] = 1,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="FILE",
            help="Save the profile here (JSON). Default: not saved.",
            show_default=False,
        ),
    ] = None,
    repeats: Annotated[
        int,
        typer.Option(
            metavar="N", min=1, help="Runs of each probe; the median counts (more: steadier)."
        ),
    ] = 3,
    max_batched_tokens: Annotated[
        int,
        typer.Option(
            "--max-batched-tokens",
            metavar="N",
            min=1,
            help="Tokens one engine step computes at most, as the engine was started with "
            "(vLLM's --max-num-batched-tokens).",
        ),
    ] = 8192,
    max_num_seqs: Annotated[
        int,
        typer.Option(
            "--max-num-seqs",
            metavar="N",
            min=1,
            help="Requests one engine step runs at most, as the engine was started with.",
        ),
    ] = 256,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="NAME",
            help="The model name to request. Default: the first at URL/v1/models.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(metavar="SECONDS", help="The longest one request may take."),
    ] = 120.0,
    as_json: JsonOpt = False,
) -> None:
    """Profile a running inference engine: fit hetero's engine model to it.

    Sends streamed completions of random prompt tokens (warm-up first): the time to first
    token of single requests of 32, 512, 1024 and 1536 prompt tokens, the time between tokens
    while 1, 2 and 8 requests decode together, and both in closed loops of 16, 32 and 64
    clients (two requests of 256 + 32 tokens each: the batches a replica runs near its
    capacity, new prompts prefilled beside the decodes). The emulator of --model-shape on
    --device (with the engine's KV capacity, read from its /metrics where it publishes it) runs
    the same probes; its calibration (compute, attention and bandwidth efficiency, step and
    per-request overhead) is fitted to the measurements by least squares, plus a constant for
    the HTTP path. Prints each probe, measured and emulated, and the calibration; --out saves
    the profile.

    Run it on an idle engine: other requests would be measured too. A few hundred requests,
    some seconds on a GPU (a minute or more on a CPU engine).
    """
    from hetero.plan import engine_profile

    if not url.startswith(("http://", "https://")):
        print_problems(ConfigError([("URL", f"must be http://HOST:PORT, got {url!r}")]), "error: ")
        raise typer.Exit(2)
    try:
        with contextlib.ExitStack() as stack:
            update = None

            def progress(done: int, total: int) -> None:
                nonlocal update  # the bar shows once probing starts, after the checks
                if update is None:
                    update = stack.enter_context(ProgressBars(True))(f"probing {url}")
                update(done, total)

            profile = asyncio.run(
                engine_profile.profile_engine(
                    url,
                    model_shape,
                    device,
                    tensor_parallel=tensor_parallel,
                    max_num_batched_tokens=max_batched_tokens,
                    max_num_seqs=max_num_seqs,
                    model=model,
                    repeats=repeats,
                    timeout=timeout,
                    progress=None if as_json else progress,
                )
            )
    except ConfigError as exc:
        named = [(_OPTIONS.get(f, f), m) for f, m in exc.problems]
        print_problems(ConfigError(named), "error: ")
        raise typer.Exit(2) from None
    except HeteroError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted: no profile made", 130)
    if out is not None:
        try:
            profile.save(out)
        except OSError as exc:
            fail(f"cannot write {out}: {exc.strerror or exc}")
    if as_json:
        print_json(profile.to_dict())
        return
    _show(profile, out)


def _show(profile: EngineProfile, out: Path | None) -> None:
    table = Table(
        title=Text(
            f"{profile.model} at {profile.url} ({profile.engine}) as {profile.model_shape} on "
            f"{profile.tensor_parallel} × {profile.device}"
        )
    )
    for name in ("probe", "real", "emulated", "error"):
        table.add_column(name, justify="left" if name == "probe" else "right")
    plan = profile.plan
    loop = f"{plan.load_prompt:,}+{plan.load_output}-token requests"
    names = {
        "ttft": "first token, {:,}-token prompt",
        "itl": "between tokens, {} decoding",
        "load_ttft": "first token, {} clients looping " + loop,
        "load_itl": "between tokens, {} clients looping " + loop,
    }
    for p in profile.probes:
        what = names[p.kind].format(p.size)
        table.add_row(
            what, f"{p.real * 1000:.1f} ms", f"{p.emulated * 1000:.1f} ms", f"{p.error:+.1%}"
        )
    console.print(table)
    c = profile.calibration
    kv = f"{profile.kv_tokens:,} (from the engine)" if profile.kv_tokens else "from the memory fit"
    console.print(
        f"calibration: compute efficiency {c.compute_efficiency:.4g}, attention efficiency "
        f"{c.attention:.4g}, bandwidth efficiency "
        f"{c.bandwidth_efficiency:.4g}, step overhead {c.step_overhead * 1000:.3g} ms, request "
        f"overhead {c.request_overhead * 1000:.3g} ms; HTTP {profile.http_s * 1000:.3g} ms\n"
        f"KV tokens: {kv}; worst error {profile.worst_error:.1%}\n"
        + (f"saved to {out}" if out else "not saved (--out FILE saves it)"),
        highlight=False,
        markup=False,
    )
