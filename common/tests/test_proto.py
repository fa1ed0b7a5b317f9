"""The protobuf contract: generated modules, message round trips, and the generator check."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.common.errors import (
    CorruptLog,
    ErrorCode,
    InvalidMessage,
    InvalidRecord,
    MetaqError,
    ProtocolError,
    StoreUnavailable,
)
from metaq.common.v1 import control_pb2, control_pb2_grpc, data_pb2

COMMON = Path(__file__).resolve().parent.parent
GENERATED = COMMON / "src" / "metaq" / "common" / "v1"

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metaq_generate", COMMON / "scripts" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- generated modules ------------------------------------------------------------------


def test_generated_modules_live_in_metaq_common_v1_but_keep_the_proto_package() -> None:
    assert data_pb2.SendRequest.__module__ == "metaq.common.v1.data_pb2"
    assert control_pb2.TopicRoute.__module__ == "metaq.common.v1.control_pb2"
    assert data_pb2.DESCRIPTOR.name == "metaq/v1/data.proto"
    assert data_pb2.DESCRIPTOR.package == "metaq.v1"
    assert data_pb2.SendRequest.DESCRIPTOR.full_name == "metaq.v1.SendRequest"
    assert control_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name == (
        "metaq.v1.NameServer"
    )


def test_grpc_module_offers_stub_servicer_and_registration() -> None:
    assert callable(control_pb2_grpc.NameServerStub)
    assert callable(control_pb2_grpc.add_NameServerServicer_to_server)
    methods = set(control_pb2.DESCRIPTOR.services_by_name["NameServer"].methods_by_name)
    assert methods == {
        "Session",
        "RegisterBroker",
        "UnregisterBroker",
        "GetRoute",
        "GetClusterInfo",
        "GetAssignment",
        "GetAssignmentFor",
        "GetControllerState",
        "Switchover",
    }
    for name in methods:
        assert hasattr(control_pb2_grpc.NameServerServicer, name)


def test_every_generated_file_has_a_stub_for_mypy() -> None:
    modules = {p.stem for p in GENERATED.glob("*_pb2*.py")}
    stubs = {p.stem for p in GENERATED.glob("*_pb2*.pyi")}
    assert modules == stubs == {"data_pb2", "control_pb2", "control_pb2_grpc"}


def test_generated_code_was_made_by_versions_the_runtime_floor_admits() -> None:
    """The generated modules refuse an older runtime, so the declared floors must cover them."""
    deps = tomllib.loads((COMMON / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {
        m.group(1): tuple(int(x) for x in m.group(2).split("."))
        for m in (re.match(r"([\w-]+)>=([\d.]+)", d) for d in deps)
        if m
    }
    gencode = re.search(
        r"Protobuf Python Version: ([\d.]+)", (GENERATED / "data_pb2.py").read_text()
    )
    grpc_gen = re.search(
        r"GRPC_GENERATED_VERSION = '([\d.]+)'", (GENERATED / "control_pb2_grpc.py").read_text()
    )
    assert gencode is not None and grpc_gen is not None
    assert tuple(int(x) for x in gencode.group(1).split(".")) <= floors["protobuf"]
    assert tuple(int(x) for x in grpc_gen.group(1).split(".")) <= floors["grpcio"]


# --- the generator and its check ----------------------------------------------------------


def test_regenerating_reproduces_the_checked_in_files(tmp_path: Path) -> None:
    generator = load_generator()

    written = generator.generate(tmp_path)

    assert {p.name for p in written} == {p.name for p in GENERATED.iterdir() if p.is_file()}
    assert generator.compare(tmp_path, GENERATED) == []
    for path in written:
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) metaq\.v1\b", text, re.MULTILINE), path.name


def test_the_check_reports_stale_missing_and_orphaned_files(tmp_path: Path) -> None:
    generator = load_generator()
    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    generator.generate(fresh)
    shutil.copytree(fresh, stale)
    (stale / "data_pb2.pyi").write_text((stale / "data_pb2.pyi").read_text() + "# edited\n")
    (stale / "control_pb2.py").unlink()
    (stale / "gone_pb2.py").write_text("")

    problems = generator.compare(fresh, stale)

    assert len(problems) == 3
    assert any(p.startswith("missing:") and "control_pb2.py" in p for p in problems)
    assert any(p.startswith("not generated") and "gone_pb2.py" in p for p in problems)
    assert any(
        p.startswith("stale:") and "+# edited" not in p and "-# edited" in p for p in problems
    )


def test_the_check_command_passes_on_fresh_files_and_fails_with_advice_on_stale_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generator = load_generator()
    out = tmp_path / "v1"
    assert generator.main(["--out", str(out)]) == 0
    assert generator.main(["--check", "--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out

    (out / "data_pb2.py").write_text("# hand-edited\n")

    assert generator.main(["--check", "--out", str(out)]) == 1
    assert "run `make generate`" in capsys.readouterr().err


# --- the Python mirror of the error codes ---------------------------------------------------


def test_error_codes_mirror_the_error_response_enum_name_for_name() -> None:
    wire = dict(data_pb2.ErrorResponse.Code.items())
    assert {c.name: c.value for c in ErrorCode} == wire


def test_each_error_carries_the_code_a_broker_would_answer_with() -> None:
    assert MetaqError.code is ErrorCode.INTERNAL
    assert InvalidMessage.code is ErrorCode.INVALID_MESSAGE
    assert InvalidRecord.code is ErrorCode.INVALID_MESSAGE
    assert StoreUnavailable.code is ErrorCode.STORE_UNAVAILABLE
    assert StoreUnavailable.retriable
    assert CorruptLog("p", 0, "r").code is ErrorCode.INTERNAL
    error = ProtocolError(ErrorCode.FRAME_TOO_LARGE, "too big")
    assert (error.code, str(error), error.retriable) == (
        ErrorCode.FRAME_TOO_LARGE,
        "too big",
        False,
    )


def test_every_header_enum_starts_unspecified_so_a_missing_status_is_not_ok() -> None:
    assert data_pb2.SendResponse().status == data_pb2.SendResponse.STATUS_UNSPECIFIED
    assert data_pb2.PullResponse().status == data_pb2.PullResponse.STATUS_UNSPECIFIED
    assert data_pb2.ErrorResponse().code == data_pb2.ErrorResponse.UNSPECIFIED
    assert data_pb2.SendResponse.OK != 0
    assert data_pb2.PullResponse.FOUND != 0


def test_pull_statuses_are_the_store_get_statuses_and_the_reset() -> None:
    names = [n for n, _ in data_pb2.PullResponse.Status.items()]
    assert names == [
        "STATUS_UNSPECIFIED",
        "FOUND",
        "NO_MATCHED_MESSAGE",
        "NO_MESSAGE_IN_QUEUE",
        "OFFSET_TOO_SMALL",
        "OFFSET_OVERFLOW_ONE",
        "OFFSET_OVERFLOW_BADLY",
        "OFFSET_MOVED",
        "OFFSET_RESET",  # the pull handler's own: the group's offsets were reset
    ]


# --- message round trips ----------------------------------------------------------------


@given(
    topic=text,
    queue_id=u32,
    group=text,
    flags=u32,
    count=u32,
    status=st.sampled_from([v for _, v in data_pb2.SendResponse.Status.items()]),
    offsets=st.lists(u64, max_size=20),
    ids=st.lists(st.binary(min_size=16, max_size=16), max_size=20),
)
def test_send_headers_round_trip(
    topic: str,
    queue_id: int,
    group: str,
    flags: int,
    count: int,
    status: data_pb2.SendResponse.Status.ValueType,
    offsets: list[int],
    ids: list[bytes],
) -> None:
    request = data_pb2.SendRequest(
        topic=topic, queue_id=queue_id, producer_group=group, flags=flags, record_count=count
    )
    response = data_pb2.SendResponse(
        status=status,
        queue_offsets=offsets,
        commitlog_offsets=offsets[::-1],
        msg_ids=ids,
        store_timestamp_ms=1_700_000_000_000,
    )

    assert data_pb2.SendRequest.FromString(request.SerializeToString()) == request
    assert data_pb2.SendResponse.FromString(response.SerializeToString()) == response


@given(
    offset=u64,
    tag_codes=st.lists(u32, max_size=10),
    expression=text,
    commit=st.none() | u64,
    status=st.sampled_from([v for _, v in data_pb2.PullResponse.Status.items()]),
    bounds=st.tuples(u64, u64, u64),
)
def test_pull_headers_round_trip_and_keep_commit_offset_presence(
    offset: int,
    tag_codes: list[int],
    expression: str,
    commit: int | None,
    status: data_pb2.PullResponse.Status.ValueType,
    bounds: tuple[int, int, int],
) -> None:
    request = data_pb2.PullRequest(
        consumer_group="cg",
        topic="orders",
        queue_id=2,
        offset=offset,
        max_messages=32,
        max_bytes=1 << 20,
        tag_codes=tag_codes,
        tag_expression=expression,
        long_poll_timeout_ms=15_000,
    )
    if commit is not None:
        request.commit_offset = commit
    nxt, lo, hi = bounds
    response = data_pb2.PullResponse(
        status=status, next_offset=nxt, min_offset=lo, max_offset=hi, record_count=3
    )

    parsed = data_pb2.PullRequest.FromString(request.SerializeToString())

    assert parsed == request
    # Committing offset 0 differs from not committing: presence must survive the wire.
    assert parsed.HasField("commit_offset") == (commit is not None)
    assert data_pb2.PullResponse.FromString(response.SerializeToString()) == response


@given(
    code=st.sampled_from(list(ErrorCode)),
    message=text,
    retriable=st.booleans(),
    address=text,
)
def test_error_response_round_trips(
    code: ErrorCode, message: str, retriable: bool, address: str
) -> None:
    error = data_pb2.ErrorResponse(
        code=data_pb2.ErrorResponse.Code.ValueType(code),
        message=message,
        retriable=retriable,
        master_address=address,
    )

    assert data_pb2.ErrorResponse.FromString(error.SerializeToString()) == error


def _broker(group: str = "broker-a", broker_id: int = 0) -> control_pb2.BrokerState:
    return control_pb2.BrokerState(
        cluster="c1",
        broker_name=group,
        broker_id=broker_id,
        role=control_pb2.BROKER_ROLE_MASTER if broker_id == 0 else control_pb2.BROKER_ROLE_SLAVE,
        replication_mode=control_pb2.REPLICATION_MODE_SYNC,
        data_address=f"127.0.0.1:{9100 + broker_id}",
        computer_room="hz-1",
        epoch=4,
        permission=control_pb2.PERMISSION_READ_WRITE,
    )


def test_control_messages_round_trip() -> None:
    register = control_pb2.RegisterBrokerRequest(
        broker=_broker(),
        topic_table=control_pb2.TopicTable(
            topics=[
                control_pb2.TopicConfig(
                    topic="orders",
                    read_queues=8,
                    write_queues=8,
                    permission=control_pb2.PERMISSION_READ_WRITE,
                    ordered=True,
                )
            ]
        ),
    )
    # Within a session a heartbeat without a table differs from one with an empty table.
    bare = control_pb2.BrokerHeartbeat(broker=_broker(broker_id=1))
    empty = control_pb2.BrokerHeartbeat(broker=_broker(), topic_table=control_pb2.TopicTable())
    assert not control_pb2.BrokerHeartbeat.FromString(bare.SerializeToString()).HasField(
        "topic_table"
    )
    assert control_pb2.BrokerHeartbeat.FromString(empty.SerializeToString()).HasField("topic_table")
    route = control_pb2.GetRouteResponse(
        route=control_pb2.TopicRoute(
            topic="orders",
            groups=[
                control_pb2.GroupRoute(
                    cluster="c1",
                    broker_name="broker-a",
                    epoch=4,
                    computer_room="hz-1",
                    brokers=[
                        control_pb2.BrokerAddress(
                            broker_id=0,
                            role=control_pb2.BROKER_ROLE_MASTER,
                            data_address="127.0.0.1:9100",
                            computer_room="hz-1",
                        )
                    ],
                    read_queues=8,
                    write_queues=8,
                    permission=control_pb2.PERMISSION_WRITE_WIPE,
                )
            ],
        )
    )
    assignment = control_pb2.GetAssignmentRequest(
        consumer_group="cg",
        topic="orders",
        strategy="computer_room_first",
        members=[control_pb2.AssignmentMember(consumer_id="host@1@2", computer_room="hz-1")],
        previous=[
            control_pb2.MemberQueues(
                consumer_id="host@1@2",
                queues=[control_pb2.MessageQueue(topic="orders", broker_name="broker-a")],
            )
        ],
    )

    for message in (register, route, assignment):
        assert type(message).FromString(message.SerializeToString()) == message


# --- the service over a real (loopback) channel -------------------------------------------


class _NameServer(control_pb2_grpc.NameServerServicer):
    async def GetRoute(
        self,
        request: control_pb2.GetRouteRequest,
        context: grpc.aio.ServicerContext[
            control_pb2.GetRouteRequest, control_pb2.GetRouteResponse
        ],
    ) -> control_pb2.GetRouteResponse:
        if request.topic != "orders":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no route for {request.topic}")
        return control_pb2.GetRouteResponse(
            route=control_pb2.TopicRoute(
                topic="orders",
                groups=[control_pb2.GroupRoute(broker_name="broker-a", read_queues=4)],
            )
        )


@pytest.mark.skipif(sys.platform != "linux", reason="loopback gRPC server")
def test_the_generated_service_answers_over_grpc_aio() -> None:
    async def scenario() -> tuple[control_pb2.GetRouteResponse, grpc.StatusCode]:
        server = grpc.aio.server()
        # The other methods answer UNIMPLEMENTED, as the generated base class does.
        servicer = _NameServer()  # type: ignore[abstract]
        control_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = control_pb2_grpc.NameServerStub(channel)
                found = await stub.GetRoute(control_pb2.GetRouteRequest(topic="orders"))
                try:
                    await stub.GetRoute(control_pb2.GetRouteRequest(topic="nope"))
                except grpc.aio.AioRpcError as exc:
                    missing = exc.code()
                else:
                    raise AssertionError("an unknown topic must not have a route")
        finally:
            await server.stop(None)
        return found, missing

    found, missing = asyncio.run(scenario())

    assert found.route.groups[0].broker_name == "broker-a"
    assert found.route.groups[0].read_queues == 4
    assert missing is grpc.StatusCode.NOT_FOUND
