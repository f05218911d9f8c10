"""Interventions (interp/): batched edited passes against one forward per edit, zero ablation
against a model whose W_O reads zeros, activation patching's identities, the logit lens against the
model's logits, direct attributions summing to the logit; TransformerLens as an independent
reference on an exported GPT-2; the induction experiment (which heads the copying needs); and
heads.py's --ablate, --patch and --lens."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import OPTIONS, model_with, noisy, replay, run_script

from common.errors import cli
from data.dataset import Dataset
from data.loader import TokenFiles, TokenWindows
from hf import folders
from interp.ablation import METRICS, ablate, ablate_heads, head_means
from interp.interventions import Edit, intervene, passes
from interp.lens import direct_attribution, head_attributions, logit_lens, term_names
from interp.patching import patch
from interp.scores import THRESHOLD, icl_differences, repeat_losses, repeated_tokens, token_losses
from model import GPT
from model.hooks import hooked, point_names, run_with_cache, run_with_hooks
from runs import checkpoint, pretrained

V = 40  # model_with's vocabulary


def tokens(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def val_windows(tmp_path: Path) -> TokenWindows:
    np.random.default_rng(0).integers(0, V, 4000).astype(np.uint16).tofile(tmp_path / "val.bin")
    return TokenWindows(
        TokenFiles.of(tmp_path / "val.bin", "uint16"), 24, torch.device("cpu"), 0, "val"
    )


def zeroed_heads(model: GPT, heads, value=0.0):
    """Hooks that set the heads' z to `value` (a number, or per layer a (T, H, d) tensor of
    means)."""

    def edit(layer):
        def fn(z, name):
            z = z.clone()
            for at, head in heads:
                if at == layer:
                    z[:, :, head] = (
                        value[layer][: z.size(1), head] if isinstance(value, list) else value
                    )
            return z

        return fn

    return {f"blocks.{layer}.attn.z": edit(layer) for layer in {at for at, _ in heads}}


# --- interventions and ablation ---


@pytest.mark.parametrize("name", OPTIONS)
def test_zero_ablating_every_head_equals_a_model_whose_W_O_reads_zeros(name):
    model, idx = model_with(OPTIONS[name]), tokens()
    cfg = model.config
    every = [
        Edit("z", layer, 0.0, head=h) for layer in range(cfg.n_layer) for h in range(cfg.n_head)
    ]
    logits = intervene(model, idx, [every])
    silent = copy.deepcopy(model)
    with torch.no_grad():
        for block in silent.blocks:
            block.attn.W_O.weight.zero_()
        expected = silent(idx)[0]
        plain = model(idx)[0]
    torch.testing.assert_close(logits[1], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(logits[0], plain, rtol=0, atol=1e-6)  # the unedited rows


@pytest.mark.parametrize("name", ["gpt2", "rope_gqa", "attention_only", "swiglu_rmsnorm"])
def test_batched_interventions_equal_one_forward_each(name, monkeypatch):
    import interp.interventions

    model, idx = model_with(OPTIONS[name]), tokens(B=3)
    groups = [[(1, 2)], [(0, 0), (1, 3)], [], [(0, 3)]]
    interventions = [[Edit("z", layer, 0.0, head=h) for layer, h in g] for g in groups]
    expected = []
    with torch.no_grad():
        for g in groups:
            expected.append(run_with_hooks(model, idx, zeroed_heads(model, g))[0])
    together = intervene(model, idx, interventions)
    for g in range(len(groups)):
        torch.testing.assert_close(together[1 + g], expected[g], rtol=0, atol=1e-5)
    # cut into passes of at most 2 rows, every (intervention, row) still comes once
    monkeypatch.setattr(interp.interventions, "ACTIVATION_BYTES", 1)
    seen = np.zeros((1 + len(groups), idx.size(0)), dtype=int)
    for which, rows, logits in passes(model, idx, interventions):
        assert logits.shape[:2] == (len(which), len(range(idx.size(0))[rows]))
        for k, i in enumerate(which):
            seen[i, rows] += 1
            reference = model(idx[rows])[0] if i == 0 else expected[i - 1][rows]
            torch.testing.assert_close(logits[k], reference, rtol=0, atol=1e-5)
    assert (seen == 1).all()


@pytest.mark.parametrize("kind", ["zero", "mean"])
def test_head_ablation_equals_one_forward_per_head(kind, val_windows: TokenWindows):
    model = model_with(OPTIONS["rope_gqa"])
    cfg = model.config
    result = ablate_heads(model, val_windows, kind, seed=3, windows=6, sequences=5)
    x, y = val_windows.batch(0, 6, stream=2)
    n = min(cfg.block_size // 2, V)
    rep = repeated_tokens(V, n, 5, seed=3)
    means = head_means(model, val_windows.batch(0, 6, stream=3)[0]) if kind == "mean" else None

    def metrics(hooks) -> np.ndarray:
        with torch.no_grad():
            text = run_with_hooks(model, x, hooks)[0]
            first, second = repeat_losses(run_with_hooks(model, rep, hooks)[0], rep, n)
        loss, icl = token_losses(text, y).mean(), icl_differences(text, y).mean()
        return np.array([loss, first.mean(), second.mean(), icl])

    clean = metrics({})
    assert list(result["clean"].values()) == pytest.approx(clean, abs=1e-4)
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            value = 0.0 if kind == "zero" else means
            change = metrics(zeroed_heads(model, [(layer, head)], value)) - clean
            got = [result[m][layer][head] for m in METRICS]
            assert got == pytest.approx(change, abs=2e-4), (layer, head)
    assert result["kind"] == kind and result["windows"] == 6 and result["sequences"] == 5


def test_mean_ablation_uses_each_heads_mean_output_per_position(val_windows: TokenWindows):
    model = model_with({})
    reference = val_windows.batch(0, 7, stream=3)[0]
    means = head_means(model, reference)
    with torch.no_grad():
        _, cache = run_with_cache(model, reference, ["blocks.1.attn.z"])
    assert means[1].shape == (24, 4, 8)
    torch.testing.assert_close(means[1], cache["blocks.1.attn.z"].mean(dim=0))
    with pytest.raises(ValueError, match="zero, mean"):
        ablate(model, val_windows, [[(0, 0)]], "median")


# --- activation patching ---


@pytest.mark.parametrize("name", ["gpt2", "window_qk_norm", "attention_only"])
def test_patching_a_run_with_its_own_activations_changes_nothing(name):
    model, idx = model_with(OPTIONS[name]), tokens()
    names = point_names(model, patterns=False)
    with torch.no_grad():
        clean, cache = run_with_cache(model, idx, names)
        for name_ in names:  # one point at a time, and all at once
            assert torch.equal(run_with_hooks(model, idx, {name_: replay(cache)})[0], clean), name_
        assert torch.equal(
            run_with_hooks(model, idx, dict.fromkeys(names, replay(cache)))[0], clean
        )


@pytest.mark.parametrize("name", ["gpt2", "rope_gqa", "attention_only"])
def test_patching_everything_from_the_clean_run_gives_the_clean_logits(name):
    model, clean_idx = model_with(OPTIONS[name]), tokens(B=1, seed=4)
    corrupt_idx = tokens(B=1, seed=5)
    cfg = model.config
    writers = ["blocks.0.resid_pre"] + [f"blocks.{i}.attn.z" for i in range(cfg.n_layer)]
    writers += [f"blocks.{i}.mlp_out" for i in range(cfg.n_layer) if cfg.mlp]
    with torch.no_grad():
        clean, cache = run_with_cache(model, clean_idx, writers)
        patched = run_with_hooks(model, corrupt_idx, dict.fromkeys(writers, replay(cache)))[0]
        assert torch.equal(patched, clean)
        edits = [Edit("resid_pre", 0, cache["blocks.0.resid_pre"][0])]
        edits += [
            Edit("z", i, cache[f"blocks.{i}.attn.z"][0, :, h], head=h)
            for i in range(cfg.n_layer)
            for h in range(cfg.n_head)
        ]
        edits += [
            Edit("mlp_out", i, cache[f"blocks.{i}.mlp_out"][0])
            for i in range(cfg.n_layer)
            if cfg.mlp
        ]
        torch.testing.assert_close(
            intervene(model, corrupt_idx, [edits])[1], clean, rtol=0, atol=1e-5
        )


def test_patch_scores_the_restored_fraction_of_the_logit_difference():
    model = model_with({})
    clean = tokens(B=1, T=12, seed=6)[0].tolist()
    for position in range(12):  # a corrupted prompt, one token changed, that changes the prediction
        corrupted = list(clean)
        corrupted[position] = (clean[position] + 1) % V
        with torch.no_grad():
            a, b = (int(model(torch.tensor([p]))[0][0, -1].argmax()) for p in (clean, corrupted))
        if a != b:
            break
    result = patch(model, clean, corrupted)
    assert (result["answer"], result["alternative"]) == (a, b)
    assert result["logit_diff_clean"] > 0 >= result["logit_diff_corrupted"]
    # the embedding at the changed position carries all of it; the others none
    row = result["resid_pre"][0]
    assert row[position] == pytest.approx(1.0, abs=1e-4)
    assert all(v == pytest.approx(0.0, abs=1e-4) for p, v in enumerate(row) if p != position)
    # a head's number, from one forward with that head patched
    with torch.no_grad():
        _, cache = run_with_cache(model, torch.tensor([clean]), ["blocks.1.attn.z"])

        def put(z, name):
            z = z.clone()
            z[:, :, 2] = cache[name][:, :, 2]
            return z

        logits = run_with_hooks(model, torch.tensor([corrupted]), {"blocks.1.attn.z": put})[0][
            0, -1
        ]
    ld = float(logits[a] - logits[b])
    ld_clean, ld_corrupt = result["logit_diff_clean"], result["logit_diff_corrupted"]
    expected = (ld - ld_corrupt) / (ld_clean - ld_corrupt)
    assert result["heads"][1][2] == pytest.approx(expected, abs=1e-4)
    assert np.array(result["attn_out"]).shape == (2, 12) and np.array(result["mlp_out"]).shape == (
        2,
        12,
    )
    with pytest.raises(ValueError, match="the most likely next"):
        patch(model, clean, clean)
    with pytest.raises(ValueError, match="equal"):
        patch(model, clean, clean[:-1])


# --- logit lens and direct logit attribution ---


@pytest.mark.parametrize("name", OPTIONS)
def test_the_logit_lens_ends_at_the_models_prediction(name):
    model = model_with(OPTIONS[name])
    ids = tokens(B=1, T=14)[0].tolist()
    lens = logit_lens(model, ids, top=4)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids]))[0][0].float(), dim=-1)
    assert len(lens["stages"]) == model.config.n_layer + 1 and np.array(lens["top_ids"]).shape == (
        3,
        14,
        4,
    )
    assert lens["top_ids"][-1] == logp.topk(4).indices.tolist()
    true = -logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    # exactly: the same final norm and head on the same residual
    assert lens["loss"][-1] == true.tolist()
    assert lens["loss"][0] != lens["loss"][-1]


@pytest.mark.parametrize("name", OPTIONS)
def test_direct_attributions_sum_to_the_logit(name):
    model = model_with(OPTIONS[name])
    ids = tokens(B=1, T=14, seed=8)[0].tolist()
    result = direct_attribution(model, ids)
    values = np.array(result["values"])
    assert result["terms"] == term_names(model) and values.shape == (13, len(term_names(model)))
    with torch.no_grad():
        last = f"blocks.{model.config.n_layer - 1}.resid_post"
        final = run_with_cache(model, torch.tensor([ids]), [last])[1][last]
        raw = model.lm_head(model.norm_f(final))[0, :-1]  # before any soft cap
    logits = raw.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert result["logit"] == pytest.approx(logits.tolist(), abs=1e-5)
    assert values.sum(axis=1) == pytest.approx(result["logit"], abs=1e-4)
    # a head whose output is zeroed attributes nothing; the rest still sum to the (changed) logit
    with hooked(model, zeroed_heads(model, [(1, 1)])):
        silenced = direct_attribution(model, ids)
    column = silenced["terms"].index("L1H1")
    assert np.abs(np.array(silenced["values"])[:, column]).max() == 0.0
    assert np.array(silenced["values"]).sum(axis=1) == pytest.approx(silenced["logit"], abs=1e-4)
    assert head_attributions(result, 2, 4)[:, 1, 1].tolist() == values[:, column].tolist()


# --- TransformerLens, an independent reference, on an exported GPT-2 ---


def exported_gpt2(run: Path, dest: Path) -> GPT:
    """The run's model with noise on every weight (so that each norm's weights matter), written as a
    Hugging Face GPT-2 folder the way export.py writes one; the noisy model is returned."""
    source = pretrained.load_pretrained(run)
    model = GPT(source.model)
    pretrained.load_into(model, source.weights, run)
    torch.manual_seed(0)
    noisy(model, 0.05)
    dest.mkdir()
    folders.write_model(dest, source.model, checkpoint.model_weights(model), source.tokenizer_meta)
    return model.eval()


def bridge_of(folder: Path):
    """TransformerLens's TransformerBridge on the folder, offline (the model and tokenizer
    given)."""
    transformers = pytest.importorskip("transformers")
    bridges = pytest.importorskip(
        "transformer_lens.model_bridge", reason="pip install -e '.[test]'"
    )
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return bridges.TransformerBridge.boot_transformers(
        str(folder), hf_model=hf, tokenizer=tokenizer, device="cpu"
    )


@pytest.mark.slow
def test_transformer_lens_agrees_on_head_outputs_patterns_ablations_and_attributions(
    run: Path, data_dir: Path, tmp_path: Path
):
    model = exported_gpt2(run, tmp_path / "gpt2")
    bridge = bridge_of(tmp_path / "gpt2")
    cfg = model.config
    val = Dataset.open("shakespeare_char", data_dir).windows(
        "val", cfg.block_size, torch.device("cpu"), 0
    )
    x, y = val.batch(0, 4, stream=2)

    with torch.no_grad():
        _, theirs = bridge.run_with_cache(x)
        _, ours = run_with_cache(
            model, x, [f"blocks.{i}.attn.{p}" for i in range(cfg.n_layer) for p in ("z", "pattern")]
        )
    for layer in range(cfg.n_layer):
        for point in ("z", "pattern"):
            torch.testing.assert_close(
                ours[f"blocks.{layer}.attn.{point}"],
                theirs[f"blocks.{layer}.attn.hook_{point}"],
                rtol=0,
                atol=1e-4,
            )

    # every head ablated, zero and mean, with TransformerLens's hooks; the same metrics of its
    # logits
    n = min(cfg.block_size // 2, cfg.vocab_size)
    rep = repeated_tokens(cfg.vocab_size, n, 4, seed=0)
    reference = val.batch(0, 4, stream=3)[0]
    with torch.no_grad():
        _, ref_cache = bridge.run_with_cache(reference)

    def their_metrics(hooks) -> np.ndarray:
        with torch.no_grad():
            text = bridge.run_with_hooks(x, fwd_hooks=hooks)
            first, second = repeat_losses(bridge.run_with_hooks(rep, fwd_hooks=hooks), rep, n)
        return np.array(
            [
                token_losses(text, y).mean(),
                first.mean(),
                second.mean(),
                icl_differences(text, y).mean(),
            ]
        )

    def replace(head, value):
        def fn(z, hook):
            z = z.clone()
            z[:, :, head] = value if isinstance(value, float) else value[: z.size(1)]
            return z

        return fn

    clean = their_metrics([])
    for kind in ("zero", "mean"):
        result = ablate_heads(model, val, kind, seed=0, windows=4, sequences=4)
        assert list(result["clean"].values()) == pytest.approx(clean, abs=1e-4)
        for layer in range(cfg.n_layer):
            for head in range(cfg.n_head):
                name = f"blocks.{layer}.attn.hook_z"
                value = 0.0 if kind == "zero" else ref_cache[name][:, :, head].mean(dim=0)
                change = their_metrics([(name, replace(head, value))]) - clean
                assert [result[m][layer][head] for m in METRICS] == pytest.approx(
                    change, abs=1e-4
                ), (kind, layer, head)

    # direct logit attribution: TransformerLens with the final norm folded into the unembedding (its
    # DLA convention) and nothing centred, so that its terms are ours
    bridge.enable_compatibility_mode(
        disable_warnings=True,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    ids = x[0].tolist()
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([ids]))
        stack = cache.stack_head_results(layer=-1, pos_slice=None)[:, 0]
        targets = torch.tensor(ids[1:] + ids[:1])  # the last position's target is a placeholder
        attrs = cache.logit_attrs(stack, tokens=targets, batch_slice=0, has_batch_dim=False)[:, :-1]
    heads = head_attributions(direct_attribution(model, ids), cfg.n_layer, cfg.n_head)
    torch.testing.assert_close(
        torch.tensor(heads.reshape(len(ids) - 1, -1).T, dtype=torch.float32),
        attrs.float(),
        rtol=0,
        atol=1e-4,
    )


# --- the induction experiment: which heads the copying needs ---

# a layer-0 head with at least this previous-token score counts as one (see the test)
PREVIOUS_TOKEN = 0.3


def induction_val(out: Path, repeats_dir: Path) -> tuple[GPT, TokenWindows]:
    loaded = pretrained.load_model(out)
    model, cfg = loaded.model, loaded.config
    val = Dataset.open("repeats", repeats_dir).windows(
        "val", cfg.model.block_size, torch.device("cpu"), cfg.train.seed
    )
    return model, val


@pytest.mark.slow
def test_copying_needs_the_induction_heads_and_the_previous_token_heads_below_them(
    induction_run, repeats_dir: Path
):
    """Margins measured over six seeds of configs/induction.yaml (1337, the default, and 1 to 5;
    zero ablation, 16 [R, R] sequences): the induction heads together raise the second-half loss to
    1.09-1.14x the first half's; each alone +0.32 to +2.03, at most 0.47 of all of them together;
    layer 0's previous-token heads together +2.88 to +5.19 (0.75 to 1.4x the gap between the
    halves); and layer 0's heads write almost nothing towards the copied token themselves (direct
    attributions 0.05 at most, layer 1's heads 5.3 or more in all): layer 1 reads what they wrote
    (K-composition)."""
    out, scores = induction_run
    model, val = induction_val(out, repeats_dir)
    H = model.config.n_head
    induction = [(1, h) for h in range(H) if scores["induction"][1][h] >= THRESHOLD]
    previous = [(0, h) for h in range(H) if scores["previous_token"][0][h] >= PREVIOUS_TOKEN]
    assert induction and previous
    result = ablate(
        model, val, [induction, *([head] for head in induction), previous], "zero", sequences=16
    )
    first, second = (
        result["clean"]["repeat_loss_first_half"],
        result["clean"]["repeat_loss_second_half"],
    )
    raised = [e["repeat_loss_second_half"] for e in result["effects"]]
    together, alone, below = raised[0], raised[1:-1], raised[-1]
    assert second + together >= 0.95 * first, (first, second, together)  # no copying left
    assert all(0.2 <= r <= 0.6 * together for r in alone), (alone, together)  # each does part of it
    # and needs layer 0's previous-token heads
    assert below >= 0.5 * (first - second), (below, first, second)

    n = 32
    direct = []
    for seed in range(8):
        ids = repeated_tokens(model.config.vocab_size, n, 1, seed)[0].tolist()
        # predictions of the copy
        direct.append(head_attributions(direct_attribution(model, ids), 2, H)[n:])
    direct = np.concatenate(direct).mean(axis=0)
    assert np.abs(direct[0]).max() <= 0.1 and direct[1].sum() >= 2.0, direct


@pytest.mark.slow
def test_heads_command_ablates_patches_and_reads_the_lens(
    induction_run, repeats_dir: Path, tmp_path: Path, capsys
):
    out, _ = induction_run
    clean, corrupted = (
        "KLxiQEFBWOmACVzYafwcKLxiQEFBWOmACVzYafw",
        "KLxiQEFBWOmACVzYafwqKLxiQEFBWOmACVzYafw",
    )
    result = run_script(
        "heads.py",
        str(out),
        "--ablate",
        "--group",
        "l1h0,L1H1,l1H2,L1h3",  # head names in any case
        "--group",
        "L0H0",
        "--patch",
        clean,
        corrupted,
        "--lens",
        "--prompt",
        clean + "c",
        "--out",
        str(tmp_path),
        check=True,
        timeout=120,
    )
    for name in ("head_ablation", "patching", "lens"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
        assert str(tmp_path / f"{name}.json") in result.stdout
    assert (
        not (tmp_path / "head_scores.json").exists()
        and not (tmp_path / "attention_layer0.png").exists()
    )
    assert (
        "zero ablation of each head" in result.stdout
        and "the clean run predicts “c”, the corrupted one “q”" in result.stdout
    )

    model, val = induction_val(out, repeats_dir)
    saved = json.loads((tmp_path / "head_ablation.json").read_text())
    assert saved["checkpoint"] == str(out / "best")
    expected = ablate_heads(model, val, groups=[[(1, 0), (1, 1), (1, 2), (1, 3)], [(0, 0)]])
    assert all(saved[k] == expected[k] for k in ("clean", *METRICS, "groups"))
    assert saved["precision"] == "fp32"  # --precision auto: float32 below width 128 on a CPU
    assert saved["groups"][0]["heads"] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    # one head
    assert saved["groups"][1]["val_loss"] == pytest.approx(saved["val_loss"][0][0], abs=2e-4)
    assert "L1H0 L1H1 L1H2 L1H3 removed together: val_loss +" in result.stdout
    patched = json.loads((tmp_path / "patching.json").read_text())
    assert patched["resid_pre"][0][19] == pytest.approx(1.0, abs=1e-3)  # where the prompts differ
    assert max(patched["heads"][1]) > max(patched["heads"][0])  # the induction heads carry the copy
    lens = json.loads((tmp_path / "lens.json").read_text())
    assert lens["lens"]["loss"][-1] == logit_lens(model, lens["ids"])["loss"][-1]
    # the lens's extremes never read as zero, and the intact model's values come with their error
    down = next(line for line in result.stdout.splitlines() if "most down:" in line)
    assert "+0.00," not in down + "," and "-0.00," not in down + ",", down
    assert "intact model, on these inputs (± the standard error over them): val_loss" in (
        result.stdout
    )

    import heads as command

    for args, message in (
        (["--patch", "abc", "abcd"], "the same length"),
        (["--patch", clean, clean], "same token the most likely next"),
        (["--ablate", "--layer", "1", "--head", "0"], "--layer/--head draw"),
        (["--ablate", "median"], "--ablate takes zero or mean"),
        (["--lens", "--prompt", "a"], "at least 2 tokens"),
        (["--ablate", "--group", "L1H4"], "L1H4 is not a head of this model (2 layers x 4 heads)"),
        (["--ablate", "--group", "L1,H2"], "--group takes heads as L<layer>H<head>"),
        (["--group", "L1H0"], "give --ablate as well"),
    ):
        with pytest.raises(SystemExit) as e:
            cli(command.main, [str(out), "--out", str(tmp_path), *args])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err, (args, err)

    # --precision bf16: the same effects, to bf16's rounding
    assert (
        command.main([str(out), "--ablate", "--precision", "bf16", "--out", str(tmp_path / "bf16")])
        == 0
    )
    low = json.loads((tmp_path / "bf16" / "head_ablation.json").read_text())
    assert low["precision"] == "bf16" and ", bf16)" in capsys.readouterr().out
    for m in METRICS:
        np.testing.assert_allclose(low[m], saved[m], atol=0.15)
    # mean ablation writes its own files beside zero ablation's
    assert command.main([str(out), "--ablate", "mean", "--out", str(tmp_path)]) == 0
    mean = json.loads((tmp_path / "head_ablation_mean.json").read_text())
    assert mean["kind"] == "mean" and (tmp_path / "head_ablation_mean.png").is_file()
    assert json.loads((tmp_path / "head_ablation.json").read_text())["kind"] == "zero"
