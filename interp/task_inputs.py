"""The tasks heads.py's analyses read, checked before any work: --ablate's --group, a prompt pair
(--patch, --attribute, --circuit CLEAN CORRUPTED), the circuit's task (--circuit: [R, R] by
default) and --discover's (induction, previous-token, or a JSONL file of prompt pairs,
interp/task_file.py). Each problem is one line for people (UserError)."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.errors import UserError
from common.user_text import user_text
from data.prompts import encode_prompt
from interp.patching import metric_ends, predictions
from interp.plots import token_labels
from interp.scores import HEAD_NAME, head_name
from interp.task_circuit import MIN_CHANGE
from interp.task_file import file_task
from interp.tasks import previous_token_task, prompt_pair, repeat_task

BUILT_IN = ("induction", "previous-token")  # --discover's own tasks


def head_groups(texts: list[str], n_layer: int, n_head: int) -> list[list[tuple[int, int]]]:
    """--group's heads (--ablate), each "L1H0,L1H2" as [(1, 0), (1, 2)]."""
    groups = []
    for text in texts:
        found = [HEAD_NAME.fullmatch(part.strip().upper()) for part in text.split(",")]
        if not all(found):
            raise UserError(
                "--group takes heads as L<layer>H<head> separated by commas (L1H0,L1H2), got "
                f"{text!r}"
            )
        heads = [(int(m.group(1)), int(m.group(2))) for m in found]
        for layer, head in heads:
            if not (0 <= layer < n_layer and 0 <= head < n_head):
                shape = f"{n_layer} layers x {n_head} heads"
                raise UserError(
                    f"--group: {head_name(layer, head)} is not a head of this model ({shape})"
                )
        groups.append(heads)
    return groups


def patch_prompts(
    model, tokenizer, texts: list[str], option: str = "--patch"
) -> tuple[list[int], list[int]]:
    """A prompt pair's token ids (--patch, --attribute, --circuit), refused unless they have the
    same length and the model predicts different next tokens after them."""
    # as --prompt is read
    texts = [user_text(t, f"a prompt of {option}", "give it in UTF-8") for t in texts]
    clean, corrupted = (
        encode_prompt(text, tokenizer, model.config.context_limit) for text in texts
    )
    if len(clean) != len(corrupted):
        raise UserError(
            f"{option} needs two prompts of the same length: the clean one has {len(clean)} "
            f"tokens, the corrupted one {len(corrupted)}; swap a word for one of the same length"
        )
    a, b = predictions(model, clean, corrupted)
    if a == b:
        token = token_labels([a], tokenizer)[0]
        raise UserError(
            f"{option}: both prompts make the same token the most likely next (“{token}”); give a "
            "corrupted prompt that changes the prediction"
        )
    return clean, corrupted


def circuit_task(model, args: argparse.Namespace, prompts, tokenizer):
    """--circuit's task, refused (before any work) when the model does it no better clean than
    corrupted; a prompt pair's metric names its tokens."""
    if prompts:
        task = prompt_pair(model, *prompts, name=lambda i: f"“{token_labels([i], tokenizer)[0]}”")
        fix = "give another prompt pair"
    else:
        task = repeat_task(model, args.sequences or 16, args.seed)
        fix = "give --circuit CLEAN CORRUPTED for a task it does"
    check_rows(task, "--circuit", "the random draws matched; give another --seed")
    return check_effect(model, task, "--circuit", fix)


def check_rows(task, option: str, fix: str) -> None:
    """Refused: a row whose clean and corrupted inputs are the same (it has no gap: f's interval
    divides by 0 on resamples of it alone)."""
    same = (task.clean == task.corrupted).all(dim=1).nonzero()[:, 0].tolist()
    if same:
        raise UserError(
            f"{option}: row {same[0] + 1} of {len(task.clean)} has the same clean and corrupted "
            f"input, so no gap to share; {fix}"
        )


def check_effect(model, task, option: str, fix: str):
    """The task, refused unless the model's metric on the clean input beats the corrupted one's by
    MIN_CHANGE: else there is no circuit to find."""
    clean, corrupted = metric_ends(model, task.noised())
    if clean - corrupted >= MIN_CHANGE:
        return task
    raise UserError(
        f"{option}: the model does the task too little to find a circuit: its metric is "
        f"{clean:+.3f} on the clean input and {corrupted:+.3f} on the corrupted one, "
        f"{clean - corrupted:+.3f}, where the clean must beat the corrupted by at least "
        f"{MIN_CHANGE}; {fix}"
    )


def discover_tasks(model, args: argparse.Namespace, val, tokenizer):
    """--discover's task and, for a built-in one, the same on other sequences (to measure the
    circuit again); refused before any work when the model does it no better clean than
    corrupted."""
    if args.discover not in BUILT_IN and not Path(args.discover).is_file():
        raise UserError(
            f"--discover takes {' or '.join(BUILT_IN)} or a JSONL task file; no file "
            f"{args.discover!r} (docs/heads.md shows the file's lines)"
        )
    made = [
        discovery_task(model, args.discover, val, tokenizer, args.sequences, args.seed + k)
        for k in range(2 if args.discover in BUILT_IN else 1)
    ]
    fix = {
        "induction": "the random draws matched; give another --seed",
        "previous-token": "no window has another token before the last; give more --sequences",
    }
    for task in made:  # a task file's lines are checked as it is read
        check_rows(task, f"--discover {args.discover}", fix.get(args.discover, ""))
    check_effect(model, made[0], "--discover", "give a task the model does")
    return made[0], made[1] if len(made) > 1 else None


def discovery_task(model, task: str, val, tokenizer, sequences, seed: int):
    """--discover's task: the built-in induction or previous-token task, or a JSONL file's."""
    if task == "induction":
        return repeat_task(model, sequences or 16, seed)
    if task == "previous-token":
        return previous_token_task(model, val, sequences or 64, seed)
    return file_task(model, task, tokenizer)
