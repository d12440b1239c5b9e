"""GRPO with verifiable rewards, top to bottom.

What it is: for each prompt sample a group of G completions, score them with the job's verifiers,
and use the group as its own baseline: advantage = (r - mean_group) / (std_group + eps) (or no std,
Dr. GRPO). The policy update is PPO's clipped surrogate against the sampling policy (with one pass
per batch the ratio is 1 and this is REINFORCE with a group-mean baseline), plus an optional KL
penalty to a frozen reference model. Loss pieces are pure functions in ``trainer.algos``,
picked by name from the spec.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import algos, checkpoint
from .config import JobSpec
from .data import PromptStream, load_splits
from .rollout import ENGINES, Rollout, SamplingParams
from .scoring import Scorer

StepCallback = Callable[[int, dict[str, Any]], None]
StopCheck = Callable[[], str | None]  # returns "pause" / "cancel" to stop early, else None


@dataclass
class RunResult:
    status: str  # succeeded | paused | cancelled
    step: int
    accuracy_before: float | None
    accuracy_after: float | None
    run_dir: str
    checkpoint: str | None


class ModelPathError(ValueError):
    pass


def resolve_model_path(path: str, models_dir: Path, log=print) -> Path:
    if path == "builtin:tiny-arith":
        from .tiny_model import ensure_tiny_model

        return ensure_tiny_model(models_dir, log=log)
    if path.startswith("builtin:"):
        raise ModelPathError(f"unknown built-in model {path!r}; known: builtin:tiny-arith")
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ModelPathError(f"model.path {path!r} is not an HF checkpoint directory (no config.json)")
    return p


def sequence_logprobs(model, ro: Rollout, temperature: float, with_entropy: bool = False):
    """log p of each completion token under ``model``: (N, T), and optionally token entropies."""
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], dim=1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at each prompt's 1st token
    P = ro.prompt_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : -1]
    logits = logits.float() / temperature
    logp = algos.token_logprobs(logits, ro.completion_ids)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        lp_all = torch.log_softmax(logits, -1)
        entropy = -(lp_all.exp() * lp_all).sum(-1)
    return logp, entropy


def _select(ro: Rollout, idx: torch.Tensor) -> Rollout:
    return Rollout(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx],
                   ro.completion_mask[idx], [ro.texts[i] for i in idx.tolist()], ro.truncated[idx])


def evaluate(engine, scorer: Scorer, samples, max_new_tokens: int, batch: int = 256) -> dict[str, float]:
    """Greedy pass@1 on held-out samples: accuracy (primary verifier `correct`) and mean reward."""
    correct, reward = [], []
    for i in range(0, len(samples), batch):
        chunk = samples[i : i + batch]
        ro = engine.generate([s["prompt"] for s in chunk], 1, SamplingParams(max_new_tokens, greedy=True))
        sc = scorer(ro.texts, [s["reference"] for s in chunk])
        correct += sc.correct
        reward += sc.rewards
    return {"eval/accuracy": sum(correct) / len(correct), "eval/reward": sum(reward) / len(reward)}


def train(
    spec: JobSpec,
    run_dir: str | Path,
    *,
    models_dir: str | Path,
    on_step: StepCallback | None = None,
    should_stop: StopCheck | None = None,
    on_rollouts: Callable[[int, list[dict[str, Any]]], None] | None = None,
    rollout_sample_groups: int = 2,
    log: Callable[[str], None] = print,
) -> RunResult:
    # ------------------------------------------------------------------ setup
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars flood worker logs

    run_dir, ckpt_root = Path(run_dir), Path(run_dir) / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    tc, ro_cfg, ac = spec.train, spec.rollout, spec.algo
    if tc.threads:
        torch.set_num_threads(tc.threads)
    random.seed(tc.seed)
    torch.manual_seed(tc.seed)

    model_dir = resolve_model_path(spec.model.path, Path(models_dir), log=log)
    resume_from = checkpoint.latest(ckpt_root)
    load_dir = resume_from or model_dir
    dtype = getattr(torch, spec.model.dtype)
    tok = AutoTokenizer.from_pretrained(load_dir)
    policy = AutoModelForCausalLM.from_pretrained(load_dir, dtype=dtype)
    ref = None
    if ac.kl_coef > 0:  # the reference is the job's starting model, never a later checkpoint
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval().requires_grad_(False)
    engine = ENGINES[ro_cfg.engine](policy, tok)
    scorer = Scorer(spec.verifiers)
    train_set, eval_set = load_splits(spec.data.dataset, spec.data.eval_dataset, spec.data.eval_size)
    stream = PromptStream(train_set, seed=tc.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.optim.lr, weight_decay=spec.optim.weight_decay)
    warm = spec.optim.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)

    start, acc_before = 0, None
    if resume_from is not None:
        state = checkpoint.load_state(resume_from)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        stream.position, start, acc_before = state["data_position"], state["step"], state.get("accuracy_before")
        log(f"resumed from {resume_from.name} (step {start}, data position {stream.position})")

    metrics_file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8")

    def emit(step: int, m: dict[str, Any]) -> None:
        metrics_file.write(json.dumps({"step": step, **m}) + "\n")
        metrics_file.flush()
        if on_step:
            on_step(step, m)

    def save(step: int) -> Path:
        return checkpoint.save(ckpt_root, step, policy, tok, {
            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "data_position": stream.position, "accuracy_before": acc_before,
        })

    if start == 0:
        ev = evaluate(engine, scorer, eval_set, ro_cfg.max_new_tokens)
        acc_before = ev["eval/accuracy"]
        emit(0, ev)
        log(f"step 0: held-out accuracy {acc_before:.3f}")

    G = ro_cfg.group_size
    sampling = SamplingParams(ro_cfg.max_new_tokens, ro_cfg.temperature, ro_cfg.top_p)
    policy_loss, agg = algos.POLICY_LOSSES[ac.policy_loss], algos.LOSS_AGG[ac.loss_agg]
    advantage_fn, kl_fn = algos.ADVANTAGES[ac.advantage], algos.KL_ESTIMATORS[ac.kl_estimator]
    step, last_ckpt = start, None
    for step in range(start + 1, tc.steps + 1):
        # -------------------------------------------------------------- rollout
        t0 = time.perf_counter()
        batch = stream.next_batch(tc.prompts_per_step)
        ro = engine.generate([s["prompt"] for s in batch], G, sampling)
        t1 = time.perf_counter()
        # -------------------------------------------------------------- score
        refs = [s["reference"] for s in batch for _ in range(G)]
        sc = scorer(ro.texts, refs)
        rewards = torch.tensor(sc.rewards, dtype=torch.float32)
        adv = advantage_fn(rewards, G)
        t2 = time.perf_counter()
        if on_rollouts:  # a few whole groups, for people to read what the model wrote and how it was judged
            on_rollouts(step, [{
                "prompt": s["prompt"], "reference": s["reference"],
                "completions": [{"text": ro.texts[g * G + j], "reward": sc.rewards[g * G + j],
                                 "verdicts": {n: sc.verdicts[n][g * G + j].to_dict() for n in sc.verdicts}}
                                for j in range(G)],
            } for g, s in enumerate(batch[:rollout_sample_groups])])
        # -------------------------------------------------------------- update
        policy.train()
        N = rewards.numel()
        mb = ac.minibatch_size or N
        multi_pass = ac.ppo_epochs > 1 or mb < N
        with torch.no_grad():
            old_logp = sequence_logprobs(policy, ro, ro_cfg.temperature)[0] if multi_pass else None
            ref_logp = sequence_logprobs(ref, ro, ro_cfg.temperature)[0] if ref is not None else None
        stats: dict[str, list[float]] = {"loss": [], "kl": [], "clip_frac": [], "entropy": [], "grad_norm": []}
        for _epoch in range(ac.ppo_epochs):
            perm = torch.randperm(N) if multi_pass else torch.arange(N)
            for i in range(0, N, mb):
                idx = perm[i : i + mb]
                part = _select(ro, idx)
                mask = part.completion_mask.float()
                logp, ent = sequence_logprobs(policy, part, ro_cfg.temperature, with_entropy=True)
                old = old_logp[idx] if old_logp is not None else logp.detach()
                pg, clipped = policy_loss(logp, old, adv[idx], ac.clip_eps_low, ac.clip_eps_high)
                n_tok, n_seq, T = int(mask.sum()), len(idx), mask.shape[1]
                loss = agg(pg, mask, n_tok, n_seq, T)
                if ref_logp is not None:
                    kl = kl_fn(logp, ref_logp[idx])
                    loss = loss + ac.kl_coef * agg(kl, mask, n_tok, n_seq, T)
                    stats["kl"].append(float(algos.agg_token_mean(kl.detach(), mask, n_tok, 0, 0)))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), spec.optim.max_grad_norm)
                opt.step()
                stats["loss"].append(loss.item())
                stats["grad_norm"].append(float(gn))
                stats["clip_frac"].append(float(algos.agg_token_mean(clipped, mask, n_tok, 0, 0)))
                stats["entropy"].append(float(algos.agg_token_mean(ent, mask, n_tok, 0, 0)))
        sched.step()
        t3 = time.perf_counter()
        # -------------------------------------------------------------- metrics
        lengths = ro.completion_mask.sum(1).float()
        r_groups = rewards.view(-1, G)
        m: dict[str, Any] = {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if N > 1 else 0.0,
            "accuracy": sum(sc.correct) / N,
            "adv/mean": adv.mean().item(), "adv/std": adv.std().item(), "adv/max_abs": adv.abs().max().item(),
            "zero_std_group_frac": (r_groups.std(1) < 1e-8).float().mean().item(),
            "completion/len_mean": lengths.mean().item(), "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": ro.truncated.float().mean().item(),
            "tokens_per_s": ro.num_tokens / max(t3 - t0, 1e-9),
            "time/rollout_s": t1 - t0, "time/score_s": t2 - t1, "time/update_s": t3 - t2, "time/step_s": t3 - t0,
            "lr": sched.get_last_lr()[0], "data_position": stream.position,
        }
        m.update({k: sum(v) / len(v) for k, v in stats.items() if v})
        for name, scores in sc.per_verifier.items():
            m[f"verifier/{name}/mean"] = sum(scores) / N
            for status, count in sc.statuses[name].items():
                m[f"verifier/{name}/{status}_frac"] = count / N
        if not math.isfinite(m["loss"]):
            raise FloatingPointError(f"loss became {m['loss']} at step {step}")
        # -------------------------------------------------------------- eval / checkpoint / stop
        if (tc.eval_every and step % tc.eval_every == 0) or step == tc.steps:
            m.update(evaluate(engine, scorer, eval_set, ro_cfg.max_new_tokens))
        stop = should_stop() if should_stop else None
        if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == tc.steps or stop:
            last_ckpt = save(step)
            m["checkpoint"] = last_ckpt.name
        emit(step, m)
        if stop:
            metrics_file.close()
            return RunResult("paused" if stop == "pause" else "cancelled", step, acc_before,
                             None, str(run_dir), str(last_ckpt))
    metrics_file.close()
    acc_after = _last_eval(run_dir)
    return RunResult("succeeded", step, acc_before, acc_after, str(run_dir), str(last_ckpt) if last_ckpt else None)


def _last_eval(run_dir: Path) -> float | None:
    acc = None
    with (run_dir / "metrics.jsonl").open(encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            acc = rec.get("eval/accuracy", acc)
    return acc
