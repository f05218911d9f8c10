"""Data preparation speed against the tokenizer's own ceiling: MB/s and tokens/s of data/prepare.py
for each tokenizer, next to its own batch encode of the same text in memory (the most preparation
could reach), encoding in threads (what prepare does) and in a process pool, and the time and memory
to build each vocabulary.

    python -m tools.prepare_speed --text /tmp/shakespeare200.txt --mb 200
        --tokenizers char gpt2 bpe:1024

The text is made (tiny Shakespeare repeated to --mb MB) when the file does not exist. Each build,
ceiling and preparation runs in a fresh process, so its peak memory (VmHWM) is its own and the
ceiling meets the same cold start as a preparation; rounds alternate, the tables give medians;
results go to --json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import data.prepare as prep
from common import json_text
from data import encode, shard_writer
from data.bpe import BPETokenizer, TrainedBPE
from data.recipes import SHAKESPEARE
from data.sources import TextFile
from data.tokenizers import CharTokenizer, from_meta, parse_spec

MB = 1e6
BATCH = 16  # pieces (of ~1 MiB) per call of a batch encoder in the ceiling


def peak_mb() -> float:
    """This process's peak resident memory (MiB). VmHWM, not ru_maxrss: Linux carries a parent's
    ru_maxrss over into a child it starts, and the parent here holds the whole text."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (
            1024 if sys.platform != "darwin" else 2**20
        )


def make_text(path: Path, mb: float) -> None:
    """Tiny Shakespeare, repeated until the file holds mb MB."""
    text = Path(SHAKESPEARE).read_text(encoding="utf-8")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(max(1, round(mb * MB / len(text.encode())))):
            f.write(text)


# --- child processes: build a vocabulary, or prepare with one ---


def build_vocabulary(spec: str, text: str, meta_out: str) -> dict:
    """The tokenizer prepare would make for spec, timed, its metadata written to meta_out."""
    source = TextFile(text)
    kind, size = parse_spec(spec)
    start = time.perf_counter()
    if kind == "char":
        tok = CharTokenizer.from_texts(
            d for split in ("train", "val") for d in source.documents(split)
        )
    elif kind == "trained_bpe":
        tok = TrainedBPE.train(
            prep.first_chars(source.documents("train"), prep.BPE_TRAIN_CHARS), size
        )
    else:
        tok = BPETokenizer(kind)
    seconds = time.perf_counter() - start
    Path(meta_out).write_text(json_text.dumps(tok.to_meta()))
    return {"seconds": seconds, "peak_mb": peak_mb()}


_worker_tok = None


def _init_worker(meta: dict) -> None:
    global _worker_tok
    _worker_tok = from_meta(meta)


def _encode_in_worker(args) -> encode.Encoded:
    return encode._encode(_worker_tok, *args)


def process_stream(docs, tokenizer, eot, dtype, workers):
    """data/encode.py's encode_stream with a process pool instead of threads: each worker rebuilds
    the tokenizer from its metadata once, and tasks go out in windows of workers * 4 (bounded
    memory)."""
    tasks = encode._tasks(docs)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.to_meta(),)) as pool:
        while window := list(islice(tasks, workers * 4)):
            yield from pool.imap(_encode_in_worker, [(t, eot, dtype, end) for t, end in window])


def prepare_once(pool: str, text: str, meta_file: str, workers: int) -> dict:
    """prepare() of the text with a built tokenizer, encoding in threads or processes, timed."""
    tokenizer = from_meta(json.loads(Path(meta_file).read_text()))
    if pool == "processes":
        shard_writer.encode_stream = process_stream  # the one difference between the two runs
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        recipe = prep.Recipe(TextFile(text), "given")
        meta = prep.prepare_dataset(Path(out) / "speed", recipe, workers, tokenizer)
        seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "tokens": meta.train_tokens + meta.val_tokens,
        "peak_mb": peak_mb(),  # of the main process (a process pool's workers hold more)
    }


def child(*args: str) -> dict:
    """Run this script in a fresh process for one measurement; its JSON result."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "tools.prepare_speed", "--child", *args]
    root = Path(__file__).resolve().parent.parent  # where `tools` is importable from
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, cwd=root)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- the ceilings: encoding the text already in memory, nothing else ---


def library_batch(tokenizer, pieces: list[str], workers: int) -> tuple[float, int] | None:
    """(seconds, tokens) of the library's own batch encode over all cores: tiktoken's
    encode_ordinary_batch, tokenizers' encode_batch_fast (None for char: numpy has none)."""
    batches = [pieces[i : i + BATCH] for i in range(0, len(pieces), BATCH)]
    start = time.perf_counter()
    tokens = 0
    if isinstance(tokenizer, BPETokenizer):
        for batch in batches:
            tokens += sum(
                map(len, tokenizer._enc.encode_ordinary_batch(batch, num_threads=workers))
            )
    elif isinstance(tokenizer, TrainedBPE):
        for batch in batches:
            tokens += sum(
                len(e.ids)
                for e in tokenizer._tok.encode_batch_fast(batch, add_special_tokens=False)
            )
    else:
        return None
    return time.perf_counter() - start, tokens


def bare_encode(tokenizer, pieces: list[str], workers: int) -> tuple[float, int]:
    """(seconds, tokens) of the encode calls prepare makes (encode_batch per piece, in a thread
    pool), with no reading, grouping, concatenating or writing."""
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        tokens = sum(len(ids[0]) for ids in pool.map(lambda p: tokenizer.encode_batch([p]), pieces))
    return time.perf_counter() - start, tokens


def read_only(text: Path) -> float:
    """Seconds to read and decode the text as prepare does, with nothing else: its floor."""
    start = time.perf_counter()
    for split in ("train", "val"):
        for _ in TextFile(str(text)).documents(split):
            pass
    return time.perf_counter() - start


def ceiling_once(kind: str, text: str, meta_file: str, workers: int) -> dict | None:
    """One ceiling (`library` or `bare`) timed in this (fresh) process, the text read into memory
    first."""
    tokenizer = from_meta(json.loads(Path(meta_file).read_text()))
    source = TextFile(text)
    pieces = [d for split in ("train", "val") for d in source.documents(split)]
    got = (library_batch if kind == "library" else bare_encode)(tokenizer, pieces, workers)
    return None if got is None else {"seconds": got[0], "tokens": got[1]}


def measure(spec: str, text: Path, rounds: int, pools: list[str], workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        meta_file = str(Path(tmp) / "tokenizer.json")
        build = child("build", spec, str(text), meta_file)
        tokenizer = from_meta(json.loads(Path(meta_file).read_text()))
        runs: dict[str, list[dict]] = {
            "read": [],
            "library": [],
            "bare": [],
            **{p: [] for p in pools},
        }
        for r in range(rounds):
            runs["read"].append({"seconds": read_only(text)})
            for name in ("library", "bare"):  # in fresh processes, as the preparations below
                got = child("ceiling", name, str(text), meta_file, str(workers))
                if got is not None:
                    runs[name].append(got)
            tokens = runs["bare"][-1]["tokens"]
            for pool in pools:
                runs[pool].append(child("prepare", pool, str(text), meta_file, str(workers)))
                assert runs[pool][-1]["tokens"] == tokens, (pool, runs[pool][-1]["tokens"], tokens)
            done = ", ".join(f"{k} {v[-1]['seconds']:.2f} s" for k, v in runs.items() if v)
            print(f"  {spec} round {r + 1}: {done}", flush=True)
    return {"build": build, "vocab_size": tokenizer.vocab_size, "runs": runs}


def report(results: dict, text_mb: float) -> str:
    """A markdown table: medians; × is the speed of preparation over that of the faster ceiling."""
    pools = results["pools"]
    head = ["tokenizer", "build vocabulary s (peak MiB)", "tokens"]
    head += ["read only s", "library batch encode s (MB/s)", "bare encode s (MB/s, Mtok/s)"]
    head += [f"prepare, {p}: s (MB/s, × ceiling, peak MiB)" for p in pools]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for spec, res in results["tokenizers"].items():
        med = {k: statistics.median(r["seconds"] for r in v) for k, v in res["runs"].items() if v}
        tokens = res["runs"]["bare"][0]["tokens"]
        best = min(med.get("library", float("inf")), med["bare"])
        row = [
            f"`{spec}`",
            f"{res['build']['seconds']:.1f} ({res['build']['peak_mb']:.0f})",
            f"{tokens / 1e6:.1f}M",
        ]
        row.append(f"{med['read']:.2f}")
        row.append(
            f"{med['library']:.2f} ({text_mb / med['library']:.1f})" if "library" in med else "–"
        )
        row.append(
            f"{med['bare']:.2f} ({text_mb / med['bare']:.1f}, {tokens / 1e6 / med['bare']:.2f})"
        )
        for pool in pools:
            peak = max(r["peak_mb"] for r in res["runs"][pool])
            row.append(
                f"{med[pool]:.2f} ({text_mb / med[pool]:.1f}, {best / med[pool]:.2f}×, {peak:.0f})"
            )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tools.prepare_speed", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--text", default="/tmp/shakespeare200.txt", help="the text (made if missing)")
    p.add_argument(
        "--mb", type=float, default=200, help="size of the text to make (default %(default)s MB)"
    )
    p.add_argument("--tokenizers", nargs="+", default=["char", "gpt2", "bpe:1024"])
    p.add_argument(
        "--pools", nargs="+", default=["threads", "processes"], choices=["threads", "processes"]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="bench/prepare_speed.json", help="where to write the results")
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        kind, *rest = argv[1:]
        if kind == "build":
            result = build_vocabulary(*rest)
        elif kind == "ceiling":
            result = ceiling_once(*rest[:3], int(rest[3]))
        else:
            result = prepare_once(rest[0], *rest[1:3], int(rest[3]))
        print(json_text.dumps(result))
        return
    args = parse_args(argv)
    text = Path(args.text)
    if not text.exists():
        make_text(text, args.mb)
    text_mb = text.stat().st_size / MB
    print(f"{text}: {text_mb:.1f} MB, {args.workers} workers, {os.cpu_count()} cores")
    results = {"text": str(text), "text_mb": text_mb, "workers": args.workers, "pools": args.pools}
    results["tokenizers"] = {
        spec: measure(spec, text, args.rounds, args.pools, args.workers) for spec in args.tokenizers
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json_text.dumps(results, indent=1))
    print(report(results, text_mb))


if __name__ == "__main__":
    main(sys.argv[1:])
