"""The fMP4 a server streams back, on the client: counted, decoded, and cut back into the blocks it came from."""

from __future__ import annotations

import io
from bisect import bisect_right

# How `rtv rollout --url` counts a block's frames from the stream (also written into summary.json).
FRAME_COUNTING_RULE = (
    "The concatenated fMP4 is demuxed once and every packet is decoded; each decoded frame is attributed to the binary "
    "frame (transport chunk) holding its packet's bytes, giving D_j decoded frames for transport chunk j, checked "
    "against that chunk's metadata fragment_frames (its num_frames counts the frames the block generated). The muxer writes a frame's fragment only when the next frame arrives, "
    "so every block's last frame travels in the next binary frame (the next media chunk, or the trailer): block k "
    "owns decoded frames [E_(k-1), E_k) with E_k = D_0 + ... + D_k + 1 (E_-1 = 0; the last block ends at the total)."
)


def count_mp4_frames(mp4: bytes) -> tuple[int, int, int]:
    """(video packets, width, height) of an MP4, without decoding."""
    import av

    with av.open(io.BytesIO(mp4), "r") as container:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        count = sum(1 for p in container.demux(stream) if p.dts is not None)
    return count, width, height


def decode_stream(chunks: list) -> tuple[list, list[int]]:
    """Decode the concatenated fMP4 of `chunks`: (RGB uint8 frames in order, decoded frames per transport chunk)."""
    import av

    starts, pos = [], 0
    for chunk in chunks:
        starts.append(pos)
        pos += len(chunk.data)
    data = b"".join(c.data for c in chunks)
    per_chunk = [0] * len(chunks)
    frames = []
    owners: list[int] = []  # transport chunk of each packet, in decode order
    with av.open(io.BytesIO(data), "r", format="mp4") as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if packet.dts is not None:
                owners.append(max(0, bisect_right(starts, packet.pos) - 1) if packet.pos is not None and packet.pos >= 0 else -1)
            for frame in packet.decode():
                frames.append(frame.to_ndarray(format="rgb24"))
    # No B-frames: frames come out in packet order, one per packet.
    for owner in owners[: len(frames)]:
        if owner >= 0:
            per_chunk[owner] += 1
    return frames, per_chunk


def split_blocks(frames: list, media_counts: list[int]) -> list[list]:
    """Cut decoded frames into blocks by FRAME_COUNTING_RULE (`media_counts`: D_j of the media chunks, in order)."""
    blocks, begin, total = [], 0, 0
    for k, count in enumerate(media_counts):
        total += count
        end = min(len(frames), total + 1) if k < len(media_counts) - 1 else len(frames)
        blocks.append(frames[begin:end])
        begin = end
    return blocks
