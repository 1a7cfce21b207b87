"""``hetero devices --ray`` joins a running cluster and never starts one unasked: without
``--address`` and with no cluster running it says so and how to start one; ``--ray-start``
starts a throwaway local instance. Ray is faked here by its interface (``ray.init`` refusing
"auto" as Ray does when no cluster runs), so no cluster a neighbouring test runs is joined."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.commands.devices import NO_CLUSTER
from tests.ray_fake import FakeRay, install_fake_ray
from tests.rendering import flat

runner = CliRunner()


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    return install_fake_ray(monkeypatch)


def test_without_an_address_and_no_cluster_it_says_so_and_starts_none(fake_ray: FakeRay) -> None:
    result = runner.invoke(app, ["devices", "--ray"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    message = flat(result.stderr)
    assert NO_CLUSTER in message and "ray start --head" in message and "--ray-start" in message
    assert fake_ray.inits == ["auto"]  # asked for a running cluster only: "local" never


def test_ray_start_asks_for_a_local_instance(fake_ray: FakeRay) -> None:
    result = runner.invoke(app, ["devices", "--ray", "--ray-start"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and fake_ray.inits == ["local"]
    assert "nothing at local" in flat(result.stderr)


def test_ray_address_from_the_environment_is_used(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nobody listens on the discard port
    result = runner.invoke(app, ["devices", "--ray"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "cannot reach the Ray cluster at 127.0.0.1:9" in flat(
        result.stderr
    )
    assert NO_CLUSTER not in flat(result.stderr) and fake_ray.inits == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray-start"], "--ray-start applies to --ray only"),
        (["--address", "auto"], "--address applies to --ray only"),
        (
            ["--ray", "--ray-start", "--address", "h:1"],
            "--address joins a running cluster and --ray-start starts one",
        ),
    ],
)
def test_flags_that_do_not_go_together_are_refused(
    fake_ray: FakeRay, args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["devices", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and message in flat(result.stderr)
    assert fake_ray.inits == []
