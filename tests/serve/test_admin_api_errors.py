"""The admin API's answers to a bad replica: a JSON error naming the field, the bad value and
what is allowed; and a URL that is already a replica refused, naming that replica. Real mock
replicas and a real router on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import pytest

from hetero.serve.app import ServeOptions
from hetero.serve.emulator.server import MockReplica
from tests.serve.harness import Fleet, Serve, Spec, mock

KEY = "admin-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def _fleet(serve: Serve) -> Fleet:
    return await serve(Spec(), serve_options=ServeOptions(port=0, admin_key=KEY))


async def _add(fleet: Fleet, body: Any = None, data: str | None = None) -> tuple[int, Any]:
    url = fleet.admin_url + "/admin/replicas"
    async with fleet.session.post(url, json=body, data=data, headers=AUTH) as reply:
        return reply.status, await reply.json(content_type=None)


@pytest.mark.parametrize(
    ("body", "field", "parts"),
    [
        ({"url": "http://127.0.0.1:1", "slots": "abc"}, "slots", ["valid integer", "'abc'"]),
        ({"url": "http://127.0.0.1:1", "slots": 0}, "slots", ["greater than or equal to 1", "0"]),
        ({"url": "http://127.0.0.1:1", "slots": True}, "slots", ["not true or false"]),
        ({"url": "http://127.0.0.1:1", "speed": -2}, "speed", ["greater than or equal", "-2"]),
        ({"url": "http://127.0.0.1:1", "device": "A100-80"}, "device", ["closest", "A100-80GB"]),
        ({"url": "http://127.0.0.1:1", "slot": 4}, "slot", ["did you mean 'slots'", "allowed:"]),
        ({"url": "127.0.0.1:1"}, "url", ["http://HOST[:PORT]", "did you mean 'http://127"]),
        ({"slots": 4}, "url", ["required", "e.g. http://"]),
        (
            {"url": "http://127.0.0.1:1", "device": "A100-80GB", "fit_model": "nope"},
            "fit_model",
            ["unknown model 'nope'"],
        ),
    ],
)
async def test_a_bad_field_is_named_with_its_value_and_what_is_allowed(
    serve: Serve, body: dict[str, Any], field: str, parts: list[str]
) -> None:
    fleet = await _fleet(serve)
    status, answer = await _add(fleet, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field
    assert error["message"].startswith(f"bad replica: {field}: ")
    assert [p["field"] for p in error["problems"]] == [field]
    for part in parts:
        assert part in error["message"], error["message"]
    assert "pydantic" not in error["message"] and "errors.pydantic.dev" not in error["message"]
    assert [r["name"] for r in fleet.router.status()["replicas"]] == ["r0"]  # nothing added


async def test_every_bad_field_is_listed(serve: Serve) -> None:
    fleet = await _fleet(serve)
    status, answer = await _add(fleet, {"url": "http://127.0.0.1:1", "slots": -1, "context": "x"})
    assert status == 400
    assert [p["field"] for p in answer["error"]["problems"]] == ["slots", "context"]


@pytest.mark.parametrize(
    ("body", "data", "part"),
    [
        (None, "{not json", "the body is not JSON"),
        (None, "[" * 100_000, "the body is not JSON"),
        (["http://127.0.0.1:1"], None, "expected a JSON object of a replica's fields"),
    ],
)
async def test_a_body_that_is_not_a_replica_object_is_a_clear_400(
    serve: Serve, body: Any, data: str | None, part: str
) -> None:
    fleet = await _fleet(serve)
    status, answer = await _add(fleet, body, data)
    assert status == 400 and part in answer["error"]["message"], answer


async def test_a_url_that_is_already_a_replica_is_refused_naming_it(serve: Serve) -> None:
    fleet = await _fleet(serve)
    existing = fleet.router.replicas[0].replica.url  # http://127.0.0.1:PORT, replica r0
    # The same engine however it is written: under another name, with a slash, in capitals.
    for url in (existing, existing + "/", existing.replace("http://", "HTTP://")):
        status, answer = await _add(fleet, {"url": url, "name": "again"})
        assert status == 409, answer
        message = answer["error"]["message"]
        assert "already in the fleet as replica 'r0'" in message and existing in message
    assert [r["name"] for r in fleet.router.status()["replicas"]] == ["r0"]


async def test_a_url_that_was_removed_may_be_added_again(serve: Serve) -> None:
    fleet = await _fleet(serve)
    other = MockReplica(mock())
    url = await other.start()
    try:
        status, answer = await _add(fleet, {"url": url, "name": "x"})
        assert status == 201, answer
        status, answer = await _add(fleet, {"url": url + "/", "device": "T4"})
        assert status == 409 and "as replica 'x'" in answer["error"]["message"]
        async with fleet.session.delete(fleet.admin_url + "/admin/replicas/x", headers=AUTH) as r:
            assert r.status == 200
        status, answer = await _add(fleet, {"url": url, "name": "x"})
        assert status == 201, answer
    finally:
        await other.stop()
