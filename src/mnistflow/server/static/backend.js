// mnistflow serve's backend for the page: window.mnistflow answers through the server's API.
//
// app.js talks only to window.mnistflow; `mnistflow export --format web` replaces this file
// with one that runs the model in the browser, with the same members:
//   info()                 GET /api/model
//   look(picture, mode)    POST /api/layers?input=1&encoding=f16 with the picture (a Blob):
//                          {input, layers, probabilities, preprocess}; a model without layers to
//                          show (ONNX) answers through /api/predict, with layers null and `why`
//   predict(pixels)        POST /api/predict with JSON pixels -> the class probabilities
//   layers(pixels)         POST /api/layers with JSON pixels -> [{name, kind, shape, values}, ...]
//   kernel(layer, channel) GET /api/kernel
// pixels: the model's input, raw 0..255 values, H x W x C row-major (Array, Uint8Array, ...).
// A failure rejects with an Error of one line (the server's own message when it sent one).
"use strict";

(() => {
  let described = null;  // the promise of GET /api/model, asked once

  async function call(url, init) {
    const res = await fetch(url, init);
    const data = await res.json().catch(() => ({}));
    if (!res.ok) {
      const err = new Error(String(data.error || `HTTP ${res.status} from ${url}`).split("\n")[0]);
      err.status = res.status;
      throw err;
    }
    return data;
  }

  function info() {
    if (!described) described = call("api/model").catch((err) => { described = null; throw err; });
    return described;
  }

  // ---- float16 (the page's compact answer) ---------------------------------------------

  let halves = null;  // every float16 bit pattern as a float32, built on first use

  function halfTable() {
    if (halves) return halves;
    halves = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
      halves[h] = exp === 0 ? sign * frac * 2 ** -24
        : exp === 31 ? (frac ? NaN : sign * Infinity)
          : sign * (1 + frac / 1024) * 2 ** (exp - 15);
    }
    return halves;
  }

  function fromBase64(text) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
    const bin = atob(text), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  // a layer's values as a Float32Array: a JSON list (null: not a number) or base64 float16
  function values(v) {
    if (typeof v !== "string") return Float32Array.from(v, (x) => (x === null ? NaN : x));
    const bytes = fromBase64(v), table = halfTable();
    const n = bytes.length >> 1, out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = table[bytes[2 * i] | (bytes[2 * i + 1] << 8)];
    return out;
  }

  function layerList(data) {
    return data.layers.map((l) => ({ ...l, values: values(l.values) }));
  }

  // ---- pictures and pixels ---------------------------------------------------------------

  function flatInput(input) {  // the server's H x W (grey) or H x W x C lists -> Uint8Array
    return Uint8Array.from(input.flat(2));
  }

  async function pixelsBody(pixels) {  // flat H x W x C -> the JSON the API takes
    const [c, h, w] = (await info()).in_shape;
    if (!pixels || pixels.length !== h * w * c) {
      throw new Error(`pixels must hold ${h}x${w}x${c} = ${h * w * c} values (H x W x C), got ${pixels ? pixels.length : pixels}`);
    }
    const rows = [];
    for (let y = 0; y < h; y++) {
      const row = [];
      for (let x = 0; x < w; x++) {
        const at = (y * w + x) * c;
        row.push(c === 1 ? Number(pixels[at]) : Array.from(pixels.slice(at, at + c), Number));
      }
      rows.push(row);
    }
    return JSON.stringify({ pixels: rows, preprocess: "none" });
  }

  const JSON_HEADERS = { "Content-Type": "application/json" };

  let noLayers = null;  // why the server has no layers to show (an ONNX model: 501), once known

  async function look(picture, mode) {
    const how = mode === "as-is" ? "&preprocess=none" : "";
    const init = { method: "POST", headers: { "Content-Type": picture.type || "application/octet-stream" },
                   body: picture };
    if (noLayers === null) {
      try {
        const data = await call(`api/layers?input=1&encoding=f16${how}`, init);
        return { input: flatInput(data.input), layers: layerList(data), probabilities: data.probabilities,
                 preprocess: data.preprocess };
      } catch (err) {
        if (err.status !== 501) throw err;
        noLayers = err.message;
      }
    }
    const data = await call(`api/predict?input=1${how}`, init);  // the prediction without layers
    return { input: flatInput(data.input), layers: null, why: noLayers, probabilities: data.probabilities,
             preprocess: data.preprocess };
  }

  async function predict(pixels) {
    const body = await pixelsBody(pixels);
    return (await call("api/predict", { method: "POST", headers: JSON_HEADERS, body })).probabilities;
  }

  async function layers(pixels) {
    const body = await pixelsBody(pixels);
    try {
      return layerList(await call("api/layers", { method: "POST", headers: JSON_HEADERS, body }));
    } catch (err) {
      if (err.status === 501) noLayers = err.message;  // look() then asks for the prediction alone
      throw err;
    }
  }

  async function kernel(layer, channel) {
    const q = new URLSearchParams({ layer, channel: String(channel) });
    const data = await call(`api/kernel?${q}`);
    return { ...data, values: Float32Array.from(data.values) };
  }

  window.mnistflow = { info, look, predict, layers, kernel };
})();
