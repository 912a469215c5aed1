// The live-understanding page's "Video file" mode: a clip chosen in the file box plays once with the frame
// filter off, its frames go to the server as it plays, then each question is asked and answered in turn.
// Usage: node chat_file.mjs http://HOST:PORT OUT_DIR VIDEO QUESTION...  -> one JSON line on stdout.
import { writeFileSync } from "node:fs";
import { chatState, parseArgs, run } from "./common.mjs";

const { url, outDir, rest } = parseArgs();
const [video, ...questions] = rest;

await run(outDir, "chat-file", [], async (page, result) => {
  // Every frame the page sends is kept beside the screenshots, to look at what the model was shown.
  result.sent_frames = [];
  page.on("websocket", (socket) =>
    socket.on("framesent", ({ payload }) => {
      const message = typeof payload === "string" && payload.startsWith("{") ? JSON.parse(payload) : null;
      if (message?.type !== "video.frame") return;
      const file = `${outDir}/chat-file-frame-${result.sent_frames.length}.jpg`;
      writeFileSync(file, Buffer.from(message.data, "base64"));
      result.sent_frames.push({ file, pts_ms: message.pts_ms });
    }),
  );
  await page.goto(`${url}/chat`);
  await page.setInputFiles("#file", video); // its change event picks the "Video file" source
  result.source = await page.evaluate(() => document.querySelector("input[name=source]:checked").value);
  await page.uncheck("#evs");
  await page.click("#start");
  await page.waitForFunction(() => window.rtvChat.sourceEnded, null, { timeout: 60_000 });
  result.status_at_end = await page.textContent("#status");
  result.frames_at_end = await page.evaluate(() => window.rtvChat.framesSent);
  await page.waitForFunction(() => window.rtvChat.kept + window.rtvChat.dropped >= window.rtvChat.framesSent, null, { timeout: 30_000 });
  for (const [i, question] of questions.entries()) {
    await page.fill("#question", question);
    await page.click("#ask");
    await page.waitForFunction((n) => window.rtvChat.answers.length === n && window.rtvChat.answers[n - 1].done, i + 1, { timeout: 120_000 });
  }
  await page.screenshot({ path: `${outDir}/chat-file-answers.png`, fullPage: true });
  result.shown = await page.$$eval(".answer .a", (nodes) => nodes.map((n) => n.textContent).reverse()); // newest card is on top
  await page.click("#end");
  await page.waitForFunction(() => window.rtvChat.done, null, { timeout: 60_000 });
  Object.assign(result, await chatState(page));
});
