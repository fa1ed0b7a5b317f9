"""The web console in a real headless Chromium against a real cluster: every page loads
without errors, and its buttons do what they say (switchover, reset by time, dead-letter
resend); a broker that does not answer costs a page its timeout, no more, and is named."""

from __future__ import annotations

import html
import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest

from metaq.client.admin import TopicSettings
from metaq.client.pull_consumer import PullConsumer
from metaq.testing.console import (
    BROKER_TIMEOUT_MS,
    GROUPS,
    QUEUES,
    TOPIC,
    Browser,
    ConsoleCluster,
    LiveConsumer,
    LiveProducer,
    call,
)
from metaq.testing.waiting import deadline, run_async, wait_until

GROUP = "billing"


def send(cluster: ConsoleCluster, group: str, topic: str, body: str, **extra: Any) -> str:
    """Store one message through the master's admin API; its message id, once consumers
    can see it."""
    master = cluster.master(group)
    status, answer = call(
        "POST", f"{master.http_url}/topics/{quote(topic, safe='')}/messages",
        {"body": body, **extra},
    )  # fmt: skip
    assert status == 200, answer
    stored = answer["stored"][0]

    def visible() -> bool:
        # Queues are built from the log just after the append: wait until this one is.
        got, queues = call("GET", f"{master.http_url}/queues?topic={quote(topic, safe='')}")
        assert got == 200, queues
        queue = queues["queues"][stored["queue_id"]]
        return bool(queue["max_offset"] > stored["queue_offset"])

    wait_until(visible, 10, f"the message sent to {topic} is in its queue", poll_s=0.05)
    return str(stored["msg_id"])


def committed(cluster: ConsoleCluster, group: str, consumer_group: str) -> dict[int, int]:
    status, answer = call(
        "GET", f"{cluster.master(group).http_url}/groups/{consumer_group}/offsets"
    )
    assert status == 200, answer
    return {r["queue_id"]: r["offset"] for r in answer["offsets"] if r["topic"] == TOPIC}


def commit_to_end(cluster: ConsoleCluster, consumer_group: str) -> None:
    """The group has consumed everything (a reset to a time after every message)."""
    future_ms = int(time.time() * 1000) + 3_600_000
    for group in GROUPS:
        status, answer = call(
            "POST", f"{cluster.master(group).http_url}/groups/{consumer_group}/reset",
            {"topic": TOPIC, "timestamp_ms": future_ms, "dry_run": False},
        )  # fmt: skip
        assert status == 200, answer


def test_every_page_loads_with_no_console_errors(cluster: ConsoleCluster, browser: Browser) -> None:
    msg_id = send(cluster, "group-a", TOPIC, '{"order": 1, "items": ["tea"]}', keys=["order-1"])
    commit_to_end(cluster, GROUP)
    page, base = browser.page, cluster.console_url
    page.goto(base + "/")
    assert page.url.endswith("/console/overview")
    page.get_by_role("link", name="Cluster", exact=True).click()
    for group in GROUPS:
        assert page.get_by_role("heading", name=f"Group {group}").is_visible()
    assert page.get_by_text("Raft leader:").is_visible()
    # Keyboard first: Tab reaches the navigation, and the focus is drawn.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Overview"
    outline = "getComputedStyle(document.activeElement).outlineStyle"
    assert page.evaluate(outline) == "solid"
    browser.screenshot("cluster")
    page.get_by_role("link", name="Topics", exact=True).click()
    assert page.get_by_role("link", name=TOPIC, exact=True).is_visible()
    browser.screenshot("topics")
    page.get_by_role("link", name=TOPIC, exact=True).click()
    assert page.get_by_role("table", name="Queues").locator("tbody tr").count() == 2 * QUEUES
    browser.screenshot("topic")
    page.get_by_role("link", name="Consumer groups").click()
    page.get_by_role("link", name=GROUP, exact=True).click()
    assert page.get_by_role("table", name="Committed offsets").is_visible()
    browser.screenshot("group")
    page.get_by_role("link", name="Messages").click()
    page.get_by_label("Message id (32 hex digits)").fill(msg_id)
    page.get_by_label("Message id (32 hex digits)").press("Enter")
    page.get_by_role("heading", name=f"Message {msg_id}").wait_for()
    assert '"items": [' in page.locator("pre").inner_text()  # pretty-printed JSON
    assert "consumed" in page.get_by_role("table", name="Delivery").inner_text()
    browser.screenshot("message")
    page.goto(f"{base}/console/messages?topic={TOPIC}&key=order-1")
    assert page.get_by_role("heading", name=f"Message {msg_id}").is_visible()
    page.goto(f"{base}/console/topics/no-such-topic")
    assert "not served by any live broker" in page.locator(".error").inner_text()
    # The not-found page above answers 404 on purpose; nothing else may fail.
    unexpected = [p for p in browser.problems if "no-such-topic" not in p]
    assert unexpected == []


def test_the_overview_shows_each_groups_health_and_the_busiest_topics_rates(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    page = browser.page
    groups = page.get_by_role("table", name="Broker groups")

    def every_group_healthy() -> bool:
        # A broker slow to answer the console on a loaded machine shows its group amber
        # for that page: the page is loaded again until each group reads healthy.
        page.goto(f"{cluster.console_url}/console/overview")
        rows = [groups.get_by_role("row").filter(has_text=group) for group in GROUPS]
        return all(row.locator(".status.ok").count() == 1 for row in rows)

    wait_until(every_group_healthy, 60, "the overview shows every group healthy")
    for group in GROUPS:
        row = groups.get_by_role("row").filter(has_text=group)
        assert row.locator(".status.ok").inner_text() == "healthy", row.inner_text()
        assert "master 0, 2 in sync" in row.inner_text()
        # Status colours: green for healthy.
        colour = row.locator(".status").evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(230, 244, 234)"
    busiest = page.get_by_role("table", name="Busiest topics")
    line = busiest.locator(f'svg[aria-label^="{TOPIC} in:"]')

    def drawn_with_a_rate() -> bool:
        # Messages keep coming, so the samples (every 0.5 s) see the count grow.
        send(cluster, "group-a", TOPIC, "overview")
        page.reload()
        if line.count() == 0:
            return False
        label = str(line.get_attribute("aria-label"))
        return "highest 0 msg/s" not in label

    wait_until(drawn_with_a_rate, 30, f"the overview draws a rate for {TOPIC}", poll_s=0.3)
    assert line.locator("polyline").count() >= 1
    assert page.get_by_role("table", name="Cluster throughput").locator("svg").count() == 2
    # Numbers with their units sit right-aligned.
    figure = busiest.locator("td.num").first
    assert figure.inner_text().endswith("msg/s")
    assert figure.evaluate("e => getComputedStyle(e).textAlign") == "right"
    lagging = page.get_by_role("table", name="Most-lagging groups")
    assert lagging.is_visible()
    browser.screenshot("overview")
    # On a phone the page does not widen: wide tables scroll inside their box.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{cluster.console_url}/console/cluster")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    browser.screenshot("cluster-phone")
    page.goto(f"{cluster.console_url}/console/overview")
    browser.screenshot("overview-phone")
    assert browser.problems == []


def test_the_cluster_page_refreshes_itself(cluster: ConsoleCluster, browser: Browser) -> None:
    page = browser.page
    page.goto(f"{cluster.console_url}/console/cluster")
    before = page.get_by_role("table", name="Brokers of group-a").inner_text()
    send(cluster, "group-a", TOPIC, "moves the commitlog end")
    # The script refetches the page every few seconds and swaps the live part in place.
    with page.expect_request(lambda r: r.headers.get("x-console-refresh") == "1", timeout=10_000):
        pass
    page.wait_for_function(
        "before => document.querySelector('table').innerText !== before", arg=before
    )
    assert browser.problems == []


def test_every_page_goes_with_headers_that_keep_it_out_of_other_sites_frames(
    cluster: ConsoleCluster,
) -> None:
    pages = ["cluster", "topics", f"topics/{TOPIC}", "groups", f"groups/{GROUP}", "messages"]
    for path in [*pages, "topics/no-such-topic"]:
        try:
            with urllib.request.urlopen(f"{cluster.console_url}/console/{path}", timeout=10) as r:
                headers = r.headers
        except urllib.error.HTTPError as refused:  # the not-found page is a page too
            headers = refused.headers
            refused.close()
        assert headers["X-Frame-Options"] == "DENY", path
        policy = headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, path
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
        assert headers["Referrer-Policy"] == "no-referrer", path
        assert headers["X-Content-Type-Options"] == "nosniff", path


def _get_page(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode()


def test_an_unknown_group_or_page_is_a_404_in_the_consoles_layout(cluster: ConsoleCluster) -> None:
    status, page = _get_page(f"{cluster.console_url}/console/groups/no-such-group")
    assert status == 404, page
    assert "consumer group &#x27;no-such-group&#x27; is not known" in page, page
    assert 'aria-label="Console"' in page  # the navigation: the console's layout
    status, page = _get_page(f"{cluster.console_url}/console/no-such-page")
    assert status == 404, page
    assert "There is no console page at /console/no-such-page" in page, page
    assert 'aria-label="Console"' in page
    # A group the brokers know is still a page.
    commit_to_end(cluster, "known-group")
    status, page = _get_page(f"{cluster.console_url}/console/groups/known-group")
    assert status == 200, page


def test_a_time_range_is_listed_a_row_per_message_a_page_at_a_time(
    cluster: ConsoleCluster,
) -> None:
    sent_from = int(time.time() * 1000) - 1
    # More than a page's 20 per queue in at least one of group-a's two queues; bodies
    # long enough that a page showing them whole would be plain to see.
    sent = {send(cluster, "group-a", TOPIC, f"{i:03d}" + "x" * 400) for i in range(44)}
    sent_to = int(time.time() * 1000) + 1
    url = f"{cluster.console_url}/console/messages?topic={TOPIC}&from={sent_from}&to={sent_to}"
    seen: list[str] = []
    pages = 0
    while url:
        status, page = _get_page(url)
        assert status == 200, page
        pages += 1
        ids = re.findall(r'href="/console/messages\?msg_id=([0-9A-F]+)"', page, re.I)
        assert 0 < len(ids) <= 2 * 20, (pages, len(ids))  # two queues, 20 each at most
        assert "x" * 400 not in page and "<pre>" not in page  # rows, not whole messages
        seen += ids
        more = re.search(r'<a href="([^"]+)">Next page', page)
        if more:
            assert "Truncated: a page shows at most 20 messages of each queue" in page
            url = cluster.console_url + html.unescape(more.group(1))
        else:
            assert "That is all the range holds." in page
            url = ""
        assert pages <= 5, "the pages never end"
    assert pages >= 2
    assert sorted(seen) == sorted(sent)  # every message once, over the pages
    # The link of a row shows that message whole.
    status, page = _get_page(f"{cluster.console_url}/console/messages?msg_id={seen[0]}")
    assert status == 200 and "x" * 400 in page


def test_a_form_posted_from_another_site_is_refused(cluster: ConsoleCluster) -> None:
    form = b"to=1&epoch=1"
    for header, value in (("Origin", "http://elsewhere.example"), ("Sec-Fetch-Site", "cross-site")):
        request = urllib.request.Request(
            f"{cluster.console_url}/console/cluster/group-a/switchover", data=form, method="POST"
        )
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        request.add_header(header, value)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        assert "only from this site's own pages" in json.load(refused.value)["error"]
    assert cluster.route_master("group-a") == 0


def test_the_broker_endpoints_say_what_was_wrong_with_a_request(cluster: ConsoleCluster) -> None:
    url = cluster.master("group-a").http_url
    cases = [
        ("GET", "/queues?topic=nope", None, 404, "not served by broker"),
        ("GET", f"/queues/{TOPIC}/0/messages", None, 400, "give either offset or from_ms"),
        ("GET", f"/queues/{TOPIC}/0/messages?offset=x", None, 400, "are integers"),
        ("POST", f"/groups/{GROUP}/reset", {"topic": TOPIC}, 400, '"timestamp_ms": integer'),
        ("POST", f"/topics/{TOPIC}/messages", {"body": 1}, 400, '"body": text'),
        ("POST", f"/groups/{GROUP}/dlq/resend", {"msg_ids": []}, 400, "msg_ids"),
        ("POST", "/groups/nobody/dlq/resend", {"msg_ids": ["00"]}, 404, "no dead letters"),
    ]
    for method, path, body, status, words in cases:
        got, answer = call(method, url + path, body)
        assert (got, words in answer.get("error", "")) == (status, True), (path, answer)
    slave = cluster.brokers[("group-a", 1)]
    got, answer = call("POST", f"{slave.http_url}/topics/{TOPIC}/messages", {"body": "x"})
    assert got == 409 and "not its group's master" in answer["error"], answer


def test_a_group_page_shows_live_members_and_which_one_reads_each_queue(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    consumer = LiveConsumer(cluster.nameserver.grpc_address, "live-readers", TOPIC, "room-7")
    try:
        body = f"for a live reader {time.time_ns()}"
        send(cluster, "group-a", TOPIC, body)
        wait_until(lambda: body.encode() in consumer.received, 20, "the consumer got it",
                   poll_s=0.05)  # fmt: skip
        page = browser.page
        page.goto(f"{cluster.console_url}/console/groups/live-readers")
        members = page.get_by_role("table", name="Members")
        assert consumer.client_id in members.inner_text()
        assert "room-7" in members.inner_text()
        assert "127.0.0.1" in members.inner_text()  # its host, as the broker sees it
        offsets = page.get_by_role("table", name="Committed offsets")
        # A push consumer pulls every queue it owns (long polls), so each has its owner.
        wait_until(lambda: _owned(page, consumer.client_id), 15,
                   "every queue shows the consumer as its owner", poll_s=0.5)  # fmt: skip
        assert offsets.locator("tbody tr").count() == 2 * QUEUES
        browser.screenshot("group-live")
    finally:
        consumer.stop()
    assert browser.problems == []


def _owned(page: Any, client_id: str) -> bool:
    page.reload()
    rows = page.get_by_role("table", name="Committed offsets").locator("tbody tr")
    texts = [rows.nth(i).inner_text() for i in range(rows.count())]
    return len(texts) == 2 * QUEUES and all(client_id in t for t in texts)


def test_producers_and_the_consumers_of_a_topic_are_listed(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    nameserver, page = cluster.nameserver.grpc_address, browser.page
    producer = LiveProducer(nameserver, "console-producers", "console-test-producer")
    try:
        consumer = LiveConsumer(nameserver, "topic-readers", TOPIC, "room-3")
    except BaseException:
        producer.stop()
        raise
    try:
        producer.send(TOPIC, b"from a live producer")
        page.goto(f"{cluster.console_url}/console/producers")
        row = page.get_by_role("table", name="Producers").get_by_role("row")
        row = row.filter(has_text="console-test-producer")
        assert "console-producers" in row.inner_text()
        assert "127.0.0.1" in row.inner_text()
        browser.screenshot("producers")
        page.goto(f"{cluster.console_url}/console/topics/{TOPIC}")
        readers = page.get_by_role("table", name="Consumers")
        wait_until(lambda: consumer.client_id in _reloaded(page, readers), 15,
                   "the topic page lists its live consumer", poll_s=0.5)  # fmt: skip
        mine = readers.get_by_role("row").filter(has_text=consumer.client_id)
        assert "room-3" in mine.inner_text() and "*" in mine.inner_text()
        assert mine.get_by_role("link", name="topic-readers").is_visible()
    finally:
        producer.stop()
        consumer.stop()
    assert browser.problems == []


def _reloaded(page: Any, part: Any) -> str:
    """The text of ``part`` of the page, reloaded."""
    page.reload()
    return str(part.inner_text())


def test_delayed_messages_waiting_are_shown_per_tier_of_the_timer_wheel(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    producer = LiveProducer(cluster.nameserver.grpc_address, "console-delays", "delayer")
    try:
        # Due in an hour: it waits in the tier of messages due at least 2048 s ahead.
        producer.send(TOPIC, b"later", deliver_at_ms=int(time.time() * 1000) + 3_600_000)
    finally:
        producer.stop()
    page = browser.page
    page.goto(f"{cluster.console_url}/console/scheduled")
    wheel = page.get_by_role("table", name="Timer wheel")
    wait_until(lambda: "2,048 s ahead" in _reloaded(page, wheel), 15,
               "the timer wheel shows the delayed message", poll_s=0.5)  # fmt: skip
    row = wheel.get_by_role("row").filter(has_text="2,048 s ahead")
    assert row.locator("td").nth(1).inner_text() == "11"
    assert row.locator("td").nth(3).inner_text() == "1"
    assert "UTC" in row.locator("td").nth(4).inner_text()
    waiting = page.get_by_role("table", name="Waiting per broker group").inner_text()
    assert all(g in waiting for g in GROUPS)
    browser.screenshot("scheduled")
    assert browser.problems == []


def test_a_live_setting_is_changed_on_the_broker_settings_page(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    page, broker = browser.page, cluster.brokers[("group-b", 1)]
    page.goto(f"{cluster.console_url}/console/config")
    button = page.get_by_role("button", name="Set store.retention_hours on group-b/1")
    form = page.locator("form").filter(has=button)
    form.locator("input[name=value]").fill("100")
    button.click()
    said = page.get_by_role("status").inner_text()
    assert "store.retention_hours = 100.0 on broker group-b/1" in said, said
    status, found = call("GET", f"{broker.http_url}/config")
    assert status == 200 and found["settings"]["store.retention_hours"] == 100, found
    row = page.get_by_role("table", name="Settings of group-b/1").get_by_role("row")
    assert "yes" in row.filter(has_text="store.retention_hours").inner_text()
    browser.screenshot("broker-settings")
    # A value the broker cannot take: its reason, and nothing changed.
    button = page.get_by_role("button", name="Set store.disk_full_ratio on group-b/1")
    page.locator("form").filter(has=button).locator("input[name=value]").fill("7")
    button.click()
    assert "disk_full_ratio" in page.get_by_role("alert").inner_text()
    status, found = call("GET", f"{broker.http_url}/config")
    assert found["settings"]["store.disk_full_ratio"] != 7
    assert browser.problems == []


def test_a_group_is_deleted_from_its_page(cluster: ConsoleCluster, browser: Browser) -> None:
    commit_to_end(cluster, "doomed")
    assert committed(cluster, "group-a", "doomed")
    page = browser.page
    page.goto(f"{cluster.console_url}/console/groups/doomed")
    page.get_by_role("button", name="Delete group doomed").click()
    assert "consumer group doomed deleted" in page.get_by_role("status").inner_text()
    assert page.get_by_role("link", name="doomed", exact=True).count() == 0
    for group in GROUPS:
        assert committed(cluster, group, "doomed") == {}
    assert browser.problems == []


def _put_topic(cluster: ConsoleCluster, group: str, topic: str, queues: int = 1) -> None:
    master = cluster.master(group)
    status, answer = call(
        "PUT", f"{master.http_url}/topics/{quote(topic, safe='')}",
        TopicSettings(queues, queues).to_json(),
    )  # fmt: skip
    assert status == 200, answer
    wait_until(lambda: call("GET", f"{cluster.console_url}/route/{quote(topic, safe='')}")[0]
               == 200, 15, f"{topic} is routed", poll_s=0.2)  # fmt: skip


def _column(page: Any, table: str, index: int) -> list[str]:
    rows = page.get_by_role("table", name=table).locator("tbody tr")
    return [rows.nth(i).locator("td").nth(index).inner_text() for i in range(rows.count())]


def test_the_topic_and_group_tables_sort_and_filter_and_tell_group_topics_apart(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    for topic in ("aa-first", "zz-last", "%RETRY%sorted", "%DLQ%sorted"):
        _put_topic(cluster, "group-b", topic)
    send(cluster, "group-a", TOPIC, "one stored, to sort by")
    page, base = browser.page, cluster.console_url
    page.goto(f"{base}/console/topics")
    names = _column(page, "Topics", 0)
    assert names[0].startswith("%DLQ%sorted") and names[-1] == "zz-last", names
    page.get_by_role("link", name="topic ▲").click()  # the sorted column, the other way
    assert _column(page, "Topics", 0)[0] == "zz-last"
    assert "order=desc" in page.url
    # Retry and dead-letter topics wear their kind.
    dlq = page.get_by_role("row").filter(has_text="%DLQ%sorted").locator(".kind.dlq")
    assert dlq.inner_text() == "dead letters"
    page.get_by_label("Filter by name").fill("sorted")
    page.get_by_label("kind").select_option("retry")
    page.get_by_role("button", name="Filter").click()
    assert _column(page, "Topics", 0) == ["%RETRY%sorted retry"]
    page.goto(f"{base}/console/topics?sort=stored&order=desc")
    stored = [int(v.replace(",", "")) for v in _column(page, "Topics", 2) if v != "—"]
    assert stored == sorted(stored, reverse=True) and stored[0] > 0, stored
    browser.screenshot("topics-sorted")
    page.goto(f"{base}/console/groups")
    page.get_by_role("link", name="lag (messages)").click()
    page.get_by_role("link", name="lag (messages) ▲").click()
    lags = [int(v.replace(",", "")) for v in _column(page, "Consumer groups", 2) if v != "—"]
    assert lags == sorted(lags, reverse=True), lags
    page.get_by_label("Filter by name").fill("billing")
    page.get_by_role("button", name="Filter").click()
    assert _column(page, "Consumer groups", 0) == [GROUP]
    assert browser.problems == []


def test_a_queue_read_from_an_offset_is_listed_a_page_at_a_time(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    _put_topic(cluster, "group-a", "paged")
    for i in range(25):
        send(cluster, "group-a", "paged", f"paged message {i}")
    page = browser.page
    page.goto(f"{cluster.console_url}/console/messages")
    page.locator("#f-q-topic").fill("paged")
    page.get_by_label("Broker group").select_option("group-a")
    page.get_by_label("Offset").fill("0")
    page.get_by_role("button", name="Read").click()
    listed = page.get_by_role("table", name="Messages of the queue").locator("tbody tr")
    assert listed.count() == 20
    assert "paged message 0" in listed.first.inner_text()
    page.get_by_role("link", name="Next page (2) →").click()
    assert listed.count() == 5
    assert "paged message 24" in listed.last.inner_text()
    assert "That is the end of the queue" in page.locator("main").inner_text()
    browser.screenshot("queue-paged")
    assert browser.problems == []


def test_a_topic_made_on_the_page_is_routed_and_takes_a_test_message(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    page, topic = browser.page, "made-in-console"
    page.goto(f"{cluster.console_url}/console/topics")
    page.get_by_label("Topic").fill(topic)
    page.get_by_label("Read queues").fill("3")
    page.get_by_label("Write queues").fill("3")
    page.get_by_role("button", name="Create or update").click()
    assert f"topic {topic}: 3 read / 3 write queues" in page.get_by_role("status").inner_text()
    for group in GROUPS:
        status, topics = call("GET", f"{cluster.master(group).http_url}/topics")
        assert status == 200, topics
        assert topics["topics"][topic]["read_queues"] == 3, (group, topics)
    wait_until(lambda: len(cluster.route_ids("group-a", topic)) == 2, 15,
               "the nameserver routes the new topic", poll_s=0.2)  # fmt: skip
    page.goto(f"{cluster.console_url}/console/topics/{topic}")
    page.get_by_label("Body").fill("hello from the console")
    page.get_by_label("Keys (space-separated)").fill("console-key")
    page.get_by_role("button", name="Send").click()
    sent = page.get_by_role("status").inner_text()
    assert sent.startswith("sent: message "), sent
    page.goto(f"{cluster.console_url}/console/messages?topic={topic}&key=console-key")
    assert "hello from the console" in page.locator("pre").inner_text()
    assert browser.problems == []


def test_a_reset_by_time_previews_then_changes_the_committed_offsets(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    for n in range(6):
        send(cluster, GROUPS[n % 2], TOPIC, f"reset-{n}")
    commit_to_end(cluster, GROUP)
    before = {g: committed(cluster, g, GROUP) for g in GROUPS}
    assert all(sum(offsets.values()) > 0 for offsets in before.values())
    page = browser.page
    page.goto(f"{cluster.console_url}/console/groups/{GROUP}")
    page.get_by_label("Topic").select_option(TOPIC)
    page.get_by_label("Time (UTC, ISO 8601)").fill("2000-01-01T00:00:00")
    page.get_by_role("button", name="Preview (dry run)").click()
    preview = page.get_by_role("region", name="Dry run: the offsets a reset would commit")
    assert preview.locator("tbody tr").count() == 2 * QUEUES
    assert {g: committed(cluster, g, GROUP) for g in GROUPS} == before, "a dry run changed them"
    browser.screenshot("reset-preview")
    page.get_by_label("Time (UTC, ISO 8601)").fill("2000-01-01T00:00:00")
    page.get_by_role("button", name="Reset offsets").click()
    page.get_by_role("region", name="Offsets committed").wait_for()
    for group in GROUPS:
        assert set(committed(cluster, group, GROUP).values()) == {0}, group
    # It says what became of the group's running members: here there are none.
    told = page.get_by_role("status").inner_text()
    assert "no member is consuming the topic: the group starts from these offsets" in told
    assert browser.problems == []


def test_resending_a_dead_letter_delivers_it_to_a_consumer(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    dlq = f"%DLQ%{GROUP}"
    master = cluster.master("group-b")
    status, answer = call("PUT", f"{master.http_url}/topics/{quote(dlq, safe='')}",
                          {"read_queues": 1, "write_queues": 1})  # fmt: skip
    assert status == 200, answer
    body = f"dead-{time.time_ns()}"
    send(cluster, "group-b", dlq, body,
         properties={"RETRY_TOPIC": TOPIC, "LAST_FAILURE": "handler raised KeyError"})  # fmt: skip
    page = browser.page
    page.goto(f"{cluster.console_url}/console/groups/{GROUP}")
    row = page.get_by_role("row").filter(has_text=body)
    wait_until(lambda: _reloaded_has(page, row), 15, "the dead letter is listed", poll_s=0.5)
    row.get_by_role("button", name=re.compile("^Resend")).click()
    assert "resent" in page.get_by_role("status").inner_text()
    browser.screenshot("dead-letters")
    assert body in _read_topic(cluster), "the resent message did not reach the topic"
    assert browser.problems == []


def _reloaded_has(page: Any, row: Any) -> bool:
    if row.count():
        return True
    page.reload()
    return bool(row.count())


def _read_topic(cluster: ConsoleCluster) -> list[str]:
    async def read() -> list[str]:
        bodies: list[str] = []
        async with PullConsumer([cluster.nameserver.grpc_address], "console-check") as reader:
            for queue in await reader.queues(TOPIC):
                offset = 0
                while True:
                    result = await reader.pull(TOPIC, queue, offset, 256, 0)
                    if not result.messages:
                        break
                    bodies += [m.body.decode() for m in result.messages]
                    offset = result.next_offset
        return bodies

    # Playwright's sync API keeps an event loop on this thread: the client gets its own.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(lambda: run_async(read())).result()


def test_the_switchover_button_moves_the_master(cluster: ConsoleCluster, browser: Browser) -> None:
    assert cluster.route_master("group-b") == 0
    page = browser.page
    page.goto(f"{cluster.console_url}/console/cluster")
    section = page.get_by_role("table", name="Brokers of group-b")
    section.get_by_role("link", name="Make master…").click()
    browser.screenshot("switchover-confirm")
    page.get_by_role("button", name="Confirm switchover to broker 1").click()
    assert "broker 1 is master" in page.get_by_role("status").inner_text()
    # The result page itself shows the roles after the switchover, not the old ones.
    roles = page.get_by_role("table", name="Brokers of group-b").evaluate(
        "t => [...t.tBodies[0].rows].map(r => [r.cells[0].innerText, r.cells[1].innerText])"
    )
    assert sorted(roles) == [["0", "slave"], ["1", "master"]], roles
    wait_until(lambda: cluster.route_master("group-b") == 1, 15,
               "the nameserver's route names broker 1 master of group-b", poll_s=0.2)  # fmt: skip
    assert browser.problems == []


def test_a_page_with_a_broker_not_answering_says_which_within_the_timeout(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    silent = cluster.brokers[("group-a", 1)]
    silent.pause()
    try:
        page = browser.page
        started = time.monotonic()
        page.goto(f"{cluster.console_url}/console/cluster")
        took_s = time.monotonic() - started
        alert = page.get_by_role("alert").inner_text()
        browser.screenshot("broker-down")
    finally:
        silent.resume()
    assert "broker group-a/1" in alert and "did not answer within" in alert, alert
    # The page waited for the silent broker once, in parallel with the others.
    assert took_s < BROKER_TIMEOUT_MS / 1000 + deadline(3.0), f"the page took {took_s:.1f} s"
    assert page.get_by_role("heading", name="Group group-b").is_visible()


def test_a_page_with_a_broker_killed_says_which_broker_is_gone(
    cluster: ConsoleCluster, browser: Browser
) -> None:
    page = browser.page
    page.goto(f"{cluster.console_url}/console/cluster")  # the console sees it live
    cluster.brokers[("group-a", 1)].kill()
    wait_until(lambda: 1 not in cluster.route_ids("group-a"), 15,
               "the killed slave left the route of group-a", poll_s=0.2)  # fmt: skip
    started = time.monotonic()
    page.goto(f"{cluster.console_url}/console/cluster")
    took_s = time.monotonic() - started
    alert = page.get_by_role("alert").inner_text()
    browser.screenshot("broker-killed")
    assert "broker group-a/1" in alert and "not registered any more" in alert, alert
    assert took_s < BROKER_TIMEOUT_MS / 1000 + deadline(3.0), f"the page took {took_s:.1f} s"
    assert browser.problems == []
