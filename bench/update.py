"""One GRPO update on a CPU: our trainer's allocator setting (trainer.devices.keep_freed_memory: glibc
serves every block from the heap and keeps freed memory) against glibc's defaults, in the same run.

Each side is its own process (the setting is process-wide): the same job spec and seed give both the same
fixed batches, sampled once; one untimed update gives AdamW its moments (as every step of a job but the first
finds them), then each timed update (forward, backward, fused AdamW) restores the weights and that optimiser
state afterwards, so every timing does the same work. Reported: the median update time over
the batches, repeated, at one torch thread, the page faults and system time per update, and the
process's peak resident memory (what keeping freed memory costs).

    .venv/bin/python bench/update.py --quick                    # tiny model and SmolLM2 if pulled, < 5 min
    .venv/bin/python bench/update.py --model smollm2-135m --reps 4 [--threads 2]
    .venv/bin/python bench/update.py --model smollm2-135m --sides peer_kernels,ours --peer-kernels DIR --rounds 4
                                                # our kernels against DIR's (a copy of another revision's csrc)
    .venv/bin/python bench/update.py --smoke    # CI: the tiny model, each side once, one batch of 4 prompts x 4
                                                # (checks the script runs end to end; not a measurement)

Against the machine's own ceiling (bench/_ceilings.py), in the same processes: the update's achieved FLOP/s — its
matrix-product FLOPs counted from the model's shapes and each forward's tokens (x3 for the forwards it
backpropagates; torch's FlopCounterMode counts one update too, printed beside it as a cross-check) over its median
time — against this process's best fp32 matmul rate at the same thread count (square products of the model's widths
and its MLP's shape, measured before the first repetition and after each): each timing is set against the higher of
the two ceilings that bracket it, so a host whose speed drifts (a shared VM's did 90-165 GFLOP/s within minutes)
does not set a slow spell's rate against a fast spell's peak; ``update_peak_frac_of_max`` is the median rate over
the highest ceiling of the run and ``peak_gflops_low`` the lowest, beside it. The same for one no-graph forward of
the batch as a job's reference model runs (log-probs alone, no entropy, its layers packed once for the job: ``ref``)
and the last-hidden forward a separate critic makes (``critic``). And how much of the gap the products themselves
explain: the first batch's update once more with every matrix product recorded (op, shapes, strides), each kind then
timed alone on warm random operands (bench/_ceilings.py MatmulCalls): ``matmul_alone_frac``, their FLOPs over that
time against the last ceiling measured (what the update could reach if nothing ran between its products and each ran
as fast as alone), and ``matmul_alone_share``, that time over the update's (the rest is the products' slowdown in
place, cold operands, and the work between them: attention, norms, the vocabulary's softmax, the optimiser). Then
that update once more with every op timed where it runs (bench/_ceilings.py OpTimes): ``products_in_place_frac``,
its products' FLOPs over their time in place against the same ceiling (beside ``matmul_alone_frac``: how much the
products lose in place), ``products_op_share``, their time over all its ops' time (the rest: the work between
them), and a line naming the ops that took the most time, the products by shape with their rate. Of that time,
``attention_op_share`` (the attention kernels) and ``optimizer_op_share`` (every op ``optimizer.step()`` ran: a
pass over weights, gradients and moments bound by memory, with no FLOPs to count); and ``update_ceiling_frac``,
the update's counted FLOPs over its products', attention's and optimiser step's time in place against the ceiling:
the most it could reach were every other op and all Python free, its products, attention and optimiser as they ran.
Below the goal there, no work between the products closes the gap; faster products, attention or optimiser would.
Last, that update once more with its products taped, operands and all (bench/_ceilings.py ProductTape), then run
again in their order with nothing between them: ``products_in_sequence_frac``, their rate on operands as cold as
their own sequence leaves them. Near ``products_in_place_frac``, the work between the products does not slow them;
below ``matmul_alone_frac``, their operands' coming from memory does (the library's rate on this host's caches).

``--sides`` picks the peers, each its own process: ``defaults`` (glibc's malloc settings, the default),
``unchunked`` (per-token log-probs and entropies by the whole-vocabulary autograd expressions that
trainer.logprobs replaced), ``torch_embedding`` (torch's own embedding backward, which builds a zero table
per call, instead of trainer/models/embedding.py's rows added into ``.grad``), ``torch_linear`` (torch's own
linear backward, a weight-sized gradient per use summed out of place, instead of trainer/models/linear.py's
products into ``.grad``), ``repeat_kv`` (transformers' SDPA attention, which copies each key/value head to its
query heads, instead of trainer/models/attention.py's grouped-query kernel call) and ``padded`` (every layer's
products over the completions' padding too, as before trainer.batch skipped its rows), ``cached_prompt`` (the
shared-prompt forward as two model calls, the completions over a cache of the prompts, instead of
trainer/models/segments.py's packed row), ``torch_clip`` (torch's gradient clip: its norm, on one thread on the
CPU, and a multiply pass before the step, by 1 too), ``zeroed_grads`` (every gradient buffer zeroed at a step's
start, instead of trainer/models/grads.py's stale buffers overwritten by their first write), ``mkl_gemm`` (every
float32 product of the layers in MKL, torch's own, where trainer/models/gemm.py takes oneDNN's on a non-Intel
AVX-512 CPU), ``onednn_gemm`` (every one in oneDNN, where gemm.py keeps MKL: an Intel CPU, or one without AVX-512;
with ``mkl_gemm``, gemm.py's rule is measured on any host), ``torch_softmax`` (the vocabulary's log-probs and
entropies by torch's ops a chunk of rows at a time, instead of trainer/engines/csrc/vocab_softmax.cpp's one pass a
row), ``torch_swiglu`` (the MLP's silu(gate) * up by torch's ops, instead of
trainer/models/mlp.py's kernel), ``torch_segments`` (the packed row's attention, forward and backward, by
torch's kernels on copied layouts, instead of trainer/engines/csrc/segment_attend.cpp) and ``fill_empty``
(torch's NaN fill of every ``torch.empty`` under deterministic algorithms, which trainer.devices turns off).

Last line: ``update_speedup= ours_s= ours_faults= ours_rss_gb= <peer>_speedup= <peer>_s= <peer>_faults=
<peer>_rss_gb= <peer>_peak_frac= <peer>_ref_peak_frac= <peer>_critic_peak_frac= update_peak_frac= peak_gflops=
update_peak_frac_of_max= peak_gflops_low= update_gflops= ref_peak_frac= critic_peak_frac=
matmul_alone_frac= matmul_alone_share= products_in_place_frac= products_in_sequence_frac= products_op_share=
attention_op_share= optimizer_op_share= update_ceiling_frac= threads= model=`` (speedups: the peer's median
over ours; update_speedup = defaults_speedup; the figures are for the last model: SmolLM2-135M when pulled).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # _ceilings


def _unchunked(logits, targets, temperature, entropy_grad, entropy=True):
    """The autograd expressions trainer.logprobs replaced (every (B, T, V) intermediate kept): the peer of
    ``--sides unchunked``."""
    from trainer import algos

    z = algos.upcast(logits) / temperature
    return algos.token_logprobs(z, targets), algos.entropy_from_logits(z if entropy_grad else z.detach())


def _use_kernels(csrc: Path) -> None:
    """Build and load trainer/engines/csrc's kernels from ``csrc`` instead, under names of their own (a digest of the
    directory's sources), so neither side's build replaces the other's."""
    import hashlib

    from trainer.engines import native

    headers = native._headers_digest
    sources = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in sorted(csrc.glob("*.cpp"))))
    native.CSRC = csrc
    native._headers_digest = lambda: headers() + sources.hexdigest()[:6]


def measure(model: str, models: Path, reps: int, side: str, smoke: bool = False, threads: int = 1,
            n_batches: int = 3, peer_kernels: str | None = None) -> dict:
    """In this process: sample fixed batches, then time ``reps`` passes of one update per batch (``smoke``: one
    small batch), and the ceiling beside them."""
    import copy

    import torch
    from _ceilings import (
        ForwardFlops,
        MatmulCalls,
        OpTimes,
        ProductTape,
        alone_matmul,
        linear_pointwise_flops,
        matmul_peak_gflops,
        model_shapes,
    )
    from torch.utils.flop_counter import FlopCounterMode

    from service.cli.recipes import recipe
    from trainer import batch, devices, distributed, loop, online
    from trainer.config import JobSpec
    from trainer.engines import packed

    if side == "defaults":  # the peer: glibc's own malloc settings
        devices.keep_freed_memory = lambda: False
    if side == "torch_embedding":  # the peer: torch's embedding backward (a zero table per call), not ours
        from trainer.models import load

        load.grad_in_place = lambda model: False
    if side == "torch_linear":  # the peer: torch's linear backward (weight gradients summed out of place)
        from trainer.models import load

        load.linear_grad_in_place = lambda model: 0
    if side == "repeat_kv":  # the peer: transformers' SDPA attention (key/value heads copied per query head)
        from trainer.models import load

        load.gqa_in_kernel = lambda model: model
    if side == "stock_norm_rope":  # the peer: autograd's graph for RMSNorm and the rotary embedding
        from trainer.models import load

        load.fused_rms_norm = lambda model: 0
        load.fused_rope = lambda model: 0
    if side == "torch_clip":  # the peer: torch's clip (its serial norm; a multiply pass, by 1 below the limit too)
        from trainer import context

        def torch_clip(opt, params, max_norm, sharded):
            total = torch.nn.utils.clip_grad_norm_(params, max_norm)
            opt.step()
            return total

        context.clipped_step = torch_clip
    if side == "zeroed_grads":  # the peer: every gradient buffer zeroed at a step's start (optimizer.zero_grad)
        from trainer.models import grads

        grads.zero = lambda params: [p.grad.zero_() for p in params if p.grad is not None]
    if side == "mkl_gemm":  # the peer: every float32 product of the layers in MKL (torch's own), on any CPU
        from trainer.models import gemm

        gemm.min_entries = lambda: None
    if side == "onednn_gemm":  # the peer: every float32 product of the layers in oneDNN (gemm.py's override)
        from trainer.models import gemm

        os.environ["RLVR_CPU_GEMM"] = "onednn"
        gemm.min_entries.cache_clear()
    if side == "torch_swiglu":  # the peer: the MLP's silu(gate) * up by torch's ops (two passes, three backward)
        from trainer.models import mlp

        mlp.ENABLED = False
    if side == "torch_softmax":  # the peer: the vocabulary's log-probs by torch's ops, chunk by chunk
        from trainer import logprobs

        logprobs._kernel = lambda logits: None
    if side == "peer_kernels":  # the peer: our C++ kernels built from another directory (an earlier revision's)
        _use_kernels(Path(peer_kernels))
    if side == "torch_segments":  # the peer: the packed row's attention by torch's kernels (and their backward)
        from trainer.models import segments

        segments.ENABLED = False
    if side == "unchunked":  # the peer: per-token log-probs and entropies over whole (B, T, V) tensors
        batch.logp_and_entropy = _unchunked
    spec = recipe("demo-math" if model == "builtin:tiny-arith" else "real-math")
    spec["model"]["path"] = model
    spec["train"]["threads"] = threads
    if smoke:
        spec["train"]["prompts_per_step"], spec["rollout"]["group_size"], spec["data"]["eval_size"] = 4, 4, 16
    spec = JobSpec.model_validate(spec)
    with tempfile.TemporaryDirectory() as tmp, \
            distributed.group(1, spec.model_dump_json(), Path(tmp), models, "cpu") as dist:
        ctx = loop.setup(spec, Path(tmp), models, dist, None, lambda m: None).ctx
        if side == "fill_empty":  # the peer: torch's NaN fill of every torch.empty under deterministic algorithms
            torch.utils.deterministic.fill_uninitialized_memory = True
        if side == "padded":  # the peer: every position's products, the padding's included (trainer.batch)
            ctx.policy.rlvr_unpad = False
        if side == "cached_prompt":  # the peer: two model calls, the completions over a cache of the prompts
            ctx.policy.rlvr_segments = False
        batches = [online.sample_groups(ctx) for _ in range(1 if smoke else n_batches)]
        # one update first, so AdamW has its moments: every step of a job but the first finds them there, and a
        # state restored to "no moments yet" would re-create 2 x the parameters in fresh memory every timed update
        online._update(ctx, batches[0], online._prepare(ctx, batches[0]))
        weights, opt = copy.deepcopy(ctx.policy.state_dict()), copy.deepcopy(ctx.opt.state_dict())
        # a job's reference model: the starting weights, frozen, its layers packed once (trainer/loop.py setup)
        ref_model = copy.deepcopy(ctx.policy).requires_grad_(False)
        packed.pack_frozen(ref_model)
        ref_counter = ForwardFlops(ref_model, linear_rows=True)
        counter = ForwardFlops(ctx.policy, linear_rows=True)
        shapes = model_shapes(ctx.policy.config)
        times, faults, sys_s, flops, peaks, counted, at = [], [], [], [], [], None, []
        fwd = {"ref": ([], []), "critic": ([], [])}  # (seconds, FLOPs) of the no-graph forwards
        # addmm_ (trainer/models/linear.py's weight gradients into .grad) is not in torch's table
        # nor oneDNN's products (trainer/models/gemm.py): (x, w, ...) and (x, other, w, ...) by their shapes
        addmm_ = {torch.ops.aten.addmm_: lambda c, a, b, **kw: 2 * a[0] * a[1] * b[1],
                  torch.ops.mkldnn._linear_pointwise: linear_pointwise_flops}
        for rep in range(reps + 1):  # the first pass warms up (and is not counted)
            for i, grp in enumerate(batches):
                check = FlopCounterMode(display=False, custom_mapping=addmm_) if rep == 0 and i == 0 else None
                counter.take()
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                with check or contextlib.nullcontext():
                    online._update(ctx, grp, online._prepare(ctx, grp))
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                f = counter.take()
                if check is not None:
                    counted = (f, check.get_total_flops())
                ctx.policy.load_state_dict(weights)
                ctx.opt.load_state_dict(opt)
                with torch.no_grad():
                    ref = lambda: online._no_grad_forward(ctx, ref_model, grp.ro, False, entropy=False)  # noqa: E731
                    for name, run, count in (("ref", ref, ref_counter),
                                             ("critic", lambda: batch.last_hidden(ctx.policy, grp.ro), counter)):
                        t2 = time.perf_counter()
                        run()
                        t3, f2 = time.perf_counter(), count.take()
                        if rep:
                            fwd[name][0].append(t3 - t2)
                            fwd[name][1].append(f2)
                if rep:
                    at.append(rep)
                    times.append(t1 - t0)
                    faults.append(r1.ru_minflt - r0.ru_minflt)
                    sys_s.append(r1.ru_stime - r0.ru_stime)
                    flops.append(f)
            peaks.append(matmul_peak_gflops(shapes, min_s=0.1 if smoke else 0.4))
        alone, in_place, in_place_wall, in_place_flops, in_sequence = (0.0, 0.0), None, 0.0, 0.0, (0.0, 0.0)
        if side == "ours":
            # the first batch's update once more: its products recorded (then timed alone), and every op timed where
            # it runs. The mode entered last sees each op first: MatmulCalls records, then OpTimes times the kernel
            counter.take()
            with OpTimes(ctx.opt) as op_times, MatmulCalls() as rec:
                t0 = time.perf_counter()
                online._update(ctx, batches[0], online._prepare(ctx, batches[0]))
                in_place_wall = time.perf_counter() - t0
            in_place_flops = counter.take()
            ctx.policy.load_state_dict(weights)
            ctx.opt.load_state_dict(opt)
            alone, in_place = alone_matmul(rec.calls), op_times.summary()
            # and once more with its products taped (no op timed), then run again in order on their own operands
            with ProductTape() as tape:
                online._update(ctx, batches[0], online._prepare(ctx, batches[0]))
            in_sequence = tape.replay()
            del tape
            ctx.policy.load_state_dict(weights)  # after the replay: an in-place product added into .grad again
            ctx.opt.load_state_dict(opt)
        live = [float((~g.dead).float().mean()) for g in batches]
    peak = max(peaks)
    # each timing against the ceiling measured around it (the higher of the two measurements that bracket its
    # repetition): a host whose speed drifts (a shared VM: 90-165 GFLOP/s within minutes) would otherwise set one
    # spell's rate against another's peak. Beside it, the median rate over the highest peak of the whole run.
    near = [max(peaks[r - 1], peaks[r]) for r in at]
    # each batch's rate, then the median: batches differ in live groups, so in work
    gflops = statistics.median(f / t / 1e9 for f, t in zip(flops, times))
    frac = statistics.median(f / t / 1e9 / p for f, t, p in zip(flops, times, near))
    fwd_frac = {k: statistics.median(f / t / 1e9 / p for f, t, p in zip(fs, ts, near)) for k, (ts, fs) in fwd.items()}
    return {"update_s": statistics.median(times), "faults": statistics.median(faults),
            "sys_s": statistics.median(sys_s), "live_group_frac": live, "threads": torch.get_num_threads(),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "update_gflops": gflops, "peak_gflops": peak, "peak_gflops_low": min(peaks), "update_peak_frac": frac,
            "update_peak_frac_of_max": gflops / peak,
            "ref_peak_frac": fwd_frac["ref"], "critic_peak_frac": fwd_frac["critic"],
            "counted_gflop": counted[0] / 1e9, "flop_counter_gflop": counted[1] / 1e9,
            # the update's own products, each as fast as it runs alone: the most its matmuls allow
            "matmul_alone_frac": alone[0] / alone[1] / 1e9 / peaks[-1] if alone[1] else 0.0,  # the ceiling just before
            # of the first batch's median update, the time its products would take at that speed
            "matmul_alone_share": alone[1] / statistics.median(times[::len(batches)]) if alone[1] else 0.0,
            # the same update's products as they ran in it (OpTimes): their rate against the ceiling just before,
            # their share of the time its ops took, and that time's share of the update's wall clock under the timer
            "products_in_place_frac": (in_place["products_gflop"] / in_place["products_s"] / peaks[-1]
                                       if in_place and in_place["products_s"] else 0.0),
            # the same products run again in their order with nothing between them (ProductTape): their rate on
            # operands as cold as their own sequence leaves them, the most the products reach in this update
            "products_in_sequence_frac": in_sequence[0] / in_sequence[1] / 1e9 / peaks[-1] if in_sequence[1] else 0.0,
            "products_op_share": in_place["products_s"] / in_place["ops_s"] if in_place else 0.0,
            "ops_wall_share": in_place["ops_s"] / in_place_wall if in_place else 0.0,
            # of the ops' time: attention's kernels and the optimiser's step (a memory-bound pass, no FLOPs counted)
            "attention_op_share": in_place["attention_s"] / in_place["ops_s"] if in_place else 0.0,
            "optimizer_op_share": in_place["optimizer_s"] / in_place["ops_s"] if in_place else 0.0,
            # the most this update could reach with its products, attention and optimiser step as fast as they ran in
            # it and every other op (norms, activations, softmax, residuals, copies) and all Python taking no time
            "update_ceiling_frac": (in_place_flops / (in_place["products_s"] + in_place["attention_s"]
                                                      + in_place["optimizer_s"]) / 1e9 / peaks[-1]
                                    if in_place and in_place["products_s"] else 0.0),
            "top_ops": in_place["top"] if in_place else []}


SIDES = ("ours", "defaults", "unchunked", "torch_embedding", "torch_linear", "repeat_kv", "stock_norm_rope", "padded",
         "cached_prompt", "torch_clip", "zeroed_grads", "fill_empty", "mkl_gemm", "onednn_gemm", "torch_softmax",
         "torch_swiglu", "torch_segments", "peer_kernels")
FIGURES = ("update_s", "faults", "sys_s", "peak_rss_gb", "update_gflops", "peak_gflops", "peak_gflops_low",
           "update_peak_frac", "update_peak_frac_of_max",
           "ref_peak_frac", "critic_peak_frac", "matmul_alone_frac", "matmul_alone_share", "products_in_place_frac",
           "products_in_sequence_frac", "products_op_share", "ops_wall_share", "attention_op_share",
           "optimizer_op_share", "update_ceiling_frac")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the tiny model, and smollm2-135m when pulled")
    ap.add_argument("--reps", type=int, default=3, help="passes over the batches per side, split over --rounds")
    ap.add_argument("--quick", action="store_true", help="2 repetitions, one batch (< 5 minutes)")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, each side once on one small batch: checks "
                    "the script runs (seconds; not a measurement)")
    ap.add_argument("--batches", type=int, default=3, help="fixed batches each update is timed on")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the update and of its ceiling")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    ap.add_argument("--sides", default="defaults,ours", help="the processes to compare with ours: defaults (glibc's "
                    "malloc settings), unchunked (the whole-vocabulary log-softmax trainer.logprobs replaced), "
                    "torch_embedding (torch's embedding backward, trainer/models/embedding.py replaced), "
                    "torch_linear (torch's linear backward, trainer/models/linear.py replaced), "
                    "repeat_kv (transformers' SDPA with copied key/value heads, trainer/models/attention.py replaced), "
                    "stock_norm_rope (autograd's RMSNorm and rotary backward, trainer/models/norm.py and rope.py "
                    "replaced), padded (the layers' products over the completions' padding too), cached_prompt (the "
                    "shared-prompt forward as two model calls, the completions over a cache of the prompts, instead of "
                    "trainer/models/segments.py's one packed row), torch_clip (torch's gradient clip, whose "
                    "norm runs on one thread on the CPU and which multiplies every gradient by 1 below the limit, "
                    "instead of trainer.context.clipped_step), "
                    "mkl_gemm (every layer product in MKL, torch's own, where trainer/models/gemm.py would take "
                    "oneDNN's), onednn_gemm (every one in oneDNN, where gemm.py keeps MKL), torch_softmax (the "
                    "vocabulary's log-probs by torch's ops in chunks, trainer/engines/csrc/vocab_softmax.cpp "
                    "replaced), "
                    "torch_swiglu (silu(gate) * up by torch's ops, trainer/models/mlp.py replaced), "
                    "torch_segments (the packed row's attention and its backward by torch's kernels, "
                    "trainer/engines/csrc/segment_attend.cpp replaced), "
                    "peer_kernels (our C++ kernels built from --peer-kernels, e.g. an earlier revision's csrc)")
    ap.add_argument("--peer-kernels", help="a directory holding a copy of trainer/engines/csrc, for the peer_kernels "
                    "side (git archive REV trainer/engines/csrc | tar -x -C DIR)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per side, interleaved: the same code's update "
                    "time differs by up to ~10%% from one process to the next (RESULTS, session 75), so a difference "
                    "smaller than that needs more rounds")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, in a child
    a = ap.parse_args()
    if a.side:
        print(json.dumps(measure(a.model, Path(a.models), a.reps, a.side, a.smoke, a.threads, a.batches,
                                 a.peer_kernels)))
        return 0
    if a.quick:  # under 5 minutes with SmolLM2 pulled: one batch per process (three took 8 min 52 s)
        a.reps, a.batches = 2, 1
    models = [a.model] if a.model else ["builtin:tiny-arith"] + (
        ["smollm2-135m"] if (Path(a.models) / "smollm2-135m").exists() else [])
    peers = [x for x in a.sides.split(",") if x != "ours"]
    if "peer_kernels" in peers and not (a.peer_kernels and (Path(a.peer_kernels) / "segment_attend.cpp").is_file()):
        ap.error("--sides peer_kernels needs --peer-kernels DIR, a copy of trainer/engines/csrc (no "
                 f"segment_attend.cpp in {a.peer_kernels!r})")
    sides = (peers + ["ours"]) * max(1, a.rounds)  # interleaved: load drift hits every side alike
    if a.smoke:
        a.reps, models = 1, [a.model or "builtin:tiny-arith"]
        peers = ["defaults", "unchunked", "torch_embedding", "torch_linear", "cached_prompt", "torch_clip",
                 "zeroed_grads", "fill_empty", "mkl_gemm", "onednn_gemm", "torch_softmax", "torch_swiglu",
                 "torch_segments"]
        sides = peers + ["ours"]
    last = {}
    for model in models:
        res = {}
        for side in sides:
            out = subprocess.run([sys.executable, __file__, "--side", side, "--model", model, "--models", a.models,
                                  "--reps", str(max(1, a.reps // max(1, a.rounds))), "--threads", str(a.threads),
                                  "--batches", str(a.batches)] + (["--smoke"] if a.smoke else [])
                                 + (["--peer-kernels", a.peer_kernels] if a.peer_kernels else []),
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            res.setdefault(side, []).append(r)
        med = {side: {k: statistics.median(x[k] for x in rs) for k in FIGURES} for side, rs in res.items()}
        ours = med["ours"]
        print(f"{model}: each process's median update (s), in run order: "
              + "; ".join(f"{side} " + " ".join(f"{x['update_s']:.3f}" for x in rs) for side, rs in res.items()),
              flush=True)
        for name, peer in ((n, med[n]) for n in peers):
            print(f"{model}: update {ours['update_s']:.3f} s ({name} {peer['update_s']:.3f} s), page faults "
                  f"{ours['faults']:.0f} ({peer['faults']:.0f}), system time {ours['sys_s']:.2f} s "
                  f"({peer['sys_s']:.2f} s) "
                  f"per update; peak RSS {ours['peak_rss_gb']:.2f} GB ({peer['peak_rss_gb']:.2f} GB); live groups per "
                  f"batch {res['ours'][0]['live_group_frac']}", flush=True)
        print(f"{model}: update {ours['update_gflops']:.1f} GFLOP/s; against the fp32 matmul peak measured around "
              f"each timing {ours['update_peak_frac']:.2f} (the run's peaks {ours['peak_gflops_low']:.1f}-"
              f"{ours['peak_gflops']:.1f} GFLOP/s; over the highest {ours['update_peak_frac_of_max']:.2f}) ("
              + ", ".join(f"{n} {med[n]['update_peak_frac']:.2f}" for n in peers) + "); "
              f"reference forward {ours['ref_peak_frac']:.2f}, critic's last-hidden forward "
              f"{ours['critic_peak_frac']:.2f} of it; {a.threads} thread(s); one update counted "
              f"{res['ours'][0]['counted_gflop']:.1f} GFLOP from the shapes, torch's FlopCounterMode "
              f"{res['ours'][0]['flop_counter_gflop']:.1f}", flush=True)
        print(f"{model}: its matrix products, each timed alone (warm operands, nothing between them), reach "
              f"{ours['matmul_alone_frac']:.2f} of that peak and would fill {ours['matmul_alone_share']:.2f} of the "
              "update's time: the rest is the products' slowdown in place and the work between them", flush=True)
        print(f"{model}: in place (every op of that update timed where it ran) its products ran at "
              f"{ours['products_in_place_frac']:.2f} of the peak and took {ours['products_op_share']:.2f} of the "
              f"ops' time (the ops {ours['ops_wall_share']:.2f} of the update's wall clock under the timer); the "
              "ops taking the most time: " + json.dumps(res["ours"][0]["top_ops"]), flush=True)
        print(f"{model}: the same products run again in their order with nothing between them reach "
              f"{ours['products_in_sequence_frac']:.2f} of the peak: against the in-place rate, what the work between "
              "them costs the products; against the alone rate, what their operands' coming from memory does",
              flush=True)
        print(f"{model}: of those ops' time, attention {ours['attention_op_share']:.2f} and the optimiser's step "
              f"{ours['optimizer_op_share']:.2f}; with its products, attention and optimiser step as fast as they ran "
              f"and everything else free, the update would reach {ours['update_ceiling_frac']:.2f} of the peak",
              flush=True)
        last[model] = med
    model, med = list(last.items())[-1]
    ours = med["ours"]
    spread = [x["update_s"] for x in res["ours"]]
    kv = [f"ours_s={ours['update_s']:.3f}", f"ours_s_spread={max(spread) / min(spread) - 1:.3f}",
          f"ours_faults={ours['faults']:.0f}",
          f"ours_rss_gb={ours['peak_rss_gb']:.2f}"]
    for n in peers:
        p = med[n]
        kv = ([f"update_speedup={p['update_s'] / ours['update_s']:.2f}"] if n == "defaults" else []) + kv + [
            f"{n}_speedup={p['update_s'] / ours['update_s']:.2f}", f"{n}_s={p['update_s']:.3f}",
            f"{n}_faults={p['faults']:.0f}", f"{n}_rss_gb={p['peak_rss_gb']:.2f}",
            f"{n}_peak_frac={p['update_peak_frac']:.3f}", f"{n}_ref_peak_frac={p['ref_peak_frac']:.3f}",
            f"{n}_critic_peak_frac={p['critic_peak_frac']:.3f}"]
    kv += [f"update_peak_frac={ours['update_peak_frac']:.3f}", f"peak_gflops={ours['peak_gflops']:.1f}",
           f"update_peak_frac_of_max={ours['update_peak_frac_of_max']:.3f}",
           f"peak_gflops_low={ours['peak_gflops_low']:.1f}",
           f"update_gflops={ours['update_gflops']:.1f}", f"ref_peak_frac={ours['ref_peak_frac']:.3f}",
           f"critic_peak_frac={ours['critic_peak_frac']:.3f}", f"matmul_alone_frac={ours['matmul_alone_frac']:.3f}",
           f"matmul_alone_share={ours['matmul_alone_share']:.3f}",
           f"products_in_place_frac={ours['products_in_place_frac']:.3f}",
           f"products_in_sequence_frac={ours['products_in_sequence_frac']:.3f}",
           f"products_op_share={ours['products_op_share']:.3f}",
           f"attention_op_share={ours['attention_op_share']:.3f}",
           f"optimizer_op_share={ours['optimizer_op_share']:.3f}",
           f"update_ceiling_frac={ours['update_ceiling_frac']:.3f}", f"threads={a.threads}", f"model={model}"]
    kv += [f"{m.split(':')[-1]}_{n}_speedup={md[n]['update_s'] / md['ours']['update_s']:.2f}"
           for m, md in last.items() for n in peers]
    print(" ".join(kv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
