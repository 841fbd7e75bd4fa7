"use strict";
// DETR attention explorer: reads the JSON block written by detr/visualize/explorer/data.py
// (format "detr-attention-explorer/2") and draws everything on canvases and one SVG overlay.
// Two kinds of attention: "dense" maps (DETR, anchor DETR) and Deformable DETR's "sampling" points.
// No network, no libraries: the page must open from the file system.
(function () {
  const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
  if (DATA.format !== "detr-attention-explorer/2") {
    throw new Error("unsupported explorer data format: " + DATA.format);
  }
  if (DATA.kind !== "dense" && DATA.kind !== "sampling") throw new Error("unknown attention kind: " + DATA.kind);
  const SAMPLING = DATA.kind === "sampling";
  const upTo = (n) => Array.from({ length: n }, (_, k) => k);  // 0, 1, ..., n - 1

  // ---- data ---------------------------------------------------------------------------------
  const W = DATA.image.width, H = DATA.image.height;  // model input size (eval resize), pixels
  const STRIDE = DATA.feature.stride;  // sampling: the finest level's
  const FH = SAMPLING ? 0 : DATA.feature.height, FW = SAMPLING ? 0 : DATA.feature.width;
  const HW = FH * FW;
  const Q = DATA.num_queries, L = DATA.num_layers, NH = DATA.num_heads;
  const NHM = NH + 1;  // stored heads, then the mean over heads
  const MEAN = NH;  // sampling: all heads
  const NAMES = DATA.class_names;
  // A sigmoid (focal) head has no "no object" logit: its last name is a real class.
  const NO_OBJECT = DATA.no_object_label === null || DATA.no_object_label === undefined ? -1 : DATA.no_object_label;
  const PRED_LAYERS = DATA.prediction_layers;  // 1-based decoder layers with boxes and classes

  function decodeBase64(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }
  function checkLength(name, array, expected) {
    if (array.length !== expected) {
      throw new Error(name + ": expected " + expected + " values, found " + array.length);
    }
  }
  // Maps are quantised to 8 bits per map: value = byte / 255 * scale (scale = the map's maximum).
  const DEC_MAPS = SAMPLING ? null : decodeBase64(DATA.decoder.maps);
  const DEC_SCALES = SAMPLING ? null : new Float32Array(decodeBase64(DATA.decoder.scales).buffer);
  const ENC_MAPS = SAMPLING ? null : decodeBase64(DATA.encoder.maps);
  const ENC_SCALES = SAMPLING ? null : new Float32Array(decodeBase64(DATA.encoder.scales).buffer);
  if (!SAMPLING) {
    checkLength("decoder.maps", DEC_MAPS, L * NHM * Q * HW);
    checkLength("decoder.scales", DEC_SCALES, L * NHM * Q);
    checkLength("encoder.maps", ENC_MAPS, HW * HW);
    checkLength("encoder.scales", ENC_SCALES, HW);
  }

  // Deformable DETR: per layer, query, head, level and point, (x, y) in 1/16384 of the image's width and
  // height (int16) and the weight in 1/65535 (uint16); each head's weights sum to 1 over levels and points.
  const LEVELS = SAMPLING ? DATA.feature.levels : [];  // [{stride, height, width, points}], finest first
  const NL = LEVELS.length, NP = SAMPLING ? DATA.sampling.shape[4] : 0;
  // Each level's own point count (D-FINE samples 3, 6, 3: a level's slots past its count are padding).
  const LEVEL_POINTS = LEVELS.map((level) => (level.points === undefined ? NP : level.points));
  const ALL_LEVELS = NL;
  const POINT_UNITS = 16384, WEIGHT_UNITS = 65535;
  const POINTS = SAMPLING ? new Int16Array(decodeBase64(DATA.sampling.points).buffer) : null;
  const WEIGHTS = SAMPLING ? new Uint16Array(decodeBase64(DATA.sampling.weights).buffer) : null;
  if (SAMPLING) {
    checkLength("sampling.points", POINTS, L * Q * NH * NL * NP * 2);
    checkLength("sampling.weights", WEIGHTS, L * Q * NH * NL * NP);
  }
  // A prompted model (Grounding DINO): per layer, query, head and prompt token, the decoder's text cross-attention
  // weight in 1/65535 (uint16); each head's weights sum to 1 over the tokens. TEXT.phrases: the token's phrase,
  // -1 for [CLS], [SEP] and the delimiters.
  const TEXT = DATA.text || null;
  const NT = TEXT ? TEXT.tokens.length : 0;
  const TEXT_WEIGHTS = TEXT ? new Uint16Array(decodeBase64(TEXT.weights).buffer) : null;
  if (TEXT) checkLength("text.weights", TEXT_WEIGHTS, L * Q * NH * NT);
  function tokenWeights(layer, query, head) {  // [NT]; head MEAN: the mean over heads
    const weights = new Float64Array(NT);
    const heads = head === MEAN ? upTo(NH) : [head];
    for (const h of heads) {
      const base = ((layer * Q + query) * NH + h) * NT;
      for (let t = 0; t < NT; t++) weights[t] += TEXT_WEIGHTS[base + t] / WEIGHT_UNITS / heads.length;
    }
    return weights;
  }
  function samplingIndex(layer, query, head, level, point) {
    return (((layer * Q + query) * NH + head) * NL + level) * NP + point;
  }
  // One layer's points of a query: x, y in model-input pixels (the page's image), weight in [0, 1].
  function samplingPoints(layer, query) {
    const points = [];
    for (let head = 0; head < NH; head++) {
      for (let level = 0; level < NL; level++) {
        for (let point = 0; point < LEVEL_POINTS[level]; point++) {
          const i = samplingIndex(layer, query, head, level, point);
          points.push({ head: head, level: level, point: point, x: POINTS[2 * i] / POINT_UNITS * W,
            y: POINTS[2 * i + 1] / POINT_UNITS * H, weight: WEIGHTS[i] / WEIGHT_UNITS });
        }
      }
    }
    return points;
  }
  // The share of a query's attention that went to each level: one head's, or the mean over heads (MEAN).
  function levelShares(layer, query, head) {
    const shares = new Array(NL).fill(0);
    const heads = head === MEAN ? upTo(NH) : [head];
    for (const h of heads) {
      for (let level = 0; level < NL; level++) {
        for (let point = 0; point < NP; point++) {
          shares[level] += WEIGHTS[samplingIndex(layer, query, h, level, point)] / WEIGHT_UNITS / heads.length;
        }
      }
    }
    return shares;
  }

  // Panoptic models: every query's mask probability at stride 4, byte = round(255 * probability).
  const MASKS = DATA.masks ? decodeBase64(DATA.masks.maps) : null;
  const MH = DATA.masks ? DATA.masks.shape[1] : 0, MW = DATA.masks ? DATA.masks.shape[2] : 0;
  if (MASKS) checkLength("masks.maps", MASKS, Q * MH * MW);
  function maskMap(query) { return MASKS ? MASKS.subarray(query * MH * MW, (query + 1) * MH * MW) : null; }

  function decoderIndex(layer, head, query) { return (layer * NHM + head) * Q + query; }
  function decoderMap(layer, head, query) {
    const i = decoderIndex(layer, head, query);
    return { bytes: DEC_MAPS.subarray(i * HW, (i + 1) * HW), scale: DEC_SCALES[i] };
  }
  function encoderMap(position) {
    return { bytes: ENC_MAPS.subarray(position * HW, (position + 1) * HW), scale: ENC_SCALES[position] };
  }
  function predictionIndex(layer) { return PRED_LAYERS.indexOf(layer + 1); }  // -1: no head output
  const FINAL = PRED_LAYERS.length - 1;

  const ORDER = upTo(Q).sort((a, b) => DATA.scores[b] - DATA.scores[a]);
  // A frame of a tracked video (detr/visualize/explorer/tracks.py): the frame's tracks, their boxes and trails in
  // the original frame's pixels, and the query each track's box came from (null when no query's box matches).
  const TRACKS = DATA.tracks ? DATA.tracks.tracks : [];
  const SX = W / DATA.image.original_width, SY = H / DATA.image.original_height;  // original -> model-input pixels
  const TRACK_OF = {};  // query -> track id
  for (const track of TRACKS) if (track.query !== null && track.query !== undefined) TRACK_OF[track.query] = track.id;

  // ---- colours ------------------------------------------------------------------------------
  const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  const LUT = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const t = i / 255 * (VIRIDIS.length - 1), k = Math.min(Math.floor(t), VIRIDIS.length - 2), f = t - k;
    for (let c = 0; c < 3; c++) LUT[i * 3 + c] = Math.round(VIRIDIS[k][c] * (1 - f) + VIRIDIS[k + 1][c] * f);
  }
  function classColour(label) { return "hsl(" + ((label * 137.508) % 360).toFixed(1) + ",75%,48%)"; }
  function trackColour(id) { return "hsl(" + ((id * 97.3 + 40) % 360).toFixed(1) + ",85%,45%)"; }
  function queryColour(q) { return q in TRACK_OF ? trackColour(TRACK_OF[q]) : classColour(DATA.labels[q]); }
  // One colour per head: matplotlib's tab10, as detr/visualize/sampling.py's figure.
  const TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"];
  function headColour(head) { return TAB10[head % TAB10.length]; }

  function paintMap(canvas, bytes, width, height) {
    width = width || FW; height = height || FH;
    canvas.width = width; canvas.height = height;
    const context = canvas.getContext("2d");
    const image = context.createImageData(width, height);
    for (let i = 0; i < width * height; i++) {
      const v = bytes[i];
      image.data[i * 4] = LUT[v * 3]; image.data[i * 4 + 1] = LUT[v * 3 + 1];
      image.data[i * 4 + 2] = LUT[v * 3 + 2]; image.data[i * 4 + 3] = 255;
    }
    context.putImageData(image, 0, 0);
  }

  // ---- state --------------------------------------------------------------------------------
  const state = {
    query: ORDER[0], layer: L - 1, head: MEAN, mode: "decoder", encoderPosition: null,
    showAll: false, threshold: DATA.threshold, opacity: 0.6, smooth: true, trail: true,
    level: ALL_LEVELS, pointScale: 1,  // sampling only
  };

  const $ = (id) => document.getElementById(id);
  const SVG_NS = "http://www.w3.org/2000/svg";
  function svgElement(tag, attributes, parent) {
    const element = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attributes)) element.setAttribute(k, v);
    if (parent) parent.appendChild(element);
    return element;
  }
  function element(tag, text, parent, className) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (className) e.className = className;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(p) { return (100 * p).toFixed(1) + "%"; }

  const photo = new Image();
  const mainCanvas = $("main-canvas");
  const overlay = $("overlay");
  const mapCanvas = document.createElement("canvas");
  let displayScale = 1;

  function boxPixels(box) {  // normalised cxcywh -> model-input pixels xyxy
    return [(box[0] - box[2] / 2) * W, (box[1] - box[3] / 2) * H, (box[0] + box[2] / 2) * W, (box[1] + box[3] / 2) * H];
  }
  function isShown(q) {
    return state.showAll || DATA.scores[q] >= state.threshold || q === state.query || q in TRACK_OF;
  }
  function labelText(q) {
    return (q in TRACK_OF ? "id " + TRACK_OF[q] + " " : "") + NAMES[DATA.labels[q]] + " " + DATA.scores[q].toFixed(2);
  }

  // ---- drawing ------------------------------------------------------------------------------
  function currentMap() {
    if (state.mode === "encoder") {
      return encoderMap(state.encoderPosition[0] * FW + state.encoderPosition[1]);
    }
    return decoderMap(state.layer, state.head, state.query);
  }

  function headText() {
    if (SAMPLING) return state.head === MEAN ? "all " + NH + " heads" : "head " + (state.head + 1) + "/" + NH;
    return state.head === MEAN ? "mean over " + NH + " heads" : "head " + (state.head + 1) + "/" + NH;
  }
  function levelText(level) { return "level " + (level + 1) + " (stride " + LEVELS[level].stride + ")"; }

  // The image dimmed (the opacity slider), so that the points stand out; the points are on the overlay.
  function drawSamplingMain() {
    mainCanvas.width = W; mainCanvas.height = H;
    const context = mainCanvas.getContext("2d");
    context.drawImage(photo, 0, 0, W, H);
    context.fillStyle = "rgba(0,0,0," + (0.75 * state.opacity).toFixed(3) + ")";
    context.fillRect(0, 0, W, H);
    const shown = shownPoints();
    const levels = state.level === ALL_LEVELS ? "all " + NL + " levels" : levelText(state.level);
    $("caption").textContent = "Decoder cross-attention sampling points: query " + state.query + " ("
      + labelText(state.query) + "), layer " + (state.layer + 1) + "/" + L + ", " + headText() + ", " + levels
      + "; " + shown.length + " points, colour = head, area = weight";
  }
  function shownPoints() {
    return samplingPoints(state.layer, state.query).filter((p) =>
      (state.head === MEAN || p.head === state.head) && (state.level === ALL_LEVELS || p.level === state.level));
  }
  function drawPoints() {
    const group = svgElement("g", { class: "points" }, overlay);
    // Largest first, so that small points stay visible on top; area ∝ weight (radius 24 screen px for weight 1).
    const points = shownPoints().sort((a, b) => b.weight - a.weight);
    for (const p of points) {
      svgElement("circle", { class: "point", cx: p.x.toFixed(2), cy: p.y.toFixed(2),
        r: (24 * state.pointScale * Math.sqrt(p.weight) / displayScale).toFixed(3), fill: headColour(p.head),
        "data-head": p.head, "data-level": p.level }, group);
    }
  }

  function drawMain() {
    if (SAMPLING) { drawSamplingMain(); return; }
    mainCanvas.width = W; mainCanvas.height = H;
    const context = mainCanvas.getContext("2d");
    context.drawImage(photo, 0, 0, W, H);
    const map = currentMap();
    paintMap(mapCanvas, map.bytes);
    context.globalAlpha = state.opacity;
    context.imageSmoothingEnabled = state.smooth;
    // Feature cell (r, c) covers input pixels [c*stride, (c+1)*stride); the last row and column
    // may extend past the image, which the canvas clips.
    context.drawImage(mapCanvas, 0, 0, FW * STRIDE, FH * STRIDE);
    context.globalAlpha = 1;
    let peak = 0;
    for (let i = 1; i < HW; i++) if (map.bytes[i] > map.bytes[peak]) peak = i;
    // Rows sum to 1 over the h × w positions, so 1 / (h·w) is a flat map's value: says how peaked it is.
    const where = "(" + (map.scale * HW).toFixed(1) + "× uniform) at (row " + Math.floor(peak / FW)
      + ", col " + (peak % FW) + ")";
    const peakText = "; peak " + map.scale.toPrecision(3) + " " + where;
    if (state.mode === "encoder") {
      const [r, c] = state.encoderPosition;
      $("caption").textContent = "Encoder self-attention (last layer, mean over heads) of feature position (row "
        + r + ", col " + c + ")" + peakText;
    } else {
      $("caption").textContent = "Decoder cross-attention: query " + state.query + " (" + labelText(state.query)
        + "), layer " + (state.layer + 1) + "/" + L + ", " + headText() + peakText;
    }
  }

  function drawOverlay() {
    overlay.replaceChildren();
    overlay.setAttribute("viewBox", "0 0 " + W + " " + H);
    svgElement("rect", { class: "background", x: 0, y: 0, width: W, height: H, fill: "transparent" }, overlay);
    const fontSize = 12 / displayScale;
    drawTracks(fontSize);
    const shown = ORDER.filter(isShown).reverse();  // highest score drawn last (on top)
    const selectedLast = shown.filter((q) => q !== state.query).concat(shown.includes(state.query) ? [state.query] : []);
    for (const q of selectedLast) {
      const [x0, y0, x1, y1] = boxPixels(DATA.boxes[FINAL][q]);
      const colour = q === state.query ? "#ff7a00" : queryColour(q);
      const below = DATA.scores[q] < state.threshold && !(q in TRACK_OF);
      const classes = "box" + (below ? " below" : "") + (q === state.query ? " selected" : "");
      const group = svgElement("g", { class: classes, "data-query": q }, overlay);
      svgElement("rect", { class: "hit", x: x0, y: y0, width: x1 - x0, height: y1 - y0 }, group);
      svgElement("rect", { class: "edge", x: x0, y: y0, width: x1 - x0, height: y1 - y0, stroke: colour,
        "stroke-opacity": below ? 0.7 : Math.max(0.5, DATA.scores[q]) }, group);
      const tag = svgElement("g", { class: "tag" }, group);
      const text = "#" + q + " " + labelText(q);
      const tagWidth = (text.length * 0.6 + 0.6) * fontSize, tagHeight = 1.35 * fontSize;
      const tx = Math.min(Math.max(x0, 0), W - tagWidth), ty = y0 - tagHeight >= 0 ? y0 - tagHeight : Math.max(y0, 0);
      svgElement("rect", { x: tx, y: ty, width: tagWidth, height: tagHeight, fill: colour,
        "fill-opacity": below ? 0.6 : 0.9 }, tag);
      const label = svgElement("text", { x: tx + 0.3 * fontSize, y: ty + 1.05 * fontSize, "font-size": fontSize }, tag);
      label.textContent = text;
    }
    if (state.trail && PRED_LAYERS.length > 1) {
      const centres = [];
      PRED_LAYERS.forEach((layer, k) => {
        const box = DATA.boxes[k][state.query], [x0, y0, x1, y1] = boxPixels(box);
        centres.push((box[0] * W).toFixed(2) + "," + (box[1] * H).toFixed(2));
        if (k !== FINAL) {
          svgElement("rect", { class: "trail", x: x0, y: y0, width: x1 - x0, height: y1 - y0,
            "stroke-opacity": 0.25 + 0.6 * k / FINAL, "stroke-width": layer - 1 === state.layer ? 2.5 : 1 }, overlay);
        }
        const radius = (layer - 1 === state.layer ? 3 : 1.5) / displayScale;
        svgElement("circle", { class: "trail-path", cx: box[0] * W, cy: box[1] * H, r: radius }, overlay);
      });
      svgElement("polyline", { class: "trail-path", points: centres.join(" ") }, overlay);
    }
    if (SAMPLING) drawPoints();
    if (state.mode === "encoder") {
      const [r, c] = state.encoderPosition;
      const cx = Math.min((c + 0.5) * STRIDE, W - 1), cy = Math.min((r + 0.5) * STRIDE, H - 1);
      svgElement("circle", { class: "marker", cx: cx, cy: cy, r: 7 / displayScale }, overlay);
      svgElement("circle", { class: "marker-inner", cx: cx, cy: cy, r: 8.5 / displayScale }, overlay);
    }
  }

  // Each track's trail (its box centres over the last frames, oldest first) and, for a track whose box no query
  // matches, its box and id; a tracked query's own box is drawn by drawOverlay, labelled with its id.
  function drawTracks(fontSize) {
    for (const track of TRACKS) {
      const colour = trackColour(track.id);
      const group = svgElement("g", { class: "track", "data-track": track.id }, overlay);
      if (track.trail.length > 1) {
        svgElement("polyline", { class: "track-trail", stroke: colour,
          points: track.trail.map(([x, y]) => (x * SX).toFixed(2) + "," + (y * SY).toFixed(2)).join(" ") }, group);
      }
      if (track.query !== null && track.query !== undefined) continue;
      const [x0, y0, x1, y1] = track.box_xyxy;
      svgElement("rect", { class: "track-box", x: x0 * SX, y: y0 * SY, width: (x1 - x0) * SX, height: (y1 - y0) * SY,
        stroke: colour }, group);
      const text = "id " + track.id + " " + track.label_name + " " + track.score.toFixed(2);
      const tagWidth = (text.length * 0.6 + 0.6) * fontSize, tagHeight = 1.35 * fontSize;
      const tx = Math.min(Math.max(x0 * SX, 0), W - tagWidth);
      const ty = y0 * SY - tagHeight >= 0 ? y0 * SY - tagHeight : Math.max(y0 * SY, 0);
      svgElement("rect", { x: tx, y: ty, width: tagWidth, height: tagHeight, fill: colour, "fill-opacity": 0.75 }, group);
      const label = svgElement("text", { class: "track-label", x: tx + 0.3 * fontSize, y: ty + 1.05 * fontSize,
        "font-size": fontSize }, group);
      label.textContent = text;
    }
  }

  function drawDetail() {
    const q = state.query;
    $("detail-title").textContent = "Query " + q + ": " + labelText(q) + " (final layer)";
    let k = predictionIndex(state.layer);
    const note = k < 0 ? " (layer " + (state.layer + 1) + " has no head output: the model has no aux outputs;"
      + " showing layer " + L + ")" : "";
    if (k < 0) k = FINAL;
    $("classes-title").textContent = "Top classes at layer " + PRED_LAYERS[k] + note;
    const classes = $("classes");
    classes.replaceChildren();
    DATA.top_classes[k][q].forEach((label, i) => {
      const p = DATA.top_probs[k][q][i];
      const row = element("tr", null, classes);
      element("td", NAMES[label], row);
      const bar = element("td", null, row, "bar");
      const fill = element("div", null, bar, "bar-fill" + (label === NO_OBJECT ? " no-object" : ""));
      fill.style.width = (100 * p).toFixed(1) + "%";
      element("td", fmt(p), row, "num");
    });
    const table = $("layer-boxes");
    table.replaceChildren();
    const ow = DATA.image.original_width, oh = DATA.image.original_height;
    for (let layer = 0; layer < L; layer++) {
      const row = element("tr", null, table, layer === state.layer ? "current" : "");
      row.dataset.layer = layer;
      element("td", "L" + (layer + 1), row);
      const j = predictionIndex(layer);
      if (j < 0) {
        element("td", "no head output", row, "missing").colSpan = 5;
        continue;
      }
      const b = DATA.boxes[j][q];
      for (const v of [(b[0] - b[2] / 2) * ow, (b[1] - b[3] / 2) * oh, (b[0] + b[2] / 2) * ow, (b[1] + b[3] / 2) * oh]) {
        element("td", v.toFixed(0), row, "num");
      }
      const top = DATA.top_classes[j][q][0];
      element("td", NAMES[top] + " " + fmt(DATA.top_probs[j][q][0]), row);
    }
    if (MASKS) {  // the query's mask beside the attention map shown on the image
      $("mask-section").hidden = false;
      paintMap($("mask-canvas"), maskMap(q), MW, MH);
    }
    if (SAMPLING) drawLevels();
    if (TEXT) drawPrompt();
  }

  // A prompted model: the query's attention over the prompt's tokens (the shown layer and head, or the mean),
  // tokens grouped by phrase and shaded by weight, and each phrase's share.
  function drawPrompt() {
    const q = state.query, weights = tokenWeights(state.layer, q, state.head);
    const top = Math.max(...weights, 1e-9);
    $("prompt-title").textContent = "Attention over the prompt (query " + q + ", layer " + (state.layer + 1) + ", "
      + (state.head === MEAN ? "mean over heads" : "head " + (state.head + 1)) + ")";
    const strip = $("prompt-tokens");
    strip.replaceChildren();
    let group = null, groupPhrase = null;
    TEXT.tokens.forEach((token, t) => {
      const phrase = TEXT.phrases[t];
      if (group === null || phrase !== groupPhrase) {
        group = element("span", null, strip, phrase >= 0 ? "phrase" : "phrase delimiters");
        if (phrase >= 0) element("span", TEXT.phrase_names[phrase], group, "phrase-name");
        groupPhrase = phrase;
      }
      const shade = weights[t] / top;
      const chip = element("span", null, group, "token" + (shade > 0.55 ? " strong" : ""));
      chip.dataset.token = t;
      chip.style.background = "rgba(214, 72, 20, " + shade.toFixed(3) + ")";
      chip.title = token + ": " + fmt(weights[t]);
      element("span", token, chip, "token-text");
      element("span", fmt(weights[t]), chip, "token-weight");
    });
    const shares = TEXT.phrase_names.map(() => 0);
    let rest = 0;
    TEXT.phrases.forEach((phrase, t) => { if (phrase >= 0) shares[phrase] += weights[t]; else rest += weights[t]; });
    const table = $("prompt-phrases");
    table.replaceChildren();
    [...TEXT.phrase_names.map((name, k) => [name, shares[k]]), ["[CLS], [SEP] and delimiters", rest]]
      .forEach(([name, share]) => {
        const row = element("tr", null, table);
        element("td", name, row);
        const bar = element("td", null, row, "bar");
        element("div", null, bar, "bar-fill").style.width = (100 * share).toFixed(1) + "%";
        element("td", fmt(share), row, "num");
      });
  }

  // Sampling: per level its stride, its cells and the query's attention share (the shown head, or the mean).
  function drawLevels() {
    const q = state.query, shares = levelShares(state.layer, q, state.head);
    $("levels-title").textContent = "Attention share per feature level (query " + q + ", layer " + (state.layer + 1)
      + ", " + (state.head === MEAN ? "mean over heads" : "head " + (state.head + 1)) + ")";
    const table = $("levels");
    table.replaceChildren();
    LEVELS.forEach((level, k) => {
      const row = element("tr", null, table, state.level === k ? "current" : "");
      row.dataset.level = k;
      element("td", "level " + (k + 1), row);
      element("td", "stride " + level.stride, row, "num");
      element("td", level.width + "×" + level.height, row, "num");
      const bar = element("td", null, row, "bar");
      element("div", null, bar, "bar-fill").style.width = (100 * shares[k]).toFixed(1) + "%";
      element("td", fmt(shares[k]), row, "num");
    });
  }
  function buildHeadLegend() {
    const legend = $("head-legend");
    element("span", "Head colours: ", legend);
    for (let h = 0; h < NH; h++) {
      const item = element("span", null, legend, "legend-item");
      element("span", null, item, "swatch").style.background = headColour(h);
      item.appendChild(document.createTextNode(String(h + 1)));
    }
  }

  // Sampling: a layer × level grid of the query's attention shares (click: that layer and level).
  function buildShareGrid() {
    const grid = $("grid");
    grid.style.gridTemplateColumns = "28px repeat(" + NL + ", 1fr)";
    element("div", "", grid, "grid-label");
    for (let level = 0; level < NL; level++) element("div", "s" + LEVELS[level].stride, grid, "grid-label");
    for (let layer = 0; layer < L; layer++) {
      element("div", "L" + (layer + 1), grid, "grid-label");
      for (let level = 0; level < NL; level++) {
        const cell = element("div", null, grid, "share-cell");
        cell.dataset.layer = layer; cell.dataset.level = level;
        cell.title = "layer " + (layer + 1) + ", " + levelText(level);
      }
    }
  }
  function drawShareGrid() {
    const shares = Array.from({ length: L }, (_, layer) => levelShares(layer, state.query, state.head));
    for (const cell of $("grid").querySelectorAll(".share-cell")) {
      const layer = Number(cell.dataset.layer), level = Number(cell.dataset.level), share = shares[layer][level];
      const v = Math.round(255 * share);
      cell.style.background = "rgb(" + LUT[v * 3] + "," + LUT[v * 3 + 1] + "," + LUT[v * 3 + 2] + ")";
      cell.style.color = v > 150 ? "#000" : "#fff";
      cell.textContent = (100 * share).toFixed(0) + "%";
      cell.classList.toggle("current", layer === state.layer && (state.level === ALL_LEVELS || level === state.level));
    }
  }

  function buildGrid() {
    if (SAMPLING) { buildShareGrid(); return; }
    const grid = $("grid");
    grid.style.gridTemplateColumns = "28px repeat(" + NHM + ", 1fr)";
    element("div", "", grid, "grid-label");
    element("div", "mean", grid, "grid-label");
    for (let h = 0; h < NH; h++) element("div", "h" + (h + 1), grid, "grid-label");
    for (let layer = 0; layer < L; layer++) {
      element("div", "L" + (layer + 1), grid, "grid-label");
      for (const head of [MEAN].concat(upTo(NH))) {
        const canvas = element("canvas", null, grid);
        canvas.dataset.layer = layer; canvas.dataset.head = head;
        canvas.title = "layer " + (layer + 1) + ", " + (head === MEAN ? "mean" : "head " + (head + 1));
      }
    }
  }
  function drawGrid() {
    if (SAMPLING) { drawShareGrid(); return; }
    for (const canvas of $("grid").querySelectorAll("canvas")) {
      const layer = Number(canvas.dataset.layer), head = Number(canvas.dataset.head);
      paintMap(canvas, decoderMap(layer, head, state.query).bytes);
      const current = state.mode === "decoder" && layer === state.layer && head === state.head;
      canvas.classList.toggle("current", current);
    }
  }

  function buildQueryList() {
    const table = $("query-list");
    for (const q of ORDER) {
      const row = element("tr", null, table);
      row.dataset.query = q;
      const first = element("td", null, row);
      element("span", null, first, "swatch").style.background = queryColour(q);
      first.appendChild(document.createTextNode("#" + q + (q in TRACK_OF ? " id " + TRACK_OF[q] : "")));
      element("td", NAMES[DATA.labels[q]], row);
      element("td", DATA.scores[q].toFixed(3), row, "num");
      const top = DATA.top_classes[FINAL][q][0];
      element("td", top === NO_OBJECT ? "no object " + fmt(DATA.top_probs[FINAL][q][0]) : "", row, "num");
    }
  }
  function drawQueryList() {
    for (const row of $("query-list").rows) {
      const q = Number(row.dataset.query);
      row.classList.toggle("current", q === state.query);
      row.classList.toggle("below", DATA.scores[q] < state.threshold);
    }
  }

  function syncControls() {
    for (const input of document.querySelectorAll("input[name=layer]")) input.checked = Number(input.value) === state.layer;
    for (const input of document.querySelectorAll("input[name=head]")) input.checked = Number(input.value) === state.head;
    for (const input of document.querySelectorAll("input[name=level]")) input.checked = Number(input.value) === state.level;
    $("show-all").checked = state.showAll;
    $("threshold").value = state.threshold;
    $("threshold-value").textContent = state.threshold.toFixed(2);
  }

  function render() {
    syncControls();
    drawMain();
    drawOverlay();
    drawDetail();
    drawGrid();
    drawQueryList();
  }

  function fit() {
    const column = $("stage-column");
    const availableWidth = Math.max(200, column.clientWidth);
    const availableHeight = Math.max(300, window.innerHeight - 140);
    displayScale = Math.min(availableWidth / W, availableHeight / H);
    mainCanvas.style.width = (W * displayScale).toFixed(1) + "px";
    mainCanvas.style.height = (H * displayScale).toFixed(1) + "px";
  }

  // ---- actions (also the page's scripting interface, window.detrExplorer) ------------------
  function selectQuery(q) {
    if (!(q >= 0 && q < Q)) throw new Error("query out of range: " + q);
    state.query = q; state.mode = "decoder"; render();
    const row = $("query-list").querySelector("tr[data-query='" + q + "']");
    if (row) row.scrollIntoView({ block: "nearest" });
  }
  function setLayer(layer) { state.layer = Math.min(Math.max(layer, 0), L - 1); state.mode = "decoder"; render(); }
  function setHead(head) { state.head = Math.min(Math.max(head, 0), MEAN); state.mode = "decoder"; render(); }
  function setLevel(level) {
    if (!SAMPLING) throw new Error("levels are Deformable DETR's: this page shows dense maps");
    state.level = Math.min(Math.max(level, 0), ALL_LEVELS); render();
  }
  function showEncoder(row, col) {
    if (SAMPLING) throw new Error("a Deformable DETR page has no encoder maps");
    state.encoderPosition = [Math.min(Math.max(row, 0), FH - 1), Math.min(Math.max(col, 0), FW - 1)];
    state.mode = "encoder"; render();
  }
  function eventToPixel(event) {
    const rect = overlay.getBoundingClientRect();
    return [(event.clientX - rect.left) * W / rect.width, (event.clientY - rect.top) * H / rect.height];
  }

  // One radio button per value in the container, id `${name}-${key}`: key is the value's 1-based number, or the
  // word that `words` gives a special value (the mean head, every level); decorate(text, value) styles its label.
  function radioButtons(container, name, values, words, onChange, decorate = () => {}) {
    for (const value of values) {
      const label = element("label", null, $(container));
      const input = element("input", null, label);
      const word = words.get(value);
      input.type = "radio"; input.name = name; input.value = value;
      input.id = name + "-" + (word === undefined ? value + 1 : word.id);
      input.addEventListener("change", () => onChange(value));
      decorate(element("span", word === undefined ? String(value + 1) : word.text, label), value);
    }
  }
  function buildControls() {
    radioButtons("layer-buttons", "layer", upTo(L), new Map(), setLayer);
    radioButtons("head-buttons", "head", [MEAN].concat(upTo(NH)),
                 new Map([[MEAN, { id: "mean", text: SAMPLING ? "all" : "mean" }]]), setHead, (text, head) => {
                   if (SAMPLING && head !== MEAN) text.style.borderBottom = "3px solid " + headColour(head);
                 });
    if (SAMPLING) {
      radioButtons("level-buttons", "level", [ALL_LEVELS].concat(upTo(NL)),
                   new Map([[ALL_LEVELS, { id: "all", text: "all" }]]), setLevel, (text, level) => {
                     text.title = level === ALL_LEVELS ? "every level" : levelText(level);
                   });
      $("point-size").addEventListener("input", (e) => { state.pointScale = Number(e.target.value); drawOverlay(); });
      $("levels").addEventListener("click", (event) => {
        const row = event.target.closest("tr");
        if (row) setLevel(Number(row.dataset.level) === state.level ? ALL_LEVELS : Number(row.dataset.level));
      });
    }
    $("show-all").addEventListener("change", (e) => { state.showAll = e.target.checked; render(); });
    $("threshold").addEventListener("input", (e) => { state.threshold = Number(e.target.value); render(); });
    $("opacity").addEventListener("input", (e) => { state.opacity = Number(e.target.value); drawMain(); });
    $("smooth").addEventListener("change", (e) => { state.smooth = e.target.checked; drawMain(); });
    $("trail").addEventListener("change", (e) => { state.trail = e.target.checked; drawOverlay(); });
    overlay.addEventListener("click", (event) => {
      const box = event.target.closest(".box");
      if (box) { selectQuery(Number(box.dataset.query)); return; }
      if (SAMPLING) return;  // no encoder maps to show
      const [x, y] = eventToPixel(event);
      showEncoder(Math.floor(y / STRIDE), Math.floor(x / STRIDE));
    });
    $("query-list").addEventListener("click", (event) => {
      const row = event.target.closest("tr"); if (row) selectQuery(Number(row.dataset.query));
    });
    $("layer-boxes").addEventListener("click", (event) => {
      const row = event.target.closest("tr"); if (row) setLayer(Number(row.dataset.layer));
    });
    $("grid").addEventListener("click", (event) => {
      const cell = event.target.closest(".share-cell");
      if (cell) { state.layer = Number(cell.dataset.layer); setLevel(Number(cell.dataset.level)); return; }
      const canvas = event.target.closest("canvas");
      if (!canvas) return;
      state.layer = Number(canvas.dataset.layer); state.head = Number(canvas.dataset.head);
      state.mode = "decoder"; render();
    });
    document.addEventListener("keydown", (event) => {
      if (event.target instanceof HTMLInputElement && event.target.type === "range") return;
      const position = ORDER.indexOf(state.query);
      if (event.key === "ArrowLeft") setLayer(state.layer - 1);
      else if (event.key === "ArrowRight") setLayer(state.layer + 1);
      else if (event.key === "ArrowUp") selectQuery(ORDER[Math.max(position - 1, 0)]);
      else if (event.key === "ArrowDown") selectQuery(ORDER[Math.min(position + 1, Q - 1)]);
      else if (event.key === "h") setHead((state.head + 1) % NHM);
      else if (event.key === "l" && SAMPLING) setLevel((state.level + 1) % (NL + 1));
      else if (event.key === "e" && !SAMPLING) showEncoder(...(state.encoderPosition || [Math.floor(FH / 2), Math.floor(FW / 2)]));
      else return;
      event.preventDefault();
    });
    window.addEventListener("resize", () => { fit(); drawOverlay(); });
  }

  $("title").textContent = DATA.title;
  document.title = DATA.title + " · DETR attention explorer";
  const features = SAMPLING
    ? NL + " feature levels (strides " + LEVELS.map((l) => l.stride).join(", ") + "), "
      + (LEVEL_POINTS.every((count) => count === NP) ? NP + " points per head and level"
        : LEVEL_POINTS.join(", ") + " points per head on those levels")
    : "feature map " + FW + "×" + FH + " (stride " + STRIDE + ")";
  $("summary").textContent = DATA.image.original_width + "×" + DATA.image.original_height
    + " image, shown at the model's input size " + W + "×" + H + "; " + features + "; " + Q + " queries, " + L
    + " decoder layers, " + NH + " heads; " + DATA.scores.filter((s) => s >= DATA.threshold).length
    + " queries score ≥ " + DATA.threshold + (DATA.model ? "; " + DATA.model : "")
    + (TEXT ? "; prompt \u201c" + TEXT.prompt + "\u201d (" + NT + " tokens, " + TEXT.phrase_names.length + " phrases)" : "")
    + (DATA.tracks ? "; frame " + DATA.tracks.frame + " of " + DATA.tracks.source + ", " + TRACKS.length
      + " tracks (" + DATA.tracks.tracker + ", trails of " + DATA.tracks.trail_length + " frames)" : "");
  if (SAMPLING) {  // the controls and sections of the sampling view instead of the maps'
    $("hint").textContent = "Click a box's edge or label (or a row of the query list) to show where that query's "
      + "decoder cross-attention sampled: its points per head (colour) and feature level, area proportional to "
      + "the attention weight. Keys: ←/→ layer, ↑/↓ query, h head, l level.";
    $("level-row").hidden = false;
    $("levels-section").hidden = false;
    $("point-size-control").hidden = false;
    $("smooth-control").hidden = true;
    $("opacity-name").textContent = "dim image";
    $("grid-title").firstChild.textContent = "Share per layer × level ";
    buildHeadLegend();
  }
  if (TEXT) $("prompt-section").hidden = false;
  window.detrExplorer = { kind: DATA.kind, state, selectQuery, setLayer, setHead, setLevel, showEncoder, decoderMap,
    encoderMap, maskMap, samplingPoints, levelShares, tokenWeights, featureSize: [FH, FW], stride: STRIDE, imageSize: [H, W] };
  photo.addEventListener("load", () => {
    buildControls(); buildGrid(); buildQueryList(); fit(); render();
    document.body.dataset.ready = "true";
  });
  photo.addEventListener("error", () => { throw new Error("the embedded image could not be decoded"); });
  photo.src = DATA.image.src;
})();
