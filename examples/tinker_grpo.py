"""GRPO written client-side with the official Tinker SDK against `rlvr serve` (+ `rlvr worker`): sample a
group per prompt, score it with rlvr's math verifier over HTTP, turn rewards into group-relative
advantages, and train with the `importance_sampling` loss. Held-out greedy accuracy before and after;
the last line is JSON.   python examples/tinker_grpo.py --api-key rlvr_… [--base-url http://127.0.0.1:8000]
"""
import argparse
import json
import random

import httpx
import numpy as np
import tinker
from tinker import types
from transformers import AutoTokenizer

from trainer.data import arithmetic_split
from trainer.models.resolve import resolve_model  # the tiny model ships with rlvr: its tokenizer and its problems

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8000")
ap.add_argument("--api-key", default="rlvr_local")  # any key works with auth off
ap.add_argument("--models", default="~/.rlvr/models")
ap.add_argument("--steps", type=int, default=150)
ap.add_argument("--prompts", type=int, default=16)
ap.add_argument("--group", type=int, default=16)
ap.add_argument("--lr", type=float, default=5e-5)
ap.add_argument("--eval", type=int, default=400)
args = ap.parse_args()
tok = AutoTokenizer.from_pretrained(resolve_model("builtin:tiny-arith",
                                                  __import__("pathlib").Path(args.models).expanduser()))
train, held = arithmetic_split(args.eval)
http = httpx.Client(base_url=args.base_url, headers={"Authorization": f"Bearer {args.api_key}"}, timeout=120)


def ids(question):
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def score(texts, refs):  # rlvr's math verifier over HTTP, 32 completions per call
    out = []
    for i in range(0, len(texts), 32):
        items = [{"completion": t, "reference": r} for t, r in zip(texts[i:i + 32], refs[i:i + 32])]
        r = http.post("/v1/verifiers/math/run", json={"items": items, "config": {"allow_unevaluated": False}})
        out += [x["score"] for x in r.raise_for_status().json()["results"]]
    return np.array(out)


def sample(sampler, questions, n, temperature):  # all queued at once: the server runs them as one batch
    futures = [sampler.sample(types.ModelInput.from_ints(ids(q)), n, types.SamplingParams(
        max_tokens=12, temperature=temperature)) for q in questions]
    return [f.result().sequences for f in futures]


def accuracy(sampler):
    seqs = sample(sampler, [s["prompt"] for s in held], 1, 0.0)  # greedy
    return float(score([tok.decode(g[0].tokens, skip_special_tokens=True) for g in seqs],
                       [s["reference"] for s in held]).mean())


service = tinker.ServiceClient(base_url=args.base_url, api_key="tml-" + args.api_key)
training = service.create_lora_training_client(base_model="builtin:tiny-arith", rank=0).result()  # rank 0: all weights
before, rng = accuracy(training.save_weights_and_get_sampling_client().result()), random.Random(0)
for step in range(1, args.steps + 1):
    batch = rng.sample(train, args.prompts)
    groups = sample(training.save_weights_and_get_sampling_client().result(), [s["prompt"] for s in batch],
                    args.group, 1.0)
    texts = [tok.decode(q.tokens, skip_special_tokens=True) for g in groups for q in g]
    r = score(texts, [s["reference"] for s in batch for _ in range(args.group)]).reshape(len(batch), args.group)
    adv = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)  # GRPO: the group is the baseline
    n_tok, data = sum(len(q.tokens) for g in groups for q in g), []
    for s, g, a in zip(batch, groups, adv):
        p = ids(s["prompt"])
        for q, ai in ((q, ai) for q, ai in zip(g, a) if ai != 0):  # zero advantage: no gradient, skip the row
            full, pad = p + list(q.tokens), [0.0] * (len(p) - 1)
            data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
                "target_tokens": full[1:], "logprobs": pad + list(q.logprobs),  # the sampler's log-probs
                "advantages": pad + [ai / n_tok] * len(q.tokens)}))           # token-mean, as our GRPO jobs
    if data:
        training.forward_backward(data, "importance_sampling")
        training.optim_step(types.AdamParams(learning_rate=args.lr, beta2=0.999, eps=1e-8, grad_clip_norm=1.0)).result()
    print(json.dumps({"step": step, "reward": round(float(r.mean()), 4)}), flush=True)
after = accuracy(training.save_weights_and_get_sampling_client().result())
service.close("success").result()
print(json.dumps({"accuracy_before": before, "accuracy_after": after, "steps": args.steps}))
