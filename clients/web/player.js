"use strict";
// The world-model player (served at /): one session on WS /v1/realtime/video, its fragmented MP4
// played through Media Source Extensions as the binary frames arrive, the keyboard sent as
// `session.interaction` actions once per block, and live figures. No framework, no build step.
// `window.rtvPlayer` holds the session's state for people poking in the console and for the tests.

const ACTION_KEYS = ["w", "a", "s", "d", "i", "j", "k", "l"]; // move forward/left/back/right, look up/left/down/right
const LIVE_MAX_LAG_BLOCKS = 2; // seek forward when more than this many blocks of video are buffered ahead...
const LIVE_TARGET_LAG_BLOCKS = 1; // ...to this far behind the live edge
// Buffered video kept behind the playhead; older is removed in batches. A removal also drops the frames
// after it up to the next keyframe, so this stays above the encoder's keyframe interval (x264's 250
// frames: 15.6 s at 16 fps) or the playhead itself would fall into the hole.
const KEEP_BEHIND_S = 60;
const TRIM_BATCH_S = 10;
const TICK_MS = 250;

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------------
// The codecs string, read from the init segment (ftyp + moov) at the start of the first binary
// frame: moov/trak/mdia/minf/stbl/stsd/avc1/avcC, whose bytes 1..3 are profile, constraints, level.
// ---------------------------------------------------------------------------------------------
function codecFromInit(buffer) {
  const data = new Uint8Array(buffer);
  const view = new DataView(buffer);
  const boxes = function* (start, end) {
    let offset = start;
    while (offset + 8 <= end) {
      let size = view.getUint32(offset);
      let header = 8;
      if (size === 1) {
        size = Number(view.getBigUint64(offset + 8));
        header = 16;
      } else if (size === 0) {
        size = end - offset;
      }
      if (size < header || offset + size > end) return;
      yield { type: String.fromCharCode(...data.subarray(offset + 4, offset + 8)), start: offset + header, end: offset + size };
      offset += size;
    }
  };
  const child = (box, types, skip = 0) => {
    for (const b of boxes(box.start + skip, box.end)) if (types.includes(b.type)) return b;
    throw new Error(`init segment: no ${types.join("/")} box`);
  };
  let box = { start: 0, end: data.length };
  for (const type of ["moov", "trak", "mdia", "minf", "stbl", "stsd"]) box = child(box, [type]);
  const entry = child(box, ["avc1", "avc3"], 8); // stsd: version/flags + entry count, then the entries
  const avcC = child(entry, ["avcC"], 78); // the visual sample entry's own fields come before its boxes
  const hex = (i) => data[avcC.start + i].toString(16).padStart(2, "0").toUpperCase();
  return `${entry.type}.${hex(1)}${hex(2)}${hex(3)}`;
}

// ---------------------------------------------------------------------------------------------
// Media Source Extensions: binary frames are appended in arrival order, queued while the
// SourceBuffer is updating; video behind the playhead is trimmed so a long session fits.
// ---------------------------------------------------------------------------------------------
class MsePlayer {
  constructor(video, onError) {
    this.video = video;
    this.onError = onError;
    this.queue = [];
    this.codec = null;
    this.sourceBuffer = null;
    this.ending = false;
    this.failed = false;
    this.mediaSource = new MediaSource();
    this.mediaSource.addEventListener("sourceopen", () => this.pump());
    video.src = URL.createObjectURL(this.mediaSource);
  }

  append(buffer) {
    if (this.failed) return;
    if (this.codec === null) this.codec = codecFromInit(buffer); // throws on a stream it cannot read
    this.queue.push(buffer);
    this.pump();
  }

  end() {
    this.ending = true;
    this.pump();
  }

  fail(text) {
    if (this.failed) return;
    this.failed = true;
    this.onError(text);
  }

  pump() {
    const ms = this.mediaSource;
    if (this.failed || ms.readyState !== "open" || this.codec === null) return;
    if (this.sourceBuffer === null) {
      const mime = `video/mp4; codecs="${this.codec}"`;
      if (!MediaSource.isTypeSupported(mime)) return this.fail(`this browser cannot play ${mime}`);
      try {
        this.sourceBuffer = ms.addSourceBuffer(mime);
      } catch (e) {
        return this.fail(`addSourceBuffer(${mime}) failed: ${e.message}`);
      }
      this.sourceBuffer.addEventListener("updateend", () => this.pump());
      this.sourceBuffer.addEventListener("error", () => this.fail("the SourceBuffer refused a media segment"));
    }
    const sb = this.sourceBuffer;
    if (sb.updating) return;
    const behind = this.video.currentTime - KEEP_BEHIND_S;
    if (sb.buffered.length && sb.buffered.start(0) < behind - TRIM_BATCH_S) {
      sb.remove(0, behind); // updateend pumps again
      return;
    }
    if (this.queue.length) {
      const next = this.queue.shift();
      try {
        sb.appendBuffer(next);
      } catch (e) {
        this.fail(`appendBuffer failed: ${e.name}: ${e.message}`);
      }
      return;
    }
    if (this.ending) {
      this.ending = false;
      ms.endOfStream();
    }
  }

  // Seconds buffered ahead of the playhead, and where the buffer ends.
  ahead() {
    const b = this.video.buffered;
    if (!b.length) return { ahead: 0, end: 0, start: 0 };
    const end = b.end(b.length - 1);
    return { ahead: Math.max(0, end - this.video.currentTime), end, start: b.start(0) };
  }
}

// ---------------------------------------------------------------------------------------------
// The session.
// ---------------------------------------------------------------------------------------------
const player = (window.rtvPlayer = {
  state: "idle",
  requestId: null,
  generation: null,
  codec: null,
  chunks: [], // per binary frame: {index, kind, block, num_frames, started, active, completed, at}
  interactions: {}, // event_id -> {keys | prompt, sentAt, queuedAt, startedBlock, completedBlock}
  errors: [], // every error shown on the page
  mediaErrors: [], // the ones from the media pipeline (MSE, the <video> element)
  stats: {},
  done: null,
});

let ws = null;
let mse = null;
let pendingMeta = null; // a video.chunk_metadata waiting for its binary frame
let startedAt = 0;
let keySeq = 0;
let promptSeq = 0;
const held = new Set(); // keys down now
const latched = new Set(); // keys pressed since the last send (a quick tap still counts once)
const video = $("video");

function setStatus(state, text) {
  player.state = state;
  $("status").dataset.state = state;
  $("status").textContent = text;
}

function showError(text) {
  player.errors.push(text);
  const li = document.createElement("li");
  li.textContent = text;
  $("errors").appendChild(li);
  log(`error: ${text}`);
}

function mediaError(text) {
  player.mediaErrors.push(text);
  showError(`media: ${text}`);
}

function log(text) {
  const li = document.createElement("li");
  li.textContent = `${((performance.now() - startedAt) / 1000).toFixed(2)}s ${text}`;
  const list = $("log");
  list.prepend(li);
  while (list.children.length > 200) list.lastChild.remove();
}

function send(message) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
}

function live() {
  return ws !== null && player.requestId !== null && player.done === null;
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function start() {
  const prompt = $("prompt").value.trim();
  if (!prompt) return showError("Enter a prompt first.");
  // Paced to playback: the server releases each chunk at its media time (half a second early),
  // so a key press lands on screen within about a block instead of behind a growing buffer.
  const message = { type: "session.start", prompt, extra_params: { pace_to_media_time: true, pacing_lead_seconds: 0.5 } };
  const seconds = $("seconds").value.trim();
  if (seconds) {
    if (!/^[1-9][0-9]*$/.test(seconds)) return showError("Length must be a whole number of seconds, or empty.");
    message.seconds = seconds;
  }
  const image = $("image").files[0];
  if (image) message.image_reference = { image_url: await readDataUrl(image) };

  if (ws) ws.close(1000);
  Object.assign(player, { requestId: null, generation: null, codec: null, chunks: [], interactions: {}, errors: [], mediaErrors: [], stats: {}, done: null });
  $("errors").replaceChildren();
  $("log").replaceChildren();
  pendingMeta = null;
  startedAt = performance.now();
  stats.reset();
  mse = new MsePlayer(video, mediaError);
  video.requestVideoFrameCallback?.(() => stats.firstFrame());

  setStatus("connecting", "Connecting…");
  $("start").disabled = true;
  const socket = (ws = openServerSocket("/v1/realtime/video"));
  socket.binaryType = "arraybuffer";
  socket.onopen = () => {
    socket.send(JSON.stringify(message));
    setStatus("connecting", "Waiting for the server to start the session…");
    log("session.start sent");
  };
  socket.onmessage = (event) => {
    if (socket !== ws) return;
    if (typeof event.data === "string") onMessage(JSON.parse(event.data));
    else onBinary(event.data);
  };
  socket.onclose = (event) => {
    if (socket !== ws) return;
    ws = null;
    $("start").disabled = false;
    $("stop").disabled = true;
    $("send-prompt").disabled = true;
    if (player.done === null) {
      showError(`connection closed before session.done (code ${event.code}${event.reason ? ": " + event.reason : ""})`);
      setStatus("error", `Ended with an error (close code ${event.code}).`);
    }
    if (mse) mse.end();
  };
}

function stop() {
  send({ type: "session.stop" });
  setStatus("stopping", "Stopping…");
  log("session.stop sent");
}

function onMessage(m) {
  switch (m.type) {
    case "video.start": {
      player.requestId = m.request_id;
      player.generation = m.generation || null;
      const g = player.generation;
      setStatus("streaming", "Streaming: waiting for the first block…");
      log(`video.start ${m.request_id}` + (g ? ` (${g.width}x${g.height} @ ${g.fps} fps, ${g.frames_per_block} latent frames a block)` : ""));
      $("stop").disabled = false;
      $("send-prompt").disabled = false;
      if (g && g.accepts_camera === false) log("this model takes no keyboard input: keys are shown but not sent");
      break;
    }
    case "video.chunk_metadata":
      if (pendingMeta) showError(`video.chunk_metadata ${m.transport_chunk_index} came before the binary frame of ${pendingMeta.transport_chunk_index}`);
      pendingMeta = m;
      break;
    case "session.interaction.queued": {
      const it = player.interactions[m.event_id] || (player.interactions[m.event_id] = {});
      it.queuedAt = performance.now();
      log(`queued ${m.event_id}`);
      break;
    }
    case "session.done":
      player.done = m;
      setStatus("done", `Done: ${m.chunks} chunks${m.stopped ? ", stopped" : ""}.`);
      log(`session.done (${m.chunks} chunks, stopped: ${m.stopped})`);
      $("stop").disabled = true;
      $("send-prompt").disabled = true;
      break;
    case "error": {
      const where = [m.code, m.event_id && `event ${m.event_id}`].filter(Boolean).join(", ");
      showError(`server: ${m.message}${where ? ` (${where})` : ""}${m.retry_after_s ? ` (retry after ${m.retry_after_s} s)` : ""}`);
      if (m.event_id && player.interactions[m.event_id]) player.interactions[m.event_id].failed = m.message;
      break;
    }
    case "session.pong":
      break;
    default:
      log(`ignored message ${m.type}`);
  }
}

function onBinary(data) {
  const meta = pendingMeta;
  pendingMeta = null;
  if (!meta) return showError(`a binary frame of ${data.byteLength} bytes came without its video.chunk_metadata`);
  if (meta.byte_length !== data.byteLength) showError(`chunk ${meta.transport_chunk_index}: ${data.byteLength} bytes, metadata says ${meta.byte_length}`);
  try {
    mse.append(data);
  } catch (e) {
    mediaError(`cannot read the stream's init segment: ${e.message}`);
    return;
  }
  if (player.codec === null) {
    player.codec = mse.codec;
    $("codec").textContent = `codec: video/mp4; codecs="${mse.codec}" (from the init segment)`;
  }
  video.play().catch(() => {}); // muted, so allowed; refused only before data, retried each tick
  const now = performance.now();
  const chunk = {
    index: meta.transport_chunk_index,
    kind: meta.kind,
    block: meta.generation_chunk_index,
    num_frames: meta.num_frames,
    bytes: data.byteLength,
    started: meta.started_event_ids || [],
    active: meta.active_event_ids || [],
    completed: meta.completed_event_ids || [],
    at: now,
  };
  player.chunks.push(chunk);
  stats.chunk(chunk);
  for (const id of chunk.started) {
    const it = player.interactions[id] || (player.interactions[id] = {});
    if (it.startedBlock === undefined) {
      it.startedBlock = chunk.block;
      it.startedAt = now;
      if (it.sentAt !== undefined && it.keys) stats.keyLatency(now - it.sentAt);
      log(`started ${id} in block ${chunk.block}`);
    }
  }
  for (const id of chunk.completed) {
    const it = player.interactions[id] || (player.interactions[id] = {});
    if (it.completedBlock === undefined) {
      it.completedBlock = chunk.block;
      log(`completed ${id} in block ${chunk.block}`);
    }
  }
  if (chunk.kind === "media") {
    if (player.state === "streaming") setStatus("streaming", `Streaming: block ${chunk.block}.`);
    sendKeys();
  }
}

// ---------------------------------------------------------------------------------------------
// Keyboard: the keys held (or tapped since the last send) go out once per received chunk, as one
// block of actions: one key list per latent frame.
// ---------------------------------------------------------------------------------------------
function sendKeys() {
  const keys = ACTION_KEYS.filter((k) => held.has(k) || latched.has(k));
  if (!keys.length || !live()) return;
  const g = player.generation;
  if (g && g.accepts_camera === false) return;
  const perBlock = (g && g.frames_per_block) || 3;
  const eventId = `keys-${++keySeq}-${keys.join("")}`;
  send({
    type: "session.interaction",
    interaction: { event_id: eventId, event: { multi_modal_data: { actions: Array.from({ length: perBlock }, () => keys) } } },
  });
  player.interactions[eventId] = { ...player.interactions[eventId], keys, sentAt: performance.now() };
  latched.clear();
  showKeys();
  log(`sent ${eventId}`);
}

function showKeys() {
  for (const tile of document.querySelectorAll(".key[data-key]")) {
    tile.classList.toggle("held", held.has(tile.dataset.key) || latched.has(tile.dataset.key));
  }
  const names = ACTION_KEYS.filter((k) => held.has(k)).map((k) => k.toUpperCase());
  $("held").textContent = names.length ? names.join(" ") : "none";
}

function press(key) {
  if (held.has(key)) return;
  held.add(key);
  latched.add(key);
  showKeys();
}

function release(key) {
  held.delete(key);
  showKeys();
}

function typing(target) {
  return target instanceof HTMLElement && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName)) && target.type !== "range" && target.type !== "file";
}

window.addEventListener("keydown", (e) => {
  const key = e.key.toLowerCase();
  if (!ACTION_KEYS.includes(key) || typing(e.target) || e.ctrlKey || e.metaKey || e.altKey) return;
  e.preventDefault();
  press(key);
});
window.addEventListener("keyup", (e) => release(e.key.toLowerCase()));
window.addEventListener("blur", () => {
  held.clear();
  showKeys();
});
for (const tile of document.querySelectorAll(".key[data-key]")) {
  tile.addEventListener("pointerdown", () => press(tile.dataset.key));
  tile.addEventListener("pointerup", () => release(tile.dataset.key));
  tile.addEventListener("pointerleave", () => release(tile.dataset.key));
}

function sendPrompt() {
  const prompt = $("new-prompt").value.trim();
  if (!prompt) return showError("Enter the new prompt first.");
  const transition = Number($("transition").value);
  const eventId = `prompt-${++promptSeq}`;
  send({ type: "session.interaction", interaction: { event_id: eventId, event: { prompt }, transition_chunks: transition } });
  player.interactions[eventId] = { prompt, transition, sentAt: performance.now() };
  log(`sent ${eventId}: "${prompt}" over ${transition} block(s)`);
}

// ---------------------------------------------------------------------------------------------
// Live figures, and staying near the live edge.
// ---------------------------------------------------------------------------------------------
const stats = {
  reset() {
    Object.assign(this, { ttff: null, firstChunkAt: null, blocks: 0, frames: 0, lastChunkAt: null, chunkMs: null, seeks: 0, keyMs: null, lastDecoded: 0, lastTickAt: null, fps: null });
    this.render();
  },
  firstFrame() {
    if (this.ttff === null) {
      this.ttff = performance.now() - startedAt;
      log(`first frame on screen after ${(this.ttff / 1000).toFixed(2)} s`);
    }
  },
  chunk(c) {
    if (this.firstChunkAt === null) this.firstChunkAt = c.at;
    if (this.lastChunkAt !== null) this.chunkMs = c.at - this.lastChunkAt;
    this.lastChunkAt = c.at;
    if (c.kind === "media") this.blocks = c.block + 1;
    this.frames += c.num_frames;
  },
  keyLatency(ms) {
    this.keyMs = ms;
  },
  tick() {
    const now = performance.now();
    const q = video.getVideoPlaybackQuality ? video.getVideoPlaybackQuality() : { totalVideoFrames: 0, droppedVideoFrames: 0 };
    if (q.totalVideoFrames > 0) this.firstFrame();
    if (this.lastTickAt !== null && now > this.lastTickAt) this.fps = ((q.totalVideoFrames - this.lastDecoded) * 1000) / (now - this.lastTickAt);
    this.lastTickAt = now;
    this.lastDecoded = q.totalVideoFrames;
    this.decoded = q.totalVideoFrames;
    this.dropped = q.droppedVideoFrames;
    this.buffered = mse ? mse.ahead().ahead : 0;
    player.stats = {
      ttff_ms: this.ttff,
      blocks: this.blocks,
      frames: this.frames,
      decoded: this.decoded,
      dropped: this.dropped,
      fps: this.fps,
      chunk_ms: this.chunkMs,
      buffered_s: this.buffered,
      seeks: this.seeks,
      key_ms: this.keyMs,
      current_time: video.currentTime,
    };
    this.render();
  },
  render() {
    const ms = (v) => (v === null || v === undefined ? "–" : `${Math.round(v)} ms`);
    $("stat-ttff").textContent = ms(this.ttff);
    $("stat-blocks").textContent = this.blocks;
    $("stat-frames").textContent = this.frames;
    $("stat-decoded").textContent = this.decoded === undefined ? "0" : `${this.decoded} (${this.dropped} dropped)`;
    $("stat-fps").textContent = this.fps === null ? "–" : this.fps.toFixed(1);
    const genSeconds = this.lastChunkAt !== null && this.firstChunkAt !== null ? (this.lastChunkAt - startedAt) / 1000 : 0;
    $("stat-gen-fps").textContent = genSeconds > 0 ? (this.frames / genSeconds).toFixed(1) : "–";
    $("stat-chunk").textContent = ms(this.chunkMs);
    $("stat-buffered").textContent = this.buffered === undefined ? "–" : `${this.buffered.toFixed(2)} s`;
    $("stat-seeks").textContent = this.seeks;
    $("stat-key").textContent = ms(this.keyMs);
  },
};

function blockSeconds() {
  const g = player.generation;
  return g ? (g.frames_per_block * g.scale_factor_temporal) / g.fps : 0.75;
}

let lastPlaybackReport = 0;
function tick() {
  if (mse && !mse.failed) {
    const { ahead, end, start } = mse.ahead();
    if (end > 0) {
      if (video.currentTime < start) video.currentTime = start; // a gap before the first fragment
      else if (ahead > LIVE_MAX_LAG_BLOCKS * blockSeconds() && player.done === null) {
        video.currentTime = end - LIVE_TARGET_LAG_BLOCKS * blockSeconds();
        stats.seeks += 1;
      }
      if (video.paused && !video.ended && ahead > 0) video.play().catch(() => {});
    }
    // Playback feedback for servers that pace generation to it (PROTOCOL.md: session.playback).
    if (live() && performance.now() - lastPlaybackReport > 1000) {
      lastPlaybackReport = performance.now();
      send({ type: "session.playback", position_seconds: video.currentTime });
    }
  }
  stats.tick();
}

video.addEventListener("error", () => {
  const e = video.error;
  mediaError(`<video> error ${e ? e.code : "?"}${e && e.message ? ": " + e.message : ""}`);
});
$("start").addEventListener("click", () => start().catch((e) => showError(`could not start: ${e.message}`)));
$("stop").addEventListener("click", stop);
$("send-prompt").addEventListener("click", sendPrompt);
$("transition").addEventListener("input", () => ($("transition-value").textContent = $("transition").value));
stats.reset();
setInterval(tick, TICK_MS);
