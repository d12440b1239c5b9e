"""Held-out evaluation: greedy pass@1, pass@k, the strict accuracy beside the reward's own, per-problem records.

``eval/accuracy`` is what the job's own verifiers call correct; ``eval/strict_accuracy`` is what the task's
declared verifiers call correct (trainer.tasks: e.g. arithmetic must be stated, not echoed — a job may
loosen its reward, never its yardstick; for a dataset file the job's first verifier with the math checker's
``allow_unevaluated`` off). Each problem's outcome and completion are returned as records, so two runs can
be compared problem by problem (paired tests) and a reward hack audited after the fact.

:class:`Drift` measures how far the policy has moved from the starting one when no reference is loaded:
KL(pi_0 || pi_t) on a fixed probe of completions pi_0 sampled, one forward every eval.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import torch

from verifiers.spec import VerifierSpec

from . import distributed
from .config import JobSpec
from .engines import join
from .rollout import SamplingParams, select
from .scoring import Scorer


def strict_verifiers(spec: JobSpec) -> list[VerifierSpec]:
    """What the held-out problems must be judged with, whatever the job rewards: the eval task's declared
    verifiers (a built-in task; where the job uses the same verifier, its own settings such as time limits
    stay and the task's declared ones win), else the job's first verifier with unevaluated arithmetic refused."""
    from .tasks import task_for

    task = task_for(spec.data.eval_dataset or spec.data.dataset)
    if task is not None and task.verifiers:
        mine = {v.name: v.config for v in reversed(spec.verifiers)}  # the first use of a name wins
        return [VerifierSpec(name=v["name"], config={**mine.get(v["name"], {}), **v.get("config", {})})
                for v in task.verifiers]
    first = spec.verifiers[0]
    if first.name == "math":
        return [first.model_copy(update={"config": {**first.config, "allow_unevaluated": False}, "weight": 1.0})]
    return [first]


def loosened(spec: JobSpec) -> list[str]:
    """Warnings for a job whose reward is looser than its task's declared judge (the reward can be gamed)."""
    from .tasks import task_for

    task = task_for(spec.data.dataset)
    if task is None:
        return []
    strict = {v["name"]: v.get("config", {}) for v in task.verifiers}
    out = []
    for v in spec.verifiers:
        want = strict.get(v.name)
        if want is None:
            continue
        from verifiers.registry import verifier_class

        cls = verifier_class(v.name)
        mine, theirs = cls.Config(**v.config), cls.Config(**want)  # defaults filled in on both sides
        looser = [k for k, x in theirs.model_dump().items() if x is False and getattr(mine, k) is True]
        if looser:
            out.append(f"verifier {v.name!r} sets {', '.join(f'{k}: true' for k in looser)} on {spec.data.dataset}, "
                       f"which its task judges with {', '.join(f'{k}: false' for k in looser)}: a policy can earn "
                       "this reward without solving the problem (e.g. by echoing the question); the held-out eval "
                       "reports eval/strict_accuracy beside eval/accuracy")
    return out


def evaluate(engine, scorer: Scorer, samples, max_new_tokens: int, dist: distributed.Dist | None = None,
             batch: int = 256, n_samples: int = 0, temperature: float = 1.0, top_p: float = 1.0,
             stop: Sequence[str] = (), strict: Scorer | None = None,
             records: list[dict[str, Any]] | None = None, play=None, prefix: str = "eval/") -> dict[str, float]:
    """Held-out metrics: greedy pass@1 (``eval/accuracy``: the primary verifier said `correct`), mean
    reward, completion lengths; with ``strict``, ``eval/strict_accuracy`` by that scorer; with ``n_samples``
    >= 2 also pass@1 and pass@k (k = 2, 4, …) from that many samples per problem (the unbiased estimator of
    Chen et al. 2021). Per task too when the held-out set mixes tasks (samples carrying ``task``). With
    ``records``, one record per problem is appended (every rank's, in the held-out set's order). ``play``
    (an :class:`Episodes`): each problem is an episode with the tool, judged on what the model wrote."""
    dist = dist or distributed.Dist()
    mine = list(range(len(samples)))[dist.rank :: dist.world]
    rows = []
    step = max(1, batch // n_samples) if n_samples >= 2 else batch  # sampled generations per chunk <= batch
    # every rank makes as many generate calls as the rank with the largest slice (FSDP all-gathers the
    # policy's shards in each call): a rank past the end of its own slice joins the others' calls
    for i in range(0, -(-len(samples) // dist.world), step):
        chunk = [samples[k] for k in mine[i : i + step]]
        if not chunk:
            for _ in range(2 if n_samples >= 2 else 1):
                join(engine)
            continue
        prompts, refs = [s["prompt"] for s in chunk], [s["reference"] for s in chunk]
        sample = play.sample if play is not None else _single_turn
        texts, lens, truncated, extra = sample(engine, prompts, 1, SamplingParams(max_new_tokens, greedy=True,
                                                                                   stop=tuple(stop)), refs)
        sc = scorer(texts, refs)
        if extra and "env_reward" in extra[0]:  # an HTTP environment's own reward (episodes.env reward: env)
            from .scoring import Scores

            env_r = [float(x.pop("env_reward") or 0.0) for x in extra]
            sc = Scores(env_r, [r > 0 for r in env_r], {"env": env_r})
        if extra and "first_completion" in extra[0]:  # code repair: the first attempt, judged like the last
            for x, ok in zip(extra, scorer([x["first_completion"] for x in extra], refs).correct):
                x["first_correct"] = bool(ok)
        st = strict(texts, refs) if strict is not None else sc
        hits, lost = [0] * len(chunk), [0] * len(chunk)
        if n_samples >= 2:
            many, _, _, more = sample(engine, prompts, n_samples,
                                      SamplingParams(max_new_tokens, temperature, top_p, stop=tuple(stop)), refs)
            if more and "env_reward" in more[0]:  # judged as the greedy answer is: by the environment's reward
                ok = [float(x.get("env_reward") or 0.0) > 0 and not x.get("excluded") for x in more]
                infra = [bool(x.get("excluded")) for x in more]  # an infra_error counts as a miss, and is counted
            else:
                ok = scorer(many, [r for r in refs for _ in range(n_samples)]).correct
                infra = [False] * len(many)
            hits = [sum(ok[j * n_samples:(j + 1) * n_samples]) for j in range(len(chunk))]
            lost = [sum(infra[j * n_samples:(j + 1) * n_samples]) for j in range(len(chunk))]
        rows += [{"index": mine[i + j], "id": s.get("id"), "task": s.get("task", ""), "prompt": s["prompt"],
                  "reference": s["reference"], "completion": texts[j], "correct": bool(sc.correct[j]),
                  "strict_correct": bool(st.correct[j]), "reward": float(sc.rewards[j]),
                  "verdicts": {n: v[j].to_dict() for n, v in sc.verdicts.items()},
                  "strict_verdicts": {n: v[j].to_dict() for n, v in st.verdicts.items()},
                  "length": int(lens[j]), "truncated": bool(truncated[j]),
                  **extra[j], **({"samples": n_samples, "samples_correct": hits[j]} if n_samples >= 2 else {}),
                  **({"samples_excluded": lost[j]} if lost[j] else {})}
                 for j, s in enumerate(chunk)]
    rows = sorted((r for part in dist.gather(rows) for r in part), key=lambda r: r["index"])
    out = _eval_metrics(prefix, rows, n_samples)
    if play is not None:
        out[prefix + "tool_calls"] = sum(r["tool_calls"] for r in rows) / len(rows)
    if rows and "first_correct" in rows[0]:  # code repair: first attempt, and how many failures were fixed
        failed = [r for r in rows if not r["first_correct"]]
        out[prefix + "first_accuracy"] = sum(r["first_correct"] for r in rows) / len(rows)
        out[prefix + "fix_rate"] = sum(r["correct"] for r in failed) / len(failed) if failed else 0.0
    tasks = sorted({r["task"] for r in rows})
    if len(tasks) > 1:
        for t in tasks:
            out.update(_eval_metrics(f"{prefix}{t}/", [r for r in rows if r["task"] == t], n_samples))
    if records is not None:
        records.extend(rows)
    return out


def _single_turn(engine, prompts, n, params, refs=None) -> tuple[list[str], list[int], list[bool], list[dict]]:
    ro = engine.generate(prompts, n, params)
    return ro.texts, ro.completion_mask.sum(1).tolist(), ro.truncated.tolist(), [{} for _ in ro.texts]


class Episodes:
    """Held-out problems played as episodes with the job's tool (spec.episodes): the verifiers judge what
    the model wrote; each record carries the episode's turns."""

    def __init__(self, tok, cfg, tools):
        self.tok, self.cfg, self.tools = tok, cfg, tools

    def sample(self, engine, prompts, n, params, refs=None) -> tuple[list[str], list[int], list[bool], list[dict]]:
        from . import episodes

        eps, _ = episodes.run(engine, self.tok, prompts, n, params, self.cfg, self.tools, references=refs)
        extra = [{"tool_calls": e.tool_calls, "finish": e.finish, "turns": episodes.turns_for_people(e),
                  **({"first_completion": e.first_text()} if e.final_only else {}),
                  **({"env_reward": e.reward, "excluded": e.excluded} if getattr(self.tools.env, "rewards", False)
                     else {})} for e in eps]
        return ([e.model_text() for e in eps], [e.tokens() for e in eps], [e.finish in episodes.TRUNCATED for e in eps],
                extra)


def _eval_metrics(prefix: str, rows: list[dict], n_samples: int) -> dict[str, float]:
    n = len(rows)
    out = {prefix + "accuracy": sum(r["correct"] for r in rows) / n,
           prefix + "strict_accuracy": sum(r["strict_correct"] for r in rows) / n,
           prefix + "reward": sum(r["reward"] for r in rows) / n,
           prefix + "len_mean": sum(r["length"] for r in rows) / n,
           prefix + "truncated_frac": sum(r["truncated"] for r in rows) / n}
    k = 1
    while n_samples >= 2 and k <= n_samples:
        out[f"{prefix}pass@{k}"] = sum(pass_at_k(n_samples, r["samples_correct"], k) for r in rows) / n
        k *= 2
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n samples, c of them correct, is correct)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class Drift:
    """KL(pi_0 || pi_t) of the current policy from the starting one, on a fixed probe: completions the
    starting policy sampled for the first ``rows`` held-out prompts (at the rollout temperature), with
    their log-probs under it. Unbiased under pi_0's own samples (k3 of the ratio pi_t / pi_0), one forward of
    ``rows`` sequences per measurement; the probe is kept in the run dir, so a resumed run measures from the
    same start."""

    def __init__(self, path: Path, rows: int = 32):
        self.path, self.rows, self.probe = path, rows, None
        if path.exists():
            self.probe = torch.load(path, map_location="cpu", weights_only=False)

    def start(self, engine, policy, samples, spec: JobSpec) -> None:
        from .batch import forward

        if self.probe is not None or not samples:
            return
        ro_cfg = spec.rollout
        ro = engine.generate([s["prompt"] for s in samples[: self.rows]], 1,
                             SamplingParams(ro_cfg.max_new_tokens, ro_cfg.temperature, ro_cfg.top_p,
                                            stop=tuple(ro_cfg.stop)))
        with torch.no_grad():
            logp = forward(policy, ro, ro_cfg.temperature, entropy=False).logp.float().cpu()
        self.probe = {"rollout": select(ro, list(range(len(ro.texts)))), "logp": logp}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.probe, self.path)

    def measure(self, policy, temperature: float) -> dict[str, float]:
        from .batch import forward

        if self.probe is None:
            return {}
        ro, logp0 = self.probe["rollout"], self.probe["logp"]
        with torch.no_grad():
            logp = forward(policy, ro, temperature, entropy=False).logp.float().cpu()
        m = ro.completion_mask.bool()
        log_r = (logp - logp0)[m]
        return {"eval/drift_kl_from_start": float((log_r.exp() - 1 - log_r).mean())}
