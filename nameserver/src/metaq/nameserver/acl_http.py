"""The cluster's ACL over HTTP, for ``metaq acl`` and other tools: ``GET /acl`` answers the
ACL file's JSON; ``PUT /acl`` with ``{"acl": ..., "expected_version": N}`` commits a new
one through Raft (:class:`~metaq.nameserver.cluster_acl.ClusterAcl`), refused with 409 when
the cluster's is no longer at version N. Both need a user holding ``admin cluster`` (the
users' middleware sees to it): the ACL holds each user's verifier."""

from __future__ import annotations

from aiohttp import web

from metaq.common.acl import Acl, AclError
from metaq.common.http import json_object
from metaq.nameserver.cluster_acl import ClusterAcl
from metaq.nameserver.controller import AclChangeRefused, ControllerUnavailable


def routes(cluster_acl: ClusterAcl) -> list[web.RouteDef]:
    async def get(_request: web.Request) -> web.Response:
        return web.json_response(cluster_acl.acl.to_json())

    async def put(request: web.Request) -> web.Response:
        body = await json_object(request)
        expected = body.get("expected_version")
        if not isinstance(expected, int) or isinstance(expected, bool):
            return _error(400, 'send {"acl": {...}, "expected_version": N}, N the version read')
        try:
            new = Acl.from_json(body.get("acl"))
            changed = await cluster_acl.change(lambda _current: new, expected)
        except AclError as exc:
            return _error(400, str(exc))
        except AclChangeRefused as exc:
            return _error(409, str(exc))
        except ControllerUnavailable as exc:
            return _error(503, f"the nameservers could not agree on the change: {exc}")
        return web.json_response({"version": changed.version})

    return [web.get("/acl", get), web.put("/acl", put)]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
