"""The data source's options: parsed and validated on the driver, before any task runs.

Names follow Spark's Kafka source where one exists and are case-insensitive, as Spark's
options are. Anything wrong raises :class:`OptionError` naming the option, what was wrong
and what is accepted, so a job fails at planning instead of inside an executor.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from metaq.client.tags import TagFilter
from metaq.common.tls import TlsConfig, TlsError

EARLIEST: Final = -2
LATEST: Final = -1
"""Offset sentinels inside a JSON offsets option, as in the Kafka source."""

QueueOffsets = dict[str, dict[str, int]]
"""{topic: {"broker:queue": offset}}: the JSON form of starting/ending offsets."""


class OptionError(ValueError):
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
    tags: str = "*"
    consumer_group: str = ""
    max_messages_per_trigger: int = 0
    """0: no limit per micro-batch."""
    min_partitions: int = 0
    fail_on_data_loss: bool = True
    pull_batch_messages: int = 1024
    request_timeout_s: float = 10.0
    tls: TlsConfig | None = None
    """Set: nameservers and brokers are reached over TLS (options ``tls``, ``tlsCaFile``,
    ``tlsCertFile``, ``tlsKeyFile``; the files at the same paths on every executor)."""

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


_TLS_KEYS: Final = ("tls", "tlscafile", "tlscertfile", "tlskeyfile")
_SOURCE_KEYS: Final = {
    "nameservers",
    "topic",
    "topics",
    "topicpattern",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "tags",
    "consumergroup",
    "maxmessagespertrigger",
    "minpartitions",
    "failondataloss",
    "pullbatchmessages",
    "requesttimeoutms",
    *_TLS_KEYS,
}
_SPARK_KEYS: Final = ("path", "checkpointlocation", "queryname")
_SINK_KEYS: Final = {
    "nameservers",
    "topic",
    "producergroup",
    "batchmessages",
    "requesttimeoutms",
    *_TLS_KEYS,
}


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The read options, validated; raises OptionError naming what is wrong."""
    opts = _lower(options, _SOURCE_KEYS)
    chosen = [k for k in ("topic", "topics", "topicpattern") if opts.get(k)]
    if len(chosen) != 1:
        raise OptionError(
            "exactly one of the options 'topic', 'topics' (comma list) or 'topicPattern' "
            f"(regex) is needed; got {_names(chosen) or 'none'}"
        )
    topics: tuple[str, ...] = ()
    pattern = ""
    if chosen[0] == "topicpattern":
        pattern = opts["topicpattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option 'topicPattern' {pattern!r} is not a regex: {exc}") from None
    else:
        topics = tuple(dict.fromkeys(t.strip() for t in opts[chosen[0]].split(",") if t.strip()))
        if not topics:
            raise OptionError(f"option {chosen[0]!r} names no topic")
    starting = _offsets(opts, "startingoffsets", "earliest")
    ending = _offsets(opts, "endingoffsets", "latest")
    if streaming and "endingoffsets" in opts:
        raise OptionError("option 'endingOffsets' is for batch reads only; a stream has no end")
    if streaming and "endingtimestamp" in opts:
        raise OptionError("option 'endingTimestamp' is for batch reads only; a stream has no end")
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
    tags = opts.get("tags", "*")
    TagFilter.parse(tags)
    group = opts.get("consumergroup", "")
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
        starting_timestamp_ms=_int(opts, "startingtimestamp", "startingTimestamp", None, 0),
        ending_timestamp_ms=_int(opts, "endingtimestamp", "endingTimestamp", None, 0),
        tags=TagFilter.parse(tags).expression,
        consumer_group=group,
        max_messages_per_trigger=_int(opts, "maxmessagespertrigger", "maxMessagesPerTrigger", 0, 1)
        or 0,
        min_partitions=_int(opts, "minpartitions", "minPartitions", 0, 1) or 0,
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        pull_batch_messages=_int(opts, "pullbatchmessages", "pullBatchMessages", 1024, 1) or 1024,
        request_timeout_s=(_int(opts, "requesttimeoutms", "requestTimeoutMs", 10_000, 1) or 1)
        / 1000,
        tls=_tls(opts),
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options, _SINK_KEYS)
    return SinkOptions(
        nameservers=_nameservers(opts),
        topic=opts.get("topic", "").strip(),
        producer_group=opts.get("producergroup", "spark-writer"),
        batch_messages=_int(opts, "batchmessages", "batchMessages", 256, 1) or 256,
        request_timeout_s=(_int(opts, "requesttimeoutms", "requestTimeoutMs", 10_000, 1) or 1)
        / 1000,
        tls=_tls(opts),
    )


def _tls(opts: Mapping[str, str]) -> TlsConfig | None:
    """TLS when ``tls`` is true or any of its files is named; the files are read here, on
    the driver, so a wrong path fails the job at planning."""
    files = [opts.get(key, "").strip() for key in ("tlscafile", "tlscertfile", "tlskeyfile")]
    if not (_bool(opts, "tls", "tls", False) or any(files)):
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


def _lower(options: Mapping[str, str], known: set[str]) -> dict[str, str]:
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    for own in _SPARK_KEYS:  # Spark's own options, passed along to every source and sink
        opts.pop(own, None)
    unknown = sorted(set(opts) - known)
    if unknown:
        raise OptionError(
            f"unknown option(s) {_names(unknown)} for format('metaq'); known: "
            + ", ".join(sorted(known))
        )
    return opts


def _names(keys: list[str]) -> str:
    return ", ".join(repr(k) for k in keys)


def _nameservers(opts: Mapping[str, str]) -> tuple[str, ...]:
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


def _int(
    opts: Mapping[str, str], key: str, name: str, default: int | None, minimum: int
) -> int | None:
    if key not in opts:
        return default
    try:
        value = int(opts[key])
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {opts[key]!r}") from None
    if value < minimum:
        raise OptionError(f"option {name!r} must be at least {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    if key not in opts:
        return default
    value = opts[key].strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, got {opts[key]!r}")
    return value == "true"


def _offsets(opts: Mapping[str, str], key: str, default: str) -> str | QueueOffsets:
    name = "startingOffsets" if key.startswith("start") else "endingOffsets"
    raw = opts.get(key, default).strip()
    if raw.lower() in ("earliest", "latest"):
        return raw.lower()
    example = '{"orders": {"broker-a:0": 42, "broker-a:1": -2}}'
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {name!r} is neither earliest, latest nor JSON ({exc}); e.g. {example}"
        ) from None
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
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(
                    f"option {name!r}: offset of {topic}/{queue} must be an integer >= -2 "
                    f"(-2 earliest, -1 latest), got {offset!r}"
                )
            result[topic][queue] = offset
    return result
