// mnistflow serve: the draw-a-digit page. No dependencies, nothing loaded from the network.
//
// The page sends the raw canvas (PNG) or the uploaded file to POST /api/predict; the server
// prepares it as the model's dataset images were made (for MNIST: bounding box -> 20x20 ->
// centre of mass in 28x28, the training data's polarity; data/picture.py) and returns the prediction together with the image it used
// (?input=1), which is drawn in #seen. One request is in flight at a time; strokes made meanwhile are
// sent as soon as it returns, so the prediction follows the pen.
//
// #prediction carries data-label (the data's own label value, e.g. 1..26) and data-state: "busy" while a change is
// not yet predicted, "idle" once the shown prediction matches the drawing.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const pad = $("pad");
  const ctx = pad.getContext("2d");
  const seen = $("seen");
  const prediction = $("prediction");

  const state = {
    dark: false,          // false: black ink on white paper; true: white on black
    drawing: false,
    pointer: null,
    last: null,
    hasInk: false,
    next: null,           // () => Promise<[body, contentType]>: the newest thing to predict
    inFlight: false,
    classes: [],
    rows: [],
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
    if (e.button !== 0 || state.drawing) return;
    e.preventDefault();
    pad.setPointerCapture(e.pointerId);
    state.drawing = true;
    state.pointer = e.pointerId;
    state.last = pos(e);
    dot(state.last);
    changed();
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
    changed();
  });

  function endStroke(e) {
    if (!state.drawing || e.pointerId !== state.pointer) return;
    state.drawing = false;
    state.pointer = null;
    changed();
  }
  pad.addEventListener("pointerup", endStroke);
  pad.addEventListener("pointercancel", endStroke);

  function changed() {
    state.hasInk = true;
    queue(() => new Promise((resolve) => pad.toBlob((blob) => resolve([blob, "image/png"]), "image/png")));
  }

  // ---- talking to the server -------------------------------------------------------------

  function queue(make) {
    state.next = make;
    prediction.dataset.state = "busy";
    pump();
  }

  async function pump() {
    if (state.inFlight) return;
    const make = state.next;
    if (!make) {
      prediction.dataset.state = "idle";
      return;
    }
    state.next = null;
    state.inFlight = true;
    try {
      const [body, type] = await make();
      const res = await fetch("/api/predict?input=1", { method: "POST", headers: { "Content-Type": type }, body });
      const data = await res.json().catch(() => ({ error: `HTTP ${res.status}` }));
      if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
      if (state.hasInk) show(data);
    } catch (err) {
      showError(err.message || String(err));
    } finally {
      state.inFlight = false;
      pump();
    }
  }

  // ---- showing results -------------------------------------------------------------------

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

  function show(res) {
    $("error").hidden = true;
    prediction.textContent = res.class_name;
    prediction.dataset.label = String(res.label);
    const probs = res.probabilities;
    const top = res.index ?? res.label; // the model output (res.label is the data's own label)
    $("confidence").textContent = `${(100 * probs[top]).toFixed(1)}% sure`;
    state.rows.forEach((r, k) => {
      const p = probs[k] || 0;
      r.fill.style.width = `${(100 * p).toFixed(1)}%`;
      r.pct.textContent = `${(100 * p).toFixed(1)}%`;
      r.row.classList.toggle("top", k === top);
    });
    drawSeen(res.input);
    const how = {
      mnist: "MNIST-style preparation", emnist: "EMNIST-style preparation",
      fashion: "Fashion-MNIST-style preparation", resize: "resized", none: "used as is",
    }[res.preprocess] || res.preprocess;
    $("latency").textContent = `${res.latency_ms.toFixed(1)} ms on the server · ${how}`;
  }

  function drawSeen(input) {
    const h = input.length, w = input[0].length;
    if (seen.width !== w || seen.height !== h) {
      seen.width = w;
      seen.height = h;
    }
    const sctx = seen.getContext("2d");
    const img = sctx.createImageData(w, h);
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        const v = input[y][x];
        const [r, g, b] = Array.isArray(v) ? v : [v, v, v];
        const i = 4 * (y * w + x);
        img.data[i] = r; img.data[i + 1] = g; img.data[i + 2] = b; img.data[i + 3] = 255;
      }
    }
    sctx.putImageData(img, 0, 0);
  }

  function showEmpty() {
    prediction.textContent = "–";
    prediction.dataset.label = "";
    $("confidence").textContent = "draw something";
    $("latency").textContent = "";
    $("error").hidden = true;
    state.rows.forEach((r) => { r.fill.style.width = "0"; r.pct.textContent = ""; r.row.classList.remove("top"); });
    seen.getContext("2d").clearRect(0, 0, seen.width, seen.height);
    if (!state.inFlight) prediction.dataset.state = "idle";
  }

  function showError(message) {
    const el = $("error");
    el.textContent = message;
    el.hidden = false;
  }

  // ---- buttons, upload, model panel ----------------------------------------------------

  $("clear").addEventListener("click", clearAll);

  $("polarity").addEventListener("click", () => {
    state.dark = !state.dark;
    $("polarity").textContent = state.dark ? "Black on white" : "White on black";
    clearAll();
  });

  $("upload").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    e.target.value = "";
    if (!file) return;
    fillPaper();
    try {  // show the picture on the pad; drawing on it afterwards sends the pad
      const bmp = await createImageBitmap(file);
      const s = Math.min(pad.width / bmp.width, pad.height / bmp.height);
      const w = bmp.width * s, h = bmp.height * s;
      ctx.drawImage(bmp, (pad.width - w) / 2, (pad.height - h) / 2, w, h);
    } catch (_) { /* the server says what is wrong with it */ }
    state.hasInk = true;
    queue(() => Promise.resolve([file, file.type || "application/octet-stream"]));
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
    $("m-backend").textContent = m.backend === "onnxruntime" ? "ONNX Runtime" : "PyTorch";
    $("seen-caption").textContent = `what the model sees (${h}×${w})`;
    seen.width = w;
    seen.height = h;
    buildBars(m.class_names);
  }

  fillPaper();
  fetch("/api/model")
    .then((r) => r.json())
    .then(showModel)
    .catch((err) => showError(`could not load the model description: ${err.message}`));
})();
