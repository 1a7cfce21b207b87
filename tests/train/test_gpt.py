"""A GPT-style transformer (transformers' GPT-2 from a small config, random weights) on 3 gloo
ranks over 127.0.0.1: under DDP and under FSDP, with uneven shares, accumulation and a rank
with share 0 (GPT-2 takes no batch of 0 sequences: that rank runs one, weighted 0), the
parameters after 5 steps match one process training on the same global batches; and the
example trains under ``hetero launch``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from torch import nn
from torch.utils.data import TensorDataset

from hetero.train import Trainer, TrainerOptions
from tests.train._ranks import Outcome, matching_one_process, one_process, run_ranks

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "examples"))
from train_gpt import gpt  # noqa: E402  (the example's model, here smaller)

WORLD = 3
STEPS = 5
SEQ, VOCAB = 12, 48


def _gpt(dtype: torch.dtype = torch.float32) -> nn.Module:
    return gpt(2, 32, VOCAB, SEQ, seed=0, heads=2).to(dtype)


def _tokens(n: int = 30) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    sequences = torch.randint(0, VOCAB, (n, SEQ + 1), generator=generator)
    return TensorDataset(sequences[:, :-1], sequences[:, 1:])


def _loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """The sum over the sequences of each one's mean next-token cross-entropy."""
    logits = output.logits.flatten(0, 1)  # in the model's precision (fp64 for AdamW's runs)
    return nn.functional.cross_entropy(logits, target.flatten(), reduction="sum") / SEQ


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.02, momentum=0.9)


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def _exact(
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    dtype: torch.dtype = torch.float32,
    **kw: Any,
) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=12, seed=3, profile_steps=1, **kw)
        trainer = Trainer(_gpt(dtype), make_optimizer, _loss, _tokens(), options)
        reports = trainer.train(STEPS, progress=False)
        state = trainer.model_state_dict()
        model = _gpt(dtype)
        reference = one_process(
            model, _tokens(), make_optimizer(model.parameters()), _loss, options, STEPS
        )
        # Relative to the largest parameter value: per tensor, LayerNorm's biases (near 0
        # after a few steps) would turn fp32's rounding into a large ratio.
        diff = max((state[n] - p).abs().max().item() for n, p in reference.named_parameters())
        diff /= max(p.abs().max().item() for p in reference.parameters())
        return {"diff": diff, "reports": [r.to_dict() for r in reports]}

    return scenario


# AdamW divides each gradient by its running magnitude, so on elements whose gradient nearly
# cancels it turns fp32's summation-order rounding into visible differences: it runs in fp64.
SCENARIOS: dict[str, Callable[[int], Any]] = {
    # 30 sequences: the third step is an epoch's partial last batch of 6, the fourth a new one.
    "ddp": _exact(_sgd, shares=(7, 4, 1), micro_batch=3),
    "ddp_share0": _exact(_adamw, torch.float64, shares=(8, 4, 0), micro_batch=3),
    "fsdp": _exact(_sgd, shares=(7, 4, 1), micro_batch=3, sharding="fsdp"),
    "fsdp_share0": _exact(_adamw, torch.float64, shares=(8, 4, 0), micro_batch=3, sharding="fsdp"),
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("gpt"))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_transformer_matches_one_process_training_on_the_global_batches(
    ranks: list[dict[str, Outcome]], name: str
) -> None:
    reports = matching_one_process(ranks, name, 1e-6)[0]["reports"]
    assert [r["global_batch"] for r in reports] == [12, 12, 6, 12, 12]
    micro = [(r["samples"], r["micro_batches"]) for r in reports[0]["ranks"]]
    assert micro == ([(7, 3), (4, 2), (1, 1)] if "share0" not in name else [(8, 3), (4, 2), (0, 0)])


def test_the_example_trains_a_gpt_under_hetero_launch_with_fsdp(tmp_path: Path) -> None:
    report = tmp_path / "steps.jsonl"
    command = [sys.executable, "-m", "hetero", "launch", "--nproc", "3"]
    command += [str(ROOT / "examples" / "train_gpt.py"), "--sharding", "fsdp", "--quiet"]
    command += ["--layers", "2", "--width", "64", "--vocab", "128", "--seq-len", "16"]
    command += ["--steps", "3", "--sample-time", "0.002", "--report", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(
        r"^3 ranks \(gloo, fsdp\), GPT-2 2 layers × 64, vocabulary 128, 0\.\dM parameters, "
        r"sequences of 16; global batch 14, speeds 1 : 0.401 : 0.208; shares after profiling: "
        r"\d+/\d+/\d+$",
        out,
        re.M,
    ), out
    assert re.search(r"^median step [\d.]+ ms, ideal [\d.]+ ms .*: efficiency \d+%$", out, re.M)
    assert re.search(r"^held-out loss: [\d.]+ -> [\d.]+ \(the data's floor", out, re.M)
    assert len(report.read_text().splitlines()) == 3


def test_the_example_explains_itself() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "GPT-style transformer" in done.stdout and "--sharding {ddp,fsdp}" in done.stdout
