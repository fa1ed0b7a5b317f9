"""Pure planning logic: option validation, range splitting, per-trigger caps, push-down."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    StringContains,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from metaq.common.model import QueueRoute, TopicRoute
from metaq.common.users import Credentials
from metaq.spark import stream
from metaq.spark.options import OptionError, parse_sink_options, parse_source_options
from metaq.spark.plan import DataLoss, QueueRange, QueueState, checked_range, split
from metaq.spark.pushdown import Pushed, push
from metaq.spark.schema import Projection, SchemaError
from metaq.spark.sink import RowError, _given_queue
from metaq.spark.stream import MetaqStreamReader, cap, up_to_target

NS = {"nameservers": "127.0.0.1:9876"}


def test_options_are_case_insensitive_and_json_offsets_are_parsed() -> None:
    options = parse_source_options(
        {**NS, "TOPICS": "a, b", "startingoffsets": '{"a": {"broker-a:0": 5}}'}, streaming=False
    )
    assert options.topics == ("a", "b")
    assert options.starting == {"a": {"broker-a:0": 5}}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"topic": "a", "startingOfsets": "earliest"}, ["unknown option", "startingofsets"]),
        ({"topic": "a", "topics": "b"}, ["exactly one of", "'topic'", "'topics'"]),
        ({"topic": "a", "startingOffsets": '{"a": {"0": 1}}'}, ["startingOffsets", "broker:queue"]),
        ({"topic": "a", "endingOffsets": "earliest"}, ["endingOffsets", "earliest"]),
        ({"topic": "a", "minPartitions": "0"}, ["minPartitions", "at least 1"]),
        ({"topic": "a", "failOnDataLoss": "maybe"}, ["failOnDataLoss", "true or false"]),
        ({"topicPattern": "("}, ["topicPattern", "regex"]),
        ({"topic": "a", "startingOffsetsByTimestamp": "soon"}, ["ByTimestamp", "not JSON"]),
        (
            {"topic": "a", "startingOffsetsByTimestamp": '{"a": {"b:0": -1}}'},
            ["'startingOffsetsByTimestamp'", "a/b:0", "epoch milliseconds", "-1"],
        ),
        (
            {"topic": "a", "endingOffsetsByTimestamp": '{"a": {"b:0": 5}}', "endingTimestamp": "9"},
            ["'endingTimestamp' and 'endingOffsetsByTimestamp'", "give one"],
        ),
        (
            {
                "topic": "a",
                "startingOffsets": '{"a": {"b:0": 5}}',
                "startingOffsetsByTimestamp": '{"a": {"b:0": 5, "b:1": 7}}',
            },
            ["'startingOffsets' and 'startingOffsetsByTimestamp'", "both name a/b:0"],
        ),
        ({"topic": "a", "maxMessagesPerPartition": "0"}, ["maxMessagesPerPartition", "at least"]),
        ({"topic": "a", "maxRecordsPerPartition": "9"}, ["Kafka", "'maxMessagesPerPartition'"]),
        ({"topic": "a", "minOffsetsPerTrigger": "9"}, ["Kafka", "'minMessagesPerTrigger'"]),
        ({"topic": "a", "minMessagesPerTrigger": "9"}, ["'minMessagesPerTrigger'", "streams"]),
        ({"topic": "a", "accessKey": "app"}, ["'accessKey' is set", "'secretKeyFile' is not"]),
        ({"topic": "a", "secretKeyFile": "/x"}, ["'secretKeyFile' is set", "'accessKey' is not"]),
        (
            {"topic": "a", "accessKey": "app", "secretKeyFile": "/no/such/secret"},
            ["'secretKeyFile'", "cannot read /no/such/secret"],
        ),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], words: list[str]) -> None:
    with pytest.raises(OptionError) as failure:
        parse_source_options({**NS, **options}, streaming=False)
    for word in words:
        assert word in str(failure.value)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"maxTriggerDelay": "soon", "minMessagesPerTrigger": "5"}, ["maxTriggerDelay", "'15m'"]),
        ({"maxTriggerDelay": "5m"}, ["'maxTriggerDelay'", "set 'minMessagesPerTrigger'"]),
        (
            {"minMessagesPerTrigger": "50", "maxMessagesPerTrigger": "10"},
            ["'minMessagesPerTrigger' (50) is above 'maxMessagesPerTrigger' (10)"],
        ),
        ({"endingOffsetsByTimestamp": '{"a": {"b:0": 5}}'}, ["batch reads only"]),
    ],
)
def test_bad_stream_options_name_the_option(options: dict[str, str], words: list[str]) -> None:
    with pytest.raises(OptionError) as failure:
        parse_source_options({**NS, "topic": "a", **options}, streaming=True)
    for word in words:
        assert word in str(failure.value)


def test_trigger_and_partition_options_are_parsed() -> None:
    options = parse_source_options(
        {**NS, "topic": "a", "minMessagesPerTrigger": "20", "maxTriggerDelay": "90s",
         "maxMessagesPerPartition": "1000",
         "startingOffsetsByTimestamp": '{"a": {"broker-a:1": 1767225600000}}'},
        streaming=True,
    )  # fmt: skip
    assert options.min_messages_per_trigger == 20
    assert options.max_trigger_delay_ms == 90_000
    assert options.max_messages_per_partition == 1000
    assert options.starting_by_timestamp == {"a": {"broker-a:1": 1767225600000}}
    assert parse_source_options({**NS, "topic": "a"}, streaming=True).max_trigger_delay_ms == (
        15 * 60_000
    )


def test_credentials_come_from_the_access_key_and_the_secret_key_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the-secret-key-of-app\n")
    options = parse_source_options(
        {**NS, "topic": "a", "accessKey": "app", "secretKeyFile": str(secret)}, streaming=False
    )
    assert options.credentials == Credentials("app", "the-secret-key-of-app")
    assert "the-secret-key-of-app" not in repr(options)
    sink = parse_sink_options({**NS, "accesskey": "app", "SECRETKEYFILE": str(secret)})
    assert sink.credentials == Credentials("app", "the-secret-key-of-app")
    secret.write_text("\n")
    with pytest.raises(OptionError, match=r"'secretKeyFile': .* is empty"):
        parse_sink_options({**NS, "accessKey": "app", "secretKeyFile": str(secret)})


def test_max_messages_per_partition_cuts_every_range_then_min_partitions_applies() -> None:
    ranges = [QueueRange("t", "b", 0, 10, 110), QueueRange("t", "b", 1, 0, 20)]
    pieces = split(ranges, 0, 30)
    assert [(p.queue_id, p.start, p.end) for p in pieces] == [
        (0, 10, 35), (0, 35, 60), (0, 60, 85), (0, 85, 110), (1, 0, 20),
    ]  # fmt: skip
    pieces = split(ranges, 12, 30)
    assert len(pieces) >= 12 and max(p.size for p in pieces) <= 30
    for queue, start, end in ((0, 10, 110), (1, 0, 20)):
        mine = sorted((p.start, p.end) for p in pieces if p.queue_id == queue)
        assert mine[0][0] == start and mine[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))


def test_min_messages_per_trigger_holds_a_batch_until_enough_wait_or_the_delay_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(stream.time, "monotonic", lambda: now[0])
    options = parse_source_options(
        {**NS, "topic": "t", "minMessagesPerTrigger": "10", "maxTriggerDelay": "60s"},
        streaming=True,
    )
    reader = MetaqStreamReader(options)
    start = {"t": {"b:0": 0}}
    # The first batch runs at once, whatever waits (Kafka's rule).
    assert not reader._delayed(start, {"t": {"b:0": 3}})
    now[0] += 1
    start = {"t": {"b:0": 3}}
    assert reader._delayed(start, {"t": {"b:0": 12}})  # 9 wait: too few
    assert not reader._delayed(start, {"t": {"b:0": 13}})  # 10 wait
    now[0] += 59
    start = {"t": {"b:0": 13}}
    assert reader._delayed(start, {"t": {"b:0": 14}})
    now[0] += 1  # 60 s after the last batch: whatever waits goes
    assert not reader._delayed(start, {"t": {"b:0": 14}})
    now[0] += 1
    assert reader._delayed({"t": {"b:0": 14}}, {"t": {"b:0": 15}})


def test_a_queue_column_names_one_writable_queue() -> None:
    queues = tuple(QueueRoute(b, f"{b}:1", q, "") for b in ("broker-a", "broker-b") for q in (0, 1))
    # Only the route's topic and writable queues matter here.
    route = cast(TopicRoute, SimpleNamespace(topic="orders", write_queues=queues))
    assert str(_given_queue(route, 1, "broker-b", 0)) == "broker-b:1"
    with pytest.raises(RowError, match="queue 1 on broker groups broker-a, broker-b"):
        _given_queue(route, 1, None, 4)
    with pytest.raises(RowError, match=r"row 4: .* no writable queue broker-a:2"):
        _given_queue(route, 2, "broker-a", 4)


def test_min_partitions_cuts_ranges_into_contiguous_pieces() -> None:
    pieces = split([QueueRange("t", "b", 0, 10, 110), QueueRange("t", "b", 1, 0, 20)], 6)
    assert len(pieces) >= 6
    for queue, start, end in ((0, 10, 110), (1, 0, 20)):
        mine = sorted((p.start, p.end) for p in pieces if p.queue_id == queue)
        assert mine[0][0] == start and mine[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))


def test_the_trigger_cap_is_shared_by_what_each_queue_has_waiting() -> None:
    start = {"t": {"b:0": 0, "b:1": 100}}
    latest = {"t": {"b:0": 300, "b:1": 200, "b:2": 100}}
    capped = cap(start, latest, 50)
    taken = {k: capped["t"][k] - start["t"].get(k, 0) for k in capped["t"]}
    assert sum(taken.values()) == 50
    assert taken["b:0"] > taken["b:1"] >= 1 and taken["b:2"] >= 1


def test_pushed_filters_become_tags_queues_and_a_time_range() -> None:
    since = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    filters = [
        In(("tags",), ("red", "blue")),
        EqualTo(("queue",), 3),
        GreaterThanOrEqual(("store_timestamp",), since),
        LessThan(("store_timestamp",), since + dt.timedelta(seconds=1)),
        StringContains(("msg_id",), "ab"),
    ]
    pushed, rest = push(filters, Pushed())
    assert pushed.tag_expression("*") == "blue || red"
    assert pushed.tag_expression("red || green") == "red"
    assert pushed.tag_expression("green") is None
    assert pushed.queues == frozenset({3})
    assert pushed.from_ms == int(since.timestamp() * 1000)
    assert pushed.until_ms == pushed.from_ms + 1000
    # Unsupported filters stay with Spark; the time bounds are exact (the source checks
    # each row's store time), so Spark need not check them again.
    assert rest == [filters[4]]


def test_not_null_filters_and_columns_spelled_otherwise_are_taken() -> None:
    filters = [IsNotNull(("tags",)), EqualTo(("Tags",), "red"), IsNotNull(("other",))]
    pushed, rest = push(filters, Pushed())
    assert pushed.tags == frozenset({"red"})
    assert rest == [filters[2]]


def test_a_user_schema_projects_columns_by_name_in_its_order() -> None:
    fields = [StructField("offset", LongType()), StructField("BODY", BinaryType())]
    projection = Projection.of(StructType(fields))
    assert projection.columns == ("offset", "body")
    assert projection.arrow.names == ["offset", "BODY"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ([StructField("value", BinaryType())], ["'value'", "not one of its", "body binary"]),
        ([StructField("queue", StringType())], ["'queue'", "string", "gives it as int", "cast"]),
        ([StructField("body", BinaryType()), StructField("Body", BinaryType())], ["twice"]),
        ([], ["names no column"]),
    ],
)
def test_a_user_schema_naming_what_the_source_lacks_is_refused(
    fields: list[StructField], words: list[str]
) -> None:
    with pytest.raises(SchemaError) as failure:
        Projection.of(StructType(fields))
    for word in words:
        assert word in str(failure.value)


def test_an_available_now_run_stops_at_its_target_and_leaves_later_queues_out() -> None:
    start = {"t": {"b:0": 10, "b:1": 0}}
    target = {"t": {"b:0": 40, "b:1": 5}}
    latest = {"t": {"b:0": 90, "b:1": 3, "b:2": 7}, "u": {"b:0": 4}}
    assert up_to_target(start, latest, target) == {"t": {"b:0": 40, "b:1": 3}}


QUEUE = QueueState("orders", QueueRoute("broker-a", "127.0.0.1:1", 0, ""), 10, 120)


@pytest.mark.parametrize(
    ("start", "end", "words"),
    [
        (500, 120, ["'startingOffsets'", "'orders'", "broker-a:0", "500", "end 120"]),
        (20, 130, ["'endingOffsets'", "broker-a:0", "130", "end 120"]),
        (60, 50, ["'startingOffsets' and 'endingOffsets'", "broker-a:0", "60", "50"]),
    ],
)
def test_an_offset_range_the_queue_cannot_hold_is_refused_naming_queue_and_offsets(
    start: int, end: int, words: list[str]
) -> None:
    with pytest.raises(OptionError) as failure:
        checked_range(QUEUE, start, end, fail_on_data_loss=False)
    for word in words:
        assert word in str(failure.value)


def test_a_start_retention_deleted_fails_unless_data_loss_is_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(DataLoss, match="offsets 3 to 9 were deleted by retention"):
        checked_range(QUEUE, 3, 50, fail_on_data_loss=True)
    assert checked_range(QUEUE, 3, 50, fail_on_data_loss=False) == (10, 50)
    assert checked_range(QUEUE, 3, 5, fail_on_data_loss=False) == (10, 10)
    assert "skipped (failOnDataLoss=false)" in caplog.text
    assert checked_range(QUEUE, 10, 120, fail_on_data_loss=True) == (10, 120)
