"""Reading a trained model back: sampling text from a checkpoint of any layout, on one process.

    the checkpoint      a run directory (its newest good checkpoint), a directory of checkpoints, or one
                        step_N directory; its marker gives the model's dimensions, the run's config.json
                        (beside the checkpoints) the data it trained on
    the model           built whole on the CPU, each parameter assembled from the saved pieces that cover it
                        (engine/checkpoint/layout.py names them by the single-process model's names and flat
                        ranges, whatever dp, tp, pp, ZeRO or ep wrote them: the resharding load to a world of
                        one); a 16-bit run's fp32 master weights where it saved them
    the tokens          text data: UTF-8 bytes; nanoGPT's character sets: meta.pkl's stoi and itos; other
                        data (synthetic, GPT-2 BPE .bin files: no tokenizer here): token ids, the prompt
                        given as space-separated ids
    generation          nanoGPT's `generate`: the last seq_len tokens through the model, the last position's
                        logits ÷ temperature, the top k kept, one token drawn (seeded), appended; no KV cache

No process group is started: DCP reads the files on this process (`no_dist`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.config import ConfigError, ModelConfig
from workbench.config.data_spec import parse_data, read_meta
from workbench.engine.checkpoint.files import MARKER, CheckpointError, latest_good, verify
from workbench.engine.checkpoint.save_load import saved_pieces
from workbench.model.gpt import GPT


@dataclass(kw_only=True)
class Sample:
    """What `sample` made: the prompt's and the new tokens, and the text they decode to."""

    text: str  # prompt and continuation, decoded (ids joined by spaces where there is no tokenizer)
    prompt_ids: list[int]
    new_ids: list[int]
    checkpoint: str
    step: int  # the checkpoint holds the model before this step

    def __str__(self) -> str:
        return self.text


def find_checkpoint(path: str) -> tuple[str, dict[str, Any] | None]:
    """(the checkpoint directory, the run's config.json or None) for a run directory, a directory of
    checkpoints or a checkpoint; CheckpointError naming what was looked for."""
    path = os.path.abspath(path)
    candidates = [path, os.path.join(path, "checkpoints")]
    for where in candidates:
        if os.path.exists(os.path.join(where, MARKER)):
            verify(where)
            ckpt = where
            break
        found, skipped = latest_good(where)
        if found is not None:
            ckpt = found
            break
    else:
        raise CheckpointError(
            f"{path}: no complete checkpoint here or under {candidates[1]} (a run keeps them "
            f"with --checkpoint-every N)"
        )
    for run_dir in (os.path.dirname(os.path.dirname(ckpt)), path):
        config = os.path.join(run_dir, "config.json")
        if os.path.exists(config):
            with open(config) as f:
                return ckpt, json.load(f)
    return ckpt, None


def load_whole_model(ckpt: str) -> tuple[GPT, int]:
    """The single-process model a checkpoint holds, in fp32 on the CPU, and the step it was saved before."""
    import torch.distributed.checkpoint as dcp

    marker = verify(ckpt)
    cfg = ModelConfig(**marker["model"])
    model = GPT(cfg, seed=0).eval()
    saved = saved_pieces(dcp.FileSystemReader(ckpt).read_metadata())
    wanted: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}
    for name, _ in model.named_parameters():
        source = f"master/{name}" if f"master/{name}" in saved else f"model/{name}"
        if source not in saved:
            raise CheckpointError(
                f"{ckpt} holds no {source}: not a checkpoint of this model ({cfg.family})"
            )
        sources[name] = source
        for _, n, key, dtype in saved[source]:
            wanted[key] = torch.empty(n, dtype=dtype)
    # "torch.distributed is disabled ...": one process is the intent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(wanted, checkpoint_id=ckpt, no_dist=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.view(-1)
            covered = 0
            for start, n, key, _ in saved[sources[name]]:
                flat[start : start + n].copy_(wanted[key])
                covered += n
            if covered < flat.numel():
                raise CheckpointError(
                    f"{ckpt}: the pieces of {sources[name]} cover {covered} of its "
                    f"{flat.numel()} elements"
                )
    return model, int(marker["step"])


def codec(
    config: dict[str, Any] | None, vocab_size: int
) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """(encode, decode) for the data the run trained on (the module's docstring)."""
    kind, path = parse_data(config.get("data", "synthetic") if config else "synthetic")
    if kind == "text":
        return (
            lambda s: list(s.encode("utf-8")),
            lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"),
        )
    meta = (
        os.path.join(os.path.dirname(os.path.abspath(path)), "meta.pkl")
        if kind == "bin" and path is not None
        else None
    )
    if meta is not None and os.path.exists(meta):
        table = read_meta(meta)
        if "stoi" in table and "itos" in table:
            stoi, itos = table["stoi"], table["itos"]

            def encode(s: str) -> list[int]:
                unknown = sorted({c for c in s if c not in stoi})
                if unknown:
                    raise ConfigError(f"prompt: {unknown} not in the data's character set ({meta})")
                return [stoi[c] for c in s]

            return encode, lambda ids: "".join(itos[i] for i in ids)

    def ids(s: str) -> list[int]:
        try:
            out = [int(x) for x in s.split()]
        except ValueError:
            raise ConfigError(
                f"prompt={s!r}: this run's data has no tokenizer here ({kind}); give token ids "
                f"separated by spaces, each below {vocab_size}"
            ) from None
        if any(not 0 <= i < vocab_size for i in out):
            raise ConfigError(f"prompt={s!r}: token ids must lie in [0, {vocab_size})")
        return out

    return ids, lambda tokens: " ".join(str(i) for i in tokens)


def newline(encode: Callable[[str], list[int]]) -> list[int]:
    """Where an empty prompt starts: a newline where the tokens have one (nanoGPT's start), else token 0."""
    try:
        return encode("\n") or [0]
    except ConfigError:
        return [0]


@torch.no_grad()
def generate(
    model: GPT,
    ids: list[int],
    tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> list[int]:
    """`tokens` new token ids after `ids` (nanoGPT's loop: the module's docstring)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.tensor([ids], dtype=torch.long)
    out: list[int] = []
    for _ in range(tokens):
        logits = model(seq[:, -model.cfg.seq_len :])[0, -1].float()
        if temperature == 0:  # greedy
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                kth = logits.topk(top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(logits.softmax(-1), 1, generator=g))
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    return out


def sample(
    path: str,
    prompt: str = "",
    *,
    tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> Sample:
    """Sample `tokens` tokens after `prompt` from the model a run (or checkpoint) at `path` saved. An empty
    prompt starts from a newline for text (nanoGPT's start) and token 0 otherwise."""
    if not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(
            f"tokens={tokens!r}: the number of tokens to sample must be a positive integer"
        )
    if not temperature >= 0:
        raise ConfigError(
            f"temperature={temperature!r}: must be ≥ 0 (0: the most likely token each time)"
        )
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ConfigError(f"top_k={top_k!r}: must be a positive integer (or None: every token)")
    ckpt, config = find_checkpoint(path)
    model, step = load_whole_model(ckpt)
    encode, decode = codec(config, model.cfg.vocab_size)
    start = encode(prompt) if prompt else newline(encode)
    new = generate(model, start, tokens, temperature=temperature, top_k=top_k, seed=seed)
    return Sample(
        text=decode(start + new), prompt_ids=start, new_ids=new, checkpoint=ckpt, step=step
    )
