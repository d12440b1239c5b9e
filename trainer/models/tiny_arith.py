"""The bundled tiny model: a ~0.9M-parameter character-level Llama, built here with no download.

Why its weights are committed (``trainer/models/assets/tiny-arith``, 3.5 MB) instead of built on each machine:
the build is a short SFT warm-up, and training amplifies last-bit float differences between CPU kernel
paths. The same seed, thread count and code gave 11% held-out accuracy on an AVX2 host and 39% on an
AVX-512 one. Every learning test, the demo and the README measure gains from this starting point, so it
must be the same everywhere: one build, committed, with a manifest (``rlvr_build.json``: file hashes and
the held-out accuracy it was built to) that ``verify_assets`` and the tests check.

``python -m trainer.models.tiny_arith build OUT`` rebuilds it (tokenizer + config + SFT on the TRAIN split of
the built-in arithmetic task). The warm-up does not run a fixed number of steps: it stops as soon as the
held-out greedy accuracy enters ``TARGET_BAND`` (measured every ``EVAL_EVERY`` steps), so a rebuild on
any CPU gives a model with the same contract — low but non-zero accuracy — even though its weights
differ. ``ensure_tiny_model(models_dir)`` copies the committed build into the model cache; the result
loads with ``AutoModelForCausalLM.from_pretrained`` like any HF checkpoint.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shutil
import string
import sys
import time
from pathlib import Path

import torch

NAME = "tiny-arith"
ASSETS = Path(__file__).parent / "assets" / NAME
MANIFEST = "rlvr_build.json"
SPECIALS = ["<pad>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}<|end|>"
    "{% else %}<|user|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SFT_BATCH = 64
SFT_LR = 1e-3
MIN_STEPS, MAX_STEPS, EVAL_EVERY = 400, 1500, 10
TARGET_BAND = (0.10, 0.20)  # held-out greedy accuracy the warm-up stops in: room to learn, signal to learn from
EVAL_SIZE = 400             # the held-out problems the demo and the learning tests score
# the demo's verifier: the answer must be stated as a number, not the question echoed into the box
EVAL_VERIFIER = {"name": "math", "config": {"allow_unevaluated": False}}


class TinyModelError(RuntimeError):
    """The committed build is missing or does not match its manifest, or a rebuild missed its band."""


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


def boxed_answer(s) -> str:
    return "\\boxed{" + str(s["reference"]) + "}"


def sft_batch(tokenizer, samples, answer=boxed_answer):
    """Token ids and a loss mask covering only the answer (and its EOS)."""
    from ..rollout import render_prompt

    seqs, masks = [], []
    for s in samples:
        p = tokenizer(render_prompt(tokenizer, s["prompt"]), add_special_tokens=False)["input_ids"]
        a = tokenizer(answer(s), add_special_tokens=False)["input_ids"]
        seqs.append(p + a + [tokenizer.eos_token_id])
        masks.append([0] * len(p) + [1] * (len(a) + 1))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    m = torch.zeros((len(seqs), width))
    for i, (s, k) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        m[i, : len(k)] = torch.tensor(k, dtype=torch.float)
    return ids, m


def sft_step(model, opt, ids: torch.Tensor, m: torch.Tensor) -> float:
    logits = model(input_ids=ids).logits[:, :-1]
    loss_tok = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    ).view(ids.shape[0], -1)
    loss = (loss_tok * m[:, 1:]).sum() / m[:, 1:].sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def held_out_accuracy(model, tokenizer, samples, max_new_tokens: int = 12, verifier: dict = EVAL_VERIFIER) -> float:
    """Greedy pass@1 on ``samples`` with the demo's verifier (what the demo and learning tests report)."""
    from verifiers.spec import VerifierSpec

    from ..engines import HFEngine
    from ..rollout import SamplingParams
    from ..scoring import Scorer

    ro = HFEngine(model, tokenizer).generate([s["prompt"] for s in samples], 1,
                                             SamplingParams(max_new_tokens, greedy=True))
    scored = Scorer([VerifierSpec.model_validate(verifier)])(ro.texts, [s["reference"] for s in samples])
    return sum(scored.correct) / len(samples)


def build(out: str | Path, band: tuple[float, float] = TARGET_BAND, seed: int = 0, log=print) -> dict:
    """Build the tiny model into ``out``: SFT until held-out accuracy enters ``band``. Returns the manifest."""
    from ..data import arithmetic_split

    out = Path(out)
    t0 = time.time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reproducible on a given kernel path
    try:
        torch.manual_seed(seed)
        tok = build_tokenizer()
        model = build_model(tok, seed)
        train, held = arithmetic_split(eval_size=EVAL_SIZE)
        import random

        rng = random.Random(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
        acc, step = 0.0, 0
        while True:
            model.train()
            for _ in range(EVAL_EVERY):
                loss = sft_step(model, opt, *sft_batch(tok, rng.sample(train, SFT_BATCH)))
                step += 1
            if step < MIN_STEPS:
                continue
            model.eval()
            acc = held_out_accuracy(model, tok, held)
            log(f"sft step {step}: loss {loss:.3f}, held-out accuracy {acc:.4f}")
            if band[0] <= acc <= band[1]:
                break
            if acc > band[1] or step >= MAX_STEPS:
                raise TinyModelError(f"the warm-up missed its band {band}: accuracy {acc:.4f} at step {step} "
                                     f"(try another seed or a smaller EVAL_EVERY)")
    finally:
        torch.set_num_threads(threads)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    manifest = {
        "name": NAME, "sft_steps": step, "seed": seed, "held_out_accuracy": acc, "eval_size": EVAL_SIZE,
        "band": list(band), "seconds": round(time.time() - t0, 1),
        "built_with": {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "sha256": _hashes(tmp),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"tiny model built in {time.time() - t0:.0f}s at {out}: {step} SFT steps, held-out accuracy {acc:.4f}")
    return manifest


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}


def manifest(folder: Path = ASSETS) -> dict:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TinyModelError(f"{folder}: no readable {MANIFEST}: {e}") from None


def verify_assets(folder: Path = ASSETS) -> dict:
    """The manifest, after checking every file it lists is there with the recorded hash."""
    man = manifest(folder)
    got = _hashes(folder)
    bad = sorted(n for n, h in man["sha256"].items() if got.get(n) != h)
    if bad:
        raise TinyModelError(f"{folder}: {', '.join(bad)} differ from the manifest (rebuild with "
                             f"`python -m trainer.models.tiny_arith build {folder}` and commit the result)")
    return man


def ensure_tiny_model(models_dir: str | Path, log=print) -> Path:
    """Return the tiny model's directory in ``models_dir`` (see :func:`install`)."""
    return install(ASSETS, models_dir, log)


def install(assets: Path, models_dir: str | Path, log=print) -> Path:
    """Copy a committed build into ``models_dir`` if needed (process-safe) and return its directory.
    Copied rather than used in place: the model cache is the one place jobs load models from, and an
    installed package directory may be read-only or shared between versions."""
    out = Path(models_dir) / assets.name
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{assets.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be copying it right now
        want = verify_assets(assets)
        try:
            if manifest(out).get("sha256") == want["sha256"]:  # an older cached build has none
                return out
        except TinyModelError:
            pass
        tmp = out.with_name(f".{assets.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(assets, tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        log(f"tiny model ready at {out} (held-out accuracy {want['held_out_accuracy']:.4f} at build)")
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.models.tiny_arith", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="rebuild the model (SFT until held-out accuracy enters the band)")
    b.add_argument("out", nargs="?", default=str(ASSETS))
    b.add_argument("--seed", type=int, default=0)
    sub.add_parser("verify", help="check the committed build against its manifest")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.out, seed=args.seed)
    else:
        print(json.dumps(verify_assets(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
