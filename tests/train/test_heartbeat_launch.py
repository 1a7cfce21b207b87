"""``hetero launch --heartbeat-timeout`` with real ranks: a rank that hangs (a busy loop, a
``signal.pause()``, SIGSTOP) while its peers wait in a collective is found by its heartbeat long
before the collective's 300 s timeout, killed, blamed, and recovered from as a failed rank is
(restart, or loss under ``--nproc MIN:MAX``); a script runs under the heartbeat as it runs
without it; a bad --heartbeat-timeout is a clear error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.commands.launch import register
from tests.cli_apps import command_app, hetero_cli
from tests.processes import gone

pytest.importorskip("torch")

APP = command_app(register)

# Rank 1 hangs (how: argv[2]) before step 3 on its first argv[3] starts; the collective's
# timeout (300 s) is far beyond the launcher's heartbeat timeout (10 s: a rank of a machine
# under load may go seconds without the CPU, and that is no hang).
SCRIPT = """
import os, signal, sys
import torch
from hetero import comm

out, how, hang_starts = sys.argv[1], sys.argv[2], int(sys.argv[3])
slot, start = int(os.environ["LOCAL_RANK"]), int(os.environ["HETERO_RESTART"])
with open(f"{out}/pid-{start}-{slot}", "w") as f:
    f.write(str(os.getpid()))
comm.init(backend="gloo", timeout=300)
x = torch.ones(4)
for step in range(6):
    if slot == 1 and step == 3 and start < hang_starts:
        if how == "busy":
            while True:
                pass
        elif how == "pause":
            signal.pause()
        else:
            os.kill(os.getpid(), signal.SIGSTOP)
    comm.all_reduce(x)
comm.destroy()
with open(f"{out}/done-{start}-{slot}", "w") as f:
    f.write(str(float(x[0])))
"""


def launch(
    tmp_path: Path, how: str, hang_starts: int, *args: str
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [
            *(sys.executable, "-m", "hetero", "launch", "--heartbeat-timeout", "10", *args),
            *(str(script), str(tmp_path), how, str(hang_starts)),
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )


def pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text()) for p in tmp_path.glob("pid-*")]


def test_a_rank_busy_in_a_loop_is_found_killed_and_the_ranks_start_again(tmp_path: Path) -> None:
    done = launch(tmp_path, "busy", 1, "--nproc", "2", "--max-restarts", "1")
    assert done.returncode == 0, done.stderr
    # Where it hangs: the loop's two lines.
    where = re.escape(f"{tmp_path / 'job.py'}:") + r"1[56] \(<module>\)"
    assert re.search(
        rf"local rank 1 hung: made no progress for [\d.]+ s outside any collective, at "
        rf"{where}, while local rank 0 waited [\d.]+ s in one",
        done.stderr,
    ), done.stderr
    assert "in one; starting all 2 ranks again (0 restarts left)" in done.stderr
    # The second start ran to the end on both ranks: 6 all-reduces of ones over 2 ranks.
    assert [(tmp_path / f"done-1-{s}").read_text() for s in (0, 1)] == ["64.0", "64.0"]
    assert not list(tmp_path.glob("done-0-*"))
    assert all(gone(pid) for pid in pids(tmp_path))


@pytest.mark.slow
def test_a_stopped_rank_is_found_by_its_silence_and_blamed_not_its_peers(tmp_path: Path) -> None:
    done = launch(tmp_path, "stop", 9, "--nproc", "3", "--max-restarts", "0")
    assert done.returncode == 1
    assert "local rank 1 hung: sent no heartbeat for " in done.stderr
    assert "local rank 1 failed once; giving up: no restarts left" in done.stderr
    assert "local rank 0" not in done.stderr and "local rank 2" not in done.stderr
    assert "Traceback" not in done.stderr
    assert all(gone(pid) for pid in pids(tmp_path))  # the stopped one was killed too


@pytest.mark.slow
def test_under_min_max_a_hung_rank_is_lost_and_the_others_go_on(tmp_path: Path) -> None:
    done = launch(tmp_path, "pause", 9, "--nproc", "1:2", "--rank-restarts", "0")
    assert done.returncode == 0, done.stderr
    assert "local rank 1 hung: made no progress for " in done.stderr
    assert (
        "it is lost: it failed once, more than --rank-restarts 0; going on with 1 rank "
        "(local rank 0) from the last checkpoint" in done.stderr
    )
    assert (tmp_path / "done-1-0").read_text() == "1.0"  # alone, at the second start


PROBE = """
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
               "spec": __spec__ is None}, f)
raise ValueError("the end")
"""


def test_a_script_runs_under_the_heartbeat_as_it_runs_without(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "probe.py"
    script.write_text(PROBE)
    seen, errors = {}, {}
    for timeout in ("0", "30"):
        out = tmp_path / f"probe-{timeout}.json"
        done = hetero_cli(
            *("launch", "--max-restarts", "0", "--heartbeat-timeout", timeout),
            *(str(script), str(out), "-x"),
        )
        assert done.returncode == 1, done.stderr
        seen[timeout] = json.loads(out.read_text())
        errors[timeout] = done.stderr
    watched = seen["30"]
    assert watched["argv"] == [str(script), str(tmp_path / "probe-30.json"), "-x"]
    assert watched["name"] == "__main__" and watched["file"] == str(script)
    assert watched["path0"] == str(script.parent) == seen["0"]["path0"]
    assert watched["spec"] and seen["0"]["spec"]
    # The same traceback, from the script's first frame, and the same failure.
    assert errors["30"] == errors["0"]
    assert f'File "{script}", line 6, in <module>' in errors["30"]


@pytest.mark.parametrize("value", ["-1", "0.5", "nan", "inf"])
def test_a_bad_heartbeat_timeout_is_a_clear_error(tmp_path: Path, value: str) -> None:
    job = tmp_path / "job.py"
    job.write_text("")
    done = CliRunner().invoke(APP, ["launch", "--heartbeat-timeout", value, str(job)])
    assert done.exit_code == 2, done.output
    assert (
        f"--heartbeat-timeout must be 0 (off) or a number of seconds >= 1, got {float(value)}"
        in done.stderr
    )


def test_a_heartbeat_timeout_that_is_no_number_is_refused_naming_the_option(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text("")
    done = CliRunner().invoke(APP, ["launch", "--heartbeat-timeout", "soon", str(job)])
    assert done.exit_code == 2 and "--heartbeat-timeout" in done.stderr
