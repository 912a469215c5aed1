"""A property-based fuzzer against both live endpoints.

Each example is one connection that sends a short script of messages: random JSON (wrong types,
huge and empty values, unicode, non-finite numbers), valid messages with one field mutated, raw
text that is not JSON, binary frames where text is expected, messages out of order, and floods.
Properties: everything the server sends is a documented message (errors carry a documented code),
binary frames come right after their metadata, the connection ends with a documented close code
or stays usable, and afterwards a well-behaved session that ran beside the fuzzer finished
cleanly, the server answers, and no replica of this app logged a traceback.

The whole run happens twice: on an open server, and on one with API keys and allowed origins
configured, where each example also draws what it presents (the right key from an allowed
origin, or no key, a wrong key, a foreign origin); a refused connection must get nothing but
the refusal (one error naming why) and close 1008, whatever it sends.

FUZZ_EXAMPLES sets the number of examples per endpoint (CI runs the default).
"""

import asyncio
import base64
import glob
import json
import os
import threading
import urllib.request

import pytest
import websockets
from chatclient import jpeg
from conftest import chat_app_args, deployed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.ingress import access
from deployments.protocol import chat as chat_protocol
from deployments.protocol import errors

pytestmark = pytest.mark.timeout(900)

APP, PREFIX = "fuzz", "/fuzz"
VIDEO = PREFIX + "/v1/realtime/video"
CHAT = PREFIX + "/v1/video/chat/stream"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
COUNTS = {"video": 0, "chat": 0, "server_messages": 0}
QUIET_S = 1.0  # an example ends when the server has been quiet this long
READ_FOR_S = 4.0  # or after this long (a fuzzed session.start may ask for an hour of video)

VIDEO_TYPES = {"video.start", "video.chunk_metadata", "session.interaction.queued", "session.done", "session.pong", "error"}
CHAT_TYPES = {"response.start", "response.text.delta", "response.text.done", "response.evs_stats", "session.done", "video.frame.ack", "pong", "error"}
CODES = {v for k, v in vars(errors).items() if k.isupper() and isinstance(v, str) and not k.endswith("_MESSAGE")}
CODES |= {chat_protocol.IDLE_TIMEOUT, chat_protocol.FRAME_TOO_LARGE, chat_protocol.INVALID_IMAGE, chat_protocol.INVALID_AUDIO}
CODES |= {chat_protocol.NO_FRAMES, chat_protocol.QUERY_FAILED, chat_protocol.AUDIO_BUFFER_FULL}
CODES |= {access.UNAUTHORIZED, access.ORIGIN_NOT_ALLOWED, access.TOO_MANY_SESSIONS}
CLOSE_CODES = {1000, 1008, 1009, 1011, 1013}

KEY, ORIGIN = "fuzz-key-7", "http://app.example"
# What a client presents on the guarded server: (headers, origin, the refusal's code or None).
CREDENTIALS = {
    "right": ({"Authorization": f"Bearer {KEY}"}, ORIGIN, None),
    "no key": ({}, ORIGIN, access.UNAUTHORIZED),
    "wrong key": ({"Authorization": "Bearer not-the-key"}, ORIGIN, access.UNAUTHORIZED),
    "key in the query": ({}, None, None),  # ?api_key=, as a browser page sends it (see `url`)
    "foreign origin": ({"Authorization": f"Bearer {KEY}"}, "http://elsewhere.example", access.ORIGIN_NOT_ALLOWED),
}
OPEN = {"open": ({}, None, None)}


@pytest.fixture(scope="module", params=["open", "guarded"])
def guard(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def credentials(guard) -> dict:
    return CREDENTIALS if guard == "guarded" else OPEN


def url(address: str, path: str, credential: str) -> str:
    return f"ws://{address}{path}" + (f"?api_key={KEY}" if credential == "key in the query" else "")


@pytest.fixture(scope="module")
def address(serve_address, world_model_dir, omni_dir, guard):
    config = chat_app_args(
        world_model_dir,
        omni_dir,
        **({"api_keys": [KEY], "allowed_origins": [ORIGIN]} if guard == "guarded" else {}),
        max_sessions_per_replica=8,
        start_timeout_s=2.0,
        chat_config_timeout_s=2.0,
        chat_idle_timeout_s=5.0,
    )
    with deployed(APP, PREFIX, config):
        yield serve_address


# -- strategies ---------------------------------------------------------------------------------
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", " ", "\u0000", "\ud7ff\ue000", "💥" * 50, "x" * 5000, "data:image/png;base64,AAAA"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)

VIDEO_VALID = [
    {"type": "session.start", "prompt": "a meadow", "num_frames": 21},
    {"type": "session.start", "prompt": "a cave", "size": "64x64", "seconds": "1", "seed": 3},
    {"type": "session.interaction", "interaction": {"event_id": "e", "event": {"prompt": "night falls"}}},
    {"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {"actions": [["W"], ["A", "S"]]}}}},
    {"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {"camera": {"linear_velocity": [0, 0, 1]}}}}},
    {"type": "session.playback", "position_seconds": 0.5},
    {"type": "session.ping"},
    {"type": "session.stop"},
]
CHAT_VALID = [
    {"type": "session.config", "evs_enabled": False, "max_frames": 8},
    {"type": "video.frame", "data": jpeg(1), "frame_id": "a", "pts_ms": 0},
    {"type": "audio.chunk", "data": base64.b64encode(b"\0\0" * 800).decode()},
    {"type": "video.query", "text": "what is here?"},
    {"type": "ping"},
    {"type": "video.done"},
]


def mutated(valid: list[dict]):
    """A valid message with one field replaced, removed or added."""

    @st.composite
    def build(draw):
        message = json.loads(json.dumps(draw(st.sampled_from(valid))))
        keys = sorted(message)
        how = draw(st.sampled_from(["replace", "remove", "add", "type"]))
        if how == "replace":
            message[draw(st.sampled_from(keys))] = draw(values)
        elif how == "remove":
            message.pop(draw(st.sampled_from(keys)))
        elif how == "add":
            message[draw(st.text(min_size=1, max_size=12))] = draw(values)
        else:
            message["type"] = draw(st.one_of(st.text(max_size=20), st.sampled_from([m["type"] for m in valid])))
        return message

    return build()


def frames_for(valid: list[dict]):
    """One websocket frame: JSON text, raw text, binary, or a flood marker."""
    as_json = st.one_of(st.sampled_from(valid), mutated(valid), st.dictionaries(st.text(max_size=10), values, max_size=5), values)
    return st.one_of(
        as_json.map(lambda m: json.dumps(m, allow_nan=True)),
        as_json.map(lambda m: json.dumps(m, allow_nan=True).encode()),  # JSON in a binary frame
        st.text(max_size=200),
        st.binary(max_size=200),
        st.sampled_from(["", "{", "[]", "null", "{" * 2000, " " * 10]),
        st.just(("flood", 300)),
    )


def scripts(valid: list[dict]):
    return st.lists(frames_for(valid), min_size=1, max_size=6)


# -- one connection --------------------------------------------------------------------------------
async def play(address: str, path: str, script: list, allowed_types: set[str], credential: tuple[str, tuple] = ("open", OPEN["open"])) -> list[str]:
    """Send the script, read until the server goes quiet or closes; returns what broke the properties."""
    problems: list[str] = []
    name, (headers, origin, refusal) = credential
    ws = await websockets.connect(url(address, path, name), max_size=None, open_timeout=60, additional_headers=headers, origin=origin)
    if refusal is not None:
        return await refused(ws, script, refusal)
    expecting_binary = None
    try:
        for frame in script:
            if isinstance(frame, tuple):  # a flood of pings
                ping = json.dumps({"type": "session.ping" if path == VIDEO else "ping"})
                for _ in range(frame[1]):
                    await ws.send(ping)
            else:
                await ws.send(frame)
        deadline = asyncio.get_running_loop().time() + READ_FOR_S
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                raw = await asyncio.wait_for(ws.recv(), min(QUIET_S, max(left, 0.01)))
            except asyncio.TimeoutError:
                break  # quiet, or a long session still streaming: either way the connection is usable
            COUNTS["server_messages"] += 1
            if isinstance(raw, bytes):
                if expecting_binary is None or expecting_binary != len(raw):
                    problems.append(f"binary frame of {len(raw)} bytes without matching metadata")
                expecting_binary = None
                continue
            message = json.loads(raw)
            if message.get("type") not in allowed_types:
                problems.append(f"undocumented message type {message.get('type')!r}")
            if message.get("type") == "error":
                if not isinstance(message.get("message"), str):
                    problems.append(f"error without a message: {message}")
                if "code" in message and message["code"] not in CODES:
                    problems.append(f"undocumented error code {message['code']!r}")
                if message.get("code") == errors.INTERNAL_ERROR:
                    problems.append(f"internal error: {message}")
            if message.get("type") == "video.chunk_metadata":
                expecting_binary = message["byte_length"]
    except websockets.ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd else None
        if code not in CLOSE_CODES:
            problems.append(f"closed with {code}")
    finally:
        await ws.close()
    return problems


async def refused(ws, script: list, code: str) -> list[str]:
    """A connection the server must refuse: one error with `code`, then close 1008, whatever the client sends."""
    problems: list[str] = []
    received: list = []
    try:
        try:
            for frame in script:
                if not isinstance(frame, tuple):
                    await ws.send(frame)
        except websockets.ConnectionClosed:
            pass  # the refusal may close before the script is sent; what came before the close is still read
        try:
            async for raw in ws:
                received.append(raw)
        except websockets.ConnectionClosed:
            pass
    finally:
        await ws.close()
    messages = [json.loads(raw) if isinstance(raw, str) else raw for raw in received]
    if len(messages) != 1 or not isinstance(messages[0], dict) or messages[0].get("type") != "error" or messages[0].get("code") != code:
        problems.append(f"a refused connection ({code}) got {str(messages)[:300]}")
    if ws.close_code != 1008:
        problems.append(f"a refused connection ({code}) closed with {ws.close_code}")
    return problems


# -- a well-behaved session beside the fuzzer --------------------------------------------------------
class Bystander(threading.Thread):
    def __init__(self, address: str, credential: tuple) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.headers, self.origin, _ = credential
        self.sessions = 0
        self.problems: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        while not self.stop.is_set():
            ws = await websockets.connect(f"ws://{self.address}{VIDEO}", max_size=None, open_timeout=60,
                                          additional_headers=self.headers, origin=self.origin)
            async with ws:
                await ws.send(json.dumps({"type": "session.start", "prompt": "a calm lake", "num_frames": 45}))
                frames = 0
                async for raw in ws:
                    if isinstance(raw, bytes):
                        continue
                    message = json.loads(raw)
                    if message["type"] == "error":
                        self.problems.append(str(message))
                    elif message["type"] == "video.chunk_metadata":
                        frames += message["num_frames"]
                        try:  # after the last chunk the server may already have closed
                            await ws.send(json.dumps({"type": "session.playback", "position_seconds": frames / 16}))
                        except websockets.ConnectionClosed:
                            pass
                    elif message["type"] == "session.done":
                        self.sessions += 1
                if ws.close_code != 1000:
                    self.problems.append(f"closed with {ws.close_code}")


def replica_tracebacks() -> list[str]:
    import ray

    session_dir = ray._private.worker.global_worker.node.get_session_dir_path()
    found = []
    for path in glob.glob(os.path.join(session_dir, "logs", "serve", f"replica_{APP}_*.log")):
        with open(path, errors="replace") as f:
            text = f.read()
        if "Traceback" in text:
            found.append(f"{os.path.basename(path)}: {text[text.index('Traceback'):][:1500]}")
    return found


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)


def test_fuzz_both_endpoints_beside_a_well_behaved_session(address, report, guard, credentials):
    counts = dict.fromkeys(COUNTS, 0) | {"refused": 0}
    COUNTS.update(counts)
    bystander = Bystander(address, next(iter(credentials.values())))
    bystander.start()
    # Mostly the right credential: a refused example cannot reach the message handlers.
    presented = st.sampled_from([next(iter(credentials))] * 3 + list(credentials)[1:]).map(lambda name: (name, credentials[name]))

    @FUZZ
    @given(scripts(VIDEO_VALID), presented)
    def video(script, credential):
        COUNTS["video"] += 1
        COUNTS["refused"] += credential[1][2] is not None
        assert asyncio.run(play(address, VIDEO, script, VIDEO_TYPES, credential)) == []

    @FUZZ
    @given(scripts(CHAT_VALID), presented)
    def chat(script, credential):
        COUNTS["chat"] += 1
        COUNTS["refused"] += credential[1][2] is not None
        assert asyncio.run(play(address, CHAT, script, CHAT_TYPES, credential)) == []

    try:
        video()
        chat()
    finally:
        bystander.stop.set()
        bystander.join(120)
    report(f"fuzz ({guard}): {COUNTS['video']} video and {COUNTS['chat']} chat examples ({COUNTS['refused']} refused), "
           f"{COUNTS['server_messages']} server messages; bystander finished {bystander.sessions} sessions")

    assert bystander.sessions >= 1 and bystander.problems == []
    with urllib.request.urlopen(f"http://{address}{PREFIX}/healthz", timeout=30) as response:
        assert json.loads(response.read())["status"] == "ok"
    assert replica_tracebacks() == []
