"""The training report in one process: the new options' checks, step reports read back from
their JSON lines, the HTML picture of a long run, and the example writing it from a fleet
config's ranks with the equal split and clipping."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hetero.errors import ConfigError
from hetero.train import RankReport, StepReport, TrainerOptions, write_training_report
from hetero.train.report_html import MAX_BARS, MAX_TABLE_ROWS

ROOT = Path(__file__).resolve().parents[2]


def test_the_split_and_clipping_options_name_their_bad_values() -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=6, split="fast", max_grad_norm=0.0)  # type: ignore[arg-type]
    assert str(info.value) == (
        "2 problems:\n"
        "  - split: must be one of speed, equal (speed: shares in proportion to the ranks' "
        "measured speeds; equal: the same share each, as plain DDP), got 'fast'\n"
        "  - max_grad_norm: must be a finite number > 0 (the largest L2 norm of the global "
        "batch's gradient) or None for no clipping, got 0.0"
    )
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=6, split="equal", shares=(3, 3))
    assert str(info.value) == (
        "shares: must be None with split='equal' (which gives every rank the same share), "
        "got (3, 3)"
    )
    with pytest.raises(ConfigError, match=r"max_grad_norm: .* got inf"):
        TrainerOptions(global_batch=6, max_grad_norm=float("inf"))


def _run(steps: int) -> list[StepReport]:
    """``steps`` made-up steps of 2 ranks: rank 1 idles 10 ms, the loss falls as 1/step."""
    return [
        StepReport(
            step,
            0,
            (6, 2),
            (20.0, 10.0),
            (
                RankReport(0, 6, 2, 0.30, 0.0, 0.01, 0.33, 0.02),
                RankReport(1, 2, 1, 0.20, 0.01, 0.01, 0.33, 0.0),
            ),
            rebalanced=step == 3,
            next_shares=(5, 3) if step == 3 else (),
            loss=1.0 / step,
            grad_norm=2.0,
            lr=0.1 if step < 10 else 0.01,
        )
        for step in range(1, steps + 1)
    ]


def test_a_step_report_reads_back_from_its_json_line_and_sums_up_its_loss() -> None:
    report = _run(3)[2]
    line = json.loads(json.dumps(report.to_dict()))
    assert StepReport.from_dict(line) == report
    assert "shares 6/2, loss 0.3333, compute/data/comm/idle ms r0 300/20/10/0" in report.summary()


def test_a_long_run_is_drawn_with_each_rank_every_loss_and_a_sample_of_its_steps(
    tmp_path: Path,
) -> None:
    reports = _run(1000)
    path = write_training_report(
        reports, tmp_path / "deep" / "run.html", title="MLP <run>", labels=["A100", "T4"]
    )
    page = path.read_text()
    assert "<title>MLP &lt;run&gt;</title>" in page  # escaped
    assert page.count("data:image/png;base64,") == 2  # the time bars, the loss (with lr, norm)
    assert "<td>A100</td>" in page and "<td>T4</td>" in page
    assert "<td>1–1000</td><td>2</td><td>6/2</td>" in page  # steps, ranks, last shares
    steps_table = page.split("<h2>Steps</h2>")[1].split("</table>")[0]
    assert steps_table.count("<tr>") == 1 + MAX_TABLE_ROWS  # the header, then a sample
    assert "<tr><td>1</td>" in steps_table and "<tr><td>1000</td>" in steps_table
    listed = re.search(r"<pre>(.*?)</pre>", page, re.S)
    assert listed is not None
    assert listed.group(1).splitlines() == [f"{r.step} {1 / r.step:.6g}" for r in reports]
    assert MAX_BARS < 1000  # the bars were binned


def test_a_report_needs_steps_and_one_label_a_rank(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^reports: must hold at least one step report"):
        write_training_report([], tmp_path / "run.html")
    with pytest.raises(ConfigError) as info:
        write_training_report(_run(2), tmp_path / "run.html", labels=["A100"])
    assert str(info.value) == "labels: must name each of the 2 ranks once, got ['A100']"


def test_the_example_takes_its_ranks_from_the_fleet_and_draws_the_equal_split(
    tmp_path: Path,
) -> None:
    html = tmp_path / "run.html"
    command = [sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--steps", "3"]
    command += ["--sample-time", "0.001", "--split", "equal", "--max-grad-norm", "0.5"]
    command += ["--quiet", "--html", str(html)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # examples/train_fleet.yaml: an A100, a V100 and a T4, relative to the A100.
    assert "3 ranks (gloo), global batch 63, speeds 1 : 0.401 : 0.208; equal split: 21/21/21" in (
        out
    )
    assert re.search(
        r"^loss over each global batch: [\d.]+ at step 1 -> [\d.]+ at step 3$", out, re.M
    )
    page = html.read_text()
    for label in ("rank 0: A100-80GB (speed 1)", "rank 1: V100-32GB", "rank 2: T4 (speed 0.208)"):
        assert label in page
    listed = re.search(r"<pre>(.*?)</pre>", page, re.S)
    assert listed is not None and len(listed.group(1).splitlines()) == 3  # a loss each step


def test_the_example_refuses_a_fleet_too_small_for_its_ranks(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("devices:\n  - {type: gpu, model: T4, emulate: true}\n")
    command = [sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--fleet", str(fleet)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert (
        f"error: --fleet {fleet} lists 1 device for 3 ranks: list one a rank, or start fewer "
        "(--nproc)"
    ) in done.stderr
