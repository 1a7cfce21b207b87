"""Bad input to the Ray backend: clear HeteroErrors, never a hang or a deep traceback."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

import hetero
from hetero.errors import ConfigError, HeteroError
from hetero.runtime.ray_cluster import NODE_CONFIG_ENV, import_ray, local_cluster
from tests.ray.fleets import write_fleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_nobody_answers_is_a_clear_error_at_once() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(HeteroError, match=f"cannot reach the Ray cluster at {address}"):
        hetero.Context(backend="ray", address=address)


def test_an_address_that_is_not_one_names_the_forms_allowed() -> None:
    with pytest.raises(HeteroError, match="not host:port, ray://host:port, 'auto' or 'local'"):
        hetero.Context(backend="ray", address="my-cluster")


def test_an_address_without_the_ray_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match="address"):
        hetero.Context(backend="local", address="127.0.0.1:6379")


def test_an_unknown_backend_names_those_allowed() -> None:
    with pytest.raises(ConfigError, match="allowed: local, ray"):
        hetero.Context(backend="dask")  # type: ignore[arg-type]


def test_without_ray_installed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(HeteroError, match=r"pip install -e '\.\[ray\]' \(in the hetero checkout\)"):
        hetero.Context(backend="ray")


def test_a_ray_too_old_is_named_with_the_version_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = import_ray()
    monkeypatch.setattr(ray, "__version__", "2.5.1")
    with pytest.raises(HeteroError, match=r"needs ray>=2\.9, found ray 2\.5\.1"):
        hetero.Context(backend="ray")


def test_a_node_whose_fleet_config_is_invalid_is_named(tmp_path: Path) -> None:
    head = write_fleet(tmp_path, "head", [{"type": "gpu", "model": "T4", "emulate": True}])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"devices": [{"type": "gpu", "model": "NoSuchGPU-9000"}]}))
    with local_cluster([head]) as cluster:
        cluster.add_node(num_cpus=1, env_vars={NODE_CONFIG_ENV: str(bad)})
        cluster.wait_for_nodes()
        with pytest.raises(HeteroError, match=r"node [0-9a-f]{6}: HETERO_NODE_CONFIG=.*bad\.yaml"):
            hetero.Context(backend="ray", address=cluster.address)


def test_a_function_that_cannot_be_shipped_is_refused_at_submit(cluster: Any) -> None:
    lock = threading.Lock()
    with (
        hetero.Context(backend="ray", address=cluster.address) as ctx,
        pytest.raises(HeteroError, match="cannot be sent to a worker"),
    ):
        ctx.submit(lambda: lock.locked())


def test_the_config_can_choose_the_ray_backend_and_its_address(
    cluster: Any, tmp_path: Path
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "backend": {"kind": "ray", "address": cluster.address},
                "scheduler": {"strategy": "round_robin"},
            }
        )
    )
    with hetero.Context(path) as ctx:
        assert type(ctx.backend).__name__ == "RayBackend"
        assert ctx.strategy == "round_robin" and len(ctx.devices) == 5
        assert ctx.run(sum, [1, 2, 3]) == 6


def test_devices_given_for_a_cluster_are_named_as_unused(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from hetero.config import parse_config
    from hetero.devices.fleet import build_fleet

    mine = build_fleet(parse_config({"devices": [{"type": "gpu", "model": "T4", "emulate": True}]}))
    with hetero.Context(devices=mine, backend="ray", address=cluster.address) as ctx:
        assert len(ctx.devices) == 5  # the nodes' own
    assert "the 1 device(s) given to the Context are not used" in caplog.text


def test_a_ray_client_address_runs_the_same_api(tmp_path: Path) -> None:
    head = write_fleet(tmp_path, "head", [{"type": "gpu", "model": "T4", "emulate": True}])
    port = free_port()
    with (
        local_cluster([head], client_port=port) as cluster,
        hetero.Context(backend="ray", address=f"ray://127.0.0.1:{port}") as ctx,
    ):
        assert cluster.address != f"127.0.0.1:{port}"
        assert [d.model for d in ctx.devices] == ["T4"]
        assert list(ctx.map(abs, range(-20, 20), progress=False)) == [
            abs(x) for x in range(-20, 20)
        ]
        future = ctx.submit(sum, [1, 2])
        assert ctx.run(max, future, 2) == 3  # a task graph, through the client


def test_an_unknown_strategy_is_refused_before_any_cluster_is_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = import_ray()
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called"))
    with pytest.raises(ConfigError, match="no_such_policy"):
        hetero.Context(backend="ray", strategy="no_such_policy")
