"""The attention explorer (interp/explorer.py, `heads.py --html`): the page's data against the
model's attention weights, its size bound, and the page itself in a real browser: headless Chromium
driven by Playwright, the file opened from disk, a head clicked, tokens and map cells hovered, and
the weights it shows compared with `GPT.attention_weights`. The browser tests skip, saying why,
where Chromium (Debian's `chromium` package, or the browser at $CHROMIUM) or Playwright is
missing."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import string
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_script

import interp.explorer
from data.tokenizers import CharTokenizer, from_meta
from interp.ablation import METRICS
from interp.circuits import composition_table
from interp.explorer import LENS_TOP, MAX_WEIGHTS, page_data, render, tokens_that_fit, write_page
from interp.lens import direct_attribution, head_attributions, logit_lens
from interp.plots import token_labels
from interp.scores import ROLES, head_roles, repeated_tokens
from model import GPT, GPTConfig
from runs import pretrained

STEP = 1 / 255  # the quantisation step; a stored weight is within half a step of the model's
SHOWN = 0.5 * STEP + 0.0005 + 1e-6  # ... and the page shows it to 3 decimals
CHARS = string.ascii_letters + string.digits + " \n<>/&'\"!?()"
PROMPT = "KLxiQEFBWOmACVzYafwc" * 2  # the README's: a random segment twice (R of 20 letters)


def fake_scores(n_layer: int, n_head: int, seed: int = 0) -> dict:
    """Role scores in the shape score_heads returns (values random; the page only shows them)."""
    rng = np.random.default_rng(seed)
    scores = {role: rng.uniform(0, 1, (n_layer, n_head)).round(4).tolist() for role in ROLES}
    return {
        **scores,
        "icl_score": -0.5,
        "repeat_loss_first_half": 4.0,
        "repeat_loss_second_half": 1.0,
        "repeat_length": 8,
        "icl_positions": [5, 63],
    }


def tiny_model(n_layer=2, n_head=3, block_size=64, seed=0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=len(CHARS), block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=24
    )
    return GPT(config).eval()


def stored(view: dict, n_layer: int, n_head: int) -> np.ndarray:
    """A view's weights as floats, (n_layer, n_head, T, T), the future zero."""
    T = len(view["tokens"])
    raw = np.frombuffer(base64.b64decode(view["weights"]), dtype=np.uint8)
    triangles = raw.reshape(n_layer, n_head, T * (T + 1) // 2) / 255
    out = np.zeros((n_layer, n_head, T, T))
    rows, cols = np.tril_indices(T)  # row-major, as the page reads them
    out[..., rows, cols] = triangles
    return out


def attention(model: GPT, ids: list[int]) -> np.ndarray:
    """(n_layer, n_head, T, T) weights straight from the model."""
    with torch.no_grad():
        _, weights = model.attention_weights(torch.tensor([ids]))
    return torch.stack([w[0] for w in weights]).numpy()


def test_the_page_holds_every_weight_to_half_a_step():
    tokenizer = CharTokenizer(CHARS)
    model = tiny_model()
    ids = tokenizer.encode("Hello <world> & 'all'\n" * 1 + "abc").tolist()
    data = page_data(model, ids, tokenizer, fake_scores(2, 3), "a model")
    prompt, repeated = data["views"]
    assert prompt["tokens"] == token_labels(ids, tokenizer) and prompt["total_tokens"] == len(ids)
    assert np.abs(stored(prompt, 2, 3) - attention(model, ids)).max() <= 0.5 * STEP + 1e-6

    n = repeated["repeat_length"]
    assert n == min(64 // 2, len(CHARS)) and repeated["seed"] == 0
    assert repeated["ids"] == repeated_tokens(len(CHARS), n, 1, seed=0)[0].tolist()
    assert (
        np.abs(stored(repeated, 2, 3) - attention(model, repeated["ids"])).max()
        <= 0.5 * STEP + 1e-6
    )
    # viridis, as the PNGs
    assert data["colormap"][0] == "#440154" and data["colormap"][255] == "#fde725"


def fake_ablation(n_layer: int, n_head: int) -> dict:
    """An ablation result in the shape ablate_heads returns (values random)."""
    rng = np.random.default_rng(1)
    tables = {m: rng.normal(0, 1, (n_layer, n_head)).round(4).tolist() for m in METRICS}
    return {
        "kind": "mean",
        "windows": 4,
        "sequences": 4,
        "clean": dict.fromkeys(METRICS, 1.5),
        **tables,
    }


def test_the_page_holds_the_lens_the_attributions_and_the_ablation():
    tokenizer = CharTokenizer(CHARS)
    model = tiny_model()
    ids = tokenizer.encode("Hello <world> & 'all'\nabc").tolist()
    ablation = fake_ablation(2, 3)
    data = page_data(model, ids, tokenizer, fake_scores(2, 3), "a model", ablation=ablation)
    assert data["ablation"] == {k: ablation[k] for k in ("kind", "clean", *METRICS)}
    assert data["metrics"] == list(METRICS)
    for view in data["views"]:
        lens, attribution = (
            logit_lens(model, view["ids"], top=LENS_TOP),
            direct_attribution(model, view["ids"]),
        )
        assert (
            view["lens"]["stages"] == lens["stages"] and view["lens"]["top_ids"] == lens["top_ids"]
        )
        for key in ("top_probs", "loss"):
            assert np.abs(np.array(view["lens"][key]) - np.array(lens[key])).max() <= 5e-4 + 1e-7, (
                key
            )
        named = {i for stage in lens["top_ids"] for position in stage for i in position}
        assert view["lens"]["labels"] == {
            str(i): token_labels([i], tokenizer)[0] for i in sorted(named)
        }
        assert view["attribution"]["terms"] == attribution["terms"]
        stored = np.array(view["attribution"]["values"])
        assert np.abs(stored - np.array(attribution["values"])).max() <= 5e-4 + 1e-7
    assert page_data(model, ids, tokenizer, fake_scores(2, 3), "a model")["ablation"] is None
    # the weights alone
    assert data["composition"] == composition_table(model) and data["circuit"] is None
    circuit = {"nodes": [], "edges": []}
    assert (
        page_data(model, ids, tokenizer, fake_scores(2, 3), "a model", circuit=circuit)["circuit"]
        == circuit
    )


def test_each_head_is_labelled_with_its_strongest_role():
    scores = fake_scores(2, 2)
    scores["induction"] = [[0.0, 0.0], [0.9, 0.1]]
    scores["previous_token"] = [[0.7, 0.0], [0.0, 0.0]]
    scores["duplicate_token"] = [[0.0, 0.0], [0.0, 0.0]]
    scores["first_token"] = [[0.0, 0.2], [0.0, 0.3]]
    scores["current_token"] = [[0.1, 0.1], [0.0, 0.2]]
    assert head_roles(scores) == [
        [{"role": "previous-token", "score": 0.7}, {"role": "first-token", "score": 0.2}],
        [{"role": "induction", "score": 0.9}, {"role": "first-token", "score": 0.3}],
    ]


def test_a_6x6_model_on_256_tokens_is_under_two_megabytes():
    tokenizer = CharTokenizer(CHARS)
    model = tiny_model(n_layer=6, n_head=6, block_size=256)
    ids = np.random.default_rng(0).integers(0, len(CHARS), 256).tolist()
    data = page_data(model, ids, tokenizer, fake_scores(6, 6), "6 x 6")
    assert len(data["views"][0]["tokens"]) == 256  # nothing cut
    page = render(data)
    assert 1.5e6 < len(page.encode()) < 2e6


def test_the_budget_keeps_the_most_leading_tokens_that_fit():
    for heads, tokens, budget in (
        (36, 256, MAX_WEIGHTS),
        (144, 1024, MAX_WEIGHTS),
        (7, 100, 1000),
        (5, 3, 10),
    ):
        fit = tokens_that_fit(heads, tokens, budget)
        assert heads * fit * (fit + 1) // 2 <= budget or fit == 1
        assert fit == tokens or heads * (fit + 1) * (fit + 2) // 2 > budget
    assert (
        tokens_that_fit(36, 256, MAX_WEIGHTS) == 256
        and tokens_that_fit(144, 1024, MAX_WEIGHTS) == 166
    )
    assert tokens_that_fit(10**7, 50, MAX_WEIGHTS) == 1


def test_a_long_prompt_is_cut_to_exact_leading_rows(monkeypatch):
    tokenizer = CharTokenizer(CHARS)
    model = tiny_model()
    ids = np.random.default_rng(1).integers(0, len(CHARS), 30).tolist()
    monkeypatch.setattr(interp.explorer, "MAX_WEIGHTS", 6 * 12 * 13 // 2)  # 6 heads x 12 tokens
    prompt = page_data(model, ids, tokenizer, fake_scores(2, 3), "cut")["views"][0]
    assert (
        len(prompt["tokens"]) == 12 and prompt["total_tokens"] == 30 and prompt["ids"] == ids[:12]
    )
    whole = attention(model, ids)[:, :, :12, :12]  # causal: the first rows do not see what follows
    assert np.abs(stored(prompt, 2, 3) - whole).max() <= 0.5 * STEP + 1e-6


def test_prompt_text_cannot_close_the_data_block():
    tokenizer = CharTokenizer(CHARS)
    ids = tokenizer.encode("</script><script>alert('x')</script>").tolist()
    page = render(page_data(tiny_model(), ids, tokenizer, fake_scores(2, 3), "</title><b>"))
    # the data block and the script
    assert page.count("</script>") == 2 and page.count("<script") == 2
    assert "<title>attention · &lt;/title&gt;&lt;b&gt;</title>" in page


# --- in a browser
# ----------------------------------------------------------------------------------------

FLAGS = [  # no sandbox (CI runs as root), no GPU, and nothing that phones home
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (a fresh temporary profile, Playwright's default), shared by the module."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[test]')"
    )
    executable = (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not executable:
        pytest.skip(
            "no Chromium: install Debian's chromium package (apt-get install chromium) or set "
            "CHROMIUM"
        )
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        yield chromium
        chromium.close()


@contextmanager
def opened(browser, path: Path):
    """The page at `path` from disk; on leaving, checks it logged no error and requested nothing
    else."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on(
        "console", lambda message: errors.append(message.text) if message.type == "error" else None
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(path.as_uri())
        yield page
        assert errors == [], errors
        assert requests == [path.as_uri()], requests  # the file itself, nothing from the network
    finally:
        page.close()


def shown_weights(page) -> dict[int, float]:
    """Token position -> the weight its title shows (masked tokens left out)."""
    titles = page.eval_on_selector_all("#tokens .token", "tokens => tokens.map(t => t.title)")
    found = {i: re.search(r": (\d\.\d{3})$", title) for i, title in enumerate(titles)}
    return {i: float(m.group(1)) for i, m in found.items() if m}


def signed_value(text: str) -> float:
    """The number in a page's signed text ("+1.23", "−0.45")."""
    return float(text.replace("−", "-"))


def role_label(page, layer: int, head: int) -> str:
    return page.inner_text(f'.head[data-layer="{layer}"][data-head="{head}"] .role')


def hover_cell(page, query: int, key: int) -> float:
    """Move the mouse over one cell of the map; the weight the readout shows for it."""
    layout = page.evaluate("mapLayout()")
    box = page.locator("#map").bounding_box()
    margin, cell = layout["margin"], layout["cell"]
    page.mouse.move(
        box["x"] + margin + (key + 0.5) * cell, box["y"] + margin + (query + 0.5) * cell
    )
    text = page.inner_text("#readout .cell")
    assert text.startswith(f"query {query} ") and f"→ key {key} " in text, text
    return float(text.rsplit(": ", 1)[1])


@pytest.mark.slow
def test_the_page_in_a_browser_shows_the_models_weights(browser, induction_run, tmp_path: Path):
    out, scores = induction_run
    result = run_script(
        "heads.py",
        str(out),
        "--prompt",
        PROMPT,
        "--html",
        "--ablate",
        "--circuit",
        "--discover",
        "--out",
        str(tmp_path),
        check=True,
    )
    path = tmp_path / "attention.html"
    assert str(path) in result.stdout
    loaded = pretrained.load_model(out)
    model, tokenizer_meta = loaded.model, loaded.tokenizer_meta
    tokenizer = from_meta(tokenizer_meta)
    ids = tokenizer.encode(PROMPT).tolist()
    weights = attention(model, ids)
    induction = int(np.argmax(scores["induction"][1]))
    previous = int(np.argmax(scores["previous_token"][0]))
    q, n = 25, len(PROMPT) // 2  # a query in the second copy; its token last came at q - n

    with opened(browser, path) as page:
        # every head labelled by role: the induction heads in L1, the previous-token head in L0
        assert role_label(page, 1, induction) == "induction"
        assert role_label(page, 0, previous) == "previous-token"
        strongest = max(
            (
                (layer, head, r["score"])
                for layer, row in enumerate(head_roles(scores))
                for head, r in enumerate(row)
            ),
            key=lambda item: item[2],
        )
        selected = page.locator(".head.selected")  # the strongest head opens first
        assert (selected.get_attribute("data-layer"), selected.get_attribute("data-head")) == tuple(
            str(i) for i in strongest[:2]
        )

        # one head: the query's weights on every key, and its strongest key the one after the
        # earlier copy
        page.click(f'.head[data-layer="1"][data-head="{induction}"]')
        page.hover(f'#tokens .token[data-index="{q}"]')
        shown = shown_weights(page)
        assert sorted(shown) == list(range(q + 1))  # later keys masked
        assert max(abs(shown[k] - weights[1, induction, q, k]) for k in shown) <= SHOWN
        top = page.inner_text("#readout .top")
        assert top.startswith(
            f"query {q} “{PROMPT[q]}” attends most to: “{PROMPT[q - n + 1]}” at {q - n + 1}: "
        )

        # the mean over the layer's heads
        page.click("#show-mean")
        assert page.inner_text("#detail-title") == "L1: mean over its 4 heads"
        page.hover(f'#tokens .token[data-index="{q}"]')
        shown = shown_weights(page)
        assert max(abs(shown[k] - weights[1, :, q, k].mean()) for k in shown) <= SHOWN

        # a key: which queries attend to it, in the previous-token head
        page.click(f'.head[data-layer="0"][data-head="{previous}"]')
        page.check('input[value="key"]')
        page.hover('#tokens .token[data-index="5"]')
        shown = shown_weights(page)
        assert sorted(shown) == list(range(5, len(ids)))  # earlier queries cannot see it
        assert max(abs(shown[i] - weights[0, previous, i, 5]) for i in shown) <= SHOWN

        # a cell of the full map
        assert abs(hover_cell(page, 30, 11) - weights[0, previous, 30, 11]) <= SHOWN

        # each head's ablation effect under its role, for the metric chosen, as head_ablation.json
        # has it
        ablation = json.loads((tmp_path / "head_ablation.json").read_text())
        for metric in ("val_loss", "repeat_loss_second_half"):
            page.select_option("#ablation-metric", metric)
            for layer, head in ((1, induction), (0, previous)):
                line = page.inner_text(f'.head[data-layer="{layer}"][data-head="{head}"] .ablation')
                assert (
                    abs(signed_value(line.removeprefix("Δ ")) - ablation[metric][layer][head])
                    <= 0.0051
                )
        assert page.locator("#ablation-tables table").count() == len(METRICS)

        # the logit lens: each cell's probability and loss of the true next token, as the model has
        # them
        lens = logit_lens(model, ids)
        for stage, position in ((0, 3), (2, 25), (2, 38)):
            title = page.get_attribute(
                f'#lens td[data-stage="{stage}"][data-position="{position}"]', "title"
            )
            p, loss = (
                float(x) for x in re.search(r"p (\d\.\d{3}), loss (\d+\.\d{3})", title).groups()
            )
            assert abs(loss - lens["loss"][stage][position]) <= 0.0011, title
            assert abs(p - math.exp(-lens["loss"][stage][position])) <= 0.0011, title

        # a token clicked: which heads pushed its prediction up or down, from direct_attribution
        page.click('#tokens .token[data-index="30"]')
        pushes = head_attributions(direct_attribution(model, ids), 2, 4)[29].ravel()
        shown = page.eval_on_selector_all(
            "#attribution-heads td", "tds => tds.map(t => t.textContent)"
        )
        assert max(abs(signed_value(text) - v) for text, v in zip(shown, pushes)) <= 0.0051
        # layer 1 copies the token
        assert len(shown) == 8 and max(pushes[4:]) > 1.0 > max(abs(pushes[:4]))
        assert f"“{PROMPT[30]}” (token 30)" in page.inner_text("#attribution-title")
        page.click('#tokens .token[data-index="30"]')  # unpinned

        # the repeated-sequence demo: the same view on [R, R]
        page.click("#views button:nth-child(2)")
        page.click(f'.head[data-layer="1"][data-head="{induction}"]')
        page.check('input[value="query"]')
        n = min(model.config.block_size // 2, 32)
        demo = repeated_tokens(tokenizer.vocab_size, n, 1, seed=0)[0].tolist()
        labels = page.eval_on_selector_all(
            "#tokens .token", "tokens => tokens.map(t => t.textContent)"
        )
        assert labels == token_labels(
            demo, tokenizer
        ) and f"stripe {n - 1} left" in page.inner_text("#view-note")
        assert (
            abs(hover_cell(page, n + 5, 6) - attention(model, demo)[1, induction, n + 5, 6])
            <= SHOWN
        )
        check_composition_and_circuit(page, model, scores, tmp_path, previous, induction)
        page.screenshot(path=tmp_path / "explorer.png", full_page=True)
    assert (tmp_path / "explorer.png").read_bytes()[:4] == b"\x89PNG"


def check_composition_and_circuit(
    page, model, scores, folder: Path, previous: int, induction: int
) -> None:
    """The composition matrix's readout for (previous-token head, induction head), and the circuit's
    K edge between them and its numbers, as circuit.json has them; a click on a node opens its
    head."""
    page.click('#composition-kinds button[data-kind="k"]')
    layout = page.evaluate("compositionLayout()")
    box = page.locator("#composition").bounding_box()
    writer, reader, margin, cell = previous, 4 + induction, layout["margin"], layout["cell"]
    page.mouse.move(
        box["x"] + margin + (reader + 0.5) * cell, box["y"] + margin + (writer + 0.5) * cell
    )
    table, roles = composition_table(model), head_roles(scores)
    role = lambda layer, head: f"{roles[layer][head]['role']} {roles[layer][head]['score']:.2f}"  # noqa: E731
    score = table["k"][writer][reader]
    assert page.inner_text("#composition-readout") == (
        f"L0H{previous} ({role(0, previous)}) → L1H{induction} ({role(1, induction)}): "
        f"K-composition {score:.3f}, {score / table['baseline']:.1f}× the random baseline "
        f"{table['baseline']:.3f} ± {table['baseline_std']:.3f}"
    )
    circuit = json.loads((folder / "circuit.json").read_text())
    [edge] = [
        e
        for e in circuit["edges"]
        if e["from"] == f"L0H{previous}" and e["to"] == f"L1H{induction}" and e["kind"] == "k"
    ]
    drawn = page.locator(
        f'#circuit-svg .edge[data-from="L0H{previous}"][data-to="L1H{induction}"][data-kind="k"]'
    )
    drawn.dispatch_event("mouseenter")
    assert page.inner_text("#circuit-readout") == (
        f"L0H{previous} → L1H{induction} through its K: effect {signed(edge['effect'])} ± "
        f"{edge['effect_se']:.2f}, K-composition {edge['composition']:.3f}"
    )
    # every edge, those into the logits (the answer writers' direct effects) included
    assert page.locator("#circuit-svg .edge").count() == len(circuit["edges"])
    page.click(f'#circuit-svg .node[data-name="L1H{induction}"] circle')
    assert page.inner_text("#detail-title").startswith(f"L1H{induction} · induction")
    check_discovered(page, folder)


def check_discovered(page, folder: Path) -> None:
    """The discovered circuit: an arrow per kept edge, its faithfulness as discovered.json has it,
    a point per measured size on its curve, and an edge's score on hover."""
    found = json.loads((folder / "discovered.json").read_text())
    kept = [e for e in found["edges"] if e["kept"]]
    assert page.locator("#discovered-svg .edge").count() == len(kept) == found["size"]
    assert f"f = {found['faithfulness']:.3f}" in page.inner_text("#discovered-note")
    assert f"under {found['ablation']} ablation" in page.inner_text("#discovered-note")
    if "interval" in found:
        low, high = found["interval"]
        assert f"[{low:.3f}, {high:.3f}]" in page.inner_text("#discovered-note")
    assert page.locator("#discovered-curve circle").count() == len(found["curve"])
    e = kept[0]
    at = f'[data-from="{e["from"]}"][data-to="{e["to"]}"][data-kind="{e["kind"]}"]'
    page.locator(f"#discovered-svg .edge{at}").dispatch_event("mouseenter")
    assert f"score {signed(e['score'])[0]}{abs(e['score']):.3f}" in page.inner_text(
        "#discovered-readout"
    )


def signed(x: float) -> str:
    """As the page writes a signed number: +0.12, −0.12."""
    return f"{'+' if x >= 0 else '−'}{abs(x):.2f}"


def test_the_browser_says_when_the_prompt_is_cut_and_shows_its_text_as_text(
    browser, tmp_path: Path, monkeypatch
):
    tokenizer = CharTokenizer(CHARS)
    text = "</script><b>bold?</b> & 'all'\n" * 2
    ids = tokenizer.encode(text).tolist()
    monkeypatch.setattr(interp.explorer, "MAX_WEIGHTS", 6 * 40 * 41 // 2)
    path = write_page(
        tmp_path / "attention.html", tiny_model(), ids, tokenizer, fake_scores(2, 3), "cut"
    )
    with opened(browser, path) as page:
        note = page.inner_text("#view-note")
        assert f"the prompt has {len(ids)} tokens; this page shows the first 40" in note
        labels = page.eval_on_selector_all(
            "#tokens .token", "tokens => tokens.map(t => t.textContent)"
        )
        assert labels == token_labels(ids[:40], tokenizer)  # "<b>" shown, not parsed
        assert page.locator("#tokens b").count() == 0


def discovered_page(tmp_path: Path, found: dict) -> Path:
    """The page of the tiny model on "abcabc" with the discovered circuit `found`."""
    tokenizer = CharTokenizer(CHARS)
    ids = tokenizer.encode("abcabc").tolist()
    page = tmp_path / "discovered.html"
    return write_page(page, tiny_model(), ids, tokenizer, fake_scores(2, 3), "", discovered=found)


def test_the_page_says_a_discovered_circuit_of_one_row_has_no_interval(browser, tmp_path: Path):
    """discovered.json with "missing": {"interval": ...} (one row): the page writes f once and why
    there is no interval, not f twice as an interval of no width."""
    from test_discovery_pictures import discovered

    found = discovered(missing={"interval": "one row, which every resample of the rows repeats"})
    del found["interval"]
    view = interp.explorer.discovered_view(tiny_model(), found)
    assert "interval" not in view and view["no_interval"].startswith("one row")
    with opened(browser, discovered_page(tmp_path, found)) as page:
        note = page.inner_text("#discovered-note")
        assert "f = 1.200 (no interval: one row) of what the model does" in note, note
        assert "[1.200, 1.200]" not in note


def test_the_page_shows_a_discovered_circuit_of_no_edges(browser, tmp_path: Path):
    """A circuit with no edges left (its strongest edges all off a path from the embeddings to the
    logits): discovered.json's minimality has no share; the page says so, as discover prints it,
    and draws no arrow."""
    from test_discovery_pictures import discovered

    found = discovered(size=0, faithfulness=0.0, reached=False, interval=[0.0, 0.0])
    found["edges"] = [e | {"kept": False} for e in found["edges"]]
    found["incompleteness"] = {"value": 0.0, "removed": []}
    found["minimality"] = {"share": None, "edges": 0, "weakest": []}
    with opened(browser, discovered_page(tmp_path, found)) as page:
        note = page.inner_text("#discovered-note")
        assert "0 edges keep f = 0.000" in note and "minimality none (no edges)." in note, note
        assert page.locator("#discovered-svg .edge").count() == 0
        assert page.locator("#discovered-curve circle").count() == len(found["curve"])
