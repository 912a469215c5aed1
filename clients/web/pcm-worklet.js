"use strict";
// AudioWorklet: the microphone (or a video file's sound) as 16 kHz mono PCM16, posted to the page in
// chunks of `chunkSamples`. Downsampling averages each output period (a box filter against aliasing);
// the rare input slower than 16 kHz is interpolated linearly. `sampleRate` is the context's rate.
const TARGET_RATE = 16000;

class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.ratio = sampleRate / TARGET_RATE; // input samples per output sample
    this.chunkSamples = (options.processorOptions && options.processorOptions.chunkSamples) || 4000;
    this.out = new Int16Array(this.chunkSamples);
    this.n = 0;
    this.phase = 0;
    this.acc = 0;
    this.count = 0;
    this.prev = 0;
    this.sumSquares = 0;
  }

  emit(value) {
    const v = Math.max(-1, Math.min(1, value));
    this.sumSquares += v * v;
    this.out[this.n++] = v < 0 ? v * 0x8000 : v * 0x7fff;
    if (this.n === this.chunkSamples) {
      const rms = Math.sqrt(this.sumSquares / this.n);
      this.port.postMessage({ pcm: this.out.buffer, rms }, [this.out.buffer]);
      this.out = new Int16Array(this.chunkSamples);
      this.n = 0;
      this.sumSquares = 0;
    }
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || !channels.length) return true;
    const frames = channels[0].length;
    for (let i = 0; i < frames; i++) {
      let x = 0;
      for (const channel of channels) x += channel[i];
      x /= channels.length;
      if (this.ratio >= 1) {
        this.acc += x;
        this.count += 1;
        this.phase += 1;
        if (this.phase >= this.ratio) {
          this.phase -= this.ratio;
          this.emit(this.acc / this.count);
          this.acc = 0;
          this.count = 0;
        }
      } else {
        while (this.phase < 1) {
          this.emit(this.prev + (x - this.prev) * this.phase);
          this.phase += this.ratio;
        }
        this.phase -= 1;
        this.prev = x;
      }
    }
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
