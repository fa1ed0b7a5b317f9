"""Assignment: 10 to 10,000 consumers of one group over 100 to 100,000 queues.

In this process, with the nameserver's own functions (``metaq.nameserver.assignment``,
pure): for each strategy, the time to compute the group's assignment, and the fraction of
the queues that change owner when one member joins (a new consumer id, drawn at random,
so it sorts anywhere among the others as real ids do) and when one leaves (a member drawn
at random). A member's fair share is ``1 / (members + 1)`` of the queues: a strategy
that moves only the joining member's queues moves about that fraction.

``sticky`` is the consumers' default, measured fed the running assignment as
``previous``, as the push consumer feeds it the holdings its members report in their
heartbeats; ``balanced_hash`` (stateless) is the default before it and ``average`` the
one before that. Queues are spread over brokers of 100 queues, all in one room; members
in another.

What ``sticky``'s holdings cost on the wire, with the broker's own membership table and
answer (``metaq.broker``) and the generated messages: the CONSUMER_HEARTBEAT answer to a
member whose copy of the list is up to date (every heartbeat but the first, when nothing
changed), to one whose copy predates the join and the reports that followed it, and the
whole list (a first heartbeat, or a broker restarted: what every answer was before the
answers carried only changes); and the ``GetAssignment`` request and answer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

POINTS: Final = ((10, 100), (100, 1_000), (1_000, 10_000), (10_000, 100_000))
QUICK_POINTS: Final = ((10, 100), (50, 500), (100, 1_000), (200, 2_000))
DEFAULT: Final = "sticky"
BEFORE: Final = "balanced_hash"
OLDEST: Final = "average"
STRATEGIES: Final = (DEFAULT, BEFORE, OLDEST)
FED_PREVIOUS: Final = frozenset({DEFAULT})


def _moved(before: Mapping[str, Sequence[Any]], after: Mapping[str, Sequence[Any]]) -> int:
    owner = {queue: member for member, share in before.items() for queue in share}
    return sum(1 for member, share in after.items() for queue in share if owner[queue] != member)


def measure(members: int, queues: int, seed: int = 7) -> dict[str, Any]:
    from metaq.nameserver.assignment import Member, QueueRef, assign

    rnd = random.Random(seed)
    brokers = max(1, queues // 100)
    topic = [QueueRef(f"broker-{b:04d}", q, "") for b in range(brokers) for q in range(100)]
    topic = topic[:queues]
    group = [Member(f"consumer-{rnd.getrandbits(48):012x}", "default") for _ in range(members)]
    newcomer = Member(f"consumer-{rnd.getrandbits(48):012x}", "default")
    leaver = rnd.choice(group)
    row: dict[str, Any] = {"members": members, "queues": queues, "share": 1 / (members + 1)}
    for name in STRATEGIES:
        sticky = name in FED_PREVIOUS
        began = time.perf_counter()
        running = assign(name, group, topic)
        row[f"{name}_compute_s"] = round(time.perf_counter() - began, 4)
        joined = assign(name, [*group, newcomer], topic, running if sticky else None)
        left = assign(name, [m for m in group if m != leaver], topic, running if sticky else None)
        row[f"{name}_moved_on_join"] = round(_moved(running, joined) / queues, 5)
        # The leaver's own queues are counted: they move whatever the strategy.
        held = {q: c for c, share in running.items() for q in share}
        moved_left = sum(1 for c, share in left.items() for q in share if held[q] != c)
        row[f"{name}_moved_on_leave"] = round(moved_left / queues, 5)
        sizes = [len(share) for share in joined.values()]
        row[f"{name}_spread"] = max(sizes) - min(sizes)
        if name == DEFAULT:
            row.update(wire_bytes(running, joined, newcomer.consumer_id))
    return row


TOPIC: Final = "scale-assignment"


def wire_bytes(
    running: Mapping[str, Sequence[Any]], joined: Mapping[str, Sequence[Any]], newcomer: str
) -> dict[str, int]:
    """Bytes of the heartbeat answers and the GetAssignment messages of one group."""
    from metaq.broker.consumers import ConsumerGroups
    from metaq.broker.handlers import heartbeat_answer
    from metaq.common.v1 import control_pb2 as pb

    groups = ConsumerGroups(timeout_s=30, epoch=1)

    def report(client_id: str, share: Sequence[Any], version: int) -> None:
        held = [(TOPIC, q.broker, q.queue_id) for q in share]
        groups.heartbeat(
            "g", client_id, computer_room="default", held=held, holdings_version=version
        )

    def answer_bytes(seq: int) -> int:
        changes = groups.changes("g", groups.epoch if seq else 0, seq)
        return heartbeat_answer(changes, 30, with_holdings=True).ByteSize()

    for client_id, share in running.items():
        report(client_id, share, 1)
    whole = answer_bytes(0)
    copy = groups.changes("g").seq
    for client_id, share in running.items():
        report(client_id, share, 1)  # a round of heartbeats that change nothing
    unchanged = answer_bytes(copy)
    for client_id, share in joined.items():
        if list(share) != list(running.get(client_id, ())):
            report(client_id, share, 2)
    after_join = answer_bytes(copy)

    request = pb.GetAssignmentRequest(
        consumer_group="g",
        topic=TOPIC,
        strategy=DEFAULT,
        members=[pb.AssignmentMember(consumer_id=c, computer_room="default") for c in joined],
    )
    for client_id, share in running.items():
        request.previous.add(
            consumer_id=client_id,
            queues=[
                pb.MessageQueue(topic=TOPIC, broker_name=q.broker, queue_id=q.queue_id)
                for q in share
            ],
        )
    reply = pb.GetAssignmentResponse(
        assignment=[
            pb.MemberQueues(
                consumer_id=client_id,
                queues=[
                    pb.MessageQueue(topic=TOPIC, broker_name=q.broker, queue_id=q.queue_id)
                    for q in joined[client_id]
                ],
            )
            for client_id in sorted(joined)
        ]
    )
    assert newcomer in joined
    return {
        "heartbeat_answer_bytes_whole": whole,
        "heartbeat_answer_bytes_unchanged": unchanged,
        "heartbeat_answer_bytes_after_join": after_join,
        "get_assignment_request_bytes": request.ByteSize(),
        "get_assignment_response_bytes": reply.ByteSize(),
    }


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    top = max(rows, key=lambda row: row["queues"])
    return {
        "assignment_rows": rows,
        "assignment_at": f"{top['members']} members, {top['queues']} queues",
        "assignment_moved_fraction_on_join": top[f"{DEFAULT}_moved_on_join"],
        "assignment_moved_fraction_on_join_before": top[f"{BEFORE}_moved_on_join"],
        "assignment_moved_fraction_on_join_average": top[f"{OLDEST}_moved_on_join"],
        "assignment_member_share": round(top["share"], 5),
        "assignment_compute_s": top[f"{DEFAULT}_compute_s"],
        "assignment_heartbeat_answer_bytes_before": top["heartbeat_answer_bytes_whole"],
        "assignment_heartbeat_answer_bytes": top["heartbeat_answer_bytes_unchanged"],
        "assignment_heartbeat_answer_bytes_after_join": top["heartbeat_answer_bytes_after_join"],
        "assignment_get_assignment_request_bytes": top["get_assignment_request_bytes"],
        "assignment_get_assignment_response_bytes": top["get_assignment_response_bytes"],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"| members | queues | share | {DEFAULT} + previous s | moved on join | moved on leave "
        f"| {BEFORE} s | moved on join | moved on leave | {OLDEST} s "
        "| moved on join | moved on leave |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        cells = [f"{row['members']:,}", f"{row['queues']:,}", f"{row['share']:.5f}"]
        for name in STRATEGIES:
            cells += [
                str(row[f"{name}_compute_s"]),
                f"{row[f'{name}_moved_on_join']:.5f}",
                f"{row[f'{name}_moved_on_leave']:.5f}",
            ]
        print("| " + " | ".join(cells) + " |")


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    x = [row["members"] for row in rows]
    for ax, key, title in (
        (axes[0], "moved_on_join", "fraction of queues moved when one joins"),
        (axes[1], "moved_on_leave", "fraction of queues moved when one leaves"),
        (axes[2], "compute_s", "time to compute, s"),
    ):
        for name, style in ((OLDEST, "o--"), (BEFORE, "o-"), (DEFAULT, "s:")):
            label = f"{name} + previous" if name in FED_PREVIOUS else name
            ax.plot(x, [row[f"{name}_{key}"] for row in rows], style, label=label)
        if key != "compute_s":
            ax.plot(x, [row["share"] for row in rows], "k:", label="the member's share")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("members (queues = 10 × members)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle("Assignment of one group's queues (one process, 2 cores)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
