// The browser's forward pass of a model exported by `mnistflow export RUN --format web`.
//
// model.js holds the model as a graph (artifacts/web: nodes in execution order, each an
// operation of earlier nodes, its output shape recorded) and its weights (float32, base64).
// This file runs that graph on one image, in plain JavaScript: Float32Array values, sums
// accumulated in double precision and stored as float32 (PyTorch's float32 results to ~1e-6).
// The Python twin of every operation is artifacts/web/run.py.
//
//   const T = mnistflowForward.tensors(window.mnistflowModel);   // decode the weights once
//   const values = mnistflowForward.run(window.mnistflowModel, T, x);  // x: normalized CHW
//   values[model.output].data                                     // the logits
(function () {
  "use strict";

  const size = (shape) => shape.reduce((a, b) => a * b, 1);

  function strides(shape) {
    const s = new Array(shape.length);
    let k = 1;
    for (let i = shape.length - 1; i >= 0; i--) {
      s[i] = k;
      k *= shape[i];
    }
    return s;
  }

  // The weights: one float32 little-endian blob, cut into the graph's tensors.
  function tensors(model) {
    if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
      throw new Error("this browser's machine is big-endian: the exported weights are little-endian");
    }
    const bin = atob(model.weights);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const all = new Float32Array(bytes.buffer);
    return model.tensors.map((t) => ({ data: all.subarray(t.offset, t.offset + size(t.shape)), shape: t.shape }));
  }

  // Each window of the input, as a row of `cols` (P x K, K = Cg * KH * KW in the weights' order).
  function im2col(n, x, wshape, b, c0, cols) {
    const [, C, H, W] = x.shape, [, , OH, OW] = n.shape, [, Cg, KH, KW] = wshape;
    const [sh, sw] = n.stride, [dh, dw] = n.dilation, pt = n.pad[0], pl = n.pad[1], xd = x.data;
    let at = 0;
    for (let oy = 0; oy < OH; oy++) {
      for (let ox = 0; ox < OW; ox++) {
        for (let ci = 0; ci < Cg; ci++) {
          const plane = (b * C + c0 + ci) * H * W;
          for (let ky = 0; ky < KH; ky++) {
            const iy = oy * sh + ky * dh - pt;
            if (iy < 0 || iy >= H) {
              cols.fill(0, at, at + KW);
              at += KW;
              continue;
            }
            const row = plane + iy * W;
            for (let kx = 0; kx < KW; kx++, at++) {
              const ix = ox * sw + kx * dw - pl;
              cols[at] = ix < 0 || ix >= W ? 0 : xd[row + ix];
            }
          }
        }
      }
    }
  }

  // out[at + (o - o0) * stride + p] = bias[o] + dot(w row o, x row p), for o in [o0, o1) and p < P: the
  // rows of x (length k) against the rows of w, in blocks of four rows of w and two of x (each value
  // read once for several products); sums in double precision.
  function matmul(w, x, k, P, o0, o1, bias, out, at, stride) {
    const b = (o) => (bias ? bias[o] : 0);
    let o = o0;
    for (; o + 3 < o1; o += 4) {
      const w0 = o * k, w1 = w0 + k, w2 = w1 + k, w3 = w2 + k;
      let p = 0;
      for (; p + 1 < P; p += 2) {
        const xa = p * k, xb = xa + k;
        let a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
        for (let i = 0; i < k; i++) {
          const u = x[xa + i], v = x[xb + i], c0 = w[w0 + i], c1 = w[w1 + i], c2 = w[w2 + i], c3 = w[w3 + i];
          a0 += c0 * u; a1 += c1 * u; a2 += c2 * u; a3 += c3 * u;
          b0 += c0 * v; b1 += c1 * v; b2 += c2 * v; b3 += c3 * v;
        }
        const q = at + (o - o0) * stride + p;
        out[q] = b(o) + a0; out[q + stride] = b(o + 1) + a1; out[q + 2 * stride] = b(o + 2) + a2;
        out[q + 3 * stride] = b(o + 3) + a3;
        out[q + 1] = b(o) + b0; out[q + 1 + stride] = b(o + 1) + b1; out[q + 1 + 2 * stride] = b(o + 2) + b2;
        out[q + 1 + 3 * stride] = b(o + 3) + b3;
      }
      for (; p < P; p++) {
        const xa = p * k;
        let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (let i = 0; i < k; i++) {
          const u = x[xa + i];
          a0 += w[w0 + i] * u; a1 += w[w1 + i] * u; a2 += w[w2 + i] * u; a3 += w[w3 + i] * u;
        }
        const q = at + (o - o0) * stride + p;
        out[q] = b(o) + a0; out[q + stride] = b(o + 1) + a1; out[q + 2 * stride] = b(o + 2) + a2;
        out[q + 3 * stride] = b(o + 3) + a3;
      }
    }
    for (; o < o1; o++) {
      for (let p = 0; p < P; p++) {
        let s = 0;
        for (let i = 0, wo = o * k, xo = p * k; i < k; i++) s += w[wo + i] * x[xo + i];
        out[at + (o - o0) * stride + p] = b(o) + s;
      }
    }
  }

  // A convolution as dot products of each window with each filter (im2col).
  function conv2d(n, [x], T) {
    const w = T[n.weight], wd = w.data, bias = n.bias == null ? null : T[n.bias].data;
    const [N, C] = x.shape, [, O, OH, OW] = n.shape, G = n.groups, Og = O / G, Cg = C / G;
    const K = w.shape[1] * w.shape[2] * w.shape[3], P = OH * OW;
    const out = new Float32Array(N * O * P), cols = new Float32Array(P * K);
    for (let b = 0; b < N; b++) {
      for (let g = 0; g < G; g++) {
        im2col(n, x, w.shape, b, g * Cg, cols);
        matmul(wd, cols, K, P, g * Og, (g + 1) * Og, bias, out, (b * O + g * Og) * P, P);
      }
    }
    return out;
  }

  function linear(n, [x], T) {
    const w = T[n.weight], wd = w.data, O = w.shape[0], I = w.shape[1];
    const bias = n.bias == null ? null : T[n.bias].data;
    const xd = x.data, rows = xd.length / I, out = new Float32Array(rows * O);
    for (let r = 0; r < rows; r++) matmul(wd, xd.subarray(r * I, (r + 1) * I), I, 1, 0, O, bias, out, r * O, 1);
    return out;
  }

  // Batch norm (eval), folded into a scale and a shift per channel (axis 1); then ReLU if asked.
  function affine(n, [x], T) {
    const scale = T[n.scale].data, shift = T[n.shift].data, relu = !!n.relu;
    const C = x.shape[1], inner = size(x.shape.slice(2)), outer = x.shape[0];
    const xd = x.data, out = new Float32Array(xd.length);
    for (let b = 0; b < outer; b++) {
      for (let c = 0; c < C; c++) {
        const a = scale[c], s = shift[c], p = (b * C + c) * inner;
        for (let i = p; i < p + inner; i++) {
          const v = Math.fround(xd[i] * a) + s;
          out[i] = relu && v < 0 ? 0 : v;
        }
      }
    }
    return out;
  }

  // erf to ~1e-7 (Numerical Recipes' erfc, fractional error under 1.2e-7)
  function erf(x) {
    const z = Math.abs(x), t = 1 / (1 + 0.5 * z);
    const r = t * Math.exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
      t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 +
      t * 0.17087277)))))))));
    return x >= 0 ? 1 - r : r - 1;
  }

  const UNARY = {
    relu: () => (v) => (v < 0 ? 0 : v),
    tanh: () => Math.tanh,
    sigmoid: () => (v) => 1 / (1 + Math.exp(-v)),
    gelu: () => (v) => 0.5 * v * (1 + erf(v * Math.SQRT1_2)),
    gelu_tanh: () => (v) => 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v * v * v))),
    silu: () => (v) => v / (1 + Math.exp(-v)),
    leaky_relu: (n) => (v) => (v < 0 ? v * n.alpha : v),
    elu: (n) => (v) => (v > 0 ? v : n.alpha * Math.expm1(v)),
    hardtanh: (n) => (v) => (v < n.min ? n.min : v > n.max ? n.max : v),
    exp: () => Math.exp, log: () => Math.log, neg: () => (v) => -v, abs: () => Math.abs, sqrt: () => Math.sqrt,
  };

  function unary(n, [x]) {
    const f = UNARY[n.fn](n), xd = x.data, out = new Float32Array(xd.length);
    for (let i = 0; i < xd.length; i++) out[i] = f(xd[i]);
    return out;
  }

  const BINARY = {
    add: (a, b) => a + b, sub: (a, b) => a - b, mul: (a, b) => a * b, div: (a, b) => a / b,
    max: (a, b) => (a >= b || a !== a ? a : b), min: (a, b) => (a <= b || a !== a ? a : b),
  };

  // The strides of `shape` read as the (longer) `out` shape: 0 along broadcast axes.
  function broadcastStrides(shape, out) {
    const s = strides(shape), r = new Array(out.length).fill(0), lead = out.length - shape.length;
    for (let i = 0; i < shape.length; i++) r[lead + i] = shape[i] === 1 ? 0 : s[i];
    return r;
  }

  // out[i] = f(a at the same index, b at the same index), with broadcasting; f takes the two flat indices.
  function eachPair(shape, sa, sb, f) {
    const nd = shape.length, idx = new Array(nd).fill(0), total = size(shape);
    let ia = 0, ib = 0;
    for (let i = 0; i < total; i++) {
      f(i, ia, ib);
      for (let d = nd - 1; d >= 0; d--) {
        idx[d]++;
        ia += sa[d];
        ib += sb[d];
        if (idx[d] < shape[d]) break;
        ia -= sa[d] * shape[d];
        ib -= sb[d] * shape[d];
        idx[d] = 0;
      }
    }
  }

  function binary(n, [a, b]) {
    const f = BINARY[n.fn], total = size(n.shape), out = new Float32Array(total), ad = a.data, bd = b.data;
    if (ad.length === total && bd.length === total) {
      for (let i = 0; i < total; i++) out[i] = f(ad[i], bd[i]);
    } else if (ad.length === total && bd.length === 1) {
      const v = bd[0];
      for (let i = 0; i < total; i++) out[i] = f(ad[i], v);
    } else {
      eachPair(n.shape, broadcastStrides(a.shape, n.shape), broadcastStrides(b.shape, n.shape),
        (i, ia, ib) => { out[i] = f(ad[ia], bd[ib]); });
    }
    return out;
  }

  function reduce(n, [x]) {
    const shape = x.shape, kept = shape.map((s, d) => (n.axes.includes(d) ? 1 : s));
    const total = size(kept), count = size(shape) / total, xd = x.data;
    const init = { max: -Infinity, min: Infinity, mean: 0, sum: 0 }[n.fn];
    const acc = new Float64Array(total).fill(init), fn = n.fn;
    eachPair(shape, strides(shape), broadcastStrides(kept, shape), (i, ix, io) => {
      const v = xd[ix];
      if (fn === "max") acc[io] = v > acc[io] || v !== v ? v : acc[io];
      else if (fn === "min") acc[io] = v < acc[io] || v !== v ? v : acc[io];
      else acc[io] += v;
    });
    if (fn === "mean") for (let i = 0; i < total; i++) acc[i] /= count;
    return Float32Array.from(acc);
  }

  function softmax(n, [x]) {
    const shape = x.shape, len = shape[n.axis], inner = size(shape.slice(n.axis + 1));
    const outer = size(shape.slice(0, n.axis)), xd = x.data, out = new Float32Array(xd.length);
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < inner; j++) {
        const p = o * len * inner + j;
        let m = -Infinity, s = 0;
        for (let k = 0; k < len; k++) m = Math.max(m, xd[p + k * inner]);
        for (let k = 0; k < len; k++) s += Math.exp(xd[p + k * inner] - m);
        for (let k = 0; k < len; k++) {
          const v = xd[p + k * inner] - m;
          out[p + k * inner] = n.log ? v - Math.log(s) : Math.exp(v) / s;
        }
      }
    }
    return out;
  }

  // Pooling over the last two axes; `window(plane, oy, ox)` gives one output value.
  function pool2d(n, x, window) {
    const H = x.shape[x.shape.length - 2], W = x.shape[x.shape.length - 1];
    const OH = n.shape[n.shape.length - 2], OW = n.shape[n.shape.length - 1];
    const planes = size(x.shape) / (H * W), out = new Float32Array(planes * OH * OW);
    for (let p = 0; p < planes; p++) {
      for (let oy = 0; oy < OH; oy++) {
        for (let ox = 0; ox < OW; ox++) out[(p * OH + oy) * OW + ox] = window(p * H * W, oy, ox, H, W, OH, OW);
      }
    }
    return out;
  }

  function maxpool2d(n, [x]) {
    const [kh, kw] = n.kernel, [sh, sw] = n.stride, [ph, pw] = n.pad, [dh, dw] = n.dilation, xd = x.data;
    return pool2d(n, x, (p, oy, ox, H, W) => {
      let m = -Infinity;
      for (let ky = 0; ky < kh; ky++) {
        const iy = oy * sh - ph + ky * dh;
        if (iy < 0 || iy >= H) continue;
        for (let kx = 0; kx < kw; kx++) {
          const ix = ox * sw - pw + kx * dw;
          if (ix < 0 || ix >= W) continue;
          const v = xd[p + iy * W + ix];
          if (v > m || v !== v) m = v;
        }
      }
      return m;
    });
  }

  function avgpool2d(n, [x]) { // PyTorch's windows and divisors (ceil_mode, count_include_pad, divisor_override)
    const [kh, kw] = n.kernel, [sh, sw] = n.stride, [ph, pw] = n.pad, xd = x.data;
    return pool2d(n, x, (p, oy, ox, H, W) => {
      let y0 = oy * sh - ph, x0 = ox * sw - pw;
      let y1 = Math.min(y0 + kh, H + ph), x1 = Math.min(x0 + kw, W + pw);
      const all = (y1 - y0) * (x1 - x0);
      y0 = Math.max(y0, 0); x0 = Math.max(x0, 0); y1 = Math.min(y1, H); x1 = Math.min(x1, W);
      if (y0 >= y1 || x0 >= x1) return 0;
      let s = 0;
      for (let iy = y0; iy < y1; iy++) for (let ix = x0; ix < x1; ix++) s += xd[p + iy * W + ix];
      return s / (n.divisor || (n.count_include_pad ? all : (y1 - y0) * (x1 - x0)));
    });
  }

  function adaptivepool2d(n, [x]) {
    const xd = x.data, max = n.fn === "max";
    return pool2d(n, x, (p, oy, ox, H, W, OH, OW) => {
      const y0 = Math.floor(oy * H / OH), y1 = Math.ceil((oy + 1) * H / OH);
      const x0 = Math.floor(ox * W / OW), x1 = Math.ceil((ox + 1) * W / OW);
      let s = max ? -Infinity : 0;
      for (let iy = y0; iy < y1; iy++) {
        for (let ix = x0; ix < x1; ix++) {
          const v = xd[p + iy * W + ix];
          s = max ? (v > s || v !== v ? v : s) : s + v;
        }
      }
      return max ? s : s / ((y1 - y0) * (x1 - x0));
    });
  }

  function pad(n, [x]) { // a constant around each axis (a negative padding crops)
    const out = new Float32Array(size(n.shape)).fill(n.value), xd = x.data, os = strides(n.shape);
    const shape = x.shape, nd = shape.length, lo = n.pads.map((p) => p[0]), idx = new Array(nd).fill(0);
    for (let i = 0; i < xd.length; i++) {
      let io = 0, inside = true;
      for (let d = 0; d < nd && inside; d++) {
        const k = idx[d] + lo[d];
        inside = k >= 0 && k < n.shape[d];
        io += k * os[d];
      }
      if (inside) out[io] = xd[i];
      for (let d = nd - 1; d >= 0 && ++idx[d] === shape[d]; d--) idx[d] = 0;
    }
    return out;
  }

  function permute(n, [x]) {
    const xs = strides(x.shape), out = new Float32Array(x.data.length), xd = x.data;
    const read = n.perm.map((d) => xs[d]); // out axis k walks input axis perm[k]
    eachPair(n.shape, read, strides(n.shape), (i, ix) => { out[i] = xd[ix]; });
    return out;
  }

  function concat(n, xs) {
    const axis = n.axis, outer = size(n.shape.slice(0, axis)), out = new Float32Array(size(n.shape));
    const row = size(n.shape.slice(axis));
    let at = 0;
    for (const x of xs) {
      const part = size(x.shape.slice(axis));
      for (let o = 0; o < outer; o++) out.set(x.data.subarray(o * part, (o + 1) * part), o * row + at);
      at += part;
    }
    return out;
  }

  const OPS = {
    const: (n, _, T) => ("tensor" in n ? T[n.tensor].data : Float32Array.of(n.value)),
    conv2d, linear, affine, unary, binary, reduce, softmax, maxpool2d, avgpool2d, adaptivepool2d, pad,
    reshape: (n, [x]) => x.data,
    permute, concat,
  };

  // Every node's value ({data, shape}) for the normalized input `x` (Float32Array, C x H x W).
  function run(model, T, x) {
    const values = new Array(model.nodes.length);
    for (let i = 0; i < model.nodes.length; i++) {
      const n = model.nodes[i];
      const op = n.op === "input" ? () => x : OPS[n.op];
      if (!op) throw new Error(`this page cannot run the operation '${n.op}' (an export from a newer mnistflow?)`);
      values[i] = { data: op(n, n.in.map((j) => values[j]), T), shape: n.shape };
    }
    return values;
  }

  // The class probabilities of the logits (1 x K), as torch_probabilities: softmax in float32.
  function probabilities(logits) {
    return softmax({ axis: 1, log: false }, [{ data: logits.data, shape: logits.shape }]);
  }

  window.mnistflowForward = { tensors, run, probabilities, size };
})();
