// window.mnistflow for the exported page: the model runs here, in the browser (forward.js), on
// the graph and weights of model.js; pictures are prepared by prepare.js. The same members,
// answers and errors as the served page's backend.js (which asks `mnistflow serve`):
//
//   info()                 -> the JSON of GET /api/model (backend "browser", plus picture)
//   predict(pixels)        -> class probabilities, the model's class order
//   layers(pixels)         -> [{name, kind, shape, values}, ..., {name: "probabilities", ...}]
//   look(picture, mode)    -> {input, layers, probabilities, preprocess} for a Blob
//   kernel(layer, channel) -> {layer, channel, shape, input_channels, values}
//
// pixels: the model's input as 0..255 values, H x W x C row-major (Array, Uint8Array or
// Uint8ClampedArray). Every layer comes whole: no channel is dropped (the server bounds its
// answers at core.limits.MAX_LAYER_VALUES; in the browser nothing is sent anywhere).
(function () {
  "use strict";

  const model = window.mnistflowModel;
  const forward = window.mnistflowForward;
  const info = model.info;
  const [C, H, W] = info.in_shape;
  let weights = null; // decoded on first use
  const tensors = () => weights || (weights = forward.tensors(model));

  function checked(pixels) {
    const n = C * H * W, want = `${n} values (${H}x${W}x${C}, row-major)`;
    if (pixels == null || typeof pixels !== "object" || typeof pixels.length !== "number") {
      throw new Error(`pixels must be an array of ${want}, got ${pixels === null ? "null" : typeof pixels}`);
    }
    if (pixels.length !== n) throw new Error(`pixels must hold ${want}, got ${pixels.length}`);
    if (pixels instanceof Uint8Array || pixels instanceof Uint8ClampedArray) return pixels;
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) {
      const v = pixels[i];
      if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 255) {
        throw new Error(`pixels must be integers 0..255; value ${i} is ${String(v).slice(0, 20)}`);
      }
      out[i] = v;
    }
    return out;
  }

  // H x W x C uint8 -> C x H x W float32, (x - mean) * (1 / std) in float32 (data.normalize).
  function normalized(px) {
    const { mean, inv_std: inv } = model.normalize, x = new Float32Array(C * H * W);
    for (let c = 0; c < C; c++) {
      for (let i = 0; i < H * W; i++) x[c * H * W + i] = Math.fround(px[i * C + c] - mean[c]) * inv[c];
    }
    return x;
  }

  function run(pixels) {
    const values = forward.run(model, tensors(), normalized(checked(pixels)));
    return { values, probs: forward.probabilities(values[model.output]) };
  }

  function layerList({ values, probs }) {
    const out = model.layers.map((l) => ({
      name: l.name, kind: l.kind, shape: values[l.node].shape.slice(1), values: values[l.node].data.slice(),
    }));
    out.push({ name: "probabilities", kind: "softmax", shape: [probs.length], values: probs });
    return out;
  }

  function kernel(layer, channel) {
    const name = String(layer).split("#")[0];
    const shown = String(layer).length <= 80 ? String(layer) : `${String(layer).slice(0, 80)}...`;
    const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
    if (!name || !own(model.modules, name)) throw new Error(`no layer named '${shown}' in this model`);
    const kind = model.modules[name], conv = own(model.kernels, name) ? model.kernels[name] : null;
    if (!conv) throw new Error(`layer '${shown}' is a ${kind}, not a convolution: only convolutions have kernels`);
    if (!Number.isInteger(channel) || channel < 0 || channel >= conv.out_channels) {
      throw new Error(`layer '${shown}' has channels 0..${conv.out_channels - 1}, not ${String(channel).slice(0, 20)}`);
    }
    const w = tensors()[conv.tensor], per = forward.size(w.shape.slice(1));
    if (per > model.max_kernel_values) {
      throw new Error(`the kernel of layer '${shown}' holds ${per.toLocaleString("en-US")} values: at most ` +
        `${model.max_kernel_values.toLocaleString("en-US")}`);
    }
    const perGroup = conv.in_channels / conv.groups;
    const first = Math.floor(channel / (conv.out_channels / conv.groups)) * perGroup;
    return {
      layer: String(layer), channel, shape: w.shape.slice(1),
      input_channels: Array.from({ length: perGroup }, (_, i) => first + i),
      values: w.data.slice(channel * per, (channel + 1) * per),
    };
  }

  // --- pictures -------------------------------------------------------------------------
  async function decode(picture) {
    if (!(picture instanceof Blob)) throw new Error("look takes a picture: a Blob (a PNG of the canvas, or a file)");
    let bmp;
    try {
      bmp = await createImageBitmap(picture, { premultiplyAlpha: "none", colorSpaceConversion: "none" });
    } catch (e) {
      throw new Error("not a readable image (PNG, JPEG, WebP, GIF or BMP)");
    }
    const w = bmp.width, h = bmp.height;
    if (w * h > info.max_pixels) {
      bmp.close();
      throw new Error(`image of ${w}x${h} pixels: at most ${info.max_pixels.toLocaleString("en-US")} pixels`);
    }
    const canvas = typeof OffscreenCanvas !== "undefined" ? new OffscreenCanvas(w, h)
      : Object.assign(document.createElement("canvas"), { width: w, height: h });
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    ctx.drawImage(bmp, 0, 0);
    bmp.close();
    return ctx.getImageData(0, 0, w, h);
  }

  // RGBA -> RGB on a background that contrasts with the ink (data.picture.flatten_alpha).
  function flattened(img) {
    const d = img.data, n = img.width * img.height, rgb = new Uint8ClampedArray(n * 4);
    let sum = 0, count = 0;
    for (let i = 0; i < n; i++) {
      if (d[4 * i + 3] / 255 > 0.5) {
        sum += d[4 * i] + d[4 * i + 1] + d[4 * i + 2];
        count += 3;
      }
    }
    const bg = !count || sum / count < 128 ? 255 : 0;
    for (let i = 0; i < n; i++) {
      const a = d[4 * i + 3] / 255;
      for (let k = 0; k < 3; k++) rgb[4 * i + k] = Math.floor(Math.fround(d[4 * i + k] * a + bg * (1 - a)) + 0.5);
      rgb[4 * i + 3] = 255;
    }
    return new ImageData(rgb, img.width, img.height);
  }

  // "as-is" (predict --as-is, data.picture.as_is): the picture unchanged, made grey or colour
  // as the model takes it; resized (prepare.js's "resize", never inverted) if not at its size.
  function asIs(img, target) {
    const flat = flattened(img), d = flat.data, w = flat.width, h = flat.height;
    const grey = (i) => Math.fround((d[4 * i] + d[4 * i + 1] + d[4 * i + 2]) / 3);
    if (w !== W || h !== H) {
      let border = 0, k = 0;
      for (let i = 0; i < w * h; i++) {
        const y = Math.floor(i / w), x = i % w;
        if (y === 0 || y === h - 1 || x === 0 || x === w - 1) { border += grey(i); k++; }
      }
      const own = border / k > 127 ? "light" : "dark"; // the picture's own polarity: kept
      const made = window.mnistflowPrepare(flat, { ...target, picture: "resize", background: own });
      return { pixels: made.pixels, preprocess: "as-is" };
    }
    const px = new Uint8Array(H * W * C);
    for (let i = 0; i < H * W; i++) {
      if (C === 1) px[i] = Math.min(255, Math.trunc(grey(i)));
      else for (let c = 0; c < C; c++) px[i * C + c] = d[4 * i + c];
    }
    return { pixels: px, preprocess: "as-is" };
  }

  async function look(picture, mode) {
    if (mode != null && mode !== "as-is") throw new Error(`mode must be null or "as-is", got ${String(mode).slice(0, 20)}`);
    const img = await decode(picture);
    const target = { height: H, width: W, channels: C, picture: info.picture, background: info.background };
    const made = mode === "as-is" ? asIs(img, target) : window.mnistflowPrepare(img, target);
    const result = run(made.pixels);
    return { input: made.pixels, layers: layerList(result), probabilities: Array.from(result.probs),
      preprocess: made.preprocess };
  }

  window.mnistflow = {
    info: async () => JSON.parse(JSON.stringify(info)),
    predict: async (pixels) => Array.from(run(pixels).probs),
    layers: async (pixels) => layerList(run(pixels)),
    look,
    kernel: async (layer, channel) => kernel(layer, channel),
  };
})();
