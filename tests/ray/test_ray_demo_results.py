"""The Ray demo (examples/ray_cluster.py) counts results per device, not map batches: its
table's column adds up to the items mapped, and a line says how many batches carried them."""

from __future__ import annotations

import re

import pytest

from tests.example_runs import run_example


@pytest.mark.timeout(180)
def test_the_demo_counts_each_devices_results_and_names_the_batches() -> None:
    out = run_example("ray_cluster.py", "--items", "300", "--quick", timeout=170)
    assert re.search(r"^device +results  in the fleet$", out, re.M), out
    rows = re.findall(r"^(\S+/\S+) +(\d+)  (yes|left)$", out, re.M)
    # Every device the fleet had (the one that joined late may have computed none) adds up to
    # the items mapped: results, not batches.
    assert len(rows) >= 5 and sum(int(n) for _, n, _ in rows) == 300
    legend = re.search(
        r"^results: items each device computed \(300 in all\); ctx\.map ran "
        r"them as (\d+) batches \(tasks\)$",
        out,
        re.M,
    )
    assert legend and 1 <= int(legend.group(1)) <= 300
