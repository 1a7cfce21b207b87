"""The admin API (``/admin/replicas``): list the replicas, add one, drain, undrain or remove
one; every call with the admin key. It listens on an address of its own (``Server``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from hetero.errors import ConfigError
from hetero.serve.client_requests import api_key, error_response, same_key
from hetero.serve.records import ReplicaState
from hetero.serve.replicas import replica_config, replica_from_config
from hetero.serve.router import Router

__all__ = ["AdminApi"]


class AdminApi:
    """The admin routes of ``router``, guarded by ``key``; ``added`` is awaited with the state
    of each replica added (to probe it and read its load) before the call answers."""

    def __init__(
        self, router: Router, key: str, added: Callable[[ReplicaState], Awaitable[None]]
    ) -> None:
        self.router = router
        self._key = key
        self._added = added

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/admin/replicas", self._list)
        app.router.add_post("/admin/replicas", self._add)
        app.router.add_post("/admin/replicas/{name}/drain", self._drain)
        app.router.add_post("/admin/replicas/{name}/undrain", self._undrain)
        app.router.add_delete("/admin/replicas/{name}", self._remove)
        return app

    def _authorized(self, request: web.Request) -> web.Response | None:
        given = api_key(request)
        if not given:
            return error_response(
                401, "admin API key missing (Authorization: Bearer KEY)", "auth_error"
            )
        if not same_key(given, self._key):
            return error_response(401, "wrong admin API key", "auth_error")
        return None

    async def _list(self, request: web.Request) -> web.Response:
        return self._authorized(request) or web.json_response(self.router.status())

    async def _add(self, request: web.Request) -> web.Response:
        denied = self._authorized(request)
        if denied:
            return denied
        try:
            data = json.loads(await request.text())
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
            why = "nested too deep to read" if isinstance(exc, RecursionError) else str(exc)
            return _bad_replica(ConfigError([("", f"the body is not JSON ({why})")]))
        try:
            replica = replica_from_config(replica_config(data))
        except ValueError as exc:  # ConfigError, naming the field; anything else, as it says
            return _bad_replica(exc if isinstance(exc, ConfigError) else ConfigError(str(exc)))
        try:
            state = self.router.add(replica)
        except ConfigError as exc:  # its name or its engine is in the fleet already
            return error_response(409, str(exc), "conflict")
        await self._added(state)
        return web.json_response({"added": replica.name}, status=201)

    async def _member(self, request: web.Request, action: str) -> web.Response:
        denied = self._authorized(request)
        if denied:
            return denied
        name = request.match_info["name"]
        try:
            getattr(self.router, action)(name)
        except ConfigError as exc:
            return error_response(404, str(exc), "not_found")
        return web.json_response({action: name})

    async def _drain(self, request: web.Request) -> web.Response:
        return await self._member(request, "drain")

    async def _undrain(self, request: web.Request) -> web.Response:
        return await self._member(request, "undrain")

    async def _remove(self, request: web.Request) -> web.Response:
        return await self._member(request, "remove")


def _bad_replica(exc: ConfigError) -> web.Response:
    """400 naming each bad field (its value and what is allowed): ``param`` is the first
    field, as in OpenAI's errors, and ``problems`` lists every one."""
    problems = [{"field": field, "message": why} for field, why in exc.problems]
    error = {
        "message": f"bad replica: {exc}",
        "type": "invalid_request_error",
        "code": 400,
        "param": exc.problems[0][0] or None,
        "problems": problems,
    }
    return web.json_response({"error": error}, status=400)
