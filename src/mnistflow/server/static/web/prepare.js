// STUB for part "web" of issue 39 until part "prepare" lands: the real prepare.js (the JS port of
// data.picture.prepare, tested against it) replaces this file at merge. This stub only resizes
// the whole picture (the browser's filter) and fixes its polarity; it is not data.picture.prepare.
(function () {
  "use strict";
  window.mnistflowPrepare = function (imageData, target) {
    const { width: w, height: h, data: d } = imageData, C = target.channels, H = target.height, W = target.width;
    const grey = (i) => (d[4 * i] + d[4 * i + 1] + d[4 * i + 2]) / 3;
    let border = 0, k = 0;
    for (let i = 0; i < w * h; i++) {
      const y = Math.floor(i / w), x = i % w;
      if (y === 0 || y === h - 1 || x === 0 || x === w - 1) { border += grey(i); k++; }
    }
    const invert = C === 1 && (border / k > 127) === (target.background === "dark");
    let src = imageData;
    if (w !== W || h !== H) {
      const a = new OffscreenCanvas(w, h), b = new OffscreenCanvas(W, H);
      a.getContext("2d").putImageData(imageData, 0, 0);
      const ctx = b.getContext("2d", { willReadFrequently: true });
      ctx.drawImage(a, 0, 0, W, H);
      src = ctx.getImageData(0, 0, W, H);
    }
    const s = src.data, px = new Uint8Array(H * W * C);
    for (let i = 0; i < H * W; i++) {
      if (C === 1) {
        const g = Math.trunc((s[4 * i] + s[4 * i + 1] + s[4 * i + 2]) / 3);
        px[i] = invert ? 255 - g : g;
      } else for (let c = 0; c < C; c++) px[i * C + c] = s[4 * i + c];
    }
    return { pixels: px, preprocess: w === W && h === H && !invert ? "none" : target.picture };
  };
})();
