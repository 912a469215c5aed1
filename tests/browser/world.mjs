// The built-in world model on the player page, as a person demos it: start in a meadow, hold D (the
// view pans), then Send prompt "a snowy field" with the page's transition (the world turns to snow).
// The frames are read off the playing <video> element (drawn to a canvas at the stream's size) and
// placed in their blocks by the media time, so what is measured is what the page shows, block by block.
// Usage: node world.mjs http://HOST:PORT OUT_DIR -> one JSON line.
import { parseArgs, run } from "./common.mjs";

const { url, outDir } = parseArgs();
const REACH = 8; // widest pan looked for between the first and last frame of a block, in pixels

// One picture of the video as it plays: its media time, mean colour, and the grey rows of the lower half (the ground).
const grab = (page) =>
  page.evaluate(() => {
    const v = document.querySelector("video");
    const w = v.videoWidth, h = v.videoHeight;
    const c = (window.__grabCanvas ||= document.createElement("canvas"));
    c.width = w;
    c.height = h;
    const ctx = c.getContext("2d", { willReadFrequently: true });
    ctx.drawImage(v, 0, 0, w, h);
    const px = ctx.getImageData(0, 0, w, h).data;
    const mean = [0, 0, 0];
    for (let i = 0; i < px.length; i += 4) for (let k = 0; k < 3; k++) mean[k] += px[i + k];
    const rows = [];
    for (let y = Math.floor(h / 2); y < h; y++) {
      const row = [];
      for (let x = 0; x < w; x++) {
        const i = (y * w + x) * 4;
        row.push(0.299 * px[i] + 0.587 * px[i + 1] + 0.114 * px[i + 2]);
      }
      rows.push(row);
    }
    return { t: v.currentTime, mean: mean.map((m) => m / (w * h)), rows };
  });

// Horizontal shift of b against a (content moving right is positive), by the best whole-pixel match.
function shift(a, b) {
  let best = 0, bestErr = Infinity;
  for (let s = -REACH; s <= REACH; s++) {
    let err = 0, n = 0;
    for (let y = 0; y < a.rows.length; y++) {
      const ra = a.rows[y], rb = b.rows[y];
      for (let x = REACH; x < ra.length - REACH; x++) {
        err += Math.abs(rb[x] - ra[x - s]);
        n++;
      }
    }
    if (err / n < bestErr) [best, bestErr] = [s, err / n];
  }
  return best;
}

const playedTo = (page, seconds) =>
  page.waitForFunction((t) => document.querySelector("video").currentTime >= t, seconds, { timeout: 120_000, polling: 100 });

await run(outDir, "world", [], async (page, result) => {
  await page.goto(`${url}/`);
  await page.fill("#prompt", "a green meadow");
  await page.click("#start");
  await page.waitForFunction(() => document.querySelector("video").currentTime > 0.2, null, { timeout: 90_000 });
  await page.click("video"); // focus out of the text boxes

  // Frames are grabbed all along, while the keys and the prompt go out.
  const samples = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      samples.push(await grab(page));
      await page.waitForTimeout(60);
    }
  })();

  // Block k's first frame on the media timeline, from the geometry video.start states: a causal VAE's first
  // latent frame is one video frame, every later one `scale_factor_temporal` of them.
  const g = await page.evaluate(() => window.rtvPlayer.generation);
  const blockFrames = g.frames_per_block * g.scale_factor_temporal;
  const blockStart = (k) => (k === 0 ? 0 : blockFrames - g.scale_factor_temporal + 1 + blockFrames * (k - 1)) / g.fps;
  await playedTo(page, blockStart(3));
  await page.screenshot({ path: `${outDir}/world-meadow.png`, fullPage: true });

  // Hold D until three blocks have started with it (the page sends the held keys once per block).
  await page.keyboard.down("d");
  const held = await page
    .waitForFunction(() => {
      const started = Object.values(window.rtvPlayer.interactions).filter((it) => it.keys && it.keys.includes("d") && it.startedBlock !== undefined);
      return started.length >= 3 && started.map((it) => it.startedBlock);
    }, null, { timeout: 90_000 })
    .then((h) => h.jsonValue());
  await page.keyboard.up("d");

  // The page's own prompt box and transition slider ("a snowy field" over 4 blocks as the page opens).
  result.new_prompt = await page.inputValue("#new-prompt");
  result.transition = Number(await page.inputValue("#transition"));
  await page.click("#send-prompt");
  const promptId = await page
    .waitForFunction(() => Object.entries(window.rtvPlayer.interactions).find(([, it]) => it.prompt && it.completedBlock !== undefined)?.[0], null, {
      timeout: 90_000,
    })
    .then((h) => h.jsonValue());
  const [started, completed] = await page.evaluate((id) => [window.rtvPlayer.interactions[id].startedBlock, window.rtvPlayer.interactions[id].completedBlock], promptId);
  await playedTo(page, blockStart(completed + 3));
  await page.screenshot({ path: `${outDir}/world-snow.png`, fullPage: true });
  sampling = false;
  await sampler;

  // Per block: the shift from its first grabbed frame to its last, and its mean colour.
  const blocks = {};
  for (const s of samples) {
    let k = 0;
    while (blockStart(k + 1) <= s.t) k++;
    (blocks[k] ||= []).push(s);
  }
  const perBlock = {};
  for (const [k, list] of Object.entries(blocks)) {
    const first = list[0], last = list[list.length - 1];
    const mean = [0, 1, 2].map((c) => list.reduce((a, s) => a + s.mean[c], 0) / list.length);
    perBlock[k] = { samples: list.length, span: last.t - first.t, shift: last.t - first.t > 0.3 ? shift(first, last) : null, mean };
  }
  result.blocks = perBlock;
  result.d_blocks = held;
  result.prompt_blocks = [started, completed];
  result.errors = await page.evaluate(() => window.rtvPlayer.errors);
  await page.click("#stop");
});
