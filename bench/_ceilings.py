"""The machine's own ceilings, measured in the bench's process, and the work a model's passes did.

What bench/update.py and bench/rollout.py compare their rates against:
  matmul_peak_gflops  the best fp32 GEMM rate this process gets at its torch thread count, over square
                      matrices of the model's own widths (hidden, MLP) and the update's MLP shape, from MKL
                      and oneDNN alike;
  copy_gbs            the rate of a large tensor copy (read + write bytes per second): what a decode step,
                      which reads every weight and the whole KV cache once, can at best stream;
  ForwardFlops        the matrix-product FLOPs of every forward of a Hugging Face Llama-style causal LM,
                      counted from its shapes and each call's tokens (padding included: the kernels compute
                      it; ``linear_rows``: the layers' products from the rows each is given, for trainer.batch,
                      which skips the padding; a packed row's attention by its segments, as the kernel calls run
                      it) and from the rows its output layer is given, times 3 for a
                      forward whose graph is kept (its backward: input and weight grads);
  decode_bytes        the bytes a forward must read: every weight once, plus the KV cache of each row;
  roofline_s          the least time a list of forwards can take: each at the slower of its FLOPs and its bytes;
  MatmulCalls         every matrix product a region of code runs (op, operand shapes, strides, dtype), to be
                      timed again alone by ``alone_matmul``: how fast that very work's products go on this
                      machine when nothing else runs between them and their operands are warm in cache;
  OpTimes             every op a region of code runs, each timed where it runs (the products by shape, with
                      their FLOPs): how fast the products go in place, and what the time between them is spent on;
  ProductTape         every matrix product a region of code runs, with its very operands, to be run again in
                      order with nothing between them (``replay``): how fast that sequence of products goes on
                      its own, operands as cold as the sequence leaves them; beside OpTimes' in-place rate, what
                      the work between the products costs them.
Ceilings on a shared host move with the other processes' load: measure them next to the work they bound.
"""
from __future__ import annotations

import collections
import math
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.engines import packed
from trainer.models.attention import SEGMENTS


def _rate(fn, flops_or_bytes: float, min_s: float) -> float:
    fn()  # warm-up: first-touch pages, kernel choice
    best = float("inf")
    t_end = time.perf_counter() + min_s
    while True:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > t_end:
            return flops_or_bytes / best


def matmul_peak_gflops(shapes: list[tuple[int, int, int]], dtype=torch.float32, min_s: float = 0.4) -> float:
    """Best GFLOP/s over ``(m, k, n)`` products (best of repeats: the least-disturbed run), by torch's ``mm`` (MKL on
    x86) and, in float32, by oneDNN's packed product too, which the sampler uses (trainer/engines/packed.py): on
    an AMD Zen 4 host it ran these shapes at 110-114 GFLOP/s against MKL's 96-105 (RESULTS "Session 60"), so a
    ceiling from MKL alone would not be the machine's."""
    out = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        c = torch.empty(m, n, dtype=dtype)
        out = max(out, _rate(lambda: torch.mm(a, b, out=c), 2.0 * m * k * n, min_s) / 1e9)
        if dtype == torch.float32 and "onednn" in packed.kinds():
            wt = b.t().contiguous()  # a linear layer's (out, in) weight
            w = packed._pack("onednn", wt, m)
            out = max(out, _rate(lambda: packed._product("onednn", a, w, wt, None, m), 2.0 * m * k * n, min_s) / 1e9)
    return out


def model_shapes(cfg, tokens: int = 1024) -> list[tuple[int, int, int]]:
    """Square products at the model's widths, and its MLP's up-projection over ``tokens`` rows."""
    H, inter = cfg.hidden_size, cfg.intermediate_size
    return [(H, H, H), (inter, inter, inter), (tokens, H, inter)]


def copy_gbs(mb: int = 512, min_s: float = 0.4) -> float:
    """GB/s of bytes moved (read + written) by one large copy: bigger than any cache, so it streams memory."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    return _rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, min_s) / 1e9


class ForwardFlops:
    """Counts the matrix-product FLOPs of every forward of ``model`` while installed: the layers and attention
    from each call's shapes (a forward pre-hook), the output layer from the rows of logits the forward returns
    (trainer.batch runs it over the completion tokens only, not their padding)."""

    def __init__(self, model, linear_rows: bool = False):
        cfg = model.config
        self.model, self.cfg = model, cfg
        layers = model.get_decoder().layers
        linears = [m for m in layers.modules() if isinstance(m, torch.nn.Linear)]
        self.layer_params = sum(m.weight.numel() for m in linears)
        # linear_rows: the layers' products counted from the rows each is given (a hook on each), not from the
        # call's B x L: trainer.batch skips the padding's rows in an update. Not for the sampler: a hook keeps
        # trainer/engines/packed.py from switching a layer.
        self.linear_rows, self.graph = linear_rows, 1.0
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.weight_bytes, self.kv_bytes_per_position = decode_bytes(model, 0, 0), decode_bytes(model, 1, 1)
        self.kv_bytes_per_position -= self.weight_bytes
        self.flops = 0.0
        self.calls: list[tuple[float, float]] = []  # (FLOPs, bytes read at best) of each forward
        # the output layer's rows from the logits the model returns, not from a hook on that layer: a hooked layer
        # is one trainer/engines/packed.py will not switch, so the sampler measured would not be a job's
        self.head = model.get_output_embeddings()
        self.handles = [model.register_forward_pre_hook(self._hook, with_kwargs=True),
                        model.register_forward_hook(self._head)]
        if linear_rows:
            self.handles += [m.register_forward_hook(self._linear) for m in linears]

    def body_flops(self, B: int, L: int, past: int, pairs: int | None = None) -> float:
        """The layers' products and attention of one forward of B rows × L new tokens over ``past`` cached ones
        (``pairs``: the (query, key) pairs attention scores, where not each row's whole rectangle)."""
        c = self.cfg
        linear = 0.0 if self.linear_rows else 2.0 * B * L * self.layer_params
        # scores and weighted sum over the whole (L, past + L) rectangle: with a padding mask the kernel
        # computes it all
        pairs = B * L * (past + L) if pairs is None else pairs
        attn = 4.0 * c.num_attention_heads * self.head_dim * pairs * c.num_hidden_layers
        return linear + attn

    def head_flops(self, rows: int) -> float:
        return 2.0 * rows * self.cfg.hidden_size * self.cfg.vocab_size

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        B, L = ids.shape
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        past = cache.get_seq_length() if cache is not None else 0
        self.graph = 3.0 if self._graph(module) else 1.0
        segs, pairs = kwargs.get(SEGMENTS), None
        if segs is not None:  # one packed row (trainer/models/segments.py): each prompt's rectangle, then each
            U, Pm, Bc, Tm = segs.shape  # completion's over its prompt and itself, as torch's kernel calls run them
            pairs = U * Pm * Pm + Bc * Tm * (Pm + Tm)
            if self._segment_kernel():  # csrc/segment_attend.cpp (and its backward): each query's visible keys
                nq, np_ = segs.units[:, 1], segs.units[:, 3]
                pairs = int((nq * np_ + nq * (nq + 1) // 2).sum())
        f = self.body_flops(B, L, past, pairs) * self.graph
        self.flops += f
        positions = B * (past + L)  # each row's keys and values
        first = cache.layers[0] if cache is not None and getattr(cache, "layers", None) else None
        if getattr(first, "shared", False):  # a prompt's held once for its group (trainer/engines/kv.py)
            G, _, P, _ = first.prompt_k.shape
            positions = G * P + B * (past - P + L)
        self.calls.append((f, self.weight_bytes + self.kv_bytes_per_position * positions))

    def _head(self, module, args, out):
        logits = getattr(out, "logits", None)
        if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
            return
        f = self.head_flops(logits.numel() // logits.shape[-1]) * (3.0 if self._graph(self.head) else 1.0)
        self.flops += f
        if self.calls:  # the forward it is part of
            self.calls[-1] = (self.calls[-1][0] + f, self.calls[-1][1])

    def _linear(self, module, args, out):
        x = args[0]  # the rows it was given (a pre-hook's choice), whatever a later hook makes of its output
        f = 2.0 * (x.numel() // x.shape[-1]) * module.weight.numel() * self.graph
        self.flops += f
        if self.calls:
            self.calls[-1] = (self.calls[-1][0] + f, self.calls[-1][1])

    def _segment_kernel(self) -> bool:
        """Whether a packed row of this model attends in csrc/segment_attend.cpp (segments.kernel_fits)."""
        from trainer.engines import native
        from trainer.models import segments

        c = self.cfg
        return (segments.kernel_fits(self.model.dtype, self.head_dim, c.num_attention_heads, c.num_key_value_heads)
                and native.segment_attend() is not None)

    @staticmethod
    def _graph(module) -> bool:
        return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())

    def take(self) -> float:
        """FLOPs counted since the last take."""
        f, self.flops = self.flops, 0.0
        return f

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def roofline_s(calls: list[tuple[float, float]], gflops: float, gbs: float) -> tuple[float, float]:
    """(seconds the bytes alone take at ``gbs``, seconds of the roofline: each forward at the slower of its
    FLOPs at ``gflops`` and its bytes at ``gbs``), summed over the forwards ``calls``."""
    return (sum(b for _, b in calls) / (gbs * 1e9),
            sum(max(f / (gflops * 1e9), b / (gbs * 1e9)) for f, b in calls))


def decode_bytes(model, rows: int, kv_len: float) -> float:
    """Bytes one forward reads at best: each weight once (tied embeddings: the head's copy; the input
    embedding reads only one row per token) plus ``rows`` KV caches of ``kv_len`` positions."""
    cfg = model.config
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * elem
    if not getattr(cfg, "tie_word_embeddings", False):  # the input table: one row per token, not all of it
        weights -= model.get_input_embeddings().weight.numel() * elem
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem * kv_len * rows
    return weights + kv


class MatmulCalls(TorchDispatchMode):
    """While active, counts every matrix product by (op, operand shapes, strides, dtype, its other arguments)."""

    # addmm_: trainer/models/linear.py's products into .grad; _linear_pointwise: oneDNN's (trainer/models/gemm.py)
    OPS = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "_linear_pointwise"}

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.OPS:
            operands = tuple((tuple(t.shape), tuple(t.stride()), t.dtype) if isinstance(t, torch.Tensor)
                             else (t if not isinstance(t, list) else tuple(t)) for t in args)
            self.calls[(func, operands)] += 1
        return func(*args, **(kwargs or {}))


def linear_pointwise_flops(x, *rest, **kw) -> float:
    """oneDNN's product's FLOPs (trainer/models/gemm.py) from its arguments' shapes: (x, w, bias, ...) or, its
    ``.binary`` overload, (x, other, w, bias, attr). Also a FlopCounterMode formula (given shapes)."""
    w = rest[1] if len(rest) >= 4 and isinstance(rest[3], str) else rest[0]
    return 2.0 * math.prod(x) * w[0]


def _flops(name: str, ts: list) -> float:
    if name == "_linear_pointwise":
        return linear_pointwise_flops(*[tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in ts])
    a, b = [t for t in ts if isinstance(t, torch.Tensor)][-2:]  # mm/bmm: (a, b); addmm/addmm_/baddbmm: (c, a, b)
    return 2.0 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)


def alone_matmul(calls: collections.Counter, rounds: int = 5) -> tuple[float, float]:
    """(FLOPs, seconds) of the recorded products, each kind timed alone on random operands of its shapes,
    strides and dtype (best of ``rounds``, after a warm-up call) and multiplied by its count."""
    flops = seconds = 0.0
    for (func, operands), n in calls.items():
        ts = [torch.randn(1 + sum((d - 1) * st for d, st in zip(o[0], o[1])), dtype=o[2]).as_strided(o[0], o[1])
              if isinstance(o, tuple) and len(o) == 3 and isinstance(o[2], torch.dtype)
              else (list(o) if isinstance(o, tuple) else o) for o in operands]
        f = _flops(func.overloadpacket.__name__, ts)
        func(*ts)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            func(*ts)
            best = min(best, time.perf_counter() - t0)
        flops, seconds = flops + f * n, seconds + best * n
    return flops, seconds


class ProductTape(TorchDispatchMode):
    """While active, keeps every matrix product (MatmulCalls.OPS) a region runs with its arguments: the tensors
    themselves, so a replay reads the same memory in the same order (it holds them alive: the region's
    activations and gradients, until the tape is dropped)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in MatmulCalls.OPS:
            self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))

    def replay(self, passes: int = 2) -> tuple[float, float]:
        """(FLOPs, seconds) of the taped products run again in their order, nothing between them, each timed; the
        last of ``passes`` (the first settles allocations). An in-place product (``addmm_`` into a gradient) adds
        into its output again: run it where those contents no longer matter."""
        flops = sum(_flops(f.overloadpacket.__name__, list(a)) for f, a, _ in self.calls)
        seconds = 0.0
        for _ in range(passes):
            seconds = 0.0
            for func, args, kwargs in self.calls:
                t0 = time.perf_counter()
                func(*args, **kwargs)
                seconds += time.perf_counter() - t0
        return flops, seconds


# our C++ kernels (trainer/engines/native.py): pybind calls, which the dispatcher (so a TorchDispatchMode) never
# sees; OpTimes times them by wrapping their loaders. The first is attention's.
NATIVE = ("segment_attend", "rms_norm", "rope", "swiglu", "vocab_softmax")


class _Timed:
    """A native kernel module whose functions book their wall time into ``ops`` as ``native:<kernel>.<function>``."""

    def __init__(self, mod, name: str, ops: dict):
        self._mod, self._name, self._ops = mod, name, ops

    def __getattr__(self, attr):
        fn = getattr(self._mod, attr)
        if not callable(fn):
            return fn

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            row = self._ops[(f"native:{self._name}.{attr}", ())]
            row[0], row[1] = row[0] + 1, row[1] + time.perf_counter() - t0
            return out

        return timed


class OpTimes(TorchDispatchMode):
    """While active, times every op as it runs (``perf_counter`` around the kernel's call, so the mode's own Python
    is left out): the products (MatmulCalls.OPS) by op and operand shapes with their FLOPs, everything else by op,
    and our C++ kernels (``NATIVE``: the dispatcher does not see them) by kernel and function.
    Why not torch's profiler: on a SmolLM2 update it put one output-layer weight gradient at 478 ms that took 180 ms
    timed this way and in the plain run (RESULTS "Session 64"); one update's per-op figures there are not each op's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer | None = None):
        super().__init__()
        self.ops: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])  # key: [calls, s, FLOPs]
        # the ops ``optimizer.step()`` runs, timed apart (its step hooks mark them): the step is a pass over the
        # weights, gradients and moments, bound by memory, with no FLOPs counted
        self.optimizer, self.in_step, self.step_s, self.hooks, self.loaders = optimizer, False, 0.0, [], {}

    def __enter__(self):
        from trainer.engines import native

        if self.optimizer is not None:
            self.hooks = [self.optimizer.register_step_pre_hook(lambda *a: setattr(self, "in_step", True)),
                          self.optimizer.register_step_post_hook(lambda *a: setattr(self, "in_step", False))]
        self.loaders = {name: getattr(native, name) for name in NATIVE}
        for name, load in self.loaders.items():
            mod = load()
            if mod is not None:
                timed = _Timed(mod, name, self.ops)
                setattr(native, name, lambda timed=timed: timed)
        return super().__enter__()

    def __exit__(self, *exc):
        from trainer.engines import native

        for name, load in self.loaders.items():
            setattr(native, name, load)
        for h in self.hooks:
            h.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        dt = time.perf_counter() - t0
        name = func.overloadpacket.__name__
        if self.in_step:
            self.step_s += dt
        if name in MatmulCalls.OPS:
            key, flops = (name, tuple(tuple(t.shape) for t in args if isinstance(t, torch.Tensor))), _flops(name, args)
        else:
            key, flops = (name, ()), 0.0
        row = self.ops[key]
        row[0], row[1], row[2] = row[0] + 1, row[1] + dt, row[2] + flops
        return out

    def summary(self, top: int = 12) -> dict:
        """The products' FLOPs and seconds, all ops' seconds, attention's and the optimiser step's seconds, and the
        ``top`` rows by time (products by shape)."""
        prod = [(k, r) for k, r in self.ops.items() if r[2]]
        rows = sorted(self.ops.items(), key=lambda kr: -kr[1][1])[:top]
        return {"products_gflop": sum(r[2] for _, r in prod) / 1e9, "products_s": sum(r[1] for _, r in prod),
                "ops_s": sum(r[1] for r in self.ops.values()),
                # attention's kernels, torch's and ours (their FLOPs are counted from the shapes by ForwardFlops)
                "attention_s": sum(r[1] for k, r in self.ops.items()
                                   if "scaled_dot_product" in k[0] or k[0].startswith(f"native:{NATIVE[0]}.")),
                "optimizer_s": self.step_s,
                "top": [{"op": k[0], "shapes": [list(x) for x in k[1]], "calls": r[0], "ms": round(r[1] * 1e3, 2),
                         **({"gflops": round(r[2] / r[1] / 1e9, 1)} if r[2] else {})} for k, r in rows]}
