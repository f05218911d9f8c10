/* The explorer's composition matrix and circuit diagram (interp/circuits.py, interp/task_circuit.py). This file is
   inlined after explorer.js, in the same script: it uses its DATA, $, element, COLOURS and selectHead, and
   explorer.js's start() calls buildComposition and buildCircuit. */

const KINDS = { q: "Q", k: "K", v: "V" };   // the composition matrix's kinds
const KIND_COLOURS = { q: "#1f77b4", k: "#ff7f0e", v: "#2ca02c", mlp: "#9467bd", direct: "#b2182b" };
const ROLE_COLOURS = { "previous-token": "#9467bd", induction: "#d62728", "duplicate-token": "#8c564b" };
const SVG = "http://www.w3.org/2000/svg";
const compositionState = { kind: "k", cell: null };

const headAt = (i) => [Math.floor(i / N_HEAD), i % N_HEAD];
const roleOf = (layer, head) => {
  const { role, score } = DATA.head_roles[layer][head];
  return `${role} ${score.toFixed(2)}`;
};

// --- the composition matrix: writer rows x reader columns, one kind at a time ---------------------------

// Where the matrix sits on its canvas (CSS pixels): the label margin, the cell size, the heads.
function compositionLayout() {
  const n = DATA.composition.heads.length;
  const cell = Math.max(3, Math.min(22, Math.floor(520 / n)));
  return { n, cell, margin: n <= 48 ? 44 : 12 };
}

function buildComposition() {
  const c = DATA.composition;
  for (const [kind, name] of Object.entries(KINDS)) {
    const button = element("button", "", `${name}-composition`);
    button.type = "button";
    button.dataset.kind = kind;
    button.addEventListener("click", () => {
      compositionState.kind = kind;
      drawComposition();
    });
    $("composition-kinds").append(button);
  }
  $("composition-note").textContent =
    `random heads of these shapes score ${c.baseline.toFixed(3)} ± ${c.baseline_std.toFixed(3)} ` +
    `(${c.baseline_draws.toLocaleString("en")} random pairs); the weights as TransformerLens processes ` +
    `them: ${c.processing}`;
  const canvas = $("composition");
  canvas.addEventListener("mousemove", (e) => {
    const { n, cell, margin } = compositionLayout();
    const box = canvas.getBoundingClientRect();
    const col = Math.floor((e.clientX - box.left - margin) / cell);
    const row = Math.floor((e.clientY - box.top - margin) / cell);
    compositionState.cell = row >= 0 && col >= 0 && row < n && col < n ? [row, col] : null;
    drawComposition();
  });
  canvas.addEventListener("mouseleave", () => {
    compositionState.cell = null;
    drawComposition();
  });
  canvas.addEventListener("click", () => {
    if (compositionState.cell) selectHead(...headAt(compositionState.cell[1]));
  });
  drawComposition();
}

function drawComposition() {
  const c = DATA.composition;
  const { n, cell, margin } = compositionLayout();
  const values = c[compositionState.kind];
  const top = Math.max(c.baseline + 1e-6, ...["q", "k", "v"].flatMap((k) => c[k].flat()));
  const ctx = sized($("composition"), margin + n * cell + 2, margin + n * cell + 2);
  for (let w = 0; w < n; w++) {
    for (let r = 0; r < n; r++) {
      const later = headAt(w)[0] < headAt(r)[0];
      const x = Math.min(1, Math.max(0, (values[w][r] - c.baseline) / (top - c.baseline)));
      ctx.fillStyle = later ? `rgb(${COLOURS[Math.round(x * 255)]})` : "#f0f0f3";
      ctx.fillRect(margin + r * cell, margin + w * cell, cell - (cell > 6), cell - (cell > 6));
    }
  }
  if (margin > 20) compositionLabels(ctx, c.heads, margin, cell);
  if (compositionState.cell) {
    const [w, r] = compositionState.cell;
    ctx.strokeStyle = "#e0701b";
    ctx.lineWidth = 2;
    ctx.strokeRect(margin + r * cell, margin + w * cell, cell, cell);
  }
  document.querySelectorAll("#composition-kinds button").forEach((b) => {
    b.classList.toggle("on", b.dataset.kind === compositionState.kind);
  });
  $("composition-readout").textContent = compositionReadout();
}

function compositionLabels(ctx, heads, margin, cell) {
  ctx.save();
  ctx.font = "9px ui-monospace, Menlo, Consolas, monospace";
  ctx.fillStyle = "#6b6b70";
  heads.forEach((name, i) => {
    ctx.textAlign = "right";
    ctx.fillText(name, margin - 3, margin + (i + 0.5) * cell + 3);
    ctx.save();
    ctx.translate(margin + (i + 0.5) * cell + 3, margin - 3);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(name, 0, 0);
    ctx.restore();
  });
  ctx.restore();
}

// The hovered cell: the two heads, their roles, the score against the baseline.
function compositionReadout() {
  const c = DATA.composition;
  const kind = KINDS[compositionState.kind];
  if (!compositionState.cell) return `hover a cell: writer (row) → reader (column), ${kind}-composition`;
  const [w, r] = compositionState.cell;
  const [wl, wh] = headAt(w);
  const [rl, rh] = headAt(r);
  const pair = `${c.heads[w]} (${roleOf(wl, wh)}) → ${c.heads[r]} (${roleOf(rl, rh)})`;
  if (wl >= rl) return `${pair}: the reader is not in a later layer; no composition`;
  const score = c[compositionState.kind][w][r];
  return (
    `${pair}: ${kind}-composition ${score.toFixed(3)}, ${(score / c.baseline).toFixed(1)}× the random ` +
    `baseline ${c.baseline.toFixed(3)} ± ${c.baseline_std.toFixed(3)}`
  );
}

// --- the circuit: heads per layer, the paths between them, the answer -------------------------------------

function svg(tag, attributes, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function circuitLayout() {
  const width = Math.max(480, Math.min(1000, 130 * N_HEAD));
  const dx = (width - 150) / Math.max(1, N_HEAD - 1);   // room for the last head's label
  const row = 110;
  const where = new Map();
  for (let l = 0; l < N_LAYER; l++) {
    for (let h = 0; h < N_HEAD; h++) where.set(headName(l, h), [30 + h * dx, (N_LAYER - l) * row + 30]);
    where.set(`MLP${l}`, [30 + (N_HEAD - 0.5) * dx, (N_LAYER - l) * row - row / 2 + 30]);   // half a row up
  }
  where.set("embeddings", [width / 2, (N_LAYER + 1) * row + 30]);
  where.set("answer", [width / 2, 30]);
  return { width, height: (N_LAYER + 1) * row + 60, where };
}

function buildCircuit() {
  const c = DATA.circuit;
  $("circuit-section").hidden = !c;
  if (!c) return;
  $("circuit-note").textContent =
    `${c.task}. Each number: the fraction of the change from the clean to the corrupted run that one patch ` +
    `makes (${c.direction}); composition: the score of the weights (random heads ` +
    `${c.composition_baseline.mean.toFixed(3)}).`;
  const { width, height, where } = circuitLayout();
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "circuit-svg" });
  box.append(arrowHeads());
  const nodes = new Map(c.nodes.map((n) => [n.name, n]));
  const strongest = Math.max(1e-9, ...c.edges.map((e) => Math.abs(e.effect)));
  for (const [name, [x, y]] of where) {
    if (name.startsWith("L") && !nodes.has(name)) box.append(svg("circle", { cx: x, cy: y, r: 4, fill: "#d0d0d0" }));
  }
  for (const e of c.edges) {   // an edge into the logits is its sender's direct effect
    const direct = e.kind === "logits";
    const text = direct ? directText(nodes.get(e.from)) : edgeText(e);
    box.append(circuitArrow(where, e.from, direct ? "answer" : e.to, direct ? "direct" : e.kind,
      e.effect / strongest, text));
  }
  for (const n of c.nodes) box.append(circuitNode(where, n));
  for (const [name, label] of [["embeddings", "tokens (embeddings)"], ["answer", "answer (logits)"]]) {
    const [x, y] = where.get(name);
    box.append(svg("text", { x, y: y + 4, "text-anchor": "middle", class: "end" }, label));
  }
  $("circuit").append(box);
}

// One arrow head per kind of path, in its colour.
function arrowHeads() {
  const defs = svg("defs", {});
  for (const [kind, colour] of Object.entries(KIND_COLOURS)) {
    const marker = svg("marker", { id: `head-${kind}`, viewBox: "0 0 10 10", refX: 9, refY: 5,
      markerWidth: 5, markerHeight: 5, orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: colour }));
    defs.append(marker);
  }
  return defs;
}

const edgeText = (e) =>
  `${e.from} → ${e.to} ${e.kind === "mlp" ? "into its input" : `through its ${KINDS[e.kind]}`}: ` +
  `effect ${signed(e.effect)}${e.effect_se === undefined ? "" : ` ± ${e.effect_se.toFixed(2)}`}` +
  (e.composition === undefined ? "" : `, ${KINDS[e.kind]}-composition ${e.composition.toFixed(3)}`);
const directText = (n) =>
  `${n.name} → the answer, directly: effect ${signed(n.direct_effect)}` +
  (n.direct_logit_attribution == null ? "" : `, direct logit attribution ${signed(n.direct_logit_attribution)}`);

function circuitArrow(where, from, to, kind, strength, text) {
  const [x1, y1] = where.get(from);
  const [x2, y2] = where.get(to);
  const bend = { q: -0.25, k: 0, v: 0.25, mlp: 0.15, direct: 0 }[kind];
  const [cx, cy] = [(x1 + x2) / 2 - bend * (y2 - y1), (y1 + y2) / 2 + bend * (x2 - x1)];
  const group = svg("g", { class: "edge", "data-from": from, "data-to": to, "data-kind": kind });
  group.append(svg("title", {}, text));
  const path = svg("path", {
    d: `M${x1},${y1} Q${cx},${cy} ${x2},${y2 + (to === "answer" ? 12 : 15)}`,   // ends below the receiver
    stroke: KIND_COLOURS[kind],
    "stroke-width": (1 + 4 * Math.abs(strength)).toFixed(1),
    fill: "none",
    opacity: from === "embeddings" ? 0.4 : 0.85,
    "marker-end": `url(#head-${kind})`,
  });
  group.append(path);
  group.addEventListener("mouseenter", () => ($("circuit-readout").textContent = text));
  return group;
}

function circuitNode(where, n) {
  const [x, y] = where.get(n.name);
  const group = svg("g", { class: "node", "data-name": n.name });
  const role = n.role ? ` (${n.role} ${n.role_score.toFixed(2)})` : "";
  const text =
    `${n.name}${role}: its output alone corrupted moves the metric ${signed(n.effect)} of the way; ` +
    directText(n).replace(`${n.name} → the answer, directly: effect`, "directly to the answer");
  group.append(svg("title", {}, text));
  const fill = ROLE_COLOURS[n.role] || "#7f7f7f";
  group.append(n.head === null ? svg("rect", { x: x - 12, y: y - 12, width: 24, height: 24, fill })
    : svg("circle", { cx: x, cy: y, r: 13, fill }));
  group.append(svg("text", { x: x + 16, y: y - 2 }, `${n.name} ${signed(n.effect)}`));   // beside the dot
  if (n.role) group.append(svg("text", { x: x + 16, y: y + 11, class: "role" }, n.role));
  group.addEventListener("mouseenter", () => ($("circuit-readout").textContent = text));
  if (n.head !== null) group.addEventListener("click", () => selectHead(n.layer, n.head));
  return group;
}
