"""The bundled tiny model: a ~0.9M-parameter character-level Llama, built here with no download.

``ensure_tiny_model(models_dir)`` builds it once (tokenizer + config + a short SFT warm-up on the
TRAIN split of the built-in arithmetic task, so its held-out accuracy starts low but non-zero)
and caches it as a normal HF checkpoint directory; later calls just return the path. Nothing
here is special to the trainer: the result loads with ``AutoModelForCausalLM.from_pretrained``.
"""
from __future__ import annotations

import fcntl
import json
import string
import time
from pathlib import Path

import torch

NAME = "tiny-arith"
BUILD_VERSION = "1"  # bump when the recipe changes, so cached builds are rebuilt
SPECIALS = ["<pad>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}<|end|>"
    "{% else %}<|user|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SFT_STEPS = 500
SFT_BATCH = 64
SFT_LR = 1e-3


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|end|>"
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_model(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg)


def sft_batch(tokenizer, samples):
    """Token ids and a loss mask covering only the answer (and its EOS)."""
    from .rollout import render_prompt

    seqs, masks = [], []
    for s in samples:
        p = tokenizer(render_prompt(tokenizer, s["prompt"]), add_special_tokens=False)["input_ids"]
        a = tokenizer("\\boxed{" + str(s["reference"]) + "}", add_special_tokens=False)["input_ids"]
        seqs.append(p + a + [tokenizer.eos_token_id])
        masks.append([0] * len(p) + [1] * (len(a) + 1))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    m = torch.zeros((len(seqs), width))
    for i, (s, k) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        m[i, : len(k)] = torch.tensor(k, dtype=torch.float)
    return ids, m


def sft(model, tokenizer, samples, steps: int, batch: int, lr: float, seed: int = 0, log=None):
    import random

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        ids, m = sft_batch(tokenizer, rng.sample(samples, batch))
        logits = model(input_ids=ids).logits[:, :-1]
        loss_tok = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        ).view(ids.shape[0], -1)
        loss = (loss_tok * m[:, 1:]).sum() / m[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log and step % 50 == 0:
            log(f"sft step {step} loss {loss.item():.3f}")
    model.eval()


def ensure_tiny_model(models_dir: str | Path, log=print) -> Path:
    """Return the cached tiny model's directory, building it first if needed (process-safe)."""
    from .data import arithmetic_split

    out = Path(models_dir) / NAME
    stamp = out / "rlvr_build.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if stamp.exists() and json.loads(stamp.read_text()).get("version") == BUILD_VERSION:
            return out
        t0 = time.time()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one thread: bit-for-bit the same model on every machine run
        log(f"building the tiny model in {out} (one-time, ~1-3 CPU-minutes)")
        torch.manual_seed(0)
        tok = build_tokenizer()
        model = build_model(tok)
        train, _ = arithmetic_split(eval_size=200)
        sft(model, tok, train, SFT_STEPS, SFT_BATCH, SFT_LR, log=log)
        torch.set_num_threads(threads)
        tmp = out.with_name(out.name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "rlvr_build.json").write_text(json.dumps({"version": BUILD_VERSION, "seconds": time.time() - t0}))
        if out.exists():
            import shutil

            shutil.rmtree(out)
        tmp.rename(out)
        log(f"tiny model built in {time.time() - t0:.0f}s")
        return out
