"""What a Trainer refuses: a checkpoint that would run code when loaded, holds non-finite
weights or lacks part of the training state, and options whose emulated durations overflow.
One rank in this process (a process group of one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from hetero.errors import ConfigError  # noqa: E402
from hetero.train import Trainer, TrainerOptions  # noqa: E402

LOSS = nn.CrossEntropyLoss(reduction="sum")


def trainer(folder: Path, **options: Any) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(24, 4, generator=generator), torch.randint(0, 3, (24,)))
    opts = TrainerOptions(global_batch=8, checkpoint_dir=str(folder), checkpoint_every=1, **options)
    return Trainer(model, lambda p: torch.optim.Adam(p, lr=0.01), LOSS, data, opts)


def saved(folder: Path) -> dict[str, Any]:
    """The checkpoint in ``folder`` after two steps."""
    trainer(folder).train(2, progress=False)
    state: dict[str, Any] = torch.load(folder / "checkpoint.pt", weights_only=True)
    return state


def resume_error(folder: Path) -> str:
    with pytest.raises(ConfigError) as info:
        trainer(folder)
    ((field, message),) = info.value.problems
    assert field == "checkpoint_dir"
    assert message.startswith(f"cannot resume from {folder / 'checkpoint.pt'}: ")
    return message.split(": ", 1)[1]


class _RunsCode:
    """Unpickled, it writes ``path``: what a checkpoint from someone else could do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def test_a_checkpoint_resumes_with_its_steps_and_weights(group: None, tmp_path: Path) -> None:
    state = saved(tmp_path)
    resumed = trainer(tmp_path)
    assert resumed.resumed_from == resumed.steps == state["steps"] == 2
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, state["model"][name])


def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_never_runs(
    group: None, tmp_path: Path
) -> None:
    state = saved(tmp_path)
    state["sampler"]["note"] = _RunsCode(tmp_path / "ran")
    torch.save(state, tmp_path / "checkpoint.pt")
    message = resume_error(tmp_path)
    assert not (tmp_path / "ran").exists()
    assert message.startswith(
        "it holds an object other than tensors and plain values, which hetero does not load "
        "(loading it could run any code): "
    )
    assert "posix.mkdir" in message


@pytest.mark.parametrize(
    ("tensor", "bad", "found"),
    [
        ("model", "0.weight", "2 NaN"),
        ("model", "2.bias", "1 infinite"),
        ("optimizer", "0", "2 NaN"),
    ],
)
def test_a_checkpoint_with_non_finite_weights_is_refused_naming_the_tensor(
    group: None, tmp_path: Path, tensor: str, bad: str, found: str
) -> None:
    state = saved(tmp_path)
    if tensor == "model":
        values = state["model"][bad]
        where = f"model {bad}"
    else:
        values = state["optimizer"]["state"][int(bad)]["exp_avg"]
        where = f"optimizer state.{bad}.exp_avg"
    values.view(-1)[:2] = float("nan") if "NaN" in found else torch.tensor([float("inf"), 0.0])
    torch.save(state, tmp_path / "checkpoint.pt")
    assert resume_error(tmp_path) == (
        f"{where} holds {found} of {values.numel()} values; a run resumed from it would "
        "train on nothing but NaN"
    )


def test_a_checkpoint_missing_a_key_names_it_and_what_it_holds(group: None, tmp_path: Path) -> None:
    state = saved(tmp_path)
    del state["steps"]
    torch.save(state, tmp_path / "checkpoint.pt")
    assert resume_error(tmp_path) == (
        "it has no 'steps'; it holds: model, optimizer, sampler, scaler, scheduler"
    )


def test_a_checkpoint_of_another_model_names_the_parameters_that_differ(
    group: None, tmp_path: Path
) -> None:
    state = saved(tmp_path)
    state["model"]["2.weight"] = torch.zeros(5, 8)  # a head of 5 classes, not 3
    torch.save(state, tmp_path / "checkpoint.pt")
    message = resume_error(tmp_path)
    assert "size mismatch for 2.weight" in message and "torch.Size([5, 8])" in message


def test_a_checkpoint_that_is_not_a_training_state_is_named(group: None, tmp_path: Path) -> None:
    torch.save([1, 2, 3], tmp_path / "checkpoint.pt")
    assert resume_error(tmp_path) == (
        "it holds a list, not a training state (a mapping of steps, model, optimizer, sampler)"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speed": 1e-300}, "speed: must be a number from 1e-06 to 1e+06 or None, got 1e-300"),
        ({"speed": 1e300}, "speed: must be a number from 1e-06 to 1e+06 or None, got 1e+300"),
        (
            {"emulate_sample_time": 1e300},
            "emulate_sample_time: must be a number of seconds > 0 and at most 3600 or None, "
            "got 1e+300",
        ),
    ],
)
def test_options_whose_emulated_durations_overflow_are_refused(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=8, **options)
    assert str(info.value) == message
