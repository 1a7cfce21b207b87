"""``hetero launch --nproc MIN:MAX`` with plain scripts: a rank that keeps failing is left out and
the others start again at the smaller size, each keeping its local rank; below MIN the launch
fails; a bad --nproc is a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_apps import hetero_cli

SCRIPT = """
import json, os, sys, time
out, finish = sys.argv[1], int(sys.argv[3])
# Local ranks that fail, each from the start after "@" on (else from the first).
failing = dict(f"{s}@0".split("@")[:2] for s in sys.argv[2].split(",") if s)
slot, restart = int(os.environ["LOCAL_RANK"]), int(os.environ["HETERO_RESTART"])
if restart >= int(failing.get(str(slot), 1 << 30)):
    sys.exit(3)
if restart < finish:
    time.sleep(30)  # still working when a rank dies: the launcher stops it
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "HETERO_RESTART",
        "HETERO_REGROUP_FILE")
with open(f"{out}/slot{slot}.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""


def launch(
    tmp_path: Path, failing: str, finish: int, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT: the ``failing`` local ranks fail, the others finish at start ``finish``."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    job = [str(script), str(tmp_path), failing, str(finish)]
    return subprocess.run(
        [sys.executable, "-m", "hetero", "launch", *args, *job],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_lost_rank_leaves_the_others_at_the_smaller_size_keeping_their_local_ranks(
    tmp_path: Path,
) -> None:
    done = launch(tmp_path, "1", 2, "--nproc", "2:3", "--max-restarts", "1")
    assert done.returncode == 0, done.stderr
    assert (
        "local rank 1 exited with status 3; starting all 3 ranks again (0 restarts left)"
        in done.stderr
    )
    assert (
        "local rank 1 exited with status 3; it is lost: it failed 2 times, more than "
        "--rank-restarts 1; going on with 2 ranks (local ranks 0, 2)" in done.stderr
    )
    ranks = {s: json.loads((tmp_path / f"slot{s}.json").read_text()) for s in (0, 2)}
    assert [ranks[s]["RANK"] for s in (0, 2)] == ["0", "1"]
    assert [ranks[s]["LOCAL_RANK"] for s in (0, 2)] == ["0", "2"]
    assert {r["WORLD_SIZE"] for r in ranks.values()} == {"2"}
    assert {r["LOCAL_WORLD_SIZE"] for r in ranks.values()} == {"2"}
    assert {r["HETERO_RESTART"] for r in ranks.values()} == {"2"}
    assert all(r["HETERO_REGROUP_FILE"] for r in ranks.values())
    assert not (tmp_path / "slot1.json").exists()


def test_below_min_the_launch_fails_naming_the_rank_and_the_minimum(tmp_path: Path) -> None:
    done = launch(tmp_path, "1,2@1", 99, "--nproc", "2:3", "--rank-restarts", "0")
    assert done.returncode == 1
    assert "local rank 1 exited with status 3; it is lost: it failed once" in done.stderr
    assert (
        "local rank 2 failed once; giving up: it failed once, more than --rank-restarts 0, and "
        "without it 1 rank would be left, fewer than the 2 --nproc 2:3 needs" in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("slot*.json"))  # the other rank was stopped, not left running


def test_a_fixed_size_asks_no_rank_to_regroup(tmp_path: Path) -> None:
    done = launch(tmp_path, "", 0, "--nproc", "2")
    assert done.returncode == 0, done.stderr
    ranks = [json.loads((tmp_path / f"slot{s}.json").read_text()) for s in (0, 1)]
    assert [r["HETERO_REGROUP_FILE"] for r in ranks] == [None, None]


RAISING = """
import json, os, sys, time
slot, error_file = int(os.environ["LOCAL_RANK"]), os.environ["TORCHELASTIC_ERROR_FILE"]
if slot == 0:  # raises, and torch's @record writes the error where the launcher said
    with open(error_file, "w") as f:
        json.dump({"message": {"message": "ValueError: bad config", "extraInfo": {}}}, f)
    time.sleep(3)  # its teardown outlasts the peer its failure brings down
else:  # the peer, which fails once rank 0 has failed, and ends first
    while not os.path.exists(error_file.replace("-1.json", "-0.json")):
        time.sleep(0.01)
sys.exit(1)
"""


def launch_two(tmp_path: Path, job: str, restarts: int) -> subprocess.CompletedProcess[str]:
    """``hetero launch --nproc 2`` of the script ``job``, bounded in time."""
    (tmp_path / "job.py").write_text(job)
    return subprocess.run(
        [
            *(sys.executable, "-m", "hetero", "launch", "--nproc", "2"),
            *("--max-restarts", str(restarts), str(tmp_path / "job.py")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_rank_that_failed_first_is_charged_and_the_same_error_twice_stops_it(
    tmp_path: Path,
) -> None:
    done = launch_two(tmp_path, RAISING, restarts=3)
    assert done.returncode == 1
    assert (
        "local rank 0 raised ValueError: bad config; starting all 2 ranks again (2 restarts left)"
        in done.stderr
    )
    assert (
        "local rank 0 failed 2 times; giving up: it raised the same error as at its previous "
        "failure, and without it 1 rank would be left, fewer than the 2 --nproc 2 needs"
    ) in done.stderr
    assert "Traceback" not in done.stderr


DYING = """
import json, os, signal, sys, time
slot, error_file = int(os.environ["LOCAL_RANK"]), os.environ["TORCHELASTIC_ERROR_FILE"]
if slot == 1:  # dies without raising: no error file
    time.sleep(0.5)
    os._exit(1)
# The peer: its collective fails once rank 1 is gone, and it records that error as it ends
# (here when the launcher stops it, so that its error file is written after rank 1's end).
def fail(*_):
    with open(error_file, "w") as f:
        json.dump({"message": {"message": "RuntimeError: connection closed by peer"}}, f)
    os._exit(1)
signal.signal(signal.SIGTERM, fail)
while True:
    time.sleep(0.05)
"""


def test_a_rank_that_died_without_raising_is_charged_not_the_peer_its_end_brought_down(
    tmp_path: Path,
) -> None:
    done = launch_two(tmp_path, DYING, restarts=1)
    assert done.returncode == 1
    assert "local rank 1 exited with status 1; starting all 2 ranks again" in done.stderr
    assert "connection closed by peer" not in done.stderr.split("\n")[0]


LATE_SEEN = """
import json, os, sys, time
slot, error_file = int(os.environ["LOCAL_RANK"]), os.environ["TORCHELASTIC_ERROR_FILE"]
if slot == 1:  # dies without raising, its end seen only once the peer's error is written
    while not os.path.exists(error_file.replace("-1.json", "-0.json")):
        time.sleep(0.01)
    os._exit(1)
# The peer's collective fails as rank 1's connections close, and it records that at once.
with open(error_file, "w") as f:
    message = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    json.dump({"message": {"message": message}}, f)
time.sleep(2)
sys.exit(1)
"""


def test_a_lost_connection_written_before_a_silent_rank_is_seen_to_end_is_not_charged(
    tmp_path: Path,
) -> None:
    """On a loaded machine the launcher may see a rank's end after its peers have written the
    errors that end caused: a lost connection is an effect, and the rank that ended by itself
    without a word is charged."""
    done = launch_two(tmp_path, LATE_SEEN, restarts=1)
    assert done.returncode == 1
    assert "local rank 1 exited with status 1; starting all 2 ranks again" in done.stderr
    assert "Connection reset by peer" not in done.stderr.split("\n")[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "3:2"], "--nproc '3:2': MIN must be <= MAX, got MIN 3 above MAX 2"),
        (["--nproc", "0:2"], "--nproc '0:2': MIN must be >= 1 (a run needs a rank), got 0"),
        (
            ["--nproc", "a:b"],
            "--nproc must be a number of ranks N or a range MIN:MAX of whole numbers, got 'a:b'",
        ),
        (["--rank-restarts", "-1"], "--rank-restarts must be >= 0, got -1"),
        (["--rejoin-after", "-5"], "--rejoin-after must be a number of seconds >= 0, got -5.0"),
        (["--rejoin-after", "nan"], "--rejoin-after must be a number of seconds >= 0, got nan"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path: Path, args: list[str], message: str) -> None:
    job = tmp_path / "job.py"
    job.write_text("")
    done = hetero_cli("launch", *args, str(job))
    assert done.returncode == 2, (args, done.stderr)
    assert message in done.stderr and "Traceback" not in done.stderr
