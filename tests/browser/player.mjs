// The world-model player page in headless Chromium: Start, the video plays through MSE, a held key
// is queued as a session.interaction and starts in a later block, Stop ends the session.
// Usage: node player.mjs http://HOST:PORT OUT_DIR  -> one JSON line on stdout.
import { parseArgs, run } from "./common.mjs";

const { url, outDir } = parseArgs();
const state = (page) => page.evaluate(() => JSON.parse(JSON.stringify(window.rtvPlayer)));
const playback = (page) =>
  page.evaluate(() => {
    const v = document.querySelector("video");
    return { decoded: v.getVideoPlaybackQuality().totalVideoFrames, current_time: v.currentTime, ready_state: v.readyState, error: v.error && v.error.message };
  });

await run(outDir, "player", [], async (page, result) => {
  await page.goto(`${url}/?api_key=page-key-123&debug=1`);
  // The key leaves the address bar (and so the history) at once, kept for this tab; no referrer goes out.
  result.url_after_load = page.url();
  result.kept_key = await page.evaluate(() => sessionStorage.getItem("rtv_api_key"));
  result.referrer_policy = await page.getAttribute('meta[name="referrer"]', "content");
  await page.fill("#prompt", "a lighthouse at dawn");
  await page.click("#start");

  // The video plays: decoded frames and currentTime advance.
  await page.waitForFunction(() => {
    const v = document.querySelector("video");
    return v.getVideoPlaybackQuality().totalVideoFrames >= 5 && v.currentTime > 0.1;
  }, null, { timeout: 90_000 });
  result.before = await playback(page);
  await page.waitForTimeout(2000);
  result.after = await playback(page);

  // A held key: queued, then named in a later chunk's event ids.
  await page.click("video"); // focus out of the text boxes
  await page.keyboard.down("w");
  await page.waitForFunction(
    () => Object.entries(window.rtvPlayer.interactions).some(([id, it]) => it.keys && it.keys.includes("w") && it.queuedAt !== undefined),
    null,
    { timeout: 30_000 },
  );
  const heldText = await page.textContent("#held");
  await page.keyboard.up("w");
  const keyId = await page.evaluate(() =>
    Object.entries(window.rtvPlayer.interactions).find(([id, it]) => it.keys && it.keys.includes("w") && it.queuedAt !== undefined)[0],
  );
  await page.waitForFunction(
    (id) => window.rtvPlayer.chunks.some((c) => c.started.includes(id) || c.active.includes(id) || c.completed.includes(id)),
    keyId,
    { timeout: 30_000 },
  );
  let s = await state(page);
  const it = s.interactions[keyId];
  const chunk = s.chunks.find((c) => c.started.includes(keyId) || c.active.includes(keyId));
  result.key = {
    event_id: keyId,
    held_shown: heldText,
    actions_keys: it.keys,
    queued: it.queuedAt !== undefined,
    started_block: it.startedBlock ?? null,
    completed_block: it.completedBlock ?? null,
    chunk_index: chunk ? chunk.index : null,
    chunk_after_send: chunk ? chunk.at > it.sentAt : false,
    sent_to_started_ms: it.startedAt !== undefined ? Math.round(it.startedAt - it.sentAt) : null,
  };
  await page.waitForTimeout(500);
  await page.screenshot({ path: `${outDir}/player-live.png`, fullPage: true });
  result.screenshot_live = `${outDir}/player-live.png`;

  // Stop: the server ends the session with session.done {stopped: true}.
  await page.click("#stop");
  await page.waitForFunction(() => window.rtvPlayer.done !== null, null, { timeout: 30_000 });
  s = await state(page);
  result.codec = s.codec;
  result.generation = s.generation;
  result.done = s.done;
  result.stats = s.stats;
  result.chunks = s.chunks.length;
  result.errors = s.errors;
  result.media_errors = s.mediaErrors;
  result.status_text = await page.textContent("#status");
  result.end = await playback(page);
});
