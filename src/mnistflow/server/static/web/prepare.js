// mnistflow: a picture -> the model's input, in the browser. No dependencies, nothing loaded.
//
// The port of data/picture.py's prepare() and as_is(), with the decoding steps the server takes
// before them (server/inputs.py decode_image: data.formats.image.shrink and working_mode), so that
// the exported page, which has no server, feeds its model what `mnistflow serve` would:
//
//   window.mnistflowPrepare(imageData, target, mode) -> {pixels: Uint8Array H*W*C, preprocess}
//
// imageData: an ImageData (RGBA, any size), e.g. a decoded PNG of the canvas or an upload;
// target: {height, width, channels, picture: "mnist"|"emnist"|"fashion"|"resize",
//          background: "dark"|"light"} (from the model's info: in_shape, picture, background);
// mode: null/undefined/"auto" (the dataset's way: prepare's rule), "as-is" (as_is: the picture
//       only resized, preprocess "none", as `predict --as-is`), or one of the styles to force it.
// Errors throw an Error whose message is one line (the server's words for the same refusal).
//
// Pillow's LANCZOS resize and box reduce are ported exactly (Resample.c, Reduce.c: the same
// filter tables, fixed-point coefficients and rounding), so the pixels match Python's.
// The decoded picture: opaque with R = G = B everywhere is grey (Pillow's "L": a grey PNG);
// opaque otherwise is "RGB"; with any transparency it is "RGBA", flattened onto a background
// that contrasts with the ink (flatten_alpha). Grey from colour is the mean of R, G and B in
// float32, as data/picture.py's _grey takes it (not Pillow's luma).
"use strict";

(() => {
  const WORK_SIDE = 1024;  // data.formats.image.WORK_SIDE: larger pictures are box-reduced first
  const MIN_SIDE = 4;      // server.guard.Limits.min_side: smaller pictures are refused
  const FITS = {           // data.picture.FITS: the ink's box's long side, placed by mass or centre
    mnist: { box: 20 / 28, byMass: true },
    emnist: { box: 24 / 28, byMass: false },
    fashion: { box: 1.0, byMass: false },
  };
  const STYLES = [...Object.keys(FITS), "resize"];
  const f32 = Math.fround;

  // An image: {w, h, c, data: Uint8Array w*h*c, row-major, channels interleaved}.
  const image = (w, h, c, data) => ({ w, h, c, data: data || new Uint8Array(w * h * c) });

  // Python's round(): half to even.
  function roundHalfEven(x) {
    const r = Math.round(x);
    return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }

  // ---- Pillow's resampling (libImaging/Resample.c), LANCZOS ------------------------------

  const PRECISION_BITS = 32 - 8 - 2;
  const ONE = 2 ** PRECISION_BITS;

  function sinc(x) {
    if (x === 0) return 1;
    x *= Math.PI;
    return Math.sin(x) / x;
  }

  const lanczos = (x) => (x >= -3 && x < 3 ? sinc(x) * sinc(x / 3) : 0);

  // precompute_coeffs + normalize_coeffs_8bpc: for each output index, the first input index,
  // the count, and the fixed-point weights. Kept for the sizes last used (a drawing is
  // prepared again after every stroke, mostly from the same sizes).
  const tables = new Map();

  function coefficients(inSize, outSize) {
    const key = `${inSize}>${outSize}`;
    let table = tables.get(key);
    if (!table) {
      if (tables.size >= 64) tables.clear();
      table = computeCoefficients(inSize, outSize);
      tables.set(key, table);
    }
    return table;
  }

  function computeCoefficients(inSize, outSize) {
    const scale = inSize / outSize;
    const filterscale = Math.max(scale, 1);
    const support = 3 * filterscale;
    const ksize = Math.ceil(support) * 2 + 1;
    const bounds = new Int32Array(outSize * 2);
    const kk = new Float64Array(outSize * ksize);
    const inv = 1 / filterscale;
    for (let xx = 0; xx < outSize; xx++) {
      const center = (xx + 0.5) * scale;
      const xmin = Math.max(Math.trunc(center - support + 0.5), 0);
      const xmax = Math.min(Math.trunc(center + support + 0.5), inSize) - xmin;
      let ww = 0;
      for (let x = 0; x < xmax; x++) {
        const w = lanczos((x + xmin - center + 0.5) * inv);
        kk[xx * ksize + x] = w;
        ww += w;
      }
      for (let x = 0; x < xmax; x++) {
        const k = ww !== 0 ? kk[xx * ksize + x] / ww : kk[xx * ksize + x];
        kk[xx * ksize + x] = Math.trunc(k < 0 ? -0.5 + k * ONE : 0.5 + k * ONE);
      }
      bounds[xx * 2] = xmin;
      bounds[xx * 2 + 1] = xmax;
    }
    return { ksize, bounds, kk };
  }

  const clip8 = (ss) => Math.min(Math.max(Math.floor(ss / ONE), 0), 255);

  // The horizontal pass: each row's samples weighted along x (the rows unchanged).
  function passX(src, outW) {
    const { w, h, c, data } = src;
    const { ksize, bounds, kk } = coefficients(w, outW);
    const out = image(outW, h, c), o8 = out.data;
    for (let y = 0; y < h; y++) {
      const row = y * w * c;
      for (let xx = 0; xx < outW; xx++) {
        const xmin = bounds[xx * 2], xmax = bounds[xx * 2 + 1], k0 = xx * ksize;
        for (let ch = 0; ch < c; ch++) {
          let ss = ONE / 2;
          for (let x = 0, i = row + xmin * c + ch; x < xmax; x++, i += c) ss += data[i] * kk[k0 + x];
          o8[(y * outW + xx) * c + ch] = clip8(ss);
        }
      }
    }
    return out;
  }

  // The vertical pass: each output row a weighted sum of input rows (the columns unchanged).
  function passY(src, outH) {
    const { w, h, c, data } = src;
    const { ksize, bounds, kk } = coefficients(h, outH);
    const n = w * c, out = image(w, outH, c), acc = new Float64Array(n);
    for (let yy = 0; yy < outH; yy++) {
      const ymin = bounds[yy * 2], ymax = bounds[yy * 2 + 1], k0 = yy * ksize;
      acc.fill(ONE / 2);
      for (let y = 0; y < ymax; y++) {
        const k = kk[k0 + y], row = (ymin + y) * n;
        for (let i = 0; i < n; i++) acc[i] += data[row + i] * k;
      }
      for (let i = 0; i < n; i++) out.data[yy * n + i] = clip8(acc[i]);
    }
    return out;
  }

  // Image.resize(size, Image.LANCZOS) of an "L" or "RGB" image: a copy when the size is the
  // same; else two passes, each only where needed, each rounded to bytes. Pillow 13 runs the
  // vertical one first when the height loses more than twice as many pixels as the width
  // (found by testing it: every case agrees); before 13 the horizontal one always came first.
  function resize(src, w, h) {
    if (src.w === w && src.h === h) return image(w, h, src.c, src.data.slice());
    const verticalFirst = h < src.h && 2 * (src.w - w) < src.h - h;
    let im = src;
    if (verticalFirst) im = passY(im, h);
    if (im.w !== w) im = passX(im, w);
    if (im.h !== h) im = passY(im, h);
    return im;
  }

  // ---- decoding: shrink (Image.reduce, libImaging/Reduce.c) and the working mode ---------

  // Reduce.c's division_UINT32(n, 8): 2**32 / (256 n) in float32, truncated.
  const multiplier = (n) => Math.floor(f32(4294967296 / f32(256 * n)));

  // Image.reduce(factor) of an RGBA picture: premultiplied by alpha (RGBA -> RGBa), each output
  // pixel the rounded mean of its factor x factor box (smaller at the right and bottom edges),
  // then unpremultiplied (RGBa -> RGBA). For an opaque picture that is the plain box mean.
  function reduceRGBA(src, f) {
    const { w, h, data } = src;
    const ow = Math.ceil(w / f), oh = Math.ceil(h / f);
    const out = image(ow, oh, 4), sums = new Float64Array(ow * 4);
    const cell = new Int32Array(w);  // each input column's output column
    for (let x = 0; x < w; x++) cell[x] = Math.floor(x / f) * 4;
    for (let y = 0; y < oh; y++) {
      sums.fill(0);
      const y1 = Math.min(y * f + f, h);
      for (let yy = y * f; yy < y1; yy++) {
        for (let x = 0, i = yy * w * 4; x < w; x++, i += 4) {
          const a = data[i + 3], o = cell[x];
          if (a === 255) {  // opaque: premultiplying changes nothing
            sums[o] += data[i]; sums[o + 1] += data[i + 1]; sums[o + 2] += data[i + 2];
          } else {
            for (let ch = 0; ch < 3; ch++) {
              const t = data[i + ch] * a + 128;
              sums[o + ch] += ((t >> 8) + t) >> 8;  // MULDIV255: premultiplied (RGBa)
            }
          }
          sums[o + 3] += a;
        }
      }
      for (let x = 0; x < ow; x++) {
        const n = (y1 - y * f) * (Math.min(x * f + f, w) - x * f), m = multiplier(n), amend = Math.floor(n / 2);
        const o = (y * ow + x) * 4, d = out.data;
        for (let ch = 0; ch < 4; ch++) d[o + ch] = Math.floor(((sums[x * 4 + ch] + amend) * m) / 16777216);
        const a = d[o + 3];
        if (a !== 0 && a !== 255) {  // back to RGBA
          for (let ch = 0; ch < 3; ch++) d[o + ch] = Math.min(Math.floor((255 * d[o + ch]) / a), 255);
        }
      }
    }
    return out;
  }

  // data/picture.py flatten_alpha: RGBA -> RGB over white behind dark ink, black behind light.
  function flattenAlpha(src) {
    const { w, h, data } = src;
    let sum = 0, count = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] / 255 > 0.5) {
        sum += data[i] + data[i + 1] + data[i + 2];
        count += 3;
      }
    }
    const bg = count === 0 || sum / count < 128 ? 255 : 0;
    const out = image(w, h, 3);
    for (let p = 0; p < w * h; p++) {
      const alpha = f32(data[p * 4 + 3] / 255);
      for (let ch = 0; ch < 3; ch++) {
        const v = data[p * 4 + ch] * alpha + bg * (1 - alpha) + 0.5;
        out.data[p * 3 + ch] = Math.min(Math.max(Math.floor(v), 0), 255);
      }
    }
    return out;
  }

  // The picture as the server holds it after decode_image (shrink of working_mode's image)
  // and _decoded: grey (c 1), colour (c 3); transparency flattened.
  function decoded(imageData) {
    const w = imageData.width, h = imageData.height;
    if (!w || !h) throw new Error(`image of ${w}x${h} pixels has no pixels`);
    let rgba = image(w, h, 4, new Uint8Array(imageData.data.buffer, imageData.data.byteOffset, w * h * 4));
    if (Math.max(w, h) > WORK_SIDE) rgba = reduceRGBA(rgba, Math.ceil(Math.max(w, h) / WORK_SIDE));
    const d = rgba.data;
    let opaque = true, grey = true;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] !== 255) { opaque = false; break; }
      if (d[i] !== d[i + 1] || d[i] !== d[i + 2]) grey = false;
    }
    if (!opaque) return flattenAlpha(rgba);
    const out = image(rgba.w, rgba.h, grey ? 1 : 3);
    for (let p = 0, n = rgba.w * rgba.h; p < n; p++) {
      if (grey) out.data[p] = d[p * 4];
      else for (let ch = 0; ch < 3; ch++) out.data[p * 3 + ch] = d[p * 4 + ch];
    }
    return out;
  }

  // ---- data/picture.py ------------------------------------------------------------------

  // _grey: float32 grey values (the mean of R, G, B for colour).
  function greyOf(a) {
    const n = a.w * a.h, g = new Float32Array(n);
    if (a.c === 1) g.set(a.data);
    else for (let p = 0; p < n; p++) g[p] = (a.data[p * 3] + a.data[p * 3 + 1] + a.data[p * 3 + 2]) / 3;
    return g;
  }

  // np.clip(g, 0, 255).astype(np.uint8): truncated.
  function bytesOf(g, w, h) {
    const out = image(w, h, 1);
    for (let p = 0; p < g.length; p++) out.data[p] = g[p] <= 0 ? 0 : g[p] >= 255 ? 255 : Math.trunc(g[p]);
    return out;
  }

  // needs_invert: the border (rows 0 and H-1, columns 0 and W-1) is bright on average.
  function needsInvert(g, w, h) {
    let sum = 0;
    for (let x = 0; x < w; x++) sum += g[x] + g[(h - 1) * w + x];
    for (let y = 0; y < h; y++) sum += g[y * w] + g[y * w + w - 1];
    return sum / (2 * (w + h)) > 127;
  }

  // fit_ink: (w x h) grey values, light ink on black -> (size x size) bytes, the ink's bounding
  // box scaled and placed by `fit`.
  function fitInk(g, w, h, size, fit) {
    let top0 = h, bottom = -1, left0 = w, right = -1, gmax = -Infinity;
    for (let p = 0; p < g.length; p++) gmax = Math.max(gmax, g[p]);
    const threshold = f32(0.1 * Math.max(gmax, 1));  // compared in float32, as numpy does
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        if (g[y * w + x] > threshold) {
          top0 = Math.min(top0, y); bottom = Math.max(bottom, y);
          left0 = Math.min(left0, x); right = Math.max(right, x);
        }
      }
    }
    const out = image(size, size, 1);
    if (bottom < 0) return out;
    const ch = bottom - top0 + 1, cw = right - left0 + 1;
    const crop = new Float32Array(ch * cw);
    for (let y = 0; y < ch; y++) crop.set(g.subarray((top0 + y) * w + left0, (top0 + y) * w + left0 + cw), y * cw);
    const box = Math.max(1, roundHalfEven(fit.box * size));
    const scale = box / Math.max(ch, cw);
    const nh = Math.min(size, Math.max(1, roundHalfEven(ch * scale)));
    const nw = Math.min(size, Math.max(1, roundHalfEven(cw * scale)));
    const small = resize(bytesOf(crop, cw, ch), nw, nh).data;
    let total = 0, sy = 0, sx = 0;
    for (let y = 0; y < nh; y++) {
      for (let x = 0; x < nw; x++) {
        const v = small[y * nw + x];
        total += v; sy += y * v; sx += x * v;
      }
    }
    let top, left;
    if (fit.byMass && total) {
      top = roundHalfEven(size / 2 - sy / total);
      left = roundHalfEven(size / 2 - sx / total);
    } else {
      top = Math.floor((size - nh) / 2);
      left = Math.floor((size - nw) / 2);
    }
    top = Math.min(Math.max(top, 0), size - nh);
    left = Math.min(Math.max(left, 0), size - nw);
    for (let y = 0; y < nh; y++) out.data.set(small.subarray(y * nw, (y + 1) * nw), (top + y) * size + left);
    return out;
  }

  // as_is: the picture unchanged, only resized to the model's size, grey or colour as it takes.
  function asIs(a, t) {
    if (t.channels === 1) return resize(bytesOf(greyOf(a), a.w, a.h), t.width, t.height);
    if (a.c === 3) return resize(a, t.width, t.height);
    const rgb = image(a.w, a.h, 3);
    for (let p = 0; p < a.w * a.h; p++) rgb.data.fill(a.data[p], p * 3, p * 3 + 3);
    return resize(rgb, t.width, t.height);
  }

  // is_dataset_image: the model's size and channels and, for a grey model, the data's polarity.
  function isDatasetImage(a, t) {
    if (a.w !== t.width || a.h !== t.height || a.c !== t.channels) return false;
    return t.channels !== 1 || needsInvert(a.data, a.w, a.h) !== t.dark;
  }

  // prepare(): the dataset's way (style "auto") or a forced style.
  function prepare(a, t, style) {
    if (style === "auto") {
      if (isDatasetImage(a, t)) return [a, "none"];
      style = t.picture;
    }
    if (t.channels !== 1) return [asIs(a, t), "resize"];
    const g = greyOf(a);
    if (needsInvert(g, a.w, a.h) === t.dark) {
      for (let p = 0; p < g.length; p++) g[p] = 255 - g[p];
    }
    if (style in FITS) {
      const out = fitInk(g, a.w, a.h, t.height, FITS[style]);
      return [resize(out, t.width, t.height), style];
    }
    return [resize(bytesOf(g, a.w, a.h), t.width, t.height), style];
  }

  function checkedTarget(target) {
    const t = target || {};
    const height = t.height, width = t.width, channels = t.channels;
    for (const [name, v] of [["height", height], ["width", width]]) {
      if (!Number.isInteger(v) || v < 1) throw new Error(`target ${name} must be a positive integer, got ${v}`);
    }
    if (channels !== 1 && channels !== 3) throw new Error(`target channels must be 1 or 3, got ${channels}`);
    const picture = t.picture == null ? (channels === 1 ? "mnist" : "resize") : t.picture;
    if (!STYLES.includes(picture)) {
      throw new Error(`target picture must be one of ${STYLES.join(", ")}, got ${picture}`);
    }
    if (t.background !== "dark" && t.background !== "light") {
      throw new Error(`target background must be dark or light, got ${t.background}`);
    }
    return { height, width, channels, picture, dark: t.background === "dark" };
  }

  window.mnistflowPrepare = function (imageData, target, mode) {
    const t = checkedTarget(target);
    const how = mode == null ? "auto" : mode;
    if (how !== "auto" && how !== "as-is" && !STYLES.includes(how)) {
      throw new Error(`mode must be auto, as-is or one of ${STYLES.join(", ")}, got ${how}`);
    }
    const a = decoded(imageData);
    const least = Math.min(MIN_SIDE, t.height, t.width);
    if ((a.w !== t.width || a.h !== t.height) && Math.min(a.w, a.h) < least) {
      throw new Error(`image of ${a.w}x${a.h} pixels is too small to classify: at least ${least} pixels a side`);
    }
    const [out, used] = how === "as-is" ? [asIs(a, t), "none"] : prepare(a, t, how);
    return { pixels: Uint8Array.from(out.data), preprocess: used };
  };
})();
