"""The users page: the cluster's users, their grants and networks, read-only for users
holding ``view cluster`` and changed by admins (add a user, grant, revoke, remove). A
change commits through the nameservers' Raft group
(:class:`~metaq.nameserver.cluster_acl.ClusterAcl`), which hands it to every broker; each
form carries the version it was drawn from, so a change made on a page someone else's
change has outdated is refused, saying so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from metaq.common.acl import PERMISSIONS, Acl, AclError, Grant, User
from metaq.common.http import takes_forms
from metaq.common.users import Verifier, new_secret_key
from metaq.nameserver.console.context import ConsoleContext
from metaq.nameserver.console.page import Html, changes, errors, esc, field, notice, render, table
from metaq.nameserver.controller import AclChangeRefused, ControllerUnavailable

CURRENT = "/console/users"


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(_request: web.Request) -> web.Response:
        return users_page(context)

    @takes_forms
    async def change(request: web.Request) -> web.Response:
        return await _change(context, request)

    return [web.get(CURRENT, page), web.post(CURRENT + "/{action}", change)]


def users_page(context: ConsoleContext, message: str = "", problem: str = "") -> web.Response:
    if context.acl is None:
        body = (
            "<p>This nameserver runs without <code>auth_enabled</code>: there are no users, "
            "and anyone who reaches a broker's ports is served. Turn auth on "
            "(docs/operations.md, Security) to manage users here.</p>"
        )
        return render("Users", body, current=CURRENT)
    current = context.acl.acl
    rows = [
        [
            Html(f"<strong>{esc(key)}</strong>"),
            Html("<br>".join(_grant_cell(current, key, g) for g in sorted(user.grants, key=str)))
            if user.grants
            else "none",
            ", ".join(map(str, user.cidrs)) or "any",
            Html(_button(current, "remove", f"Remove user {key}", "Remove", user=key)),
        ]
        for key, user in sorted(current.users.items())
    ]
    body = (
        notice(message)
        + errors([problem])
        + f"<p>ACL version {current.version}. Changes made here reach every nameserver and "
        "every broker (with its next heartbeat); each server keeps them in its own "
        "ACL file.</p>"
        + table(["user", "grants", "networks", ""], rows, caption="Users")
        + changes(_forms(current))
    )
    return render("Users", body, current=CURRENT)


def _grant_cell(acl: Acl, user: str, grant: Grant) -> str:
    text = f"<code>{esc(grant)}</code>"
    return text + " " + _button(
        acl, "revoke", f"Revoke {grant} from {user}", "Revoke", user=user,
        permission=grant.permission, resource=grant.resource,
    )  # fmt: skip


def _button(acl: Acl, action: str, label: str, text: str, **values: str) -> str:
    hidden = "".join(
        f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">'
        for k, v in {**values, "version": str(acl.version)}.items()
    )
    return changes(
        f'<form class="inline" method="post" action="{CURRENT}/{action}">{hidden}'
        f'<button type="submit" aria-label="{esc(label)}">{esc(text)}</button></form>'
    )


def _forms(acl: Acl) -> str:
    version = f'<input type="hidden" name="version" value="{acl.version}">'
    users = "".join(f'<option value="{esc(u)}">{esc(u)}</option>' for u in sorted(acl.users))
    permissions = "".join(f'<option value="{p}">{p}</option>' for p in PERMISSIONS)
    return f"""<form method="post" action="{CURRENT}/add"><fieldset><legend>Add a user</legend>
{version}{field("user", "Access key", form="add-", required="required")}
<button type="submit">Add user</button>
<p class="muted">A secret key is made for the user and shown once, on the next page.</p>
</fieldset></form>
<form method="post" action="{CURRENT}/grant"><fieldset><legend>Grant</legend>{version}
<label for="f-grant-user">User</label><select id="f-grant-user" name="user">{users}</select>
<label for="f-grant-permission">Permission</label>
<select id="f-grant-permission" name="permission">{permissions}</select>
{field("resource", "Resource", form="grant-", required="required",
       placeholder="topic:NAME, group:NAME, NAME* or cluster")}
<button type="submit">Grant</button></fieldset></form>"""  # fmt: skip


async def _change(context: ConsoleContext, request: web.Request) -> web.Response:
    form = await request.post()
    if context.acl is None:
        return users_page(context, problem="this nameserver has no users to change")
    action = request.match_info["action"]
    user = str(form.get("user", "")).strip()
    secret = new_secret_key()
    edit: Callable[[Acl], Acl]
    if action == "add":
        try:  # slow on purpose (a key derivation): off the event loop
            verifier = await asyncio.to_thread(Verifier.make, user, secret)
        except ValueError as exc:
            return users_page(context, problem=str(exc))

        def edit(acl: Acl) -> Acl:
            if acl.user(user) is not None:
                raise AclError(f"user {user} exists; remove it first to give it a new key")
            return acl.with_user(User(user, verifier))

    elif action in ("grant", "revoke"):
        permission, resource = str(form.get("permission", "")), str(form.get("resource", ""))

        def edit(acl: Acl) -> Acl:
            grant = Grant.parse(permission, resource.strip())
            return acl.grant(user, grant) if action == "grant" else acl.revoke(user, grant)

    elif action == "remove":

        def edit(acl: Acl) -> Acl:
            return acl.without_user(user)

    else:
        raise web.HTTPNotFound()
    try:
        version = int(str(form.get("version", "")))
        changed = await context.acl.change(_keeping_an_admin(edit), version)
    except ValueError as exc:  # AclError is one
        return users_page(context, problem=str(exc) or "the form lacks its ACL version")
    except AclChangeRefused as exc:
        return users_page(context, problem=f"{exc} (the table below is the current ACL)")
    except ControllerUnavailable as exc:
        return users_page(context, problem=f"the nameservers could not agree on it: {exc}")
    message = f"{action}: done, ACL version {changed.version}"
    if action == "add":
        message = (
            f"user {user} added (ACL version {changed.version}); its secret key, shown only "
            f"now: {secret}"
        )
    return users_page(context, message=message)


def _keeping_an_admin(edit: Callable[[Acl], Acl]) -> Callable[[Acl], Acl]:
    def checked(acl: Acl) -> Acl:
        changed = edit(acl)
        if any(u.is_admin for u in acl.users.values()) and not any(
            u.is_admin for u in changed.users.values()
        ):
            raise AclError(
                "that would leave no user with admin cluster, and nobody could change the "
                "ACL any more: grant admin cluster to another user first"
            )
        return changed

    return checked
