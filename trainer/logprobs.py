"""Per-token log-probabilities and entropies from (B, T, V) logits, a few rows of the vocabulary at a time.

Written out with autograd, ``log p(target)`` and the entropy keep several full (B, T, V) tensors alive for
the backward (the scaled logits, the log-softmax, its exp, their product) and make as many passes over the
vocabulary in each direction; on SmolLM2 (V = 49152) that was 10-15% of an update. Here the forward walks
the rows in chunks of about ``CHUNK_ELEMENTS`` logits, keeps only each row's log-sum-exp and entropy, and the
backward recomputes the softmax chunk by chunk, writing the gradient of the logits straight into one
(B, T, V) buffer: the logits and their gradient are the only full-size tensors. TRL's
``selective_log_softmax`` (a loop over rows of logsumexp) and verl's ``entropy_from_logits_with_chunking``
chunk the same way, for the forward only.

With z = logits / temperature, lse = logsumexp(z), p = softmax(z):
    log p(target) = z[target] - lse          d/dz = onehot(target) - p
    H = lse - sum(p * z)                     d/dz = -p * (z - lse + H)

Float32 logits on the CPU take our C++ kernel instead (trainer/engines/csrc/vocab_softmax.cpp): the forward reads
a row twice, the backward once, each exponential in registers, where the chunks' torch ops make about a dozen
passes. SmolLM2's 304 completion rows, forward + backward: 121 -> 35 ms at one thread, 92 -> 27 ms at two (AMD
Zen 3; RESULTS "Session 71"), and closer to float64 than torch's ops (its exponential and float64 sums between
blocks). Float64 and bfloat16 logits, a GPU's, and a host that cannot build the kernel keep the chunks below.
"""
from __future__ import annotations

import torch

from .engines import native

# logits per chunk (2 MB in float32, ~10 rows of a 49k vocabulary). At one row per chunk (256 KB, to keep a chunk's
# temporaries in L2) the loop's ~40 ops per chunk cost more than the cache saved, and one row is too little to
# split over threads: within SmolLM2's update (304 completion rows, AMD Zen 3 with 512 KB of L2), forward +
# backward 132 -> 95 ms at one thread, 120 -> 54 ms at two (RESULTS "Session 63"); 4-16 rows ran alike
CHUNK_ELEMENTS = 1 << 19
# log p alone (a reference's or a teacher's forward, the old policy's: no entropy, no graph) makes two passes over a
# chunk, not seven. First measured at one thread: 4-5 rows of a 49k vocabulary ahead of one row (24 against 28 ms
# for 602 rows). On an AMD Zen 3, 304 rows, sizes interleaved in one process: 10 rows 24.4 ms against 25.6 at 5
# (one thread), 14.5 against 17.6 at two threads, where a chunk is split between them (RESULTS "Session 63")
LOGP_CHUNK_ELEMENTS = 1 << 19
# On a GPU a chunk is a few kernel launches: at the CPU's size a 152k vocabulary (Qwen) is one row per chunk,
# ~10 launches per token. 64 MB of float32 per chunk (a few hundred MB of temporaries) keeps the launches few.
GPU_CHUNK_ELEMENTS = 1 << 24


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


class _LogpEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature: float, entropy_grad: bool, step: int):
        V = logits.shape[-1]
        flat, tgt = logits.reshape(-1, V), targets.reshape(-1)
        n = flat.shape[0]
        dt = torch.float64 if logits.dtype == torch.float64 else torch.float32
        logp, ent, lse = (torch.empty(n, dtype=dt, device=logits.device) for _ in range(3))
        for i in range(0, n, step):
            z = _scaled(flat[i : i + step], temperature)
            # the same kernels as the unchunked expressions (gather - logsumexp; -sum(p log p) over
            # log_softmax): row by row, the same bits
            s = torch.logsumexp(z, -1)
            lse[i : i + step] = s
            logp[i : i + step] = z.gather(-1, tgt[i : i + step, None]).squeeze(-1) - s
            lp = torch.log_softmax(z, -1)
            ent[i : i + step] = -torch.exp(lp).mul_(lp).sum(-1)  # exp(lp) * lp, without a second temporary
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.temperature, ctx.step = temperature, step
        logp, ent = logp.view(targets.shape), ent.view(targets.shape)
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, targets, lse, ent = ctx.saved_tensors
        temp, step, V = ctx.temperature, ctx.step, logits.shape[-1]
        flat, tgt = logits.reshape(-1, V), targets.reshape(-1)
        g_logp = g_logp.reshape(-1, 1) if g_logp is not None else None
        g_ent = g_ent.reshape(-1, 1) if g_ent is not None else None
        grad = torch.empty_like(flat)  # every row is written below
        # float32/float64 logits: each chunk's gradient is computed in its rows of ``grad`` itself (log p, then
        # the terms in place), not in a temporary copied there (SmolLM2: a 60 MB copy per update); bfloat16
        # logits get theirs in float32 and rounded once, at the end
        in_place = grad.dtype == lse.dtype
        for i in range(0, flat.shape[0], step):
            sl = slice(i, i + step)
            if in_place:  # z / temp - lse, the same two roundings as _scaled's, in grad's rows
                rows = grad[sl]
                z = torch.div(flat[sl], temp, out=rows) if temp != 1.0 else flat[sl]
                lp = torch.sub(z, lse[sl, None], out=rows)
            else:
                lp = _scaled(flat[sl], temp) - lse[sl, None]
            if g_ent is not None:  # d/dz of -sum(p log p): -p (log p + H)
                p = torch.exp(lp)
                g = lp.add_(ent[sl, None]).mul_(p).mul_(-g_ent[sl])
                if g_logp is not None:
                    g.sub_(p.mul_(g_logp[sl]))
            else:  # d/dz of log p(target): onehot - p, in place of p (autograd's own products, bit for bit)
                g = lp.exp_().mul_(-g_logp[sl])
            if g_logp is not None:
                g.scatter_add_(-1, tgt[sl, None], g_logp[sl])
            if temp != 1.0:
                g.div_(temp)
            if not in_place:
                grad[sl] = g
        return grad.view(logits.shape), None, None, None, None


def _kernel(logits: torch.Tensor):
    """csrc/vocab_softmax.cpp where it applies: float32 logits on the CPU, the kernel built here."""
    return native.vocab_softmax() if logits.dtype == torch.float32 and logits.device.type == "cpu" else None


def _rows(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return logits.reshape(-1, logits.shape[-1]).contiguous(), targets.reshape(-1).contiguous()


class _Fused(torch.autograd.Function):
    """(log p, entropy) and their gradient by the C++ kernel, one pass over a row per direction."""

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, entropy_grad: bool, kernel):
        flat, tgt = _rows(logits, targets)
        logp, ent, lse = kernel.forward(flat, tgt, temperature, True)
        ctx.save_for_backward(flat, tgt, lse, ent)
        ctx.temperature, ctx.kernel, ctx.shape = temperature, kernel, logits.shape
        logp, ent = logp.view(targets.shape), ent.view(targets.shape)
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        flat, tgt, lse, ent = ctx.saved_tensors
        g_logp = lse.new_zeros(lse.shape[0]) if g_logp is None else g_logp.reshape(-1).float().contiguous()
        g_ent = lse.new_empty(0) if g_ent is None else g_ent.reshape(-1).float().contiguous()
        grad = ctx.kernel.backward(flat, tgt, lse, ent, g_logp, g_ent, ctx.temperature)
        return grad.view(ctx.shape), None, None, None, None


def _scaled(z: torch.Tensor, temperature: float) -> torch.Tensor:
    z = _upcast(z)
    return z / temperature if temperature != 1.0 else z


def logp_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     entropy_grad: bool = False, chunk_rows: int | None = None,
                     entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(target), entropy), each (B, T), of softmax(logits / temperature) over logits (B, T, V).

    Float32 at least (float64 kept). The entropy carries a gradient only with ``entropy_grad``.
    ``chunk_rows``: rows per chunk (default: about ``CHUNK_ELEMENTS`` logits); the results do not depend on it.
    ``entropy=False`` where no gradient is wanted: (log p, None), the same log p without the entropy's passes.
    """
    graph = torch.is_grad_enabled() and logits.requires_grad
    kernel = _kernel(logits)
    if kernel is not None:
        if not entropy and not graph:
            flat, tgt = _rows(logits, targets)
            return kernel.forward(flat, tgt, float(temperature), False)[0].view(targets.shape), None
        return _Fused.apply(logits, targets, float(temperature), entropy_grad, kernel)
    if not entropy and not graph:
        return _logp(logits, targets, temperature, _rows_per_chunk(logits, chunk_rows, LOGP_CHUNK_ELEMENTS)), None
    step = _rows_per_chunk(logits, chunk_rows, CHUNK_ELEMENTS)
    return _LogpEntropy.apply(logits, targets, float(temperature), entropy_grad, step)


def _rows_per_chunk(logits: torch.Tensor, chunk_rows: int | None, cpu_elements: int) -> int:
    V = max(logits.shape[-1], 1)
    if logits.device.type == "meta":  # no data (a memory estimate, bench/gpu_step.py): the loop would be all overhead
        return max(1, logits.numel() // V)
    return chunk_rows or max(1, (cpu_elements if logits.device.type == "cpu" else GPU_CHUNK_ELEMENTS) // V)


def _logp(logits: torch.Tensor, targets: torch.Tensor, temperature: float, step: int) -> torch.Tensor:
    """log p(target) only, by the forward's own expressions (gather - logsumexp, row by row): the same bits."""
    V = logits.shape[-1]
    flat, tgt = logits.reshape(-1, V), targets.reshape(-1)
    dt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logp = torch.empty(flat.shape[0], dtype=dt, device=logits.device)
    for i in range(0, flat.shape[0], step):
        z = _scaled(flat[i : i + step], temperature)
        logp[i : i + step] = z.gather(-1, tgt[i : i + step, None]).squeeze(-1) - torch.logsumexp(z, -1)
    return logp.view(targets.shape)
