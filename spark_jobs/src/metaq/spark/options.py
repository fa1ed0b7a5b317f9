"""The data source's options: parsed and validated on the driver, before any task runs.

Names follow Spark's Kafka source where one exists and are case-insensitive, as Spark's
options are; the shared loader (:mod:`metaq.common.config`) types them. Anything wrong
raises :class:`OptionError` naming the option, what was wrong and what is accepted, so a
job fails at planning instead of inside an executor.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from metaq.client.tags import TagFilter
from metaq.common.config import ConfigError, Schema, Setting
from metaq.common.tls import TlsConfig, TlsError
from metaq.common.users import Credentials, CredentialsError

EARLIEST: Final = -2
LATEST: Final = -1
"""Offset sentinels inside a JSON offsets option, as in the Kafka source."""

QueueOffsets = dict[str, dict[str, int]]
"""{topic: {"broker:queue": offset}}: the JSON form of starting/ending offsets (and, with
epoch milliseconds for offsets, of ``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp``)."""


class OptionError(ConfigError):
    """An option of ``format("metaq")`` is missing, unknown or malformed."""


@dataclass(frozen=True)
class SourceOptions:
    """What a read (batch or stream) was asked for."""

    nameservers: tuple[str, ...]
    topics: tuple[str, ...] = ()
    topic_pattern: str = ""
    starting: str | QueueOffsets = "earliest"
    ending: str | QueueOffsets = "latest"
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    starting_by_timestamp: QueueOffsets | None = None
    """Per-queue start times (epoch ms); queues left out follow ``starting``."""
    ending_by_timestamp: QueueOffsets | None = None
    tags: str = "*"
    consumer_group: str = ""
    max_messages_per_trigger: int = 0
    """0: no limit per micro-batch."""
    min_messages_per_trigger: int = 0
    """0: a micro-batch runs whatever waits; else it waits for this many messages, up to
    ``max_trigger_delay_ms`` after the last batch."""
    max_trigger_delay_ms: int = 15 * 60 * 1000
    min_partitions: int = 0
    max_messages_per_partition: int = 0
    """0: a queue's range is one partition (unless ``min_partitions`` cuts it)."""
    fail_on_data_loss: bool = True
    pull_batch_messages: int = 1024
    request_timeout_s: float = 10.0
    tls: TlsConfig | None = None
    """Set: nameservers and brokers are reached over TLS (options ``tls``, ``tlsCaFile``,
    ``tlsCertFile``, ``tlsKeyFile``; the files at the same paths on every executor)."""
    credentials: Credentials | None = None
    """Set (options ``accessKey``, ``secretKeyFile``): the user every request is signed as.
    Read on the driver and carried to the executors with the plan (never printed); unset,
    the client's own defaults apply in each process (``METAQ_ACCESS_KEY`` and so on)."""

    def matches(self, topic: str) -> bool:
        if self.topic_pattern:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


@dataclass(frozen=True)
class SinkOptions:
    """What a write was asked for."""

    nameservers: tuple[str, ...]
    topic: str = ""
    """The topic of rows without a ``topic`` column value."""
    producer_group: str = "spark-writer"
    batch_messages: int = 256
    request_timeout_s: float = 10.0
    tls: TlsConfig | None = None
    credentials: Credentials | None = None


_POSITIVE = Annotated[int, msgspec.Meta(ge=1)]
_NOT_NEGATIVE = Annotated[int, msgspec.Meta(ge=0)]
_SHARED: Final[dict[str, Any]] = {
    "nameservers": str,
    "topic": str,
    "requestTimeoutMs": _POSITIVE,
    "tls": bool,
    "tlsCaFile": str,
    "tlsCertFile": str,
    "tlsKeyFile": str,
    "accessKey": str,
    "secretKeyFile": str,
}
_SOURCE: Final = Schema(
    {
        **_SHARED,
        "topics": str,
        "topicPattern": str,
        "startingOffsets": str,
        "endingOffsets": str,
        "startingTimestamp": _NOT_NEGATIVE,
        "endingTimestamp": _NOT_NEGATIVE,
        "startingOffsetsByTimestamp": str,
        "endingOffsetsByTimestamp": str,
        "tags": str,
        "consumerGroup": str,
        "maxMessagesPerTrigger": _POSITIVE,
        "minMessagesPerTrigger": _POSITIVE,
        "maxTriggerDelay": str,
        "minPartitions": _POSITIVE,
        "maxMessagesPerPartition": _POSITIVE,
        "failOnDataLoss": bool,
        "pullBatchMessages": _POSITIVE,
    },
    noun="option",
    error=OptionError,
)
_SINK: Final = Schema(
    {**_SHARED, "producerGroup": str, "batchMessages": _POSITIVE},
    noun="option",
    error=OptionError,
)
_SPARK_KEYS: Final = ("path", "checkpointlocation", "queryname")
# The options that set a field of the same value, when given.
_SOURCE_FIELDS: Final = {
    "startingTimestamp": "starting_timestamp_ms",
    "endingTimestamp": "ending_timestamp_ms",
    "maxMessagesPerTrigger": "max_messages_per_trigger",
    "minMessagesPerTrigger": "min_messages_per_trigger",
    "minPartitions": "min_partitions",
    "maxMessagesPerPartition": "max_messages_per_partition",
    "failOnDataLoss": "fail_on_data_loss",
    "pullBatchMessages": "pull_batch_messages",
}
_SINK_FIELDS: Final = {"producerGroup": "producer_group", "batchMessages": "batch_messages"}
# Kafka's spellings of options metaq names by messages (its offsets count messages).
_KAFKA_NAMES: Final = {
    "maxoffsetspertrigger": "maxMessagesPerTrigger",
    "minoffsetspertrigger": "minMessagesPerTrigger",
    "maxrecordsperpartition": "maxMessagesPerPartition",
}
_DURATION: Final = re.compile(r"(\d+)\s*(ms|s|m|h|d)")
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The read options, validated; raises OptionError naming what is wrong."""
    opts = _read(options, _SOURCE)
    chosen = [k for k in ("topic", "topics", "topicPattern") if opts.get(k)]
    if len(chosen) != 1:
        raise OptionError(
            "exactly one of the options 'topic', 'topics' (comma list) or 'topicPattern' "
            f"(regex) is needed; got {_names(chosen) or 'none'}"
        )
    topics: tuple[str, ...] = ()
    pattern = ""
    if chosen[0] == "topicPattern":
        pattern = opts["topicPattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option 'topicPattern' {pattern!r} is not a regex: {exc}") from None
    else:
        topics = tuple(dict.fromkeys(t.strip() for t in opts[chosen[0]].split(",") if t.strip()))
        if not topics:
            raise OptionError(f"option {chosen[0]!r} names no topic")
    starting = _offsets("startingOffsets", opts.get("startingOffsets", "earliest"))
    ending = _offsets("endingOffsets", opts.get("endingOffsets", "latest"))
    if streaming and "endingOffsets" in opts:
        raise OptionError("option 'endingOffsets' is for batch reads only; a stream has no end")
    if streaming and "endingTimestamp" in opts:
        raise OptionError("option 'endingTimestamp' is for batch reads only; a stream has no end")
    if streaming and "endingOffsetsByTimestamp" in opts:
        raise OptionError(
            "option 'endingOffsetsByTimestamp' is for batch reads only; a stream has no end"
        )
    starting_by_time = _by_timestamp(opts, "startingOffsetsByTimestamp", "startingTimestamp")
    ending_by_time = _by_timestamp(opts, "endingOffsetsByTimestamp", "endingTimestamp")
    _disjoint(starting, starting_by_time, "startingOffsets", "startingOffsetsByTimestamp")
    _disjoint(ending, ending_by_time, "endingOffsets", "endingOffsetsByTimestamp")
    for name in ("minMessagesPerTrigger", "maxTriggerDelay"):
        if not streaming and name in opts:
            raise OptionError(f"option {name!r} is for streams only; a batch read has no triggers")
    low, high = opts.get("minMessagesPerTrigger", 0), opts.get("maxMessagesPerTrigger", 0)
    if low and high and low > high:
        raise OptionError(
            f"option 'minMessagesPerTrigger' ({low}) is above 'maxMessagesPerTrigger' "
            f"({high}); a batch could never hold enough messages"
        )
    if "maxTriggerDelay" in opts and not low:
        raise OptionError(
            "option 'maxTriggerDelay' bounds how long 'minMessagesPerTrigger' delays a "
            "batch; set 'minMessagesPerTrigger' too"
        )
    if ending == "earliest":
        raise OptionError("option 'endingOffsets' cannot be 'earliest'; use 'latest' or JSON")
    if isinstance(ending, dict) and any(v == EARLIEST for q in ending.values() for v in q.values()):
        raise OptionError("option 'endingOffsets' cannot hold -2 (earliest)")
    latest_inside = isinstance(starting, dict) and any(
        v == LATEST for q in starting.values() for v in q.values()
    )
    if latest_inside and not streaming:
        raise OptionError("option 'startingOffsets' cannot hold -1 (latest) in a batch read")
    if starting == "latest" and not streaming:
        raise OptionError("option 'startingOffsets' cannot be 'latest' in a batch read")
    tags = TagFilter.parse(opts.get("tags", "*"))
    group = opts.get("consumerGroup", "")
    if group:
        from metaq.common.names import check_group

        try:
            check_group(group)
        except Exception as exc:
            raise OptionError(f"option 'consumerGroup' {group!r}: {exc}") from None
    return SourceOptions(
        nameservers=_nameservers(opts),
        topics=topics,
        topic_pattern=pattern,
        starting=starting,
        ending=ending,
        tags=tags.expression,
        consumer_group=group,
        request_timeout_s=opts.get("requestTimeoutMs", 10_000) / 1000,
        tls=_tls(opts),
        credentials=_credentials(opts),
        starting_by_timestamp=starting_by_time,
        ending_by_timestamp=ending_by_time,
        max_trigger_delay_ms=_duration_ms("maxTriggerDelay", opts.get("maxTriggerDelay", "15m")),
        **{field: opts[name] for name, field in _SOURCE_FIELDS.items() if name in opts},
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _read(options, _SINK)
    return SinkOptions(
        nameservers=_nameservers(opts),
        topic=opts.get("topic", "").strip(),
        request_timeout_s=opts.get("requestTimeoutMs", 10_000) / 1000,
        tls=_tls(opts),
        credentials=_credentials(opts),
        **{field: opts[name] for name, field in _SINK_FIELDS.items() if name in opts},
    )


def _read(options: Mapping[str, str], schema: Schema) -> dict[str, Any]:
    """The options by their own spelling, typed. Spark's options are case-insensitive, and
    its own (path, checkpointLocation, queryName) reach every source and sink."""
    settings = {}
    for name, value in options.items():
        lowered = str(name).lower()
        if value is None or lowered in _SPARK_KEYS:
            continue
        key = schema.canonical(lowered)
        if key is None and lowered in _KAFKA_NAMES:
            raise OptionError(
                f"option {name!r} is the Kafka source's name; metaq's is "
                f"{_KAFKA_NAMES[lowered]!r} (its offsets count messages)"
            )
        if key is None:
            raise schema.unknown(lowered, "format('metaq')")
        settings[key] = Setting(str(value), f"option {key!r}", text=True)
    return schema.values(settings)


def _tls(opts: Mapping[str, Any]) -> TlsConfig | None:
    """TLS when ``tls`` is true or any of its files is named; the files are read here, on
    the driver, so a wrong path fails the job at planning."""
    files = [opts.get(key, "").strip() for key in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")]
    if not (opts.get("tls", False) or any(files)):
        return None
    ca, cert, key = files
    try:
        tls = TlsConfig(cert_file=cert, key_file=key, ca_file=ca)
        tls.check()
    except TlsError as exc:
        message = str(exc)
        for setting, option in (
            ("tls_ca_file", "tlsCaFile"),
            ("tls_cert_file", "tlsCertFile"),
            ("tls_key_file", "tlsKeyFile"),
        ):
            message = message.replace(setting, f"option {option!r}")
        raise OptionError(message) from None
    return tls


def _credentials(opts: Mapping[str, Any]) -> Credentials | None:
    """The user named by ``accessKey`` with the secret in ``secretKeyFile`` (the file
    ``metaq acl add-user`` hands out holds more; this is the secret alone, one line), read
    on the driver; None when neither option is given."""
    access = opts.get("accessKey", "").strip()
    file = opts.get("secretKeyFile", "").strip()
    if not (access or file):
        return None
    if not (access and file):
        given, missing = "accessKey", "secretKeyFile"
        if not access:
            given, missing = missing, given
        raise OptionError(
            f"option {given!r} is set but {missing!r} is not; an authenticated read or "
            "write needs both (the user's access key and a file holding its secret key)"
        )
    try:
        secret = Path(file).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"option 'secretKeyFile': cannot read {file} ({exc})") from None
    if not secret:
        raise OptionError(f"option 'secretKeyFile': {file} is empty; it must hold the secret key")
    try:
        return Credentials(access, secret)
    except CredentialsError as exc:
        raise OptionError(f"option 'accessKey': {exc}") from None


def _duration_ms(name: str, value: str) -> int:
    """A duration as Kafka's options spell it (``15m``, ``30s``, ``500ms``), in ms."""
    found = _DURATION.fullmatch(value.strip().lower())
    if found is None:
        raise OptionError(
            f"option {name!r}: {value!r} is not a duration; give a whole number with a unit "
            "ms, s, m, h or d, e.g. '30s' or '15m'"
        )
    return int(found[1]) * _UNIT_MS[found[2]]


def _by_timestamp(opts: Mapping[str, Any], name: str, whole: str) -> QueueOffsets | None:
    """``startingOffsetsByTimestamp``-like JSON: epoch ms per queue, none negative."""
    if name not in opts:
        return None
    if whole in opts:
        raise OptionError(
            f"options {whole!r} and {name!r} both set a time to read from; give one "
            f"({whole!r} for every queue, {name!r} per queue)"
        )
    parsed = _offsets(name, opts[name], times=True)
    assert isinstance(parsed, dict)
    return parsed


def _disjoint(
    spec: str | QueueOffsets, by_time: QueueOffsets | None, name: str, time_name: str
) -> None:
    """A queue named by both offsets JSON and timestamps JSON is ambiguous."""
    if not isinstance(spec, dict) or not by_time:
        return
    both = sorted(
        f"{topic}/{queue}" for topic, queues in by_time.items() for queue in queues
        if queue in spec.get(topic, {})
    )  # fmt: skip
    if both:
        raise OptionError(
            f"options {name!r} and {time_name!r} both name {', '.join(both)}; name each "
            "queue in one of them"
        )


def _names(keys: list[str]) -> str:
    return ", ".join(repr(k) for k in keys)


def _nameservers(opts: Mapping[str, Any]) -> tuple[str, ...]:
    raw = opts.get("nameservers") or os.environ.get("METAQ_NAMESERVERS", "")
    found = tuple(a.strip() for a in raw.split(",") if a.strip())
    if not found:
        raise OptionError(
            "option 'nameservers' (host:port, comma list) is needed, or METAQ_NAMESERVERS"
        )
    for address in found:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option 'nameservers': {address!r} is not host:port")
    return found


def _offsets(name: str, value: str, *, times: bool = False) -> str | QueueOffsets:
    """Offsets JSON (or ``earliest``/``latest``); with ``times``, epoch ms per queue."""
    raw = value.strip()
    example = (
        '{"orders": {"broker-a:0": 1767225600000}}'
        if times
        else '{"orders": {"broker-a:0": 42, "broker-a:1": -2}}'
    )
    if not times and raw.lower() in ("earliest", "latest"):
        return raw.lower()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        what = "not JSON" if times else "neither earliest, latest nor JSON"
        raise OptionError(f"option {name!r} is {what} ({exc}); e.g. {example}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {name!r} must be a JSON object like {example}")
    result: QueueOffsets = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} must map to an object {example}")
        result[topic] = {}
        for queue, offset in queues.items():
            broker, sep, qid = str(queue).rpartition(":")
            if not sep or not broker or not qid.isdigit():
                raise OptionError(
                    f"option {name!r}: queue {queue!r} of {topic!r} is not 'broker:queue-id'"
                )
            whole = isinstance(offset, int) and not isinstance(offset, bool)
            if times and not (whole and offset >= 0):
                raise OptionError(
                    f"option {name!r}: the time of {topic}/{queue} must be epoch milliseconds "
                    f"(an integer >= 0), got {offset!r}"
                )
            if not whole or offset < EARLIEST:
                raise OptionError(
                    f"option {name!r}: offset of {topic}/{queue} must be an integer >= -2 "
                    f"(-2 earliest, -1 latest), got {offset!r}"
                )
            result[topic][queue] = offset
    return result
