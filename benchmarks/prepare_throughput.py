"""`ablate prepare` tokens/s against the tokenizer's own `encode_batch`, on a corpus made here (> 1 GB).

    python benchmarks/prepare_throughput.py [--gb 1.1] [--workers 2] [--folder DIR]

(DIR: by default `ablate-prepare-bench` in the system's temporary folder.)

The corpus: JSON lines of Zipf-distributed synthetic words (a vocabulary of 20K, 50-1500 words per
document), written once and reused. The tokenizer: a byte-level BPE `tokenizer.json` of 32K tokens trained
here on the first 20 MB. Three measurements, each in its own process, one after another:

- `encode_batch, 1 thread`: the documents already in memory (read before the clock starts), encoded in
  chunks of 1 MB by `Tokenizer.encode_batch_fast` with TOKENIZERS_PARALLELISM=false;
- `encode_batch, all threads`: the same with the library's own thread pool (Rayon, one thread per core);
- `ablate prepare --workers N`: the whole command from the raw files: scan (fingerprint, document count,
  split), read, tokenize in N processes, write shards and manifest.

Peak memory is the largest resident set of the command's process tree (prepare's main process and its
workers summed), sampled every second from /proc. Prints a Markdown table; ratios are within this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENCODE = r"""
import json, os, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = []
for name in sorted(os.listdir(sys.argv[2])):
    with open(os.path.join(sys.argv[2], name), "rb") as f:
        docs += [json.loads(line)["text"] for line in f if line.strip()]
chunks, chunk, size = [], [], 0
for d in docs:
    chunk.append(d); size += len(d)
    if size >= 1 << 20:
        chunks.append(chunk); chunk, size = [], 0
chunks.append(chunk)
start = time.perf_counter()
tokens = 0
for c in chunks:
    tokens += sum(len(e.ids) + 1 for e in tok.encode_batch_fast(c, add_special_tokens=False))
print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}))
"""


def make_corpus(folder: Path, gigabytes: float, seed: int = 0) -> Path:
    corpus = folder / "corpus"
    if corpus.is_dir() and sum(p.stat().st_size for p in corpus.iterdir()) >= gigabytes * 1e9:
        return corpus
    corpus.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(20000)])
    written, part = 0, 0
    while written < gigabytes * 1e9:
        with open(corpus / f"part{part:03d}.jsonl", "w") as f:
            for _ in range(20000):
                ids = np.minimum(rng.zipf(1.2, rng.integers(50, 1500)) - 1, len(words) - 1)
                line = json.dumps({"text": " ".join(words[ids])}) + "\n"
                f.write(line)
                written += len(line)
        part += 1
    return corpus


def make_tokenizer(folder: Path, corpus: Path) -> Path:
    path = folder / "tokenizer.json"
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sample, size = [], 0
    with open(sorted(corpus.iterdir())[0]) as f:
        for line in f:
            sample.append(json.loads(line)["text"])
            size += len(line)
            if size > 20e6:
                break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(sample, trainer=trainer)
    tok.save(str(path))
    return path


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/statm").read_text().split()
            total += int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
        stack += children.get(p, [])
    return total


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(seconds, peak resident bytes of the process tree, stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, env=env, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(1.0)
    out = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"{cmd[:3]} exited {proc.returncode}")
    return time.perf_counter() - start, peak, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()) / "ablate-prepare-bench")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(args.folder, args.gb)
    tok = make_tokenizer(args.folder, corpus)
    size = sum(p.stat().st_size for p in corpus.iterdir())
    print(f"corpus {size / 1e9:.2f} GB in {len(list(corpus.iterdir()))} files; tokenizer {tok}", flush=True)

    rows = []
    for name, threads in (("encode_batch, 1 thread", "false"), ("encode_batch, all threads", "true")):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": threads}
        _, peak, out = timed([sys.executable, "-c", ENCODE, str(tok), str(corpus)], env)
        result = json.loads(out)
        rows.append((name, result["tokens"], result["seconds"], peak))
        print(rows[-1], flush=True)

    recipe = args.folder / "recipe.yaml"
    recipe.write_text(  # JSON is YAML: a one-variant recipe whose data section is the corpus
        json.dumps(
            {
                "name": "prepare-bench",
                "base": {
                    "model": {"vocab_size": 32000, "d_model": 32, "n_layers": 1, "head_dim": 8},
                    "train": {
                        "seq_len": 32,
                        "batch_tokens": 128,
                        "micro_batch_size": 4,
                        "steps": 1,
                        "lr": 1e-3,
                    },
                    "data": {"source": str(corpus), "tokenizer": {"name": "hf", "path": str(tok)}},
                },
                "variants": {"transformer": {"label": "Transformer"}},
            }
        )
    )
    out_dir = args.folder / f"shards-{args.workers}"
    subprocess.run(["rm", "-rf", str(out_dir)], check=True)
    cmd = [sys.executable, "-m", "ablate.cli", "prepare", str(recipe), "--out", str(out_dir)]
    cmd += ["--workers", str(args.workers), "--workspace", str(args.folder / "ws")]
    seconds, peak, _ = timed(cmd, dict(os.environ))
    manifest = json.loads((out_dir / "manifest.json").read_text())
    tokens = sum(s["tokens"] for s in manifest["splits"].values())
    rows.append((f"ablate prepare --workers {args.workers} (whole command)", tokens, seconds, peak))

    base = rows[0][1] / rows[0][2]
    print(f"\ncorpus {size / 1e9:.2f} GB, {os.cpu_count()} cores\n")
    print("| what | tokens | seconds | tokens/s | vs encode_batch, 1 thread | peak memory |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, s, peak in rows:
        print(
            f"| {name} | {n:,} | {s:.1f} | {n / s / 1e6:.2f}M | {n / s / base:.2f}x | {peak / 2**20:,.0f} MiB |"
        )


if __name__ == "__main__":
    main()
