"""Framing benchmark: decode (and encode) rate of pipelined frames, in process, no sockets."""

from __future__ import annotations

import argparse
import json
import statistics
import time

from metaq.common.framing import FrameDecoder, FrameType, encode_frame
from metaq.common.v1.data_pb2 import SendRequest


def _stream(frames: int, payload_bytes: int) -> bytes:
    header = SendRequest(
        topic="bench", queue_id=3, producer_group="bench-producers", record_count=1
    ).SerializeToString()
    payload = bytes(payload_bytes)
    return b"".join(
        b"".join(encode_frame(FrameType.SEND, i + 1, header, payload)) for i in range(frames)
    )


def decode_rate(chunks: list[bytes]) -> tuple[int, float]:
    decoder = FrameDecoder()
    count = 0
    start = time.perf_counter()
    for chunk in chunks:
        count += len(decoder.feed(chunk))
    return count, time.perf_counter() - start


def decode_and_parse_rate(chunks: list[bytes]) -> float:
    """Frames/s when each frame's protobuf header is parsed too, as a broker must."""
    decoder = FrameDecoder()
    parse = SendRequest.FromString
    count = 0
    start = time.perf_counter()
    for chunk in chunks:
        for frame in decoder.feed(chunk):
            parse(frame.header)
            count += 1
    return count / (time.perf_counter() - start)


def encode_rate(frames: int, payload_bytes: int) -> float:
    header = SendRequest(topic="bench", queue_id=3, record_count=1).SerializeToString()
    payload = memoryview(bytes(payload_bytes))
    start = time.perf_counter()
    for i in range(frames):
        encode_frame(FrameType.SEND, i + 1, header, payload)
    return frames / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=1024, help="payload bytes per frame")
    parser.add_argument("--chunk", type=int, default=64 * 1024, help="bytes per feed()")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    stream = _stream(args.frames, args.payload)
    chunks = [stream[i : i + args.chunk] for i in range(0, len(stream), args.chunk)]
    frame_bytes = len(stream) // args.frames
    print(
        f"{args.frames} frames of {frame_bytes} bytes ({args.payload} B payload), "
        f"fed in {len(chunks)} chunks of {args.chunk} bytes"
    )
    rates = []
    for _ in range(args.rounds):
        count, seconds = decode_rate(chunks)
        assert count == args.frames
        rates.append(count / seconds)
    best, median = max(rates), statistics.median(rates)
    print(
        f"decode: best {best:,.0f} frames/s ({best * frame_bytes / 1e6:,.0f} MB/s), "
        f"median {median:,.0f} frames/s over {args.rounds} rounds"
    )
    parsed = [decode_and_parse_rate(chunks) for _ in range(args.rounds)]
    print(
        f"decode + parse SendRequest header: best {max(parsed):,.0f} frames/s, "
        f"median {statistics.median(parsed):,.0f}"
    )
    enc = [encode_rate(args.frames, args.payload) for _ in range(args.rounds)]
    print(f"encode: best {max(enc):,.0f} frames/s, median {statistics.median(enc):,.0f}")
    figures = {
        "decode_frames_s": round(median),
        "decode_parse_frames_s": round(statistics.median(parsed)),
        "encode_frames_s": round(statistics.median(enc)),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
