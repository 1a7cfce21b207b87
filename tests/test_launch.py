"""``hetero launch``: ranks started with torchrun's environment, all restarted when one fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli_apps import hetero_cli

SCRIPT = """
import json, os, sys, time
out = sys.argv[1]
rank, restart = int(os.environ["RANK"]), int(os.environ["HETERO_RESTART"])
fail_until = int(sys.argv[2])  # restarts before which rank 1 fails
if rank == 1 and restart < fail_until:
    sys.exit(3)
if rank != 1 and restart < fail_until:
    time.sleep(30)  # still working when rank 1 dies: the launcher stops it
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HETERO_RESTART")
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({k: os.environ[k] for k in keys} | {"args": sys.argv[3:]}, f)
"""


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero",
            "launch",
            *args[:-1],
            str(script),
            str(tmp_path),
            args[-1],
            "--extra",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_rank_gets_its_environment_and_the_scripts_arguments(tmp_path: Path) -> None:
    done = launch(tmp_path, "--nproc", "3", "0")
    assert done.returncode == 0, done.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [r["RANK"] for r in ranks] == ["0", "1", "2"] == [r["LOCAL_RANK"] for r in ranks]
    assert {r["WORLD_SIZE"] for r in ranks} == {"3"}
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}
    assert len({r["MASTER_PORT"] for r in ranks}) == 1
    assert {r["HETERO_RESTART"] for r in ranks} == {"0"}
    assert ranks[0]["args"] == ["--extra", "x"]


def test_a_failed_rank_restarts_all_of_them(tmp_path: Path) -> None:
    done = launch(tmp_path, "--nproc", "3", "--max-restarts", "3", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("rank 1 exited with status 3; starting all 3 ranks again") == 2
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert {r["HETERO_RESTART"] for r in ranks} == {"2"}  # every rank of the third start


def test_out_of_restarts_is_a_clear_failure(tmp_path: Path) -> None:
    done = launch(tmp_path, "--nproc", "2", "--max-restarts", "1", "5")
    assert done.returncode == 1
    assert "rank 1 failed 2 times; giving up" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("rank*.json"))  # the other rank was stopped, not left running


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text("")
    for args, message in (
        (["--nproc", "0", str(job)], "--nproc must be >= 1, got 0"),
        (["--max-restarts", "-1", str(job)], "--max-restarts must be >= 0, got -1"),
        ([str(tmp_path / "missing.py")], "does not exist or is not a file"),
    ):
        done = hetero_cli("launch", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr


RUNNING = """
import os, sys, time
slot = os.environ["LOCAL_RANK"]
os.write(1, f"{slot} {os.getpid()}\\n".encode())  # one write: the ranks share the pipe
if slot != "2":  # local rank 2 finishes at once; the others run until they are stopped
    time.sleep(60)
"""


def test_ctrl_c_stops_the_ranks_and_says_in_one_line_which(tmp_path: Path) -> None:
    from tests.processes import gone, wait_for

    script = tmp_path / "job.py"
    script.write_text(RUNNING)
    # Its own process group, as a shell gives a command: the terminal's Ctrl-C goes to it all.
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hetero", "launch", "--nproc", "3", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    try:
        assert launcher.stdout is not None
        ranks = dict(launcher.stdout.readline().split() for _ in range(3))
        wait_for(lambda: gone(int(ranks["2"])))  # it has finished
        os.killpg(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    assert err == (
        "hetero launch: interrupted: stopped local ranks 0, 1; local rank 2 had finished\n"
    )
    assert launcher.returncode == 130
    assert all(gone(int(pid)) for pid in ranks.values())
