"""A stand-in for vLLM's offline API (``vllm.LLM``), for testing trainer.engines.vllm where vLLM is not
installed (tests/test_vllm_engine.py; the real engine runs in `make test-vllm`). Put on ``sys.path`` by
the ``fake_vllm`` fixture (tests/conftest.py).

It records what the engine asks of it, in order, in ``CALLS`` (and every engine built in ``INSTANCES``),
and behaves as vLLM 0.33 does where the engine depends on it (file:line of the vLLM source in brackets):
- the constructor takes only EngineArgs' fields (``EngineArgs(**kwargs)`` raises on others);
- it seeds random, numpy and torch with its seed, as the worker's ``set_random_seed`` does
  (v1/worker/gpu_worker.py:517);
- on CUDA it takes logical GPU ``device_ids[0]``, or GPU 0 without ``device_ids``, and makes it the
  process's current device (gpu_worker.py:454-496; ``IGNORE_DEVICE_IDS`` makes it ignore them);
- ``collective_rpc("reload_weights", kwargs=...)`` copies each pushed tensor into its own weights with
  ``param.data.copy_`` as vLLM's default_weight_loader does (model_loader/weight_utils.py:1536), so a
  DTensor shard fails here as it does there; with ``OLD_RELOAD`` the worker's ``reload_weights`` takes
  no arguments, as before vLLM 0.16;
- ``generate`` answers each request with n completions of the request's own token ids (a few, then the
  first stop id), each token with log-prob ``LOGPROB``.
"""
from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import torch

from .engine.arg_utils import EngineArgs

__version__ = "0.33.0-fake"
CALLS: list[tuple] = []
INSTANCES: list["LLM"] = []
OLD_RELOAD = False
IGNORE_DEVICE_IDS = False
OMIT_STOP = False  # finish on the stop id without returning it (vLLM does for some stop ids)
LOGPROB = -0.5


def reset() -> None:
    global OLD_RELOAD, IGNORE_DEVICE_IDS, OMIT_STOP
    CALLS.clear()
    INSTANCES.clear()
    OLD_RELOAD = IGNORE_DEVICE_IDS = OMIT_STOP = False


class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Worker:
    def __init__(self, llm: "LLM"):
        self.llm = llm

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        self.llm._load(weights_iterator)


class _OldWorker:
    def __init__(self, llm: "LLM"):
        self.llm = llm

    def reload_weights(self):  # vLLM < 0.16: reloads from the model's folder, takes no weights
        raise AssertionError("not reached: the engine passes weights, which this signature refuses")


class _Model:
    """What ``apply_model`` hands its function: the weights, on the device the engine took."""

    def __init__(self, llm: "LLM"):
        self.llm = llm

    def parameters(self):
        for t in self.llm.weights.values():
            yield t if self.llm.device.type == "cpu" else SimpleNamespace(device=self.llm.device, data=t)

    def load_weights(self, weights):
        return self.llm._load(weights)


class LLM:
    def __init__(self, **kwargs):
        EngineArgs(**kwargs)  # unknown engine arguments fail as they do in vLLM
        self.kwargs = kwargs
        CALLS.append(("init", kwargs))
        INSTANCES.append(self)
        seed = kwargs.get("seed", 0)
        random.seed(seed)
        import numpy as np

        np.random.seed(seed)
        torch.manual_seed(seed)
        if torch.cuda.is_available():  # vLLM's CUDA platform
            ids = None if IGNORE_DEVICE_IDS else kwargs.get("device_ids")
            self.device = torch.device("cuda", ids[0] if ids else 0)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        from safetensors.torch import load_file

        self.weights = load_file(Path(kwargs["model"]) / "model.safetensors")
        self.pushed: list[dict[str, torch.Tensor]] = []  # each push: the tensors it carried
        self.worker = _OldWorker(self) if OLD_RELOAD else _Worker(self)

    def _load(self, weights) -> set[str]:
        got = {}
        for name, t in weights:
            if name in self.weights:  # tied lm_head: not a weight of its own (as vLLM's Llama skips it)
                self.weights[name].data.copy_(t)
            got[name] = t.detach().clone()
        self.pushed.append(got)
        return set(got)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        CALLS.append(("collective_rpc", method))
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def apply_model(self, func):
        CALLS.append(("apply_model",))
        return [func(_Model(self))]

    def reset_prefix_cache(self):
        CALLS.append(("reset_prefix_cache",))
        return True

    def sleep(self, level: int = 1):
        CALLS.append(("sleep", level))

    def wake_up(self, tags=None):
        CALLS.append(("wake_up",))

    def generate(self, prompts, sampling_params, *, use_tqdm=True):
        CALLS.append(("generate", len(prompts)))
        sp, stop = sampling_params, (sampling_params.stop_token_ids or [0])[0]
        outs = []
        for p in prompts:
            ids = list(p["prompt_token_ids"])
            comps = []
            for j in range(sp.n):
                k = 1 + (j + len(ids)) % 3  # a few of the prompt's last tokens, then the stop id
                toks = ids[-k:] + [stop] if sp.max_tokens > k else ids[-sp.max_tokens:]
                finish = "stop" if toks[-1] == stop else "length"
                if OMIT_STOP and finish == "stop":
                    toks = toks[:-1]
                comps.append(SimpleNamespace(token_ids=toks, finish_reason=finish,
                                             stop_reason=stop if finish == "stop" else None,
                                             logprobs=[{t: SimpleNamespace(logprob=LOGPROB)} for t in toks]))
            outs.append(SimpleNamespace(prompt_token_ids=ids, outputs=comps))
        return outs


__all__ = ["CALLS", "EngineArgs", "INSTANCES", "LLM", "SamplingParams", "reset"]
