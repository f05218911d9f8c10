"use strict";
/* The attention explorer's script. It reads the data block that interp/explorer.py wrote and draws the
   token strip, the layer x head grid, one head's full map, the direct logit attribution of the token in
   focus, the logit lens and the role-score (and ablation) tables. Plain JavaScript, no libraries. Text
   from the data (tokens, the checkpoint's name) is set with textContent, never as HTML.

   Weights arrive as base64 of 8-bit lower triangles: for each layer, head, query q and key k <= q, in that
   order, the byte round(255 * weight). */

const DATA = JSON.parse(document.getElementById("data").textContent);
const N_LAYER = DATA.model.n_layer;
const N_HEAD = DATA.model.n_head;
const MEAN = -1;                        // the "head" that stands for the mean over a layer's heads
const MAP_SIZE = 520;                   // CSS pixels of the detail map's plot area, at most
const THUMB = Math.max(40, Math.min(96, Math.floor(560 / (N_HEAD + 1)) - 8));   // grid beside the map
const COLOURS = DATA.colormap.map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));
const FUTURE = [236, 236, 240];         // the masked future, under the hatching
const HIGHLIGHT = "224, 112, 27";       // the token strip's colour (rgb), its opacity the √weight
const UP = "214, 39, 40";               // diverging colours (rgb): a positive effect or attribution...
const DOWN = "33, 102, 172";            // ...and a negative one, their opacity the size

const state = {
  view: 0,             // index into DATA.views: the prompt, the repeated sequence
  layer: 0,
  head: 0,             // MEAN: the layer's mean
  lastHead: 0,         // the head "one head" goes back to
  mode: "query",       // the radio buttons: is the focus token a query or a key?
  hoverMode: null,     // a mode forced while the mouse is on the map's key or query labels
  pinned: null,        // the clicked token
  hovered: null,       // the token under the mouse, in the strip or on the map
  cell: null,          // [query, key] under the mouse on the map
  metric: "val_loss",  // the ablation metric shown under each head
};

const $ = (id) => document.getElementById(id);
const view = () => DATA.views[state.view];
const mode = () => state.hoverMode || state.mode;
const focus = () => state.hovered ?? state.pinned ?? view().T - 1;
const headName = (layer, head) => (head === MEAN ? `L${layer} mean` : `L${layer}H${head}`);
const signed = (x, digits = 2) => `${x >= 0 ? "+" : "−"}${Math.abs(x).toFixed(digits)}`;
const diverging = (x, max) => `rgba(${x >= 0 ? UP : DOWN}, ${Math.min(1, Math.abs(x) / (max || 1)).toFixed(3)})`;

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// --- weights: decoded once per view; a matrix per head, built when first shown ----------------------

function decode(v) {
  const raw = atob(v.weights);
  v.bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) v.bytes[i] = raw.charCodeAt(i);
  v.T = v.tokens.length;
  v.matrices = new Map();
  v.images = new Map();
}

// The T x T weights of one head (or MEAN), row-major: row q is query q; keys after q are NaN.
function matrix(v, layer, head) {
  const key = `${layer}:${head}`;
  if (!v.matrices.has(key)) v.matrices.set(key, head === MEAN ? meanMatrix(v, layer) : headMatrix(v, layer, head));
  return v.matrices.get(key);
}

function headMatrix(v, layer, head) {
  const T = v.T;
  const m = new Float32Array(T * T).fill(NaN);
  let at = ((layer * N_HEAD + head) * T * (T + 1)) / 2;
  for (let q = 0; q < T; q++) {
    for (let k = 0; k <= q; k++) m[q * T + k] = v.bytes[at++] / 255;
  }
  return m;
}

function meanMatrix(v, layer) {
  const m = new Float32Array(v.T * v.T);   // NaN stays NaN in the sum: the future stays masked
  for (let h = 0; h < N_HEAD; h++) {
    const one = matrix(v, layer, h);
    for (let i = 0; i < m.length; i++) m[i] += one[i] / N_HEAD;
  }
  return m;
}

// One pixel per (query, key), coloured by √weight as in heads.py's pictures; cached per head.
function image(v, layer, head) {
  const key = `${layer}:${head}`;
  if (!v.images.has(key)) {
    const T = v.T;
    const m = matrix(v, layer, head);
    const canvas = element("canvas");
    canvas.width = canvas.height = T;
    const ctx = canvas.getContext("2d");
    const pixels = ctx.createImageData(T, T);
    for (let i = 0; i < T * T; i++) {
      const rgb = Number.isNaN(m[i]) ? FUTURE : COLOURS[Math.round(Math.sqrt(m[i]) * 255)];
      pixels.data.set(rgb, 4 * i);
      pixels.data[4 * i + 3] = 255;
    }
    ctx.putImageData(pixels, 0, 0);
    v.images.set(key, canvas);
  }
  return v.images.get(key);
}

// A canvas of `width` x `height` CSS pixels, sharp on high-density screens; returns its 2D context.
function sized(canvas, width, height) {
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}

// --- the layer x head grid ---------------------------------------------------------------------------

function buildGrid() {
  const grid = $("grid");
  grid.style.gridTemplateColumns = `auto repeat(${N_HEAD + 1}, ${Math.max(THUMB + 8, 60)}px)`;
  for (let layer = 0; layer < N_LAYER; layer++) {
    grid.append(element("div", "layer", `L${layer}`));
    for (let head = 0; head < N_HEAD; head++) {
      const { role, score } = DATA.head_roles[layer][head];
      const strong = score >= DATA.threshold ? " strong" : "";
      grid.append(gridCell(layer, head, `H${head} ${score.toFixed(2)}`, role, strong));
    }
    grid.append(gridCell(layer, MEAN, "mean", "all heads", ""));
  }
}

function gridCell(layer, head, name, role, strong) {
  const cell = element("div", "head");
  cell.dataset.layer = layer;
  cell.dataset.head = head;
  cell.title = `${headName(layer, head)}: ${role} (click for its full map)`;
  cell.append(element("canvas"), element("div", "name", name), element("div", `role${strong}`, role));
  if (DATA.ablation && head !== MEAN) cell.append(element("div", "ablation"));
  cell.addEventListener("click", () => selectHead(layer, head));
  return cell;
}

function drawThumbnails() {
  const v = view();
  for (const cell of $("grid").querySelectorAll(".head")) {
    const ctx = sized(cell.querySelector("canvas"), THUMB, THUMB);
    ctx.imageSmoothingEnabled = v.T > THUMB;   // average when shrinking, sharp squares when enlarging
    ctx.drawImage(image(v, +cell.dataset.layer, +cell.dataset.head), 0, 0, THUMB, THUMB);
  }
}

function selectHead(layer, head) {
  state.layer = layer;
  state.head = head;
  if (head !== MEAN) state.lastHead = head;
  update();
}

// --- the detail map ----------------------------------------------------------------------------------

// Where the plot sits on the map canvas: margin for labels, cell size, plot size (CSS pixels).
function mapLayout() {
  const v = view();
  const T = v.T;
  const labels = T <= 64;
  const cell = T <= MAP_SIZE ? Math.floor(MAP_SIZE / T) : MAP_SIZE / T;
  const margin = labels ? Math.ceil(labelWidth(v, labelSize(cell))) + 10 : 36;
  return { T, labels, margin, cell, plot: cell * T };
}

const labelSize = (cell) => Math.max(7, Math.min(11, cell - 1));
const labelFont = (size, bold) => `${bold ? "bold " : ""}${size}px ui-monospace, Menlo, Consolas, monospace`;

// The width of the view's longest token label, in bold (as the focus token's is drawn).
function labelWidth(v, size) {
  if (v.labelWidth === undefined) {
    const ctx = element("canvas").getContext("2d");
    ctx.font = labelFont(size, true);
    v.labelWidth = Math.max(...v.tokens.map((label) => ctx.measureText(label).width));
  }
  return v.labelWidth;
}

function drawMap() {
  const v = view();
  const { T, labels, margin, cell, plot } = mapLayout();
  const ctx = sized($("map"), margin + plot + 4, margin + plot + 4);
  ctx.imageSmoothingEnabled = T > plot;
  ctx.drawImage(image(v, state.layer, state.head), margin, margin, plot, plot);
  hatchFuture(ctx, margin, cell, T);
  if (v.repeat_length) markCopies(ctx, margin, cell, plot, v.repeat_length);
  outlineFocus(ctx, margin, cell, T);
  if (labels) tokenLabels(ctx, v, margin, cell);
  else positionTicks(ctx, margin, cell, T);
}

function hatchFuture(ctx, margin, cell, T) {
  const tile = element("canvas");
  tile.width = tile.height = 6;
  const t = tile.getContext("2d");
  t.strokeStyle = "#b9b9c0";
  t.beginPath();
  t.moveTo(0, 6);
  t.lineTo(6, 0);
  t.stroke();
  ctx.save();
  ctx.beginPath();   // the staircase above the diagonal: keys after each query
  ctx.moveTo(margin + cell, margin);
  for (let q = 0; q < T - 1; q++) {
    ctx.lineTo(margin + (q + 1) * cell, margin + (q + 1) * cell);
    ctx.lineTo(margin + (q + 2) * cell, margin + (q + 1) * cell);
  }
  ctx.lineTo(margin + T * cell, margin);
  ctx.closePath();
  ctx.fillStyle = ctx.createPattern(tile, "repeat");
  ctx.fill();
  ctx.restore();
}

// Thin lines where the second copy of R starts, on both axes.
function markCopies(ctx, margin, cell, plot, n) {
  ctx.save();
  ctx.strokeStyle = "rgba(255, 255, 255, 0.6)";
  ctx.setLineDash([3, 3]);
  ctx.beginPath();
  ctx.moveTo(margin + n * cell, margin);
  ctx.lineTo(margin + n * cell, margin + plot);
  ctx.moveTo(margin, margin + n * cell);
  ctx.lineTo(margin + plot, margin + n * cell);
  ctx.stroke();
  ctx.restore();
}

function outlineFocus(ctx, margin, cell, T) {
  const f = focus();
  ctx.save();
  ctx.lineWidth = 2;
  ctx.strokeStyle = "#e0701b";
  if (mode() === "query") ctx.strokeRect(margin, margin + f * cell, (f + 1) * cell, cell);
  else ctx.strokeRect(margin + f * cell, margin + f * cell, cell, (T - f) * cell);
  if (state.cell) {
    ctx.strokeStyle = "white";
    ctx.strokeRect(margin + state.cell[1] * cell, margin + state.cell[0] * cell, cell, cell);
  }
  ctx.restore();
}

function tokenLabels(ctx, v, margin, cell) {
  const f = focus();
  const size = labelSize(cell);
  ctx.save();
  ctx.textBaseline = "middle";
  for (let i = 0; i < v.T; i++) {
    const label = v.tokens[i];
    ctx.font = labelFont(size, i === f);
    ctx.fillStyle = i === f ? "#e0701b" : "#1d1d1f";
    ctx.textAlign = "right";
    ctx.fillText(label, margin - 4, margin + (i + 0.5) * cell);                // query rows
    ctx.save();
    ctx.translate(margin + (i + 0.5) * cell, margin - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(label, 0, 0);                                                  // key columns
    ctx.restore();
  }
  ctx.restore();
}

function positionTicks(ctx, margin, cell, T) {
  const step = [8, 16, 32, 64, 128, 256, 512].find((s) => T / s <= 10) || 1024;
  ctx.save();
  ctx.font = "10px system-ui, sans-serif";
  ctx.fillStyle = "#6b6b70";
  for (let i = 0; i < T; i += step) {
    ctx.textAlign = "right";
    ctx.fillText(String(i), margin - 4, margin + (i + 0.5) * cell + 3);
    ctx.textAlign = "center";
    ctx.fillText(String(i), margin + (i + 0.5) * cell, margin - 6);
  }
  ctx.restore();
}

// The map's mouse: over a cell, its query (or key, in key mode) becomes the focus; over the labels on
// the left the row's query, over those on top the column's key.
function onMapMove(event) {
  const { T, margin, cell } = mapLayout();
  const box = $("map").getBoundingClientRect();
  const x = event.clientX - box.left - margin;
  const y = event.clientY - box.top - margin;
  const key = Math.floor(x / cell);
  const query = Math.floor(y / cell);
  state.cell = null;
  state.hoverMode = null;
  state.hovered = null;
  if (x >= 0 && y >= 0 && key < T && query < T) {
    if (key <= query) state.cell = [query, key];
    state.hovered = mode() === "query" ? query : key;
  } else if (y < 0 && x >= 0 && key < T) {
    state.hoverMode = "key";
    state.hovered = key;
  } else if (x < 0 && y >= 0 && query < T) {
    state.hoverMode = "query";
    state.hovered = query;
  }
  update();
}

function onMapLeave() {
  state.cell = state.hovered = state.hoverMode = null;
  update();
}

// --- the token strip and the readout -----------------------------------------------------------------

function buildTokens() {
  const strip = $("tokens");
  strip.replaceChildren();
  view().tokens.forEach((label, i) => {
    const token = element("span", label.includes("↵") ? "token newline" : "token", label);
    token.dataset.index = i;
    strip.append(token);
  });
}

function pin(i) {
  state.pinned = state.pinned === i ? null : i;
  update();
}

// Each token coloured by the focus token's attention to it (query mode) or its attention to the focus
// token (key mode); the title holds the weight to 3 decimals.
function colourTokens(m) {
  const v = view();
  const f = focus();
  const asQuery = mode() === "query";
  for (const token of $("tokens").children) {
    const i = +token.dataset.index;
    const [query, key] = asQuery ? [f, i] : [i, f];
    const w = m[query * v.T + key];
    const masked = key > query;
    token.classList.toggle("masked", masked);
    token.classList.toggle("focus", i === f);
    token.classList.toggle("pinned", i === state.pinned);
    token.style.background = masked ? "" : `rgba(${HIGHLIGHT}, ${Math.sqrt(w).toFixed(3)})`;
    const name = `${asQuery ? "key" : "query"} ${i} “${v.tokens[i]}”`;
    token.title = masked
      ? `${name}: masked (key ${key} comes after query ${query})`
      : `${name}: ${w.toFixed(3)}`;
  }
}

// Under the strip: the weight under the mouse on the map, and the focus token's strongest links.
function writeReadout(m) {
  const v = view();
  const f = focus();
  const asQuery = mode() === "query";
  const readout = $("readout");
  readout.replaceChildren();
  if (state.cell) {
    const [q, k] = state.cell;
    const line = element("div", "cell");
    line.append(`query ${q} `, element("b", "", `“${v.tokens[q]}”`), ` → key ${k} `);
    line.append(element("b", "", `“${v.tokens[k]}”`), `: ${m[q * v.T + k].toFixed(3)}`);
    readout.append(line);
  }
  const others = [];
  for (let i = asQuery ? 0 : f; i < (asQuery ? f + 1 : v.T); i++) {
    others.push([i, asQuery ? m[f * v.T + i] : m[i * v.T + f]]);
  }
  others.sort((a, b) => b[1] - a[1]);
  const line = element("div", "top");
  line.append(`${asQuery ? "query" : "key"} ${f} `, element("b", "", `“${v.tokens[f]}”`));
  line.append(asQuery ? " attends most to: " : " is attended most by: ");
  others.slice(0, 6).forEach(([i, w], n) => {
    line.append(n ? " · " : "", element("b", "", `“${v.tokens[i]}”`), ` at ${i}: ${w.toFixed(3)}`);
  });
  readout.append(line);
}

// --- role scores -------------------------------------------------------------------------------------

function buildScores() {
  $("threshold").textContent = DATA.threshold;
  for (const role of DATA.roles) {
    $("scores").append(
      headTable(role, DATA.scores[role], {
        text: (score) => score.toFixed(2),
        background: (score) => `rgb(${COLOURS[Math.round(Math.min(1, Math.max(0, score)) * 255)]})`,
        ink: (score) => (score > 0.6 ? "black" : "white"),
        strong: (score) => score >= DATA.threshold,
      })
    );
  }
  const s = DATA.model_scores;
  $("model-scores").textContent =
    `In-context learning score ${s.icl_score.toFixed(2)} (loss at context position ${s.icl_positions[1]} ` +
    `minus at ${s.icl_positions[0]}) · repeated-sequence loss ${s.repeat_loss_first_half.toFixed(2)} → ` +
    `${s.repeat_loss_second_half.toFixed(2)} (first → second copy of R, ${s.repeat_length} tokens)`;
}

// --- ablation: each head's effect beside its role, and one table per metric -----------------------------

function buildAblation() {
  const a = DATA.ablation;
  $("ablation-control").hidden = $("ablation-section").hidden = !a;
  if (!a) return;
  for (const metric of DATA.metrics) $("ablation-metric").append(new Option(metric, metric));
  $("ablation-metric").value = state.metric;
  $("ablation-metric").addEventListener("change", (e) => {
    state.metric = e.target.value;
    labelAblation();
  });
  $("ablation-note").textContent =
    `${a.kind} ablation: the change of each metric when the head alone is removed (red: it rose) · intact: ` +
    DATA.metrics.map((m) => `${m} ${a.clean[m].toFixed(3)}`).join(" · ");
  for (const metric of DATA.metrics) {
    const max = Math.max(...a[metric].flat().map(Math.abs));
    $("ablation-tables").append(headTable(metric, a[metric], effects(max)));
  }
  labelAblation();
}

// The ablation line under each head of the grid, for the chosen metric.
function labelAblation() {
  const a = DATA.ablation;
  for (const line of document.querySelectorAll("#grid .head .ablation")) {
    const cell = line.parentElement;
    const [layer, head] = [+cell.dataset.layer, +cell.dataset.head];
    line.textContent = `Δ ${signed(a[state.metric][layer][head])}`;
    line.title = DATA.metrics.map((m) => `${m} ${signed(a[m][layer][head], 3)}`).join(", ");
  }
}

// How headTable shows signed values (ablation effects, attributions): red up, blue down, up to max.
const effects = (max) => ({ text: (x) => signed(x), background: (x) => diverging(x, max), ink: () => "black" });

// A layer x head table of values (role scores, ablation effects, attributions); a click selects the head.
// `show` gives each value's text, background and ink colours, and whether it is bold ("strong").
function headTable(caption, rows, show) {
  const table = element("table");
  table.append(element("caption", "", caption));
  const header = table.insertRow();
  header.append(element("th"));
  for (let head = 0; head < N_HEAD; head++) header.append(element("th", "", `H${head}`));
  rows.forEach((row, layer) => {
    const tr = table.insertRow();
    tr.append(element("th", "", `L${layer}`));
    row.forEach((value, head) => {
      const td = element("td", show.strong && show.strong(value) ? "strong" : "", show.text(value));
      td.style.background = show.background(value);
      td.style.color = show.ink(value);
      td.dataset.layer = layer;
      td.dataset.head = head;
      td.title = `${headName(layer, head)} ${caption}: ${value}`;
      td.addEventListener("click", () => selectHead(layer, head));
      tr.append(td);
    });
  });
  return table;
}

// --- direct logit attribution of the token in focus --------------------------------------------------

function drawAttribution() {
  const v = view();
  const f = focus();
  const box = $("attribution");
  box.replaceChildren();
  if (!v.attribution) {
    $("attribution-title").textContent = "Direct logit attribution: the view has a single token";
    return;
  }
  if (f === 0) {
    $("attribution-title").textContent = "Direct logit attribution: the first token has no prediction";
    return;
  }
  const { terms, values, logit } = v.attribution;
  const row = values[f - 1];
  $("attribution-title").textContent =
    `Which parts pushed “${v.tokens[f]}” (token ${f}) up or down, predicted after “${v.tokens[f - 1]}”: ` +
    `logit ${logit[f - 1].toFixed(3)}`;
  const byName = new Map(terms.map((t, i) => [t, row[i]]));
  const heads = [...Array(N_LAYER)].map((_, l) => [...Array(N_HEAD)].map((_, h) => byName.get(headName(l, h))));
  const max = Math.max(...heads.flat().map(Math.abs));
  const table = headTable("heads", heads, effects(max));
  table.id = "attribution-heads";
  const others = element("ul", "others");
  for (const [t, x] of byName) {
    if (!/^L\d+H\d+$/.test(t)) others.append(element("li", "", `${t} ${signed(x, 3)}`));
  }
  box.append(table, others);
}

// --- the logit lens: stage x position, coloured by the probability of the true next token --------------

function buildLens() {
  const v = view();
  const box = $("lens");
  box.replaceChildren();
  $("lens-readout").textContent = "";
  if (!v.lens) return;
  const { stages, top_ids, top_probs, loss, labels } = v.lens;
  const table = element("table");
  const header = table.insertRow();
  header.append(element("th"));
  v.tokens.forEach((token, t) => header.append(element("th", "", v.T <= 64 ? token : t % 8 ? "" : String(t))));
  stages.forEach((stage, s) => {
    const tr = table.insertRow();
    tr.append(element("th", "", stage));
    for (let t = 0; t < v.T; t++) {
      const best = labels[top_ids[s][t][0]];
      const td = element("td", "", v.T <= 64 ? best : "");
      const tops = top_ids[s][t].map((id, k) => `“${labels[id]}” ${top_probs[s][t][k].toFixed(3)}`).join(", ");
      let about = `${stage} · position ${t} “${v.tokens[t]}”`;
      if (t < v.T - 1) {
        const p = Math.exp(-loss[s][t]);
        const rgb = COLOURS[Math.round(p * 255)];
        td.style.background = `rgb(${rgb})`;
        td.style.color = p > 0.6 ? "black" : "white";
        about += ` → true next “${v.tokens[t + 1]}”: p ${p.toFixed(3)}, loss ${loss[s][t].toFixed(3)}`;
      } else {
        td.classList.add("last");
      }
      td.title = `${about} · top: ${tops}`;
      td.dataset.position = t;
      td.dataset.stage = s;
      tr.append(td);
    }
  });
  table.addEventListener("mouseover", (e) => {
    const td = e.target.closest("td");
    if (td) $("lens-readout").textContent = td.title;
  });
  table.addEventListener("click", (e) => {
    const td = e.target.closest("td");
    if (td) pin(+td.dataset.position);
  });
  box.append(table);
}

function markLens() {
  const f = focus();
  for (const td of $("lens").querySelectorAll("td")) td.classList.toggle("focus", +td.dataset.position === f);
}

// --- views: the prompt and the repeated sequence -----------------------------------------------------

function buildViews() {
  DATA.views.forEach((v, i) => {
    const name = v.name === "prompt" ? "prompt" : "repeated random sequence [R, R]";
    const button = element("button", "", `${name} · ${v.T} tokens`);
    button.type = "button";
    button.addEventListener("click", () => showView(i));
    $("views").append(button);
  });
}

function viewNote(v) {
  const notes = [];
  if (v.name === "repeated") {
    const n = v.repeat_length;
    notes.push(
      `R is ${n} distinct random tokens (seed ${v.seed}), written twice. In the second copy an induction ` +
        `head attends to the token after the earlier occurrence of the current one: a stripe ${n - 1} ` +
        "left of the diagonal. Dashed lines: where the second copy starts."
    );
  }
  if (v.T < v.total_tokens) {
    notes.push(
      `Subsampled: the ${v.name === "prompt" ? "prompt" : "sequence"} has ${v.total_tokens} tokens; this page shows the first ${v.T}, as many ` +
        `as fit ${N_LAYER * N_HEAD} heads into ${v.max_weights.toLocaleString("en")} weights. A causal ` +
        "model's weights on them do not depend on later tokens: these rows are exact. Give heads.py a " +
        "shorter --prompt to see another part."
    );
  }
  return notes.join(" ");
}

function showView(i) {
  state.view = i;
  state.pinned = state.hovered = state.cell = null;
  document.querySelectorAll("#views button").forEach((b, j) => b.classList.toggle("on", j === i));
  $("view-note").textContent = viewNote(view());
  buildTokens();
  buildLens();
  drawThumbnails();
  update();
}

// --- everything that follows the selection -----------------------------------------------------------

function update() {
  const { layer, head } = state;
  const m = matrix(view(), layer, head);
  drawAttribution();
  for (const e of document.querySelectorAll(".head, .scores td, .attribution td")) {
    e.classList.toggle("selected", +e.dataset.layer === layer && +e.dataset.head === head);
  }
  const role = head === MEAN ? null : DATA.head_roles[layer][head];
  $("detail-title").textContent =
    head === MEAN
      ? `L${layer}: mean over its ${N_HEAD} heads`
      : `L${layer}H${head} · ${role.role} ${role.score.toFixed(2)}`;
  $("show-head").textContent = `one head (H${state.lastHead})`;
  $("show-head").classList.toggle("on", head !== MEAN);
  $("show-mean").classList.toggle("on", head === MEAN);
  drawMap();
  colourTokens(m);
  writeReadout(m);
  markLens();
}

function onKey(event) {
  if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
  if (event.target instanceof HTMLInputElement) return;   // the radio buttons' own arrows
  const step = event.key === "ArrowLeft" ? -1 : 1;
  state.pinned = Math.min(view().T - 1, Math.max(0, focus() + step));
  state.hovered = null;
  event.preventDefault();
  update();
}

// The head with the strongest role opens first.
function strongestHead() {
  let best = [0, 0, -1];
  DATA.head_roles.forEach((row, layer) =>
    row.forEach(({ score }, head) => {
      if (score > best[2]) best = [layer, head, score];
    })
  );
  return best;
}

function start() {
  DATA.views.forEach(decode);
  [state.layer, state.head] = strongestHead();
  state.lastHead = state.head;
  $("checkpoint").textContent = DATA.title;
  $("summary").textContent =
    `${N_LAYER} layers × ${N_HEAD} heads, context ${DATA.model.block_size}. Each head is labelled ` +
    "with its strongest role and score.";
  buildViews();
  buildGrid();
  buildScores();
  buildAblation();
  buildComposition();   // circuits.js
  buildCircuit();
  buildDiscovered();    // discovered.js
  const strip = $("tokens");
  strip.addEventListener("mouseover", (e) => {
    const token = e.target.closest(".token");
    if (token) {
      state.hovered = +token.dataset.index;
      update();
    }
  });
  strip.addEventListener("mouseleave", () => {
    state.hovered = null;
    update();
  });
  strip.addEventListener("click", (e) => {
    const token = e.target.closest(".token");
    if (token) pin(+token.dataset.index);
  });
  document.querySelectorAll('input[name="mode"]').forEach((radio) =>
    radio.addEventListener("change", () => {
      state.mode = radio.value;
      update();
    })
  );
  $("show-head").addEventListener("click", () => selectHead(state.layer, state.lastHead));
  $("show-mean").addEventListener("click", () => selectHead(state.layer, MEAN));
  $("map").addEventListener("mousemove", onMapMove);
  $("map").addEventListener("mouseleave", onMapLeave);
  $("map").addEventListener("click", () => {
    if (state.hovered !== null) pin(state.hovered);
  });
  document.addEventListener("keydown", onKey);
  showView(0);
}

// After the whole script has run: circuits.js and discovered.js, inlined after this file, define what
// start() calls.
document.addEventListener("DOMContentLoaded", start);
