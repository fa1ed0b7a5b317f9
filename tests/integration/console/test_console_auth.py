"""The console behind the users' middleware (``auth_enabled``) in a real Chromium: a
browser without a session is sent to the login page and back, and after logging in as an
admin the console's pages and forms work, its calls to the brokers' admin APIs signed with
the cluster secret."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.users import Credentials, Verifier
from metaq.testing import BrokerProcess
from metaq.testing.cluster import ClusterBuilder
from metaq.testing.console import BROKER_TIMEOUT_MS, Browser
from metaq.testing.http_signing import signed_for
from metaq.testing.nameserver_process import NameServerProcess
from metaq.testing.waiting import (
    cluster_secret_for_tests,
    run_async,
    wait_until,
    wait_until_async,
)

ADMIN = Credentials("console-admin", "console-admin-secret-key-for-tests")
READER = Credentials("console-reader", "console-reader-secret-key-for-tests")
VIEWER = Credentials("console-viewer", "console-viewer-secret-key-for-tests")
GROUP = "secured"


@dataclass
class AuthConsole:
    nameserver: NameServerProcess
    broker: BrokerProcess

    @property
    def console_url(self) -> str:
        return f"http://{self.nameserver.http_address}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthConsole]:
    acl_file = tmp_path_factory.mktemp("console-acl") / "acl.json"
    table = Acl()
    for who in (ADMIN, READER, VIEWER):
        table = table.with_user(User(who.access_key, Verifier.make(who.access_key, who.secret_key)))
    table = table.grant(ADMIN.access_key, Grant("admin", "cluster"))
    table = table.grant(VIEWER.access_key, Grant("view", "cluster"))
    acl.save(acl_file, table.grant(READER.access_key, Grant("sub", f"group:{GROUP}")))
    builder = ClusterBuilder(
        groups=(GROUP,), auth=True, admin=ADMIN, acl_file=acl_file,
        nameserver_args=("--http-port", "0",
                         "--console-broker-timeout-ms", str(BROKER_TIMEOUT_MS)),
    )  # fmt: skip
    with builder.start(tmp_path_factory.mktemp("console-auth")) as started:
        yield AuthConsole(started.nameservers[0], started.broker(GROUP))


def test_the_console_sends_a_browser_to_log_in_and_its_forms_work_after(
    secured: AuthConsole, browser: Browser
) -> None:
    page, topic = browser.page, "made-behind-login"
    page.goto(f"{secured.console_url}/console/topics")
    assert "/login?next=" in page.url, page.url
    page.get_by_label("access key").fill(ADMIN.access_key)
    page.get_by_label("secret key").fill(ADMIN.secret_key)
    page.get_by_role("button", name="log in").click()
    page.wait_for_url(f"{secured.console_url}/console/topics")
    browser.screenshot("login-topics")
    # A POST form: the console creates the topic through the broker's admin API, which
    # takes it only signed (by the nameserver, with the cluster secret).
    page.get_by_label("Topic").fill(topic)
    page.get_by_label("Read queues").fill("2")
    page.get_by_label("Write queues").fill("2")
    page.get_by_role("button", name="Create or update").click()
    status_line = page.get_by_role("status").inner_text()
    assert f"topic {topic}: 2 read / 2 write queues" in status_line, status_line
    # On a thread of its own: Playwright's sync API holds this thread's event loop.
    with ThreadPoolExecutor(1) as thread:
        asked = Admin(credentials=ADMIN).broker_topics(secured.broker.http_url)
        topics = thread.submit(run_async, asked).result()
    assert topics[topic].write_queues == 2, topics
    page.goto(f"{secured.console_url}/console/cluster")
    wait_until(lambda: GROUP in page.locator("main").inner_text(), 10,
               "the cluster page lists the broker group", poll_s=0.2)  # fmt: skip
    # A broker that refused the console's signed calls would be listed in the page's alert
    # (its port numbers may hold any digits, so the status code is not searched for).
    refusals = page.get_by_role("alert")
    assert refusals.count() == 0, refusals.all_inner_texts()
    assert browser.problems == []


def _log_in(page: Any, who: Credentials) -> None:
    page.get_by_label("access key").fill(who.access_key)
    page.get_by_label("secret key").fill(who.secret_key)
    page.get_by_role("button", name="log in").click()


def test_a_user_without_admin_lands_on_a_styled_page_and_an_admin_can_log_out(
    secured: AuthConsole, browser: Browser
) -> None:
    page, base = browser.page, secured.console_url
    page.goto(f"{base}/console/groups")
    # The login page wears the console's stylesheet: its header is the console's blue.
    background = "getComputedStyle(document.querySelector('header')).backgroundColor"
    assert page.evaluate(background) == "rgb(31, 58, 95)"
    _log_in(page, READER)
    page.get_by_role("heading", name="Not allowed").wait_for()
    assert page.evaluate(background) == "rgb(31, 58, 95)"
    text = page.locator("main").inner_text()
    assert f"logged in as {READER.access_key}" in text, text
    assert f"sub group:{GROUP}" in text and "admin cluster" in text, text
    browser.screenshot("login-not-admin")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/console/cluster")
    _log_in(page, ADMIN)
    page.wait_for_url(f"{base}/console/cluster")
    assert f"logged in as {ADMIN.access_key}" in page.locator("header").inner_text()
    browser.screenshot("logged-in-header")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/console/cluster")
    assert "/login?next=" in page.url, page.url
    # The reader's page answered 403 on purpose; nothing else may fail.
    assert [p for p in browser.problems if "403" not in p] == []


def test_both_servers_take_a_cluster_members_signed_call_and_no_unsigned_one(
    secured: AuthConsole,
) -> None:
    for base, path in ((secured.console_url, "/cluster"), (secured.broker.http_url, "/topics")):
        signed = urllib.request.Request(f"{base}{path}", headers=signed_for(f"{base}{path}"))
        with urllib.request.urlopen(signed, timeout=5) as answer:
            assert answer.status == 200, (base, path)
        with pytest.raises(urllib.error.HTTPError) as unsigned:
            urllib.request.urlopen(f"{base}{path}", timeout=5)
        assert unsigned.value.code == 401
        unsigned.value.close()


def test_signed_calls_name_topics_and_groups_that_are_percent_encoded_on_the_wire(
    secured: AuthConsole,
) -> None:
    # Each name holds characters its rules allow that travel percent-encoded ('%', '|',
    # '@', ':', and '/', '&', '=' in a query), so a proof over another spelling of the
    # path than the broker's would be refused (401).
    topic, group, key = "%RETRY%signed|names", "signed.readers@room:1|%x", "k/y&z=1"
    broker = secured.broker.http_url

    async def as_user() -> None:
        async with Admin(credentials=ADMIN) as admin:
            await admin.put_topic(broker, topic, TopicSettings(1, 1))
            assert topic in await admin.broker_topics(broker)
            stored = await admin.store_message(broker, topic, "signed", keys=[key])
            assert [m.queue_offset for m in stored.stored] == [0]
            reset = await admin.reset_group(broker, group, topic, 0, dry_run=True)
            assert [(q.before, q.after) for q in reset.queues] == [(None, 0)]

    async def as_cluster_member() -> None:
        member = Admin.cluster_member(cluster_secret_for_tests(), timeout_s=5)
        try:
            # The send is acknowledged once stored; its queue entry follows at dispatch.
            async def dispatched() -> bool:
                [queue] = await member.broker_queues(broker, topic)
                return (queue.min_offset, queue.max_offset) == (0, 1)

            await wait_until_async(dispatched, 10, "the queue holds the one message")
            [found] = await member.broker_messages_by_key(broker, topic, key)
            assert found.body == "signed"
            [read] = await member.read_queue(broker, topic, 0, offset=0)
            assert await member.broker_message(broker, read.msg_id) == found
            assert await member.group_offsets(broker, group) == []
        finally:
            await member.close()

    # On a thread of its own: Playwright's sync API may hold this thread's event loop.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(run_async, as_user()).result()
        thread.submit(run_async, as_cluster_member()).result()
        removed = thread.submit(run_async, Admin(credentials=ADMIN).remove_topic(broker, topic))
        assert removed.result()


_POST_TOPIC = """async () => {
  const r = await fetch('/console/topics', {method: 'POST', headers: {'Content-Type':
    'application/x-www-form-urlencoded'}, body: 'topic=by-viewer&read_queues=1&write_queues=1'});
  return [r.status, await r.text()];
}"""


def test_a_viewer_sees_the_pages_without_their_forms_and_may_change_nothing(
    secured: AuthConsole, browser: Browser
) -> None:
    page, base = browser.page, secured.console_url
    page.goto(f"{base}/")
    _log_in(page, VIEWER)
    page.wait_for_url(f"{base}/console/overview")
    assert f"logged in as {VIEWER.access_key} (read-only)" in page.locator("header").inner_text()
    assert page.get_by_role("table", name="Broker groups").get_by_text(GROUP).is_visible()
    page.goto(f"{base}/console/topics")
    assert page.get_by_role("table", name="Topics").is_visible()
    assert page.get_by_role("button", name="Create or update").count() == 0
    page.goto(f"{base}/console/users")
    users = page.get_by_role("table", name="Users")
    assert f"sub group:{GROUP}" in users.inner_text()
    assert "view cluster" in users.inner_text()
    assert page.get_by_role("button").filter(has_text="Revoke").count() == 0
    assert page.get_by_role("button", name="Add user").count() == 0
    browser.screenshot("users-read-only")
    # A change sent all the same, from the console's own page, is refused.
    status, text = page.evaluate(_POST_TOPIC)
    assert status == 403, text
    assert "lacks admin on cluster" in text, text
    assert [p for p in browser.problems if "403" not in p] == []


def test_an_admin_changes_users_on_the_users_page_and_the_change_is_in_force(
    secured: AuthConsole, browser: Browser
) -> None:
    page, base = browser.page, secured.console_url
    page.goto(f"{base}/console/users")
    _log_in(page, ADMIN)
    page.wait_for_url(f"{base}/console/users")
    page.get_by_label("Access key").fill("made-on-the-page")
    page.get_by_role("button", name="Add user").click()
    status_line = page.get_by_role("status").inner_text()
    assert "user made-on-the-page added" in status_line, status_line
    secret = status_line.rsplit(" ", 1)[1]
    page.get_by_label("User", exact=True).select_option("made-on-the-page")
    page.get_by_label("Permission").select_option("view")
    page.get_by_label("Resource").fill("cluster")
    page.get_by_role("button", name="Grant", exact=True).click()
    assert "grant: done" in page.get_by_role("status").inner_text()
    assert (
        "view cluster" in page.get_by_role("row").filter(has_text="made-on-the-page").inner_text()
    )
    browser.screenshot("users-admin")
    # A grant that cannot be: said, nothing changed.
    page.get_by_label("Permission").select_option("view")
    page.get_by_label("Resource").fill("topic:orders")
    page.get_by_role("button", name="Grant", exact=True).click()
    assert "view is granted on cluster only" in page.get_by_role("alert").inner_text()
    # The new user logs in with the key shown once, and reads the console.
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/console/cluster")
    _log_in(page, Credentials("made-on-the-page", secret))
    page.wait_for_url(f"{base}/console/cluster")
    assert "(read-only)" in page.locator("header").inner_text()
    # Revoked by the admin, it may not any more.
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/console/users")
    _log_in(page, ADMIN)
    page.wait_for_url(f"{base}/console/users")
    page.get_by_role("button", name="Revoke view cluster from made-on-the-page").click()
    assert "revoke: done" in page.get_by_role("status").inner_text()
    assert browser.problems == []
