// mnistflow's page: draw (or upload) a picture, see the prediction and every layer respond.
// No dependencies, nothing loaded from the network.
//
// The page talks only to window.mnistflow (backend.js: the server's API under `mnistflow serve`,
// the model itself in a `mnistflow export --format web` folder). Each change of the drawing is
// one look(picture): the picture prepared as the model's dataset images were made (for MNIST:
// bounding box -> 20x20 -> centre of mass in 28x28, the training data's polarity), the pixels the
// model saw, every layer's output and the probabilities. One look is in flight at a time; strokes
// made meanwhile are sent as soon as it returns, so the pictures follow the pen.
//
// Read by tests and benchmarks: #prediction's data-label (the data's own label value, e.g. 1..26)
// and data-state ("busy" while a change is not yet shown, "idle" once it is); #layers'
// data-painted (how many looks have been painted) and data-ms (the last one's time from the
// pointer event to its pictures on screen, ms); each layer's canvas (.tiles) carries data-tiles,
// data-cols, data-tile-w, data-tile-h and data-gap (where each tile is) and data-channels.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const backend = window.mnistflow;
  const pad = $("pad");
  const ctx = pad.getContext("2d");
  const seen = $("seen");
  const prediction = $("prediction");
  const layersEl = $("layers");

  const state = {
    dark: false,          // false: black ink on white paper; true: white on black
    canDraw: true,        // false for colour models: upload only
    drawing: false,
    pointer: null,
    last: null,
    hasInk: false,
    gen: 0,               // bumped by Clear: answers to older pictures are dropped
    next: null,           // {make: () => Promise<Blob>, t0}: the newest picture to look at
    inFlight: false,
    info: null,           // backend.info()
    rows: [],             // the probability bars
    views: [],            // the layers view: one entry per layer (see buildLayers)
    shown: null,          // the layers painted last (repainted on resize, order change)
    blank: null,          // the layers of an empty picture (shown before drawing, after Clear)
    painted: 0,
    width: 0,             // the layers view's width in CSS pixels (0: not read yet)
  };

  const ink = () => (state.dark ? "#fff" : "#000");
  const paper = () => (state.dark ? "#000" : "#fff");
  const brush = () => pad.width / 14;  // ~20 px: MNIST-like strokes for a digit filling the pad

  // ---- drawing -------------------------------------------------------------------------

  function fillPaper() {
    ctx.fillStyle = paper();
    ctx.fillRect(0, 0, pad.width, pad.height);
  }

  function clearAll() {
    fillPaper();
    state.hasInk = false;
    state.next = null;
    state.gen += 1;
    showEmpty();
  }

  function pos(e) {
    const r = pad.getBoundingClientRect();
    return { x: (e.clientX - r.left) * (pad.width / r.width), y: (e.clientY - r.top) * (pad.height / r.height) };
  }

  function dot(p) {
    ctx.fillStyle = ink();
    ctx.beginPath();
    ctx.arc(p.x, p.y, brush() / 2, 0, 2 * Math.PI);
    ctx.fill();
  }

  function line(a, b) {
    ctx.strokeStyle = ink();
    ctx.lineWidth = brush();
    ctx.lineCap = "round";
    ctx.lineJoin = "round";
    ctx.beginPath();
    ctx.moveTo(a.x, a.y);
    ctx.lineTo(b.x, b.y);
    ctx.stroke();
  }

  pad.addEventListener("pointerdown", (e) => {
    if (e.button !== 0 || state.drawing || !state.canDraw) return;
    e.preventDefault();
    pad.setPointerCapture(e.pointerId);
    state.drawing = true;
    state.pointer = e.pointerId;
    state.last = pos(e);
    dot(state.last);
    changed(e);
  });

  pad.addEventListener("pointermove", (e) => {
    if (!state.drawing || e.pointerId !== state.pointer) return;
    e.preventDefault();
    const events = e.getCoalescedEvents ? e.getCoalescedEvents() : [];
    for (const ev of events.length ? events : [e]) {
      const p = pos(ev);
      line(state.last, p);
      state.last = p;
    }
    changed(e);
  });

  function endStroke(e) {
    if (!state.drawing || e.pointerId !== state.pointer) return;
    state.drawing = false;
    state.pointer = null;
    changed(e);
  }
  pad.addEventListener("pointerup", endStroke);
  pad.addEventListener("pointercancel", endStroke);

  function changed(e) {
    state.hasInk = true;
    queue(() => new Promise((resolve) => pad.toBlob(resolve, "image/png")), e.timeStamp);
  }

  // ---- looking: one request in flight, the newest picture next ----------------------------

  function queue(make, t0) {
    state.next = { make, t0, gen: state.gen };
    prediction.dataset.state = "busy";
    pump();
  }

  async function pump() {
    if (state.inFlight) return;
    const job = state.next;
    if (!job) {
      prediction.dataset.state = "idle";
      return;
    }
    state.next = null;
    state.inFlight = true;
    try {
      const t0 = timed("wait", job.t0);  // from the pointer event to its turn
      const picture = await job.make();
      const t1 = timed("png", t0);
      const res = await backend.look(picture, null);
      const t2 = timed("look", t1);
      if (state.hasInk && job.gen === state.gen) {
        show(res, t2 - t1);
        afterPaint(job.t0, timed("paint", t2));
      }
    } catch (err) {
      showError(err.message || String(err));
    } finally {
      state.inFlight = false;
      pump();
    }
  }

  // a step's time as a performance measure "mnistflow <step>" (the browser's profiler shows it;
  // only the newest of each is kept); returns now
  function timed(step, start) {
    const end = performance.now();
    performance.clearMeasures(`mnistflow ${step}`);
    performance.measure(`mnistflow ${step}`, { start, end });
    return end;
  }

  // the time from the pointer event to the pictures on screen: a frame, then the task after it
  function afterPaint(t0, drawn) {
    requestAnimationFrame(() => setTimeout(() => {
      timed("frame", drawn);
      state.painted += 1;
      layersEl.dataset.ms = (performance.now() - t0).toFixed(1);
      layersEl.dataset.painted = String(state.painted);
    }, 0));
  }

  // ---- the prediction ----------------------------------------------------------------------

  function buildBars(names) {
    const bars = $("bars");
    bars.textContent = "";
    state.rows = names.map((name, k) => {
      const row = document.createElement("div");
      row.className = "bar-row";
      row.dataset.k = String(k);
      row.innerHTML = '<span class="name"></span><div class="track"><div class="fill"></div></div><span class="pct"></span>';
      row.querySelector(".name").textContent = name;
      bars.appendChild(row);
      return { row, fill: row.querySelector(".fill"), pct: row.querySelector(".pct") };
    });
  }

  const PREPARED = {
    mnist: "MNIST-style preparation", emnist: "EMNIST-style preparation",
    fashion: "Fashion-MNIST-style preparation", resize: "resized", none: "used as is",
  };

  function show(res, ms) {
    $("error").hidden = true;
    const m = state.info, probs = res.probabilities;
    let top = 0;
    probs.forEach((p, k) => { if (p > probs[top]) top = k; });
    prediction.textContent = m.class_names[top];
    prediction.classList.toggle("long", m.class_names[top].length > 3);  // "Ankle boot" in smaller type
    prediction.dataset.label = String(m.label_values ? m.label_values[top] : top);
    $("confidence").textContent = `${(100 * probs[top]).toFixed(1)}% sure`;
    state.rows.forEach((r, k) => {
      const p = probs[k] || 0;
      r.fill.style.width = `${(100 * p).toFixed(1)}%`;
      r.pct.textContent = `${(100 * p).toFixed(1)}%`;
      r.row.classList.toggle("top", k === top);
    });
    drawSeen(res.input);
    $("latency").textContent = `answered in ${ms.toFixed(0)} ms · ${PREPARED[res.preprocess] || res.preprocess}`;
    if (res.layers) paintLayers(res.layers);
    else showNoLayers(res.why);
  }

  function drawSeen(input) {  // the model's input, H x W x C row-major
    const [c, h, w] = state.info.in_shape;
    const img = new ImageData(w, h);
    for (let i = 0; i < h * w; i++) {
      const r = input[i * c], g = c === 3 ? input[i * c + 1] : r, b = c === 3 ? input[i * c + 2] : r;
      img.data[4 * i] = r; img.data[4 * i + 1] = g; img.data[4 * i + 2] = b; img.data[4 * i + 3] = 255;
    }
    seen.getContext("2d").putImageData(img, 0, 0);
  }

  function showEmpty() {
    prediction.textContent = "–";
    prediction.dataset.label = "";
    $("confidence").textContent = state.canDraw ? "draw something" : "upload a picture";
    $("latency").textContent = "";
    $("error").hidden = true;
    state.rows.forEach((r) => { r.fill.style.width = "0"; r.pct.textContent = ""; r.row.classList.remove("top"); });
    seen.getContext("2d").clearRect(0, 0, seen.width, seen.height);
    if (!state.inFlight) prediction.dataset.state = "idle";
    if (state.blank) paintLayers(state.blank);
  }

  function showError(message) {
    const el = $("error");
    el.textContent = message;
    el.hidden = false;
  }

  // ---- the layers view: structure ---------------------------------------------------------

  const MEMBER = /^members\.(\d+)\.(.+)$/;  // an ensemble's layers: members.<i>.<layer>

  // the kind of picture a layer gets: tiles (C feature maps), a strip of units, or the output bars
  function viewKind(layer, last) {
    if (last) return "output";
    const s = layer.shape;
    return s.length >= 2 && s.slice(1).reduce((a, b) => a * b, 1) > 1 ? "tiles" : "strip";
  }

  function buildLayers(list) {
    layersEl.textContent = "";
    state.views = [];
    let group = layersEl, member = null;
    list.forEach((layer, i) => {
      const m = MEMBER.exec(layer.name);
      if ((m ? m[1] : null) !== member) {
        member = m ? m[1] : null;
        group = layersEl;
        if (m) {
          group = document.createElement("details");
          group.className = "member";
          group.open = member === "0";
          group.innerHTML = `<summary>member ${member}</summary>`;
          layersEl.appendChild(group);
        }
      }
      const view = makeView(layer, viewKind(layer, i === list.length - 1), m ? m[2] : layer.name);
      group.appendChild(view.el);
      state.views.push(view);
    });
    layersEl.dataset.layout = signature(list);
  }

  function signature(list) {
    return list.map((l) => `${l.name}:${l.shape.join("x")}:${l.channels ? l.channels.length : ""}`).join(",");
  }

  function makeView(layer, kind, shortName) {
    const el = document.createElement("div");
    el.className = `layer ${kind}`;
    el.dataset.name = layer.name;
    el.dataset.kind = layer.kind;
    el.innerHTML = '<div class="layer-head"><span class="lname"></span> <span class="kind"></span> ' +
      '<span class="shape"></span> <span class="note"></span></div>';
    el.querySelector(".lname").textContent = shortName;
    el.querySelector(".kind").textContent = layer.kind;
    el.querySelector(".shape").textContent = layer.shape.join("×");
    const view = { el, kind, name: layer.name, layerKind: layer.kind, shape: layer.shape, order: null,
                   all: false, note: el.querySelector(".note"), layer: null, open: null };
    if (kind === "output") {
      view.bars = document.createElement("div");
      view.bars.className = "out-bars";
      el.appendChild(view.bars);
      return view;
    }
    view.canvas = document.createElement("canvas");
    view.canvas.className = kind === "tiles" ? "tiles" : "strip";
    el.appendChild(view.canvas);
    if (kind === "tiles") {
      view.canvas.title = "click a map to see what made it";
      view.canvas.addEventListener("click", (e) => openKernel(view, e));
      view.more = document.createElement("button");
      view.more.type = "button";
      view.more.className = "more";
      view.more.hidden = true;
      view.more.addEventListener("click", () => { view.all = !view.all; paintView(view); });
      el.appendChild(view.more);
      view.kernelEl = document.createElement("div");
      view.kernelEl.className = "kernel";
      view.kernelEl.hidden = true;
      el.appendChild(view.kernelEl);
    }
    return view;
  }

  function showNoLayers(why) {
    state.views = [];
    layersEl.dataset.layout = "";
    layersEl.innerHTML = '<p class="muted"></p>';
    layersEl.firstChild.textContent = `No layers to show: ${why || "this backend does not give them"}.`;
  }

  // ---- the layers view: painting ----------------------------------------------------------

  function paintLayers(list) {
    if (layersEl.dataset.layout !== signature(list)) buildLayers(list);
    state.shown = list;
    list.forEach((layer, i) => {
      const view = state.views[i];
      view.layer = layer;
      if (!state.drawing) view.order = null;  // re-sorted between strokes only: no jumping tiles
      paintView(view);
    });
  }

  function paintView(view) {
    if (!view.layer) return;
    if (view.kind === "output") paintOutput(view);
    else if (view.kind === "tiles") paintTiles(view);
    else paintStrip(view);
  }

  // the grey of a value on the layer's scale: 0..max (non-negative, e.g. after ReLU), or
  // -m..m with 0 in mid-grey (signed); its text for the layer's heading
  function scaleOf(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (!(hi >= lo)) lo = hi = 0;  // empty, or nothing but NaN
    if (lo >= 0) {
      const k = hi > 0 ? 255 / hi : 0;
      return { grey: (v) => v * k, text: `0 … ${fmt(hi)}` };
    }
    const m = Math.max(-lo, hi), k = 127.5 / m;
    return { grey: (v) => 127.5 + v * k, text: `−${fmt(m)} … +${fmt(m)}` };
  }

  function fmt(v) {
    return v === 0 ? "0" : Math.abs(v) >= 100 || Math.abs(v) < 0.01 ? v.toExponential(1) : v.toPrecision(2);
  }

  const NAN_PIXEL = 0xffff00ff;  // magenta: a value that is not a number
  const GAP_PIXEL = 0xffeae5e2;  // the lines between tiles (--line): a white map stays visible

  // the pixels of a canvas of n cells (w x h, `gap` apart, `cols` a row): gap-coloured, and
  // transparent where the last row has no cell; [ImageData, its pixels as uint32]
  function gridImage(canvas, n, cols, w, h, gap, gapPixel = GAP_PIXEL) {
    const img = new ImageData(canvas.width, canvas.height), px = new Uint32Array(img.data.buffer);
    px.fill(gapPixel);
    const left = n % cols ? n % cols : cols, x0 = Math.max(0, left * (w + gap) - gap);
    for (let y = canvas.height - h; x0 < canvas.width && y < canvas.height; y++) {
      px.fill(0, y * canvas.width + x0, (y + 1) * canvas.width);
    }
    return [img, px];
  }

  function greyPixel(g) {  // 0..255 -> an opaque RGBA pixel as a little-endian uint32
    if (!(g === g)) return NAN_PIXEL;
    const b = g <= 0 ? 0 : g >= 255 ? 255 : g | 0;
    return 0xff000000 | (b << 16) | (b << 8) | b;
  }

  function size(canvas, w, h) {  // a canvas's pixels, reallocated only when they change
    w = Math.max(1, w);
    h = Math.max(1, h);
    if (canvas.width !== w) canvas.width = w;
    if (canvas.height !== h) canvas.height = h;
  }

  // the layers view's width, read once per change of size (ResizeObserver below): reading it
  // between canvas writes would lay the page out again for every layer
  function contentWidth() {
    if (!state.width) state.width = layersEl.clientWidth;
    return Math.max(200, state.width || 800);
  }

  const TILE_LIMIT = 128;  // tiles shown at first; the rest behind "show all"
  const SORT_FROM = 16;    // layers with more channels than this show the most active first

  // which channels (indices into the layer's values) in which order: the most active first when asked
  function tileOrder(view, n, per) {
    if (view.order && view.order.length === n) return view.order;
    const order = Array.from({ length: n }, (_, k) => k);
    if ($("order").checked && n > SORT_FROM) {
      const v = view.layer.values, act = new Float64Array(n);
      for (let k = 0; k < n; k++) {
        let s = 0;
        for (let i = k * per; i < (k + 1) * per; i++) s += Math.abs(v[i]) || 0;
        act[k] = s;
      }
      order.sort((a, b) => act[b] - act[a] || a - b);
    }
    view.order = order;
    return order;
  }

  function tileGeometry(view, shown) {
    const s = view.shape, h = s.length >= 3 ? s[1] : 1, w = s.slice(s.length >= 3 ? 2 : 1).reduce((a, b) => a * b, 1);
    const cw = contentWidth(), target = cw < 560 ? 28 : 50, gap = 3;  // ~28 px maps on a phone
    let zoom = Math.max(1, Math.round(target / Math.max(h, w)));
    if (w * zoom > cw) zoom = Math.max(1, Math.floor(cw / w));
    const tw = w * zoom, th = h * zoom;
    const fit = Math.max(1, Math.floor((cw + gap) / (tw + gap))), rows = Math.ceil(shown / fit);
    const cols = Math.ceil(shown / rows);  // rows as even as they can be: 32 maps in 3 rows are 11, 11, 10
    return { h, w, zoom, tw, th, gap, cols, rows };
  }

  function paintTiles(view) {
    const layer = view.layer, c = layer.channels ? layer.channels.length : layer.shape[0];
    const per = c ? layer.values.length / c : 0;
    const order = tileOrder(view, c, per);
    const shown = view.all ? c : Math.min(c, TILE_LIMIT);
    const g = tileGeometry(view, Math.max(shown, 1));
    const canvas = view.canvas;
    size(canvas, g.cols * (g.tw + g.gap) - g.gap, shown ? g.rows * (g.th + g.gap) - g.gap : 1);
    const [img, px] = gridImage(canvas, shown, g.cols, g.tw, g.th, g.gap);
    const scale = scaleOf(layer.values);
    for (let t = 0; t < shown; t++) {
      const x0 = (t % g.cols) * (g.tw + g.gap), y0 = Math.floor(t / g.cols) * (g.th + g.gap);
      drawTile(px, canvas.width, x0, y0, layer.values, order[t] * per, g, scale.grey);
    }
    canvas.getContext("2d").putImageData(img, 0, 0);
    const channels = order.slice(0, shown).map((k) => (layer.channels ? layer.channels[k] : k));
    Object.assign(canvas.dataset, { tiles: String(shown), cols: String(g.cols), tileW: String(g.tw),
                                    tileH: String(g.th), gap: String(g.gap), channels: channels.join(",") });
    view.channels = channels;
    view.geometry = g;
    view.note.textContent = tileNote(layer, c, scale.text);
    view.more.hidden = c <= TILE_LIMIT;
    view.more.textContent = view.all ? `show the first ${TILE_LIMIT}` : `show all ${c} channels`;
    if (view.open !== null) paintOpenMap(view);
  }

  function tileNote(layer, kept, scaleText) {
    const note = layer.truncated
      ? `showing ${kept} of ${layer.shape[0]} channels (the most active: the rest is over the size limit) · `
      : "";
    return `${note}${scaleText}`;
  }

  // one feature map (h x w values from `at`) zoomed into the canvas pixels at (x0, y0)
  function drawTile(px, stride, x0, y0, values, at, g, grey) {
    for (let y = 0; y < g.h; y++) {
      const row = (y0 + y * g.zoom) * stride + x0;
      for (let x = 0, i = row; x < g.w; x++) {
        const p = greyPixel(grey(values[at + y * g.w + x]));
        for (let z = 0; z < g.zoom; z++) px[i++] = p;
      }
      for (let r = 1; r < g.zoom; r++) px.copyWithin(row + r * stride, row, row + g.tw);
    }
  }

  function paintStrip(view) {
    const layer = view.layer, n = layer.values.length;
    const cell = n <= 32 ? 18 : n <= 256 ? 10 : n <= 1024 ? 6 : n <= 4096 ? 4 : n <= 16384 ? 2 : 1;
    const gap = cell >= 4 ? 1 : 0, cw = contentWidth();
    const cols = Math.max(1, Math.min(n, Math.floor((cw + gap) / (cell + gap))));
    const canvas = view.canvas;
    size(canvas, cols * (cell + gap) - gap, Math.ceil(n / cols) * (cell + gap) - gap);
    const [img, px] = gridImage(canvas, n, cols, cell, cell, gap);
    const scale = scaleOf(layer.values), stride = canvas.width;
    for (let i = 0; i < n; i += cols) {  // one row of cells: its first pixel row, copied down
      const row = (i / cols) * (cell + gap) * stride;
      for (let k = i, x = row; k < Math.min(n, i + cols); k++, x += gap) {
        const p = greyPixel(scale.grey(layer.values[k]));
        for (let z = 0; z < cell; z++) px[x++] = p;
      }
      for (let r = 1; r < cell; r++) px.copyWithin(row + r * stride, row, row + stride);
    }
    canvas.getContext("2d").putImageData(img, 0, 0);
    canvas.dataset.units = String(n);
    const kept = layer.truncated ? `showing ${n} of ${layer.shape[0]} units (the most active) · ` : "";
    view.note.textContent = `${kept}${scale.text}`;
  }

  function paintOutput(view) {  // the probabilities as bars with the class names
    const probs = view.layer.values, names = state.info.class_names;
    if (view.bars.childElementCount !== probs.length) {
      view.bars.textContent = "";
      view.cols = Array.from(probs, (_, k) => {
        const col = document.createElement("div");
        col.className = "out-col";
        col.innerHTML = '<div class="out-track"><div class="out-fill"></div></div><span></span>';
        col.querySelector("span").textContent = names[k];
        col.title = names[k];
        view.bars.appendChild(col);
        return col;
      });
    }
    let top = 0;
    probs.forEach((p, k) => { if (p > probs[top]) top = k; });
    view.cols.forEach((col, k) => {
      col.firstChild.firstChild.style.height = `${(100 * probs[k]).toFixed(1)}%`;
      col.classList.toggle("top", k === top);
    });
    view.note.textContent = `${names[top]}: ${(100 * probs[top]).toFixed(1)}%`;
  }

  // ---- what made a feature map: its kernel --------------------------------------------------

  function tileAt(view, e) {  // the tile under a click, or -1
    const g = view.geometry, r = view.canvas.getBoundingClientRect();
    if (!g || !r.width) return -1;
    const x = (e.clientX - r.left) * (view.canvas.width / r.width);
    const y = (e.clientY - r.top) * (view.canvas.height / r.height);
    const col = Math.floor(x / (g.tw + g.gap)), row = Math.floor(y / (g.th + g.gap));
    if (x - col * (g.tw + g.gap) >= g.tw || y - row * (g.th + g.gap) >= g.th || col >= g.cols) return -1;
    const t = row * g.cols + col;
    return t < view.channels.length ? t : -1;
  }

  async function openKernel(view, e) {
    const t = tileAt(view, e);
    if (t < 0) return;
    const channel = view.channels[t];
    state.views.forEach((v) => { if (v !== view && v.kernelEl) { v.open = null; v.kernelEl.hidden = true; } });
    view.open = channel;
    const el = view.kernelEl;
    el.hidden = false;
    el.dataset.channel = String(channel);
    el.dataset.state = "busy";
    el.innerHTML = '<div class="kernel-head"><span class="ktitle"></span><button type="button" class="close"' +
      ' aria-label="close">×</button></div><div class="kernel-body"><figure><canvas class="map"></canvas>' +
      '<figcaption>this map</figcaption></figure><div class="weights"></div></div>';
    el.querySelector(".ktitle").textContent = `${view.name}, channel ${channel}`;
    el.querySelector(".close").addEventListener("click", () => { view.open = null; el.hidden = true; });
    paintOpenMap(view);
    const weights = el.querySelector(".weights");
    try {
      showKernel(weights, await backend.kernel(view.name, channel));
    } catch (err) {
      weights.innerHTML = '<p class="plain"></p>';
      weights.firstChild.textContent = `${err.message || err}. A ${view.layerKind} has no weights of its own: ` +
        "its map is computed from the layer before it.";
    }
    el.dataset.state = "idle";
  }

  function paintOpenMap(view) {  // the open kernel panel's copy of its feature map, larger
    const canvas = view.kernelEl.querySelector("canvas.map"), t = view.channels.indexOf(view.open);
    if (!canvas) return;
    const g = view.geometry, layer = view.layer;
    const k = layer.channels ? layer.channels.indexOf(view.open) : view.open;
    const per = layer.values.length / (layer.channels ? layer.channels.length : layer.shape[0]);
    canvas.width = g.w;
    canvas.height = g.h;
    if (t < 0 || k < 0) return;
    const img = new ImageData(g.w, g.h), px = new Uint32Array(img.data.buffer), scale = scaleOf(layer.values);
    for (let i = 0; i < g.w * g.h; i++) px[i] = greyPixel(scale.grey(layer.values[k * per + i]));
    canvas.getContext("2d").putImageData(img, 0, 0);
  }

  // signed colours: blue for negative weights, white for 0, red for positive
  function signedPixel(v, m) {
    const t = m > 0 ? Math.max(-1, Math.min(1, v / m)) : 0;
    const [r, g, b] = t < 0 ? [255 + t * 222, 255 + t * 153, 255 + t * 83] : [255 - t * 77, 255 - t * 231, 255 - t * 212];
    return 0xff000000 | ((b | 0) << 16) | ((g | 0) << 8) | (r | 0);
  }

  function showKernel(el, k) {
    const n = k.shape[0], kh = k.shape.length >= 3 ? k.shape[1] : 1;
    const kw = k.values.length / (n * kh), per = kh * kw;
    let m = 0;
    for (const v of k.values) m = Math.max(m, Math.abs(v));
    const zoom = Math.max(2, Math.round(36 / Math.max(kh, kw))), gap = 3, tw = kw * zoom, th = kh * zoom;
    const cols = Math.max(1, Math.min(n, Math.floor((Math.min(contentWidth(), 640) + gap) / (tw + gap))));
    const canvas = document.createElement("canvas");
    canvas.className = "kernel-tiles";
    canvas.width = cols * (tw + gap) - gap;
    canvas.height = Math.ceil(n / cols) * (th + gap) - gap;
    const [img, px] = gridImage(canvas, n, cols, tw, th, gap, 0xff9c918a);  // darker lines: 0 is white
    for (let c = 0; c < n; c++) {
      const x0 = (c % cols) * (tw + gap), y0 = Math.floor(c / cols) * (th + gap);
      for (let i = 0; i < per; i++) {
        const p = signedPixel(k.values[c * per + i], m), x = x0 + (i % kw) * zoom, y = y0 + Math.floor(i / kw) * zoom;
        for (let r = 0; r < zoom; r++) px.fill(p, (y + r) * canvas.width + x, (y + r) * canvas.width + x + zoom);
      }
    }
    canvas.getContext("2d").putImageData(img, 0, 0);
    canvas.dataset.tiles = String(n);
    const ins = k.input_channels, from = ins.length > 1 ? `input channels ${ins[0]}–${ins[ins.length - 1]}` : `input channel ${ins[0]}`;
    el.innerHTML = '<p class="small muted"></p>';
    el.firstChild.textContent = `its ${kh}×${kw} weights on ${from}: blue negative, red positive, |w| up to ${fmt(m)}`;
    el.appendChild(canvas);
  }

  // ---- the dataset's words -------------------------------------------------------------------

  function noun(names) {
    if (names.every((n) => /^[0-9]$/.test(n))) return "a digit";
    if (names.every((n) => /^[A-Za-z]$/.test(n))) return "a letter";
    if (names.every((n) => /^[0-9A-Za-z]$/.test(n))) return "a letter or a digit";
    if (names.every((n) => n.length <= 4)) return "a character";
    return "something";
  }

  const HOW = {
    mnist: "the ink's bounding box is scaled to 20×20 and centred by its centre of mass in 28×28, as MNIST's digits were made",
    emnist: "the ink's bounding box is centred in the square with a 2-pixel border, as EMNIST's characters were made",
    fashion: "the picture's bounding box is scaled to fill the square and centred, as Fashion-MNIST's pictures were made",
    resize: "the whole picture is resized to the model's size",
  };

  function speak(m) {
    const names = m.class_names, colour = m.in_shape[0] !== 1;
    const upload = colour || m.picture === "fashion" || m.picture === "resize";
    const what = noun(names);
    const title = !upload ? `Draw ${what}` : m.picture === "fashion" ? "Upload a picture of clothing" : "Upload a photo";
    $("title").textContent = title;
    document.title = `mnistflow · ${title.toLowerCase()}`;
    const classes = what === "a digit" ? "" : ` It knows ${names.length} classes: ${names.join(", ")}.`;
    $("subtitle").textContent = (upload
      ? (colour ? "Your own trained model names what it shows, and shows what each layer sees."
        : "Or draw one below. Your own trained model names it, and shows what each layer sees.")
      : "Your own trained model recognises it as you draw, and shows what each layer sees.") + classes;
    document.body.classList.toggle("upload-first", upload);
    $("upload-first").hidden = !upload;
    $("upload-first").textContent = m.picture === "fashion" ? "Upload a picture of clothing…" : "Upload a photo…";
    state.canDraw = !colour;
    document.body.classList.toggle("no-draw", colour);
    $("how").textContent = `The picture is prepared as the model's dataset images were made, in the training ` +
      `data's colours: ${HOW[m.picture] || HOW.resize}.`;
  }

  // ---- buttons, upload, model panel --------------------------------------------------------

  $("clear").addEventListener("click", clearAll);

  $("polarity").addEventListener("click", () => {
    state.dark = !state.dark;
    $("polarity").textContent = state.dark ? "Black on white" : "White on black";
    clearAll();
  });

  async function upload(file) {
    fillPaper();
    try {  // show the picture on the pad; drawing on it afterwards sends the pad
      const bmp = await createImageBitmap(file);
      const s = Math.min(pad.width / bmp.width, pad.height / bmp.height);
      const w = bmp.width * s, h = bmp.height * s;
      ctx.drawImage(bmp, (pad.width - w) / 2, (pad.height - h) / 2, w, h);
    } catch (_) { /* the backend says what is wrong with it */ }
    state.hasInk = true;
    queue(() => Promise.resolve(file), performance.now());
  }

  $("upload").addEventListener("change", (e) => {
    const file = e.target.files[0];
    e.target.value = "";
    if (file) upload(file);
  });
  pad.addEventListener("dragover", (e) => e.preventDefault());
  pad.addEventListener("drop", (e) => {
    e.preventDefault();
    const file = e.dataTransfer && e.dataTransfer.files[0];
    if (file) upload(file);
  });

  function showModel(m) {
    const pct = (v) => (v == null ? "—" : `${(100 * v).toFixed(2)}%`);
    const [c, h, w] = m.in_shape;
    $("m-name").textContent = m.model;
    $("m-acc").textContent = m.test_acc == null && m.val_acc != null ? `${pct(m.val_acc)} (validation)` : pct(m.test_acc);
    $("m-params").textContent = m.params == null ? "—" : m.params.toLocaleString("en-US");
    $("m-input").textContent = `${h}×${w} ${c === 1 ? "grey" : c === 3 ? "RGB" : `${c} channels`}`;
    $("m-classes").textContent = `${m.num_classes} (${m.class_names.join(", ")})`;
    $("m-dataset").textContent = m.dataset || "—";
    $("m-backend").textContent = { pytorch: "PyTorch", onnxruntime: "ONNX Runtime" }[m.backend] || m.backend;
    $("seen-caption").textContent = `what the model sees (${h}×${w})`;
    seen.width = w;
    seen.height = h;
    buildBars(m.class_names);
    speak(m);
    showEmpty();
  }

  async function showBlank(m) {  // the layers of an empty picture: the view is there before drawing
    const [c, h, w] = m.in_shape;
    const pixels = new Uint8Array(h * w * c).fill(m.background === "dark" ? 0 : 255);
    try {
      const list = await backend.layers(pixels);
      state.blank = list;
      if (!state.hasInk) paintLayers(list);
    } catch (err) {
      if (!state.hasInk) showNoLayers(err.message);
    }
  }

  $("order").addEventListener("change", () => {
    state.views.forEach((v) => { v.order = null; });
    if (state.shown) paintLayers(state.shown);
  });

  new ResizeObserver((entries) => {  // the tiles are laid out for the width: again when it changes
    const width = Math.round(entries[entries.length - 1].contentRect.width);
    if (width === state.width) return;
    state.width = width;
    if (state.shown) paintLayers(state.shown);
  }).observe(layersEl);

  fillPaper();
  backend.info()
    .then((m) => { state.info = m; showModel(m); return showBlank(m); })
    .catch((err) => showError(`could not load the model description: ${err.message}`));
})();
