"""The cluster's users and grants, read and changed at a nameserver's HTTP endpoint
(``GET`` / ``PUT /acl``): the nameservers agree on it through Raft and hand it to every
broker, so no file is copied by hand. Both calls need an admin user's credentials."""

from __future__ import annotations

from collections.abc import Callable

from metaq.client.admin.session import AdminSession, refused
from metaq.client.errors import AdminError
from metaq.common.acl import Acl, AclError


class AclConflict(AdminError):
    """The cluster's ACL changed since it was read: read it again and redo the change."""


class AclAdmin(AdminSession):
    async def cluster_acl(self, nameserver_http: str) -> Acl:
        """The cluster's ACL, from the nameserver whose HTTP endpoint is ``nameserver_http``
        (``host:port``)."""
        status, body = await self.request(nameserver_http, "GET", "/acl")
        if status != 200:
            raise refused(nameserver_http, status, body, f"answered {status} to GET /acl")
        try:
            return Acl.from_json(body)
        except AclError as exc:
            raise refused(nameserver_http, status, body, f"answered no ACL: {exc}") from None

    async def put_cluster_acl(self, nameserver_http: str, acl: Acl, expected_version: int) -> int:
        """Make ``acl`` the cluster's, if it is still at ``expected_version``; the version
        committed. AclConflict when someone changed it meanwhile."""
        sent = {"acl": acl.to_json(), "expected_version": expected_version}
        status, body = await self.request(nameserver_http, "PUT", "/acl", sent)
        if status == 409:
            raise AclConflict(str(body.get("error") if isinstance(body, dict) else body))
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("version"), int):
            raise refused(nameserver_http, status, body, f"answered {status} to PUT /acl")
        version: int = body["version"]
        return version

    async def change_cluster_acl(self, nameserver_http: str, edit: Callable[[Acl], Acl]) -> Acl:
        """Read the cluster's ACL, ``edit`` it (AclError for a change that cannot be
        made) and commit the result over the version read; the ACL committed."""
        current = await self.cluster_acl(nameserver_http)
        changed = edit(current)
        await self.put_cluster_acl(nameserver_http, changed, current.version)
        return changed
