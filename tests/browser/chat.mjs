// The live-understanding page in headless Chromium with a fake camera and microphone: frames and
// PCM16 audio flow, a question's answer streams in piece by piece, End shows the EVS statistics.
// Usage: node chat.mjs http://HOST:PORT OUT_DIR  -> one JSON line on stdout.
import { FAKE_MEDIA_FLAGS, chatState, parseArgs, run } from "./common.mjs";

const { url, outDir } = parseArgs();
const QUESTION = "What do you see and hear?";

await run(outDir, "chat", FAKE_MEDIA_FLAGS, async (page, result) => {
  await page.goto(`${url}/chat`);
  await page.click("#start");
  // The fake camera's frames reach the server (acked; EVS drops most of its near-identical frames) and the fake microphone's audio is sent.
  await page.waitForFunction(() => window.rtvChat.kept >= 1 && window.rtvChat.framesSent >= 3 && window.rtvChat.audioChunks >= 4, null, { timeout: 60_000 });
  await page.fill("#question", QUESTION);
  await page.click("#ask");
  // Streamed: the answer's text shows up on the page before the answer is done...
  await page.waitForFunction(() => {
    const a = window.rtvChat.answers[0];
    return a && a.deltas >= 1 && document.querySelector(".answer .a").textContent.length > 0;
  }, null, { timeout: 120_000 });
  result.first_piece_shown = await page.evaluate(() => ({ done: window.rtvChat.answers[0].done, shown: document.querySelector(".answer .a").textContent }));
  // ...and the answer finishes.
  await page.waitForFunction(() => window.rtvChat.answers[0].done, null, { timeout: 120_000 });
  result.answer_shown = await page.textContent(".answer .a");
  result.answer_meta = await page.textContent(".answer .meta");
  await page.screenshot({ path: `${outDir}/chat-answer.png`, fullPage: true });
  result.screenshot_answer = `${outDir}/chat-answer.png`;
  // End: the EVS statistics, then session.done.
  await page.click("#end");
  await page.waitForFunction(() => window.rtvChat.done, null, { timeout: 60_000 });
  result.evs_shown = await page.textContent("#stat-evs");
  result.status_text = await page.textContent("#status");
  Object.assign(result, await chatState(page));
});
