"""Redundant checkpoints (``checkpoint_mirrors``): each checkpoint is written to further
directories too, each copy atomic and carrying the sha256 of its content. A copy deleted, cut
short or with a flipped byte is found (never loaded: the checksum is checked first) and the run
resumes from a copy that verifies, the newest; when none does the error names every copy and
what is wrong with each. A mirror that cannot be written leaves training going on, and says so;
when no copy can be written, the error is raised as with one directory. And a Trainer on 2 gloo
ranks resumes exactly from the mirror once its primary directory is gone.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from hetero.errors import ConfigError
from hetero.train import Trainer, TrainerOptions
from hetero.train.checkpoint import read_checkpoint, read_newest_checkpoint, write_checkpoint
from tests.train._models import LOSS, data, mlp, sgd, trained_in_one_process
from tests.train._ranks import Outcome, each, run_ranks

CPU = torch.device("cpu")
NAME = "checkpoint.pt"


def _state(steps: int) -> dict[str, Any]:
    """A training state whose weight (40 kB of its 41 kB file) holds ``steps``."""
    return {
        "steps": steps,
        "model": {"weight": torch.full((10_000,), float(steps))},
        "optimizer": {"state": {}, "param_groups": []},
        "sampler": {"epoch": 0, "position": steps},
    }


def _read(primary: Path, mirror: Path) -> tuple[Path, dict[str, Any]]:
    found = read_newest_checkpoint(primary / NAME, CPU, {"weight"}, [mirror])
    assert found is not None
    return found


def _flip_a_byte(path: Path) -> None:
    """One bit of a byte in the middle of the file, in the weight's values."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files torch.load opens, by name, from here on."""
    opened: list[str] = []
    load = torch.load

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(getattr(file, "name", file)))
        return load(file, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    return opened


# ------------------------------------------------------------------------ writing and reading


def test_each_copy_is_whole_and_loads_as_a_plain_torch_file(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "a", tmp_path / "b"
    copies = write_checkpoint(primary / NAME, _state(3), mirrors=[mirror])
    assert copies.steps == 3
    assert copies.written == (primary / NAME, mirror / NAME)
    assert copies.failed == ()
    assert (primary / NAME).read_bytes() == (mirror / NAME).read_bytes()
    assert sorted(p.name for p in [*primary.iterdir(), *mirror.iterdir()]) == [NAME, NAME]
    for folder in (primary, mirror):
        assert torch.load(folder / NAME, weights_only=True)["steps"] == 3  # torch reads it as is
        assert read_checkpoint(folder / NAME, CPU, {"weight"})["steps"] == 3


def test_a_deleted_primary_falls_back_to_the_mirror_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primary, mirror = tmp_path / "a", tmp_path / "b"
    write_checkpoint(primary / NAME, _state(3), mirrors=[mirror])
    (primary / NAME).unlink()
    with caplog.at_level(logging.WARNING, logger="hetero.train"):
        where, state = _read(primary, mirror)
    assert where == mirror / NAME
    assert torch.equal(state["model"]["weight"], _state(3)["model"]["weight"])
    assert caplog.messages == [
        f"checkpoint copy {primary / NAME} passed over: there is no such file; resuming from "
        f"{mirror / NAME} (step 3)"
    ]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            lambda path: path.write_bytes(path.read_bytes()[:-1000]),
            "the file is cut short or damaged: its ",  # N bytes end neither with a checksum ...
        ),
        (_flip_a_byte, "its content does not match the sha256 written with it (sha256 "),
    ],
    ids=["cut short", "a flipped bit"],
)
def test_a_damaged_primary_is_found_by_its_checksum_never_loaded_and_the_mirror_used(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    loads: list[str],
    damage: Callable[[Path], None],
    why: str,
) -> None:
    primary, mirror = tmp_path / "a", tmp_path / "b"
    write_checkpoint(primary / NAME, _state(3), mirrors=[mirror])
    damage(primary / NAME)
    with caplog.at_level(logging.WARNING, logger="hetero.train"):
        where, state = _read(primary, mirror)
    assert where == mirror / NAME
    assert torch.equal(state["model"]["weight"], _state(3)["model"]["weight"])
    assert loads == [str(mirror / NAME)]  # the damaged copy was never loaded
    (message,) = caplog.messages
    assert message.startswith(f"checkpoint copy {primary / NAME} passed over: {why}")
    assert message.endswith(f"resuming from {mirror / NAME} (step 3)")


def test_a_flipped_bit_torch_would_load_silently_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / NAME, _state(3))
    _flip_a_byte(tmp_path / NAME)
    silently = torch.load(tmp_path / NAME, weights_only=True)["model"]["weight"]
    assert not torch.equal(silently, _state(3)["model"]["weight"])  # wrong values, no error
    with pytest.raises(ValueError, match=r"^its content does not match the sha256 written"):
        read_checkpoint(tmp_path / NAME, CPU, {"weight"})


def test_when_no_copy_verifies_the_error_names_each_and_what_is_wrong(tmp_path: Path) -> None:
    primary, mirror, gone = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_checkpoint(primary / NAME, _state(3), mirrors=[mirror])
    _flip_a_byte(primary / NAME)
    (mirror / NAME).write_bytes((mirror / NAME).read_bytes()[:-1000])
    with pytest.raises(ValueError) as info:
        read_newest_checkpoint(primary / NAME, CPU, {"weight"}, [mirror, gone])
    message = str(info.value)
    assert message.startswith(
        f"any copy: {primary / NAME}: its content does not match the sha256 written with it"
    )
    assert f"; {mirror / NAME}: the file is cut short or damaged: its " in message
    assert message.endswith(f"; {gone / NAME}: there is no such file")


def test_no_copy_anywhere_is_a_fresh_start(tmp_path: Path) -> None:
    assert read_newest_checkpoint(tmp_path / "a" / NAME, CPU, set(), [tmp_path / "b"]) is None


def test_the_newest_step_that_verifies_wins_wherever_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primary, mirror = tmp_path / "a", tmp_path / "b"
    write_checkpoint(primary / NAME, _state(2), mirrors=[mirror])
    write_checkpoint(mirror / NAME, _state(4))  # the primary's write of step 4 failed
    with caplog.at_level(logging.WARNING, logger="hetero.train"):
        where, state = _read(primary, mirror)
    assert (where, state["steps"]) == (mirror / NAME, 4)
    assert caplog.messages == [
        f"checkpoint copy {primary / NAME} passed over: it holds step 2, older; resuming from "
        f"{mirror / NAME} (step 4)"
    ]
    _flip_a_byte(mirror / NAME)  # the newest copy damaged: the older one that verifies
    assert _read(primary, mirror)[1]["steps"] == 2


def test_a_checkpoint_without_a_checksum_still_loads(tmp_path: Path) -> None:
    torch.save(_state(3), tmp_path / NAME)  # as torch.save writes it, or hetero before checksums
    assert read_checkpoint(tmp_path / NAME, CPU, {"weight"})["steps"] == 3


def test_the_latest_checkpoints_are_kept_in_every_copy(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "a", tmp_path / "b"
    for steps in (1, 2, 3):
        write_checkpoint(primary / NAME, _state(steps), keep=2, mirrors=[mirror])
    for folder in (primary, mirror):
        assert sorted(p.name for p in folder.iterdir()) == [
            "checkpoint-000000002.pt",
            "checkpoint-000000003.pt",
            NAME,
        ]
        assert read_checkpoint(folder / "checkpoint-000000002.pt", CPU, set())["steps"] == 2


# ------------------------------------------------------------------------ copies that fail


def test_a_mirror_that_cannot_be_written_is_logged_and_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"  # a file where the mirror's directory should be
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="hetero.train"):
        copies = write_checkpoint(tmp_path / "a" / NAME, _state(3), mirrors=[blocked])
    assert copies.written == (tmp_path / "a" / NAME,)
    ((where, why),) = copies.failed
    assert where == blocked / NAME and why.startswith("FileExistsError: ")
    assert caplog.messages == [
        f"the checkpoint of step 3 was not written to {blocked / NAME} ({why}); it is in "
        f"{tmp_path / 'a' / NAME}"
    ]


def test_a_primary_that_cannot_be_written_leaves_the_mirror(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    copies = write_checkpoint(blocked / NAME, _state(3), mirrors=[tmp_path / "b"])
    assert copies.written == (tmp_path / "b" / NAME,)
    assert [where for where, _ in copies.failed] == [blocked / NAME]
    assert read_checkpoint(tmp_path / "b" / NAME, CPU, set())["steps"] == 3


def test_when_no_copy_can_be_written_the_primary_error_is_raised(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "a", tmp_path / "b"  # files where the directories should be
    primary.write_text("")
    mirror.write_text("")
    with pytest.raises(FileExistsError) as info:
        write_checkpoint(primary / NAME, _state(3), mirrors=[mirror])
    assert info.value.filename == str(primary)
    assert info.value.__notes__ == [
        f"the mirror {mirror / NAME} could not be written either: "
        f"FileExistsError: [Errno 17] File exists: '{mirror}'"
    ]


def test_a_trainer_goes_on_when_a_mirror_fails_and_says_which_copies_were_written(
    group: None, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    options = TrainerOptions(
        global_batch=8,
        profile_steps=1,
        checkpoint_dir=str(tmp_path / "a"),
        checkpoint_every=1,
        checkpoint_async=True,
        checkpoint_mirrors=[str(blocked)],
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    trainer.train(2, progress=False)
    copies = trainer.wait_for_checkpoint()
    assert copies is not None
    assert (copies.steps, copies.written) == (2, (tmp_path / "a" / NAME,))
    assert [where for where, _ in copies.failed] == [blocked / NAME]


# ------------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("mirrors", "folder", "message"),
    [
        (
            ["ckpt/"],
            "ckpt",
            "checkpoint_mirrors[0]: 'ckpt/' is the same directory as checkpoint_dir: each copy "
            "needs a directory of its own (best on another disk)",
        ),
        (
            ["m", "./m"],
            "ckpt",
            "checkpoint_mirrors[1]: './m' is the same directory as checkpoint_mirrors[0]: each "
            "copy needs a directory of its own (best on another disk)",
        ),
        (
            ["m"],
            None,
            "checkpoint_mirrors[0]: 'm' mirrors the checkpoints written to checkpoint_dir, which "
            "is None: set checkpoint_dir too (the first copy), or no mirrors",
        ),
        (
            ["m", 42],
            "ckpt",
            "checkpoint_mirrors[1]: must be a directory (a non-empty string), got 42",
        ),
        ([""], "ckpt", "checkpoint_mirrors[0]: must be a directory (a non-empty string), got ''"),
        (
            "m",
            "ckpt",
            "checkpoint_mirrors: must be a list of directories each checkpoint is also written "
            "to (strings), got 'm'",
        ),
    ],
    ids=["checkpoint_dir", "repeated", "no checkpoint_dir", "not a string", "empty", "a string"],
)
def test_mirrors_name_the_bad_entry_and_what_is_allowed(
    mirrors: Any, folder: str | None, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=8, checkpoint_dir=folder, checkpoint_mirrors=mirrors)
    assert str(info.value) == message


def test_mirrors_given_as_a_list_are_kept_as_a_tuple() -> None:
    options = TrainerOptions(global_batch=8, checkpoint_dir="a", checkpoint_mirrors=["b", "c"])
    assert options.checkpoint_mirrors == ("b", "c")
    assert TrainerOptions(global_batch=8).checkpoint_mirrors == ()


# ------------------------------------------------------------------------ 2 ranks resume


def _resume_from_the_mirror(rank: int) -> dict[str, Any]:
    """Train 4 steps with a mirror, remove the primary directory, resume on a new Trainer: its
    parameters, and 2 more steps against one process training 6."""
    from hetero import comm

    primary, mirror = Path(_OUT, "primary"), Path(_OUT, "mirror")
    options = TrainerOptions(
        global_batch=12,
        profile_steps=1,
        checkpoint_dir=str(primary),
        checkpoint_every=2,
        checkpoint_async=True,
        checkpoint_mirrors=[str(mirror)],
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    trainer.train(4, progress=False)  # the last checkpoint: step 4
    copies = trainer.wait_for_checkpoint()
    at_step_4 = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.close()
    if rank == 0:
        shutil.rmtree(primary)
    comm.barrier()  # no rank reads before the primary is gone
    resumed = Trainer(mlp(), sgd, LOSS, data(), options)
    equal = all(
        torch.equal(p, q) for p, q in zip(resumed.model.parameters(), at_step_4, strict=True)
    )
    resumed.train(2, progress=False)
    comm.barrier()  # rank 0 has written the checkpoint of step 6
    reference = trained_in_one_process(mlp(), sgd, options, 6)
    diff = max(
        (p - q).abs().max().item()
        for p, q in zip(resumed.model.parameters(), reference.parameters(), strict=True)
    )
    return {
        "written": None if copies is None else [str(p) for p in copies.written],
        "resumed_from": resumed.resumed_from,
        "equal": equal,
        "diff": diff,
        "primary_again": (primary / NAME).exists(),
    }


SCENARIOS: dict[str, Callable[[int], Any]] = {"resume_from_the_mirror": _resume_from_the_mirror}
_OUT = ""  # set in each rank by run_ranks: where scenarios write files


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Outcome]]]:
    out = tmp_path_factory.mktemp("mirrors")
    return out, run_ranks(__name__, 2, out)


@pytest.mark.slow
def test_two_ranks_resume_exactly_from_the_mirror_once_the_primary_is_gone(
    ranks: tuple[Path, list[dict[str, Outcome]]],
) -> None:
    out, recorded = ranks
    first, second = each(recorded, "resume_from_the_mirror")
    assert first["written"] == [str(out / "primary" / NAME), str(out / "mirror" / NAME)]
    assert second["written"] is None  # rank 1 writes no checkpoint
    for result in (first, second):
        assert result["resumed_from"] == 4
        assert result["equal"]  # the parameters of step 4, exactly
        assert result["diff"] <= 1e-6  # and the optimizer's state: 2 more steps as one process
        assert result["primary_again"]  # the next checkpoint wrote the primary copy again
