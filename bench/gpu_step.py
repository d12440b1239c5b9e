"""GPU figures for one GRPO step on a random-init model of a real architecture (nothing downloaded).

    python bench/gpu_step.py [--arch qwen2.5-0.5b|llama-3.2-1b|smollm2-135m] [--micro-batch N] [--dry-run]
                             [--estimate-only] [--budget-gib G] [--smoke]

Self-checking, under 5 minutes on one GPU: after the component timings below it runs 3 real GRPO steps
through trainer.loop.train (what `rlvr train` runs) on a saved model folder of that shape with a KL
reference, asserts that the policy and the reference really sit on the GPU, and prints
``device= step_s= tokens_per_s= peak_mem_gb=`` as its last line.

Measures, on one CUDA device, in bf16 (fp32 on CPU):
  rollout   tokens/s of our ``hf`` engine (trainer.rollout.HFEngine) and of ``model.generate`` on
            the same batch (trainer.rollout.GenerateEngine): prompts × G rows, temperature 1;
  step      seconds per policy update on that batch, the trainer's single-pass GRPO update: forward +
            backward in micro-batches of ``--micro-batch`` rows (trainer.batch.forward: each prompt
            once, logits only where they predict a completion token), then clipping and AdamW; peak memory.
Before allocating anything it estimates the run's peak GPU memory on the ``meta`` device (no memory,
no compute: the update's saved activations measured as autograd saves them, plus weights, gradients,
Adam's moments and the rollout's KV cache) and refuses, saying what to lower, when that exceeds the
GPU's free memory (or ``--budget-gib``). ``--estimate-only`` prints the estimate and stops (any machine).
Without micro-batching the defaults needed ~300 GiB: full-vocabulary logits for 256 rows x 512 tokens.
Random weights rarely emit EOS, so rollouts run close to max_new_tokens: a worst case for length.
Prompts are arithmetic questions padded with few-shot turns to about ``--prompt-len`` tokens of the
bundled char-level tokenizer (its ids are valid in any larger vocabulary).
``--dry-run`` runs the same code on CPU with a 2-layer toy config and tiny shapes, in seconds, so
the script is known to start and finish where no GPU is around (a test runs it). ``--smoke`` is
``--dry-run`` (CI: tests/test_bench_smoke.py runs every bench's ``--smoke``): its figures are not measurements.
The last line holds the figures as key=value pairs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.batch import forward  # noqa: E402
from trainer.engines import GenerateEngine, HFEngine  # noqa: E402
from trainer.rollout import Rollout, SamplingParams, select  # noqa: E402

ARCHS = {  # public configs of released models (shapes only)
    "qwen2.5-0.5b": ("Qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                   num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                   max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True)),
    "llama-3.2-1b": ("Llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                   num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                   max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True)),
    "smollm2-135m": ("Llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                   max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True)),
    "toy": ("Llama", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          tie_word_embeddings=True)),
}


def build(arch: str, tok, device: str, dtype: torch.dtype):
    import transformers

    family, shape = ARCHS[arch]
    cfg = getattr(transformers, f"{family}Config")(**shape, pad_token_id=tok.pad_token_id,
                                                   eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, f"{family}ForCausalLM")(cfg)
    return model.to(dtype)


def make_prompts(n: int, prompt_len: int) -> list:
    from trainer.data import arithmetic_split

    train, held = arithmetic_split(400)
    shots, i = [], 0
    while sum(len(m["content"]) + 2 for m in shots) < prompt_len - 20:  # ~1 token per char + markers
        s = train[i % len(train)]
        shots += [{"role": "user", "content": s["prompt"]},
                  {"role": "assistant", "content": "\\boxed{" + str(s["reference"]) + "}"}]
        i += 1
    return [shots + [{"role": "user", "content": s["prompt"]}] for s in held[:n]]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_rollout(engine, prompts, g: int, params: SamplingParams, device: str, reps: int):
    engine.generate(prompts[:1], 2, SamplingParams(4))  # warm-up: kernels, allocator
    best, ro = float("inf"), None
    for _ in range(reps):
        torch.manual_seed(0)
        sync(device)
        t0 = time.perf_counter()
        ro = engine.generate(prompts, g, params)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return ro, ro.num_tokens / best, best


def update_step(model, opt, ro, device: str, micro: int) -> None:
    """The single-pass GRPO update as the trainer runs it: -(A * log p) token-mean over the whole batch,
    accumulated over micro-batches of ``micro`` rows, then clip and AdamW (random advantages)."""
    adv = torch.randn(ro.prompt_ids.shape[0], 1)
    n_tok = ro.completion_mask.sum().clamp(min=1).item()
    opt.zero_grad(set_to_none=True)
    for idx in torch.arange(ro.prompt_ids.shape[0]).split(micro):
        part = select(ro, idx)
        logp = forward(model, part, 1.0).logp
        mask = part.completion_mask.to(logp.device).float()
        (-(adv[idx].to(logp.device) * logp * mask).sum() / n_tok).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def estimate_gib(arch: str, dtype: torch.dtype, rows: int, group: int, prompt_len: int, new_tokens: int,
                 micro: int) -> dict[str, float]:
    """Peak GPU memory of this run, estimated on the ``meta`` device: weights + gradients + AdamW's two
    moments (all in the weights' dtype), plus the larger of (a) one micro-batch's update — the tensors
    autograd saves for its backward, counted as it saves them, and its largest one once more (its
    gradient, alive in the backward) — and (b) generation: the KV cache of every row at full length
    and one step's logits. Eager attention on meta (SDPA's mask check reads values): it saves the
    attention weights SDPA does not, so this errs high."""
    import transformers

    family, shape = ARCHS[arch]
    cfg = getattr(transformers, f"{family}Config")(**shape)
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = getattr(transformers, f"{family}ForCausalLM")(cfg).to(dtype)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    el = torch.empty((), dtype=dtype).element_size()
    m = min(micro, rows)  # rows of one micro-batch: m // group prompts (or one), each shared by its rows
    prompt = torch.arange(m)[:, None].div(group, rounding_mode="floor").add(1).repeat(1, prompt_len)
    ones = lambda n: torch.ones(m, n, dtype=torch.long)  # noqa: E731
    ro = Rollout(prompt, ones(prompt_len), torch.randint(1, shape["vocab_size"], (m, new_tokens)), ones(new_tokens),
                 [""] * m, torch.zeros(m, dtype=torch.bool))
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st._cdata] = st.nbytes()  # views share a storage: counted once
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward(model, ro, 1.0).logp.sum().backward()
    head = shape["hidden_size"] // shape["num_attention_heads"]
    kv = rows * (prompt_len + new_tokens) * shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head * el
    gib = {"static": 4 * n_params * el / 2**30, "update": (sum(saved.values()) + max(saved.values())) / 2**30,
           "generate": (kv + rows * shape["vocab_size"] * 4) / 2**30}
    gib["peak"] = gib["static"] + max(gib["update"], gib["generate"])
    return gib


def grpo_through_the_trainer(arch: str, device: str, dtype: str, steps: int, prompts: int, group: int,
                             max_new_tokens: int, work: Path, micro: int) -> dict:
    """Three real GRPO steps through trainer.loop.train (what `rlvr train` runs) on a model folder of
    ``arch``'s shape, with a KL reference loaded; asserts the policy and the reference sit on ``device``."""
    from trainer import loop
    from trainer.config import JobSpec
    from trainer.models.tiny_arith import build_tokenizer

    tok = build_tokenizer()
    folder = work / arch
    build(arch, tok, "cpu", getattr(torch, dtype)).save_pretrained(folder)
    tok.save_pretrained(folder)
    spec = JobSpec.model_validate({
        "model": {"path": str(folder), "dtype": dtype},
        "data": {"dataset": "builtin:arithmetic", "eval_size": prompts},
        "rollout": {"group_size": group, "max_new_tokens": max_new_tokens},
        "algo": {"kl_coef": 0.01, "micro_batch_size": micro}, "optim": {"lr": 1e-6},
        "train": {"steps": steps, "prompts_per_step": prompts, "eval_every": 0, "device": device}})
    placed, records = {}, []
    real_setup = loop.setup

    def check_placement(*a, **kw):
        run = real_setup(*a, **kw)
        placed["policy"] = {p.device.type for p in run.ctx.policy.parameters()}
        placed["ref"] = {p.device.type for p in run.ctx.ref.parameters()}
        return run

    loop.setup = check_placement
    try:
        loop.train(spec, work / "run", models_dir=work, log=lambda m: None,
                   on_step=lambda s, m: records.append(m) if s > 0 else None)
    finally:
        loop.setup = real_setup
    want = "cuda" if device == "cuda" else "cpu"
    assert placed == {"policy": {want}, "ref": {want}}, f"models not on {want}: {placed}"
    late = records[1:] or records  # the first step pays for allocation and kernel selection
    return {"step_s": sum(r["time/step_s"] for r in late) / len(late),
            "tokens_per_s": sum(r["tokens_per_s"] for r in late) / len(late),
            "peak_mem_gb": max((r.get("gpu/mem_peak_gb", float("nan")) for r in records), default=float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHS))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed update steps (after one warm-up)")
    ap.add_argument("--micro-batch", type=int, default=8, help="rows per forward/backward in the update")
    ap.add_argument("--budget-gib", type=float, default=None,
                    help="GPU memory the run may use (default: the GPU's free memory, less 5%%)")
    ap.add_argument("--estimate-only", action="store_true", help="print the memory estimate (any machine) and stop")
    ap.add_argument("--dry-run", action="store_true", help="CPU, toy config, tiny shapes: checks the script runs")
    ap.add_argument("--smoke", action="store_true", help="the same as --dry-run (every bench's CI flag)")
    args = ap.parse_args()
    args.dry_run = args.dry_run or args.smoke
    if args.dry_run:
        args.arch, args.prompts, args.group, args.prompt_len, args.max_new_tokens, args.steps = "toy", 2, 2, 48, 8, 1
        args.micro_batch = 3  # two micro-batches of uneven size: the accumulation path runs
    gpu = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if gpu else "cpu"
    if not gpu and not args.dry_run and not args.estimate_only:
        sys.exit("no CUDA device: run with --dry-run to check the script on CPU")
    dtype = torch.bfloat16 if gpu or args.estimate_only else torch.float32
    from trainer.models.tiny_arith import build_tokenizer
    from trainer.rollout import render_prompt

    tok = build_tokenizer()
    prompts = make_prompts(args.prompts, args.prompt_len)
    prompt_len = max(len(tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"]) for p in prompts)
    rows = args.prompts * args.group
    est = estimate_gib(args.arch, dtype, rows, args.group, prompt_len, args.max_new_tokens, args.micro_batch)
    budget = args.budget_gib
    if budget is None and gpu:
        budget = torch.cuda.mem_get_info()[0] / 2**30 * 0.95
    fits = budget is None or est["peak"] <= budget
    print(f"memory estimate: {est['peak']:.1f} GiB = weights, gradients and Adam {est['static']:.1f} + the larger of "
          f"one update micro-batch ({args.micro_batch} rows) {est['update']:.1f} and generation {est['generate']:.1f}"
          f"; budget {'none' if budget is None else f'{budget:.1f} GiB'}", flush=True)
    if args.estimate_only:
        print(f"arch={args.arch} rows={rows} seq={prompt_len + args.max_new_tokens} micro_batch={args.micro_batch} "
              f"estimate_gib={est['peak']:.2f} budget_gib={budget if budget is not None else 'none'} fits={int(fits)}")
        sys.exit(0 if fits else 2)
    if not fits:
        sys.exit(f"bench/gpu_step.py: {args.arch} with {rows} rows of ~{prompt_len} + {args.max_new_tokens} tokens "
                 f"needs about {est['peak']:.0f} GiB, more than the {budget:.0f} GiB available: lower --micro-batch "
                 f"(now {args.micro_batch}), --prompts x --group or --max-new-tokens. Nothing was allocated.")
    model = build(args.arch, tok, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    params = SamplingParams(args.max_new_tokens)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"{args.arch}: {n_params / 1e6:.0f}M params, {dtype}, {name}; {args.prompts} prompts x {args.group}, "
          f"~{args.prompt_len} prompt + {args.max_new_tokens} new tokens", flush=True)

    model.eval()
    ro, ours_tps, ours_s = time_rollout(HFEngine(model, tok), prompts, args.group, params, device, reps=2)
    print(f"rollout ours      {ours_tps:10.0f} tok/s  ({ro.num_tokens} tokens, {ours_s:.2f}s)", flush=True)
    _, gen_tps, gen_s = time_rollout(GenerateEngine(model, tok), prompts, args.group, params, device, reps=1)
    print(f"rollout generate  {gen_tps:10.0f} tok/s  ({gen_s:.2f}s)", flush=True)

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    update_step(model, opt, ro, device, args.micro_batch)  # warm-up (optimizer state allocation)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        update_step(model, opt, ro, device, args.micro_batch)
    sync(device)
    step_s = (time.perf_counter() - t0) / args.steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    seq = ro.prompt_ids.shape[1] + ro.completion_ids.shape[1]
    print(f"update step       {step_s:10.3f} s    ({ro.prompt_ids.shape[0]} x {seq} tokens, micro-batches of "
          f"{args.micro_batch}, peak {peak:.1f} GiB, estimated {est['peak']:.1f})")
    total = ours_s + step_s
    print(f"arch={args.arch} params_m={n_params / 1e6:.0f} device={name.replace(' ', '_')} dtype={str(dtype)[6:]} "
          f"rows={ro.prompt_ids.shape[0]} seq={seq} rollout_tok_s={ours_tps:.0f} generate_tok_s={gen_tps:.0f} "
          f"ours_vs_generate={ours_tps / gen_tps:.2f} update_step_s={step_s:.3f} rollout_s={ours_s:.2f} "
          f"grpo_step_s={total:.2f} peak_gib={peak:.1f} estimate_gib={est['peak']:.1f} dry_run={int(args.dry_run)}",
          flush=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
        g = grpo_through_the_trainer(args.arch, device, "bfloat16" if device == "cuda" else "float32", 3,
                                     min(args.prompts, 4), min(args.group, 8), min(args.max_new_tokens, 128),
                                     Path(tmp), args.micro_batch)
    print(f"device={name.replace(' ', '_')} step_s={g['step_s']:.3f} tokens_per_s={g['tokens_per_s']:.0f} "
          f"peak_mem_gb={g['peak_mem_gb']:.2f} arch={args.arch} policy_and_reference_on={device}")


if __name__ == "__main__":
    main()
