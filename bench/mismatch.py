"""How far the sampler's distribution is from the one the trainer optimises: bf16 sampling and top-p (issue 27).

Two sources of sampler–trainer mismatch, measured on the real-math recipe's prompts (SmolLM2-135M-Instruct by
default; 4 prompts x G, temperature 1, the recipe's completion cap), each against the trainer's fp32
recomputation of the same tokens (trainer.batch.forward: what the loss uses):

- **bf16 sampling** (vLLM's dtype on a GPU): the sampler runs a bf16 copy of the policy and reports its own
  log-probs; per sampled token, |log p_engine - log p_trainer|, and the importance weight p_trainer / p_engine
  that TIS (``algo.tis_cap``, default 2 with vLLM) would apply: its mean, spread and the share it caps. fp32
  sampling is the peer in the same run (the gap there is kernel rounding only). Also the trainer in bf16
  autocast (``train.precision: bf16``) against the same fp32 reference.
- **top-p** (``rollout.top_p`` < 1): the engine samples from the nucleus renormalised, q = p / Z on the kept
  tokens, while every log-prob it returns and the trainer recomputes is log p, uncut (trainer/rollout.py). The
  true importance weight of a sampled token is p / q = Z, never corrected; per token, -log Z is the
  token's contribution to KL(q || p), reported as its mean (the per-token KL of the distribution actually
  sampled from the one trained), with the share of tokens whose Z < 0.9 and the per-sequence prod Z.

On a CPU the bf16 kernels are not a GPU's: the bf16 figures give the size of the effect (bf16 keeps 8 bits of
mantissa everywhere), not a GPU's exact numbers; bench/gpu_check.sh measures vLLM's on a GPU.

    python bench/mismatch.py                  # SmolLM2-135M (rlvr models pull smollm2-135m), ~3 minutes
    python bench/mismatch.py --quick          # the same; --quick is the default size already (< 5 min)
    python bench/mismatch.py --smoke          # the bundled tiny model, seconds

Last line: ``bf16_logp_absdiff_mean= bf16_tis_capped_frac= fp32_logp_absdiff_mean= top_p_0.9_kl_per_token=
...`` (the figures of each arm, key=value).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainer.batch import forward  # noqa: E402
from trainer.engines import ENGINES  # noqa: E402
from trainer.rollout import SamplingParams  # noqa: E402


def gap_stats(engine_lp: torch.Tensor, trainer_lp: torch.Tensor, mask: torch.Tensor, cap: float) -> dict:
    """Per sampled token: |engine - trainer| log-prob (mean, p99, max) and the TIS weight p_trainer / p_engine."""
    m = mask.bool()
    d = (trainer_lp - engine_lp)[m].double()
    w = d.exp()
    return {"logp_absdiff_mean": d.abs().mean().item(), "logp_absdiff_p99": d.abs().quantile(0.99).item(),
            "logp_absdiff_max": d.abs().max().item(), "is_weight_mean": w.mean().item(),
            "is_weight_min": w.min().item(), "is_weight_max": w.max().item(),
            "tis_capped_frac": (w > cap).double().mean().item(), "tokens": int(m.sum())}


def nucleus_mass(model, ro, top_p: float) -> torch.Tensor:
    """(N, T) Z: the probability mass of the nucleus each sampled token was drawn from (T = 1)."""
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    P, T = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    probs = logits[:, P - 1:P - 1 + T].float().softmax(-1)
    sp, _ = probs.sort(-1, descending=True)
    cum = sp.cumsum(-1)
    # the filter keeps the sorted tokens whose preceding mass is < top_p (trainer.rollout.top_p_filter:
    # it drops those with cum <= 1 - top_p counted from the bottom): Z = mass of the kept ones
    keep = (cum - sp) < top_p
    return (sp * keep).sum(-1)


def topp_stats(z: torch.Tensor, mask: torch.Tensor) -> dict:
    m = mask.bool()
    nlz = -z.clamp_min(1e-30).log()
    per_seq = (nlz * mask).sum(1)
    return {"kl_per_token": nlz[m].mean().item(), "z_mean": z[m].mean().item(), "z_min": z[m].min().item(),
            "z_below_0.9_frac": (z[m] < 0.9).double().mean().item(),
            "seq_weight_mean": (-per_seq).exp().mean().item(), "seq_weight_min": (-per_seq).exp().min().item()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--top-p", default="0.95,0.9,0.8")
    ap.add_argument("--seeds", type=int, default=3, help="batches (each its own seed and prompts)")
    ap.add_argument("--tis-cap", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="the default size (< 5 minutes)")
    ap.add_argument("--smoke", action="store_true", help="the bundled tiny model, one batch, seconds")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.seeds, a.max_new = "builtin:tiny-arith", 1, 8
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from service.cli.recipes import REAL, recipe
    from trainer.config import JobSpec
    from trainer.models.resolve import resolve_model
    from trainer.splits import load_splits

    models = Path(os.environ.get("RLVR_MODELS", Path.home() / ".rlvr" / "models"))
    if a.model.startswith("builtin:") and (REPO / ".cache" / "models").exists():
        models = REPO / ".cache" / "models"
    mdir = resolve_model(a.model, models, log=lambda m: None)
    spec_d = recipe("demo-math" if a.smoke else REAL["math"])
    spec = JobSpec.model_validate({**spec_d, "model": {"path": str(mdir)}})
    train_set, _ = load_splits(spec.data)
    tok = AutoTokenizer.from_pretrained(mdir)
    fp32 = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.bfloat16).eval()
    arms: dict[str, list[dict]] = {}
    for seed in range(a.seeds):
        batch = train_set[seed * a.prompts:(seed + 1) * a.prompts]
        prompts = [s["prompt"] for s in batch]  # formatted as the job formats them (load_splits)
        params = SamplingParams(a.max_new, 1.0)
        for name, model in (("fp32", fp32), ("bf16", bf16)):
            torch.manual_seed(seed)
            ro = ENGINES["hf"](model, tok).generate(prompts, a.group_size, params)
            with torch.no_grad():
                ref = forward(fp32, ro, 1.0).logp
            arms.setdefault(name, []).append(gap_stats(ro.logprobs, ref, ro.completion_mask, a.tis_cap))
            if name == "fp32":  # the trainer in bf16 autocast against its fp32 self, on the same tokens
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    auto = forward(fp32, ro, 1.0).logp.float()
                arms.setdefault("trainer_autocast", []).append(gap_stats(auto, ref, ro.completion_mask, a.tis_cap))
        for p in (float(x) for x in a.top_p.split(",")):
            torch.manual_seed(seed)
            ro = ENGINES["hf"](fp32, tok).generate(prompts, a.group_size, SamplingParams(a.max_new, 1.0, p))
            arms.setdefault(f"top_p_{p:g}", []).append(topp_stats(nucleus_mass(fp32, ro, p), ro.completion_mask))
    out = {}
    for name, rows in arms.items():
        keys = rows[0].keys()
        agg = {k: (max if k.endswith(("_max", "p99")) else min if k.endswith("_min") else
                   (lambda xs: sum(xs) / len(xs)))([r[k] for r in rows]) for k in keys}
        if "tokens" in agg:
            agg["tokens"] = sum(r["tokens"] for r in rows)
        print(f"{name:18s} " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in agg.items()), flush=True)
        out[name] = agg
    eps = {"fp32": torch.finfo(torch.float32).eps, "bf16": torch.finfo(torch.bfloat16).eps}
    print(f"(dtype eps: fp32 {eps['fp32']:.2g}, bf16 {eps['bf16']:.2g}; {a.seeds} batches of {a.prompts} x "
          f"{a.group_size}, {a.max_new} new tokens, model {a.model}, {a.threads} thread(s))", flush=True)
    pick = {"bf16": ("logp_absdiff_mean", "logp_absdiff_max", "is_weight_mean", "tis_capped_frac"),
            "fp32": ("logp_absdiff_mean", "logp_absdiff_max"), "trainer_autocast": ("logp_absdiff_mean",)}
    last = [f"{arm}_{k}={out[arm][k]:.3g}" for arm, ks in pick.items() for k in ks]
    last += [f"{arm}_{k}={out[arm][k]:.3g}" for arm in out if arm.startswith("top_p")
             for k in ("kl_per_token", "z_below_0.9_frac", "seq_weight_mean")]
    print(" ".join(last) + f" model={a.model} seeds={a.seeds}")
    return 0 if all(math.isfinite(v) for r in out.values() for v in r.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
