// Shared by the page scripts: launch Debian's Chromium through playwright-core with a fresh profile,
// collect what the page logs, and print one JSON result line.
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

export const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
export const FAKE_MEDIA_FLAGS = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"];

export function parseArgs() {
  const [url, outDir, ...rest] = process.argv.slice(2);
  if (!url || !outDir) {
    console.error("usage: node SCRIPT.mjs http://HOST:PORT OUT_DIR [SCRIPT'S OWN ARGUMENTS]");
    process.exit(2);
  }
  mkdirSync(outDir, { recursive: true });
  return { url: url.replace(/\/$/, ""), outDir, rest };
}

// The chat page's session state (window.rtvChat) as the scripts report it.
export const chatState = (page) =>
  page.evaluate(() => {
    const c = window.rtvChat;
    return {
      state: c.state,
      frames_sent: c.framesSent,
      kept: c.kept,
      dropped: c.dropped,
      buffered_frames: c.bufferedFrames,
      audio_chunks: c.audioChunks,
      audio_seconds: c.audioSeconds,
      answers: c.answers.map((a) => ({ question: a.question, start: a.start, deltas: a.deltas, text: a.text, done: a.done })),
      source_ended: c.sourceEnded,
      evs: c.evs,
      done: c.done,
      errors: c.errors,
    };
  });

// Runs `body(page, result)`; whatever happens, takes a screenshot and prints `result` as one JSON line.
export async function run(outDir, name, extraFlags, body) {
  const profile = mkdtempSync(path.join(tmpdir(), "rtv-chromium-"));
  const result = { ok: false, screenshot: path.join(outDir, `${name}.png`), console_errors: [], page_errors: [] };
  let context;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [...FLAGS, ...extraFlags],
      viewport: { width: 1100, height: 900 },
    });
    const page = context.pages()[0] || (await context.newPage());
    page.on("console", (m) => m.type() === "error" && result.console_errors.push(m.text()));
    page.on("pageerror", (e) => result.page_errors.push(String(e)));
    try {
      await body(page, result);
      result.ok = true;
    } catch (e) {
      result.error = String(e && e.message ? e.message : e).split("\n").slice(0, 6).join(" | ");
    }
    try {
      await page.screenshot({ path: result.screenshot, fullPage: true });
    } catch (e) {
      result.screenshot_error = String(e);
    }
  } catch (e) {
    result.error = `browser: ${e.message}`;
  } finally {
    if (context) await context.close().catch(() => {});
    rmSync(profile, { recursive: true, force: true });
  }
  console.log(JSON.stringify(result));
  process.exit(result.ok ? 0 : 1);
}
