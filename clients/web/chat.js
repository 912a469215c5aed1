"use strict";
// Live understanding (served at /chat): a camera (getUserMedia) or a local video file (played once, or
// in a loop) sent as JPEG frames at a chosen rate on WS /v1/video/chat/stream, the microphone (or the file's sound) captured
// with an AudioWorklet as 16 kHz PCM16, questions answered token by token, EVS statistics at the end.
// `window.rtvChat` holds the session's state for the console and the tests.

const MAX_SIDE = 448; // frames are scaled down to this (the server keeps no more anyway)
const JPEG_QUALITY = 0.8;
const AUDIO_CHUNK_SAMPLES = 4000; // 0.25 s at 16 kHz per audio.chunk
const LIVE_FRAMES = 64; // the ring a live session keeps (PROTOCOL default max_frames)
const FILE_ENDED = "The file has played to its end: ask about it, or end the session.";

const $ = (id) => document.getElementById(id);

const chat = (window.rtvChat = {
  state: "idle",
  framesSent: 0,
  kept: 0,
  dropped: 0,
  bufferedFrames: 0,
  audioChunks: 0,
  audioSeconds: 0,
  answers: [], // {question, start, deltas, text, done}
  sourceEnded: false, // a file played once has reached its end: nothing more is sent, questions go on
  evs: null,
  done: false,
  errors: [],
});

let ws = null;
let media = null; // the camera/microphone MediaStream, to stop its tracks
let audioContext = null;
let frameTimer = null;
let objectUrl = null;
let t0 = 0;
const preview = $("preview");
const canvas = $("canvas");

function setStatus(state, text) {
  chat.state = state;
  $("status").dataset.state = state;
  $("status").textContent = text;
}

function showError(text) {
  chat.errors.push(text);
  const li = document.createElement("li");
  li.textContent = text;
  $("errors").appendChild(li);
}

function send(message) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
}

function base64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function render() {
  $("stat-sent").textContent = chat.framesSent;
  $("stat-acks").textContent = `${chat.kept} / ${chat.dropped}`;
  $("stat-buffered").textContent = chat.bufferedFrames;
  $("stat-audio").textContent = `${chat.audioSeconds.toFixed(1)} s in ${chat.audioChunks} chunks`;
  const e = chat.evs;
  $("stat-evs").textContent = e ? `${e.retained_count} kept, ${e.dropped_count} dropped of ${e.total_count} (drop rate ${(100 * e.drop_rate).toFixed(0)}%)` : "–";
}

// ---------------------------------------------------------------------------------------------
// Sources: the camera and microphone, or a local video file played once (a clip to ask about: a loop's
// jump back to the start would read as motion) or in a loop.
// ---------------------------------------------------------------------------------------------
async function openSource(withAudio) {
  const source = document.querySelector("input[name=source]:checked").value;
  if (source === "camera") {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) throw new Error("this page has no camera access (it needs https or localhost)");
    media = await navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 640 }, height: { ideal: 480 } }, audio: withAudio });
    preview.srcObject = media;
    preview.muted = true;
    await preview.play();
    return withAudio ? (ctx) => ctx.createMediaStreamSource(media) : null;
  }
  const file = $("file").files[0];
  if (!file) throw new Error("choose a video file first");
  objectUrl = URL.createObjectURL(file);
  preview.srcObject = null;
  preview.src = objectUrl;
  preview.loop = $("loop").checked;
  preview.muted = !withAudio; // its sound goes to the worklet only, never to the speakers
  preview.onended = sourceEnded;
  await preview.play();
  return withAudio ? (ctx) => ctx.createMediaElementSource(preview) : null;
}

async function startAudio(makeSource) {
  audioContext = new AudioContext();
  await audioContext.audioWorklet.addModule("/static/pcm-worklet.js");
  const node = new AudioWorkletNode(audioContext, "pcm16-capture", { processorOptions: { chunkSamples: AUDIO_CHUNK_SAMPLES } });
  node.port.onmessage = ({ data }) => {
    $("level").value = data.rms;
    if (!ws || ws.readyState !== WebSocket.OPEN || chat.done || chat.sourceEnded) return;
    const pcm = new Uint8Array(data.pcm);
    send({ type: "audio.chunk", data: base64(pcm) });
    chat.audioChunks += 1;
    chat.audioSeconds += pcm.length / 2 / 16000;
    render();
  };
  const silent = audioContext.createGain(); // keeps the worklet pulled without playing anything
  silent.gain.value = 0;
  makeSource(audioContext).connect(node).connect(silent).connect(audioContext.destination);
  await audioContext.resume();
  if (audioContext.sampleRate !== 16000) console.info(`audio resampled from ${audioContext.sampleRate} Hz to 16000 Hz`);
}

function sendFrame() {
  if (preview.readyState < 2 || !preview.videoWidth || !ws || ws.readyState !== WebSocket.OPEN) return;
  const scale = Math.min(1, MAX_SIDE / Math.max(preview.videoWidth, preview.videoHeight));
  canvas.width = Math.round(preview.videoWidth * scale);
  canvas.height = Math.round(preview.videoHeight * scale);
  canvas.getContext("2d").drawImage(preview, 0, 0, canvas.width, canvas.height);
  const data = canvas.toDataURL("image/jpeg", JPEG_QUALITY).split(",", 2)[1];
  chat.framesSent += 1;
  send({ type: "video.frame", data, frame_id: `f${chat.framesSent}`, pts_ms: Math.round(performance.now() - t0) });
  render();
}

// A file starts over with the session, so that its first frame is the first one sent (it has played, or
// even ended, while the socket opened).
async function rewind() {
  chat.sourceEnded = false;
  const seeked = new Promise((resolve) => preview.addEventListener("seeked", resolve, { once: true }));
  preview.currentTime = 0;
  await seeked;
  await preview.play();
}

// The file's last frame has been shown: stop sending (its frames and sound are with the server), keep the session for questions.
function sourceEnded() {
  if (chat.sourceEnded) return;
  chat.sourceEnded = true;
  clearInterval(frameTimer);
  frameTimer = null;
  if (ws && ws.readyState === WebSocket.OPEN) setStatus("live", FILE_ENDED);
}

function stopCapture() {
  clearInterval(frameTimer);
  frameTimer = null;
  if (media) media.getTracks().forEach((t) => t.stop());
  media = null;
  if (audioContext) audioContext.close().catch(() => {});
  audioContext = null;
  preview.pause();
  preview.onended = null;
  $("level").value = 0;
  if (objectUrl) URL.revokeObjectURL(objectUrl);
  objectUrl = null;
}

// ---------------------------------------------------------------------------------------------
// The session.
// ---------------------------------------------------------------------------------------------
async function start() {
  Object.assign(chat, { framesSent: 0, kept: 0, dropped: 0, bufferedFrames: 0, audioChunks: 0, audioSeconds: 0, answers: [], sourceEnded: false, evs: null, done: false, errors: [] });
  $("errors").replaceChildren();
  $("answers").replaceChildren();
  render();
  $("start").disabled = true;
  setStatus("connecting", "Opening the source…");
  const withAudio = $("audio").checked;
  let makeAudioSource;
  try {
    makeAudioSource = await openSource(withAudio);
  } catch (e) {
    showError(`source: ${e.message || e.name}`);
    setStatus("error", "Could not open the source.");
    $("start").disabled = false;
    stopCapture();
    return;
  }
  if (makeAudioSource) {
    try {
      await startAudio(makeAudioSource);
    } catch (e) {
      showError(`audio capture: ${e.message}`);
    }
  }

  setStatus("connecting", "Connecting…");
  const socket = (ws = openServerSocket("/v1/video/chat/stream"));
  socket.onopen = async () => {
    // Every kept frame in each question (num_sample_frames = max_frames): the server keeps them prefilled.
    const frames = $("live").checked ? { max_frames: LIVE_FRAMES, num_sample_frames: LIVE_FRAMES } : {};
    socket.send(JSON.stringify({ type: "session.config", modalities: ["text"], evs_enabled: $("evs").checked, ...frames }));
    $("ask").disabled = false;
    $("end").disabled = false;
    if (!preview.srcObject) await rewind();
    t0 = performance.now();
    setStatus("live", "Live: sending frames" + (makeAudioSource ? " and audio." : "."));
    sendFrame();
    frameTimer = setInterval(sendFrame, 1000 / Number($("rate").value));
  };
  socket.onmessage = (event) => socket === ws && onMessage(JSON.parse(event.data));
  socket.onclose = (event) => {
    if (socket !== ws) return;
    ws = null;
    stopCapture();
    $("start").disabled = false;
    $("ask").disabled = true;
    $("end").disabled = true;
    if (!chat.done) {
      showError(`connection closed before session.done (code ${event.code}${event.reason ? ": " + event.reason : ""})`);
      setStatus("error", `Ended with an error (close code ${event.code}).`);
    }
  };
}

function end() {
  clearInterval(frameTimer);
  frameTimer = null;
  send({ type: "video.done" });
  setStatus("ending", "Ending: waiting for the last answer and the EVS statistics…");
  $("end").disabled = true;
  $("ask").disabled = true;
}

function ask() {
  const text = $("question").value.trim();
  if (!text) return showError("Type a question first.");
  const card = document.createElement("div");
  card.className = "answer";
  card.innerHTML = '<div class="q"></div><div class="a"></div><div class="meta">waiting for the answer…</div>';
  card.querySelector(".q").textContent = text;
  $("answers").prepend(card);
  chat.answers.push({ question: text, start: null, deltas: 0, text: "", done: false, card });
  send({ type: "video.query", text });
}

// The oldest question whose answer has not finished: answers come back in the order asked.
function current() {
  return chat.answers.find((a) => !a.done) || null;
}

function onMessage(m) {
  const a = current();
  switch (m.type) {
    case "video.frame.ack":
      if (m.accepted) chat.kept += 1;
      else chat.dropped += 1;
      chat.bufferedFrames = m.buffered_frames;
      render();
      break;
    case "response.start":
      if (!a) break;
      a.start = { frames: m.frames, audio_seconds: m.audio_seconds };
      a.card.classList.add("streaming");
      a.card.querySelector(".meta").textContent =
        `answering from ${m.frames ?? "?"} frame(s)` + (m.audio_seconds ? ` and ${m.audio_seconds.toFixed(1)} s of audio` : "") + "…";
      break;
    case "response.text.delta":
      if (!a) break;
      a.deltas += 1;
      a.text += m.delta;
      a.card.querySelector(".a").textContent = a.text;
      break;
    case "response.text.done":
      if (!a) break;
      a.done = true;
      a.text = m.text;
      a.card.classList.remove("streaming");
      a.card.querySelector(".a").textContent = m.text || "(empty answer)";
      a.card.querySelector(".meta").textContent = `${a.deltas} streamed piece(s)` + (a.start && a.start.frames ? `, ${a.start.frames} frame(s)` : "") + (a.start && a.start.audio_seconds ? `, ${a.start.audio_seconds.toFixed(1)} s of audio` : "");
      break;
    case "response.evs_stats":
      chat.evs = m;
      render();
      break;
    case "session.done":
      chat.done = true;
      setStatus("done", "Session ended.");
      break;
    case "error": {
      showError(`server: ${m.message}${m.code ? ` (${m.code})` : ""}`);
      // A question the server refused (no frames yet, a bad text) gets no answer: close its card.
      if (a && !a.start && (m.code === "no_frames" || m.code === "invalid_request")) {
        a.done = true;
        a.card.querySelector(".meta").textContent = `refused: ${m.message}`;
      }
      break;
    }
    case "pong":
      break;
    default:
      console.info("ignored message", m.type);
  }
}

$("start").addEventListener("click", () => start().catch((e) => showError(`could not start: ${e.message}`)));
$("end").addEventListener("click", end);
$("ask").addEventListener("click", ask);
$("question").addEventListener("keydown", (e) => e.key === "Enter" && !$("ask").disabled && ask());
$("file").addEventListener("change", () => (document.querySelector("input[name=source][value=file]").checked = true));
render();
