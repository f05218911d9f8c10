/* The explorer's discovered circuit (heads.py --discover --html; interp/discovery.py): its edges on the model's
   nodes and the faithfulness-against-edges curve it was cut from. Inlined after circuits.js, in the same
   script: it uses DATA, $, svg, KIND_COLOURS, headName, signed and selectHead; start() calls buildDiscovered. */

const EDGE_COLOURS = { ...KIND_COLOURS, mlp: "#9467bd", logits: KIND_COLOURS.direct };
const EDGE_WORDS = { q: "its queries (Q)", k: "its keys (K)", v: "its values (V)", mlp: "the MLP's input",
  logits: "the logits" };

// Heads in rows bottom to top as in circuitLayout, each MLP right of its layer's heads, half a row up.
function discoveredLayout() {
  const columns = N_HEAD + (DATA.discovered.mlp ? 1 : 0);
  const width = Math.max(480, Math.min(1000, 120 * columns));
  const dx = (width - 150) / Math.max(1, columns - 1);
  const row = 100;
  const where = new Map();
  for (let l = 0; l < N_LAYER; l++) {
    for (let h = 0; h < N_HEAD; h++) where.set(headName(l, h), [30 + h * dx, (N_LAYER - l) * row + 30]);
    where.set(`MLP${l}`, [30 + N_HEAD * dx, (N_LAYER - l) * row - row / 2 + 30]);
  }
  where.set("embeddings", [width / 2, (N_LAYER + 1) * row + 30]);
  where.set("logits", [width / 2, 30]);
  return { width, height: (N_LAYER + 1) * row + 60, where };
}

// One arrow head per kind of edge, in its colour.
function edgeHeads() {
  const defs = svg("defs", {});
  for (const [kind, colour] of Object.entries(EDGE_COLOURS)) {
    const marker = svg("marker", { id: `dhead-${kind}`, viewBox: "0 0 10 10", refX: 9, refY: 5,
      markerWidth: 5, markerHeight: 5, orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: colour }));
    defs.append(marker);
  }
  return defs;
}

function discoveredArrow(where, e, strongest) {
  const [x1, y1] = where.get(e.from);
  const [x2, y2] = where.get(e.to);
  const bend = { q: -0.25, k: 0, v: 0.25, mlp: 0.15, logits: 0 }[e.kind];
  const [cx, cy] = [(x1 + x2) / 2 - bend * (y2 - y1), (y1 + y2) / 2 + bend * (x2 - x1)];
  const text = `${e.from} → ${e.to} into ${EDGE_WORDS[e.kind]}: score ${signed(e.score, 3)} of the effect alone`;
  const group = svg("g", { class: "edge", "data-from": e.from, "data-to": e.to, "data-kind": e.kind });
  group.append(svg("title", {}, text));
  group.append(svg("path", {
    d: `M${x1},${y1} Q${cx},${cy} ${x2},${y2 + 13}`,
    stroke: EDGE_COLOURS[e.kind],
    "stroke-width": (1 + 4 * Math.abs(e.score) / strongest).toFixed(1),
    fill: "none",
    opacity: 0.8,
    "marker-end": `url(#dhead-${e.kind})`,
  }));
  group.addEventListener("mouseenter", () => ($("discovered-readout").textContent = text));
  return group;
}

// The curve: f of the strongest k edges against k / n, the share of the n edges kept, 0 to 1 on a linear
// axis (the axis the area is taken over, interp/discovery.py's area), the target and the cut.
function discoveredCurve(d) {
  const [width, height, pad] = [420, 220, 36];
  const ks = Object.keys(d.curve).map(Number);
  const fs = ks.map((k) => d.curve[k]);
  const n = Math.max(...ks);
  const sx = (k) => pad + ((width - 2 * pad) * k) / n;
  const [low, high] = [Math.min(0, ...fs), Math.max(1.05, ...fs)];
  const sy = (f) => height - pad - ((height - 2 * pad) * (f - low)) / (high - low);
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "discovered-curve" });
  box.append(svg("line", { x1: pad, x2: width - pad, y1: sy(d.target), y2: sy(d.target), stroke: "#b2182b",
    "stroke-dasharray": "4 3" }));
  if (d.reached) box.append(svg("line", { x1: sx(d.prefix), x2: sx(d.prefix), y1: pad, y2: height - pad,
    stroke: "#2166ac" }));
  box.append(svg("polyline", { points: ks.map((k, i) => `${sx(k)},${sy(fs[i])}`).join(" "), fill: "none",
    stroke: "#333", "stroke-width": 1.5 }));
  for (const [i, k] of ks.entries()) {
    const dot = svg("circle", { cx: sx(k), cy: sy(fs[i]), r: 3, fill: "#333" });
    dot.append(svg("title", {}, `the strongest ${k} edges: f = ${fs[i].toFixed(3)}`));
    box.append(dot);
  }
  for (const f of [0, 0.5, 1]) box.append(svg("text", { x: 6, y: sy(f) + 4 }, f.toFixed(1)));
  for (const k of [0, n]) box.append(svg("text", { x: sx(k) - 4, y: height - pad + 14 }, k ? "1" : "0"));
  box.append(svg("text", { x: pad, y: height - 4 }, `share of the ${n} edges kept (the strongest k / ${n})`));
  const over = Math.max(...fs) > 1 ? "; above 1: those edges carry more than the model" : "";
  box.append(svg("text", { x: 4, y: 14 }, `f (target ${d.target}; area ${d.area.toFixed(3)}${over})`));
  return box;
}

function buildDiscovered() {
  const d = DATA.discovered;
  $("discovered-section").hidden = !d;
  if (!d) return;
  // f's interval, or where there is none (one row) why, in short: never f twice
  const bounds = d.interval
    ? `[${d.interval[0].toFixed(3)}, ${d.interval[1].toFixed(3)}]`
    : `(no interval: ${(d.no_interval || "see discovered.json").split(/,|:| \(/)[0]})`;
  // a circuit left with no edges has no share of them to measure (discovery.py prints "none")
  const minimality = d.minimality.share === null ? "none (no edges)" : d.minimality.share.toFixed(2);
  $("discovered-note").textContent =
    `${d.task}. ${d.size} edges keep f = ${d.faithfulness.toFixed(3)} ${bounds} ` +
    `of what the model does, under ${d.ablation} ablation (another ablation gives another number); ` +
    `incompleteness ${d.incompleteness.value.toFixed(3)}, minimality ${minimality}.`;
  const { width, height, where } = discoveredLayout();
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "discovered-svg" });
  box.append(edgeHeads());
  const kept = d.edges.filter((e) => e.kept);
  const strongest = Math.max(1e-9, ...kept.map((e) => Math.abs(e.score)));
  const used = new Set(kept.flatMap((e) => [e.from, e.to]));
  for (const [name, [x, y]] of where) {
    if (name === "embeddings" || name === "logits" || (name.startsWith("MLP") && !d.mlp)) continue;
    const node = svg("g", { class: "node", "data-name": name });
    const big = used.has(name);
    node.append(svg(name.startsWith("MLP") ? "rect" : "circle", name.startsWith("MLP")
      ? { x: x - (big ? 10 : 4), y: y - (big ? 10 : 4), width: big ? 20 : 8, height: big ? 20 : 8, fill: big ? "#7f7f7f" : "#d0d0d0" }
      : { cx: x, cy: y, r: big ? 11 : 4, fill: big ? "#7f7f7f" : "#d0d0d0" }));
    if (big) node.append(svg("text", { x: x + 14, y: y + 4 }, name));
    const head = name.match(/^L(\d+)H(\d+)$/);
    if (head) node.addEventListener("click", () => selectHead(+head[1], +head[2]));
    box.append(node);
  }
  for (const e of kept) box.append(discoveredArrow(where, e, strongest));
  for (const [name, label] of [["embeddings", "tokens (embeddings)"], ["logits", "answer (logits)"]]) {
    const [x, y] = where.get(name);
    box.append(svg("text", { x, y: y + 4, "text-anchor": "middle", class: "end" }, label));
  }
  $("discovered").append(box, discoveredCurve(d));
}
