"""Batches of (prompt, completion) token rows and the one forward pass every loss needs.

A :class:`trainer.rollout.Rollout` is the batch type: prompts left-padded, completions right-padded
(``select`` and ``concat`` are re-exported from there).
Offline preference pairs are encoded into the same layout, so online and offline data share code.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .logprobs import logp_and_entropy
from .models import attention, segments
from .rollout import Rollout, cache_arg, concat, left_pad, left_pad_mask, new_cache, render_prompt, select, trim  # noqa: F401 - re-exported: the batch helpers callers import from here


@dataclass
class Forward:
    logp: torch.Tensor                  # (B, T) log p of each completion token
    entropy: torch.Tensor | None        # (B, T) (differentiable only when asked; None when not asked for)
    hidden: torch.Tensor | None = None  # (B, T, H) last hidden state before each completion token


def forward(model, ro: Rollout, temperature: float, *, hidden: bool = False,
            entropy_grad: bool = False, share_prompts: bool = True, entropy: bool = True) -> Forward:
    """One forward over prompt+completion; outputs are aligned with the completion tokens.

    Rows that share a prompt (a GRPO group, a preference pair) share its forward: each distinct
    prompt runs once, its KV cache is gathered to the rows, and only the completions run per row.
    Same numbers as one forward per row (tests/test_batch.py), gradients included — they flow back
    through the gathered cache and sum over the rows — at a fraction of the compute when prompts are
    long next to completions (G=16, 40-token prompts, 12-token completions: 3-4x fewer tokens). On the CPU,
    for the Llama-like models trainer/models/segments.py lists, that is one model call over one packed row of
    the real tokens (``_segment_forward``); elsewhere two, the completions over a cache of the prompts.
    ``entropy=False`` (a no-grad forward whose caller reads log p only): ``Forward.entropy`` is None.
    """
    logits, h = _outputs(model, ro, hidden, share_prompts, with_logits=True)
    targets = ro.completion_ids.to(logits.device)
    if logits.dim() == 2:  # (n, V): the completion tokens' rows only (_head_rows); padding reads 0
        tokens = ro.completion_mask.bool().to(logits.device)
        logp, ent = logp_and_entropy(logits, targets[tokens], temperature, entropy_grad, entropy=entropy)
        return Forward(_scatter(logp, tokens), None if ent is None else _scatter(ent, tokens), h)
    # a few rows of the vocabulary at a time: the logits and their gradient are the only (B, T, V) tensors
    t = logits.shape[1]  # the columns the forward ran (_unpadded): the rest is padding, read as 0
    logp, ent = logp_and_entropy(logits, targets[:, :t], temperature, entropy_grad, entropy=entropy)
    T = targets.shape[1]
    return Forward(_widen(logp, T), None if ent is None else _widen(ent, T), h)


def _widen(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, t, ...) to (B, T, ...), zeros in the new columns."""
    if x.shape[1] == T:
        return x
    pad = [0, 0] * (x.dim() - 2) + [0, T - x.shape[1]]
    return torch.nn.functional.pad(x, pad)


def _unpadded(ro: Rollout) -> Rollout:
    """``ro`` without the padding columns no row uses: a subset of a batch's rows (a micro-batch, the rows a
    diagnostics forward takes) keeps the whole batch's widths, set by its longest prompt and completion, and
    a forward would compute every column. Unchanged when a side would have no column left."""
    t = trim(ro)
    return t if t.prompt_ids.shape[1] and t.completion_ids.shape[1] else ro


def _scatter(x: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(n,) values into a (B, T) zero tensor at the n True positions of ``where`` (differentiable)."""
    return x.new_zeros(where.shape).masked_scatter(where, x)


@contextmanager
def _head_rows(model, rows: torch.Tensor | None):
    """The output layer over the positions ``rows`` (B, T) names only, as one (n, H) product: its logits come
    back (n, V). A right-padded completion's padding predicts nothing we score, yet costs a full row of the
    output layer (SmolLM2: 49,152 x 576, a fifth of a completion token's products), the vocabulary's softmax
    and, in an update, both again in the backward; math completions are often half padding. The model's
    own code after its head (a softcap, a scale) is elementwise and sees the (n, V) rows alike. Nothing
    changes when every position is kept, the model has no separate output layer, or its input is not the
    (B, T, H) the positions describe (then the logits stay (B, T, V))."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if rows is None or head is None or bool(rows.all()):
        yield
        return

    def select_rows(module, args):
        if len(args) != 1 or args[0].dim() != 3 or args[0].shape[:2] != rows.shape:
            return None
        return (args[0][rows.to(args[0].device)],)

    handle = head.register_forward_pre_hook(select_rows)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def _real_rows(model, keep: torch.Tensor | None):
    """Each decoder layer's MLP and attention projections over the positions ``keep`` (B, L) marks only, as
    (n, H) products: a batch's completions are right-padded to its longest, and the padding ran every layer's
    products forward and backward (real math on SmolLM2-135M: 22-40% of the completion pass's positions). The
    rest of a layer (norms, rotary embedding, attention, the residual stream) keeps the (B, L) layout, so the
    cache and the masks are untouched; what the products return for a skipped position is zero. Skipped: the
    positions that predict no scored token and that no kept position reads as a key (right padding attends to
    nothing after it; left padding is masked), so the kept positions' outputs and gradients are the same sums.
    Nothing changes when every position is kept or the model's layers are not laid out as ``layers[i].mlp`` /
    ``layers[i].self_attn``; a module whose input is not the (B, L, H) the positions describe runs whole."""
    layers = None
    if keep is not None and keep.device.type != "meta" and not bool(keep.all()):
        layers = _decoder_layers(model)
    if not layers:
        yield
        return
    shape = keep.shape
    idx = keep.reshape(-1).nonzero().squeeze(1).to(next(model.parameters()).device)

    gathered: dict[torch.nn.Module, torch.Tensor] = {}  # each module's input this call, where gathered
    last: list = [None, None]  # (input, its gathered rows): the query, key and value projections share one

    def gather(module, args):
        if len(args) != 1 or args[0].dim() != 3 or args[0].shape[:2] != shape:
            return None
        if last[0] is not args[0]:
            last[:] = args[0], args[0].reshape(-1, args[0].shape[-1]).index_select(0, idx)
        gathered[module] = last[1]
        return (last[1],)

    def scatter(module, args, out):
        if not args or gathered.pop(module, None) is not args[0] or not isinstance(out, torch.Tensor):
            return None  # the pre-hook left this call whole
        return out.new_zeros(shape.numel(), out.shape[-1]).index_copy(0, idx, out).view(*shape, out.shape[-1])

    modules = []
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        modules += [m for m in (getattr(layer, "mlp", None),) if isinstance(m, torch.nn.Module)]
        modules += [m for m in (attn.children() if attn is not None else ()) if hasattr(m, "out_features")]
    handles = [h for m in modules if _entries(m) >= MIN_UNPAD_ENTRIES
               for h in (m.register_forward_pre_hook(gather), m.register_forward_hook(scatter))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# A module whose weights hold fewer entries than this runs whole: its rows' gather and scatter (forward and
# backward) and the hooks cost about what skipping the padding saves. Measured on the tiny model (10% padding):
# its MLP (147,456 entries) 1.03x faster over a whole update, its 16,384-entry attention projections 0.94x as
# fast in a forward; SmolLM2-135M's projections (110,592-331,776) took its update from 1.16x to 1.24x.
MIN_UNPAD_ENTRIES = 65536


def _entries(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.dim() == 2)


def _decoder_layers(model) -> list | None:
    get = getattr(model, "get_decoder", None)
    layers = getattr(get(), "layers", None) if get is not None else None
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else None


def last_hidden(model, ro: Rollout, share_prompts: bool = True) -> torch.Tensor:
    """(B, T, H) last hidden state before each completion token, for a value head (a separate
    critic): the same forward without the LM head over the completions or any softmax."""
    return _outputs(model, ro, True, share_prompts, with_logits=False)[1]


def _outputs(model, ro: Rollout, hidden: bool, share_prompts: bool, with_logits: bool):
    """Logits predicting each completion token (None unless ``with_logits``): (n, V) over the n completion
    tokens (_head_rows), or (B, t, V) over the first t columns, those some row uses (_unpadded); and (B, T, H)
    hidden states (None unless ``hidden``), zero in the columns no row uses."""
    T = ro.completion_ids.shape[1]
    ro = _unpadded(ro)
    head_rows = ro.completion_mask.bool() if with_logits else None
    logits, h = _outputs_of(model, ro, hidden, share_prompts, with_logits, head_rows)
    return logits, (_widen(h, T) if h is not None else None)


def _outputs_of(model, ro: Rollout, hidden: bool, share_prompts: bool, with_logits: bool,
                head_rows: torch.Tensor | None):
    dev = next(model.parameters()).device
    P = ro.prompt_ids.shape[1]
    T = ro.completion_ids.shape[1]
    uniq = inv = None
    if share_prompts and getattr(model, "rlvr_share_prompts", True) and not _checkpointing(model):
        uniq, inv = torch.unique(torch.cat([ro.prompt_ids, ro.prompt_mask], dim=1), dim=0, return_inverse=True)
    unpad = getattr(model, "rlvr_unpad", True) and not _checkpointing(model)  # (recomputing needs the same shapes)
    if uniq is not None and len(uniq) < len(inv) and P > 1:  # (a one-token prompt has nothing to run alone)
        if unpad and getattr(model, "rlvr_segments", True) and segments.eligible(model):
            out = _segment_forward(model, ro, uniq[:, :P], uniq[:, P:], inv, hidden, with_logits, dev)
            if out is not None:
                return out
        return _shared_prompt_forward(model, ro, uniq[:, :P], uniq[:, P:], inv, hidden, with_logits, dev, head_rows,
                                      unpad)
    # the completion's last token predicts nothing we score: it is left out
    ids = torch.cat([ro.prompt_ids, ro.completion_ids[:, :-1]], dim=1).to(dev)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], dim=1)[:, :-1].to(dev)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at each prompt's 1st token
    # lm_head only over the positions that predict completion tokens (the prompt's last one onward):
    # with a 50k vocabulary the prompt's logits would dominate the memory of the whole forward
    # the positions to compute: the prompts' tokens and those predicting a completion token
    keep = torch.cat([ro.prompt_mask, ro.completion_mask[:, 1:]], dim=1).bool() if unpad else None
    with _head_rows(model, head_rows), _real_rows(model, keep):
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=hidden,
                    logits_to_keep=T if with_logits else torch.empty(0, dtype=torch.long, device=dev))
    h = out.hidden_states[-1][:, P - 1 :] if hidden else None
    return (out.logits if with_logits else None), h


def _shared_prompt_forward(model, ro: Rollout, p_ids, p_mask, inv, hidden: bool, with_logits: bool, dev,
                           head_rows: torch.Tensor | None, unpad: bool):
    # The prompts run once without their last token, whose logits predict the first completion token: it
    # runs per row at the head of the completion pass, so every logit comes from one output-layer product.
    # Computed in the prompt pass instead, those few rows' logits cost the backward a second output-layer
    # weight gradient — a product of a few rows' depth that MKL runs far below its speed (0.22 s on
    # SmolLM2's 49,152 x 576, for 2 prompts) — and the sum of the two (another 0.22 s).
    cache = new_cache(model)
    P = ro.prompt_ids.shape[1]
    p_keep = p_mask[:, :-1].bool() if unpad else None  # read here, where the mask holds values (not on meta)
    p_mask = p_mask.to(dev)
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    arg = cache_arg(model)
    none = torch.empty(0, dtype=torch.long, device=dev)  # the prompt pass keeps no logits at all
    with _real_rows(model, p_keep):
        model(input_ids=p_ids[:, :-1].to(dev), attention_mask=p_mask[:, :-1], position_ids=p_pos[:, :-1],
              use_cache=True, logits_to_keep=none, **{arg: cache})
    inv = inv.to(dev)
    cache.batch_select_indices(inv)  # each row gets its prompt's keys/values (differentiable gather)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], dim=1).to(dev)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    # [the prompt's last token, the completion but its last token]: the positions that predict the completion
    ids = torch.cat([ro.prompt_ids[:, -1:], ro.completion_ids[:, :-1]], dim=1).to(dev)
    # the completion pass computes the positions predicting a completion token (the hidden states' too)
    with _head_rows(model, head_rows), _real_rows(model, ro.completion_mask.bool() if unpad else None):
        comp = model(input_ids=ids, attention_mask=attn[:, :-1], position_ids=pos[:, P - 1 : -1], use_cache=True,
                     output_hidden_states=hidden, logits_to_keep=0 if with_logits else none, **{arg: cache})
    return (comp.logits if with_logits else None), (comp.hidden_states[-1] if hidden else None)


def _segment_forward(model, ro: Rollout, p_ids, p_mask, inv, hidden: bool, with_logits: bool, dev):
    """The shared-prompt forward as one model call over one row of the real tokens (trainer/models/segments.py):
    each distinct prompt but its last token, then each row's [prompt's last token, completion but its last token].
    Logits (n, V) over the completion tokens, row by row, and hidden states (B, T, H), zero at the padding. None
    where the batch is not laid out as the segments expect (left-padded prompts of at least one token,
    right-padded completions, some completion token)."""
    p_mask, c_mask = p_mask.bool(), ro.completion_mask.bool()
    p_len, c_len = p_mask.sum(1), c_mask.sum(1)
    T = c_mask.shape[1]
    if (not bool((p_mask[:, 1:] >= p_mask[:, :-1]).all()) or not bool((c_mask[:, 1:] <= c_mask[:, :-1]).all())
            or not bool((p_len > 0).all()) or not int(c_len.sum())):
        return None
    p_part = p_mask.clone()
    p_part[:, -1] = False  # the prompt's last token leads its rows' completion part
    p_pos = (p_part.cumsum(1) - 1)[p_part]
    c_ids = torch.cat([p_ids[inv, -1:], ro.completion_ids[:, :-1]], dim=1)[c_mask]
    c_pos = ((p_len[inv] - 1)[:, None] + torch.arange(T))[c_mask]
    ids = torch.cat([p_ids[p_part], c_ids])[None].to(dev)
    pos = torch.cat([p_pos, c_pos])[None].to(dev)
    segs = segments.Segments.build(p_len - 1, inv, c_len)  # on the CPU, where segments.eligible holds
    n_comp = segs.n - segs.n_prompt
    none = torch.empty(0, dtype=torch.long, device=dev)
    whole = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=dev)  # a 4-D mask is taken as given: no mask is built
    with attention.shared_prompt_attention(model) as ours:
        if not ours:
            return None
        out = model(input_ids=ids, attention_mask=whole, position_ids=pos, use_cache=False,
                    output_hidden_states=hidden, logits_to_keep=n_comp if with_logits else none,
                    **{attention.SEGMENTS: segs})
    h = None
    if hidden:
        rows = out.hidden_states[-1][0, segs.n_prompt:]
        where = c_mask.reshape(-1).nonzero().squeeze(1).to(dev)
        h = rows.new_zeros(c_mask.numel(), rows.shape[-1]).index_copy(0, where, rows).view(*c_mask.shape, -1)
    # squeeze, a view: indexing [0] would backpropagate through a zero (1, n, V) tensor and a copy into it
    return (out.logits.squeeze(0) if with_logits else None), h


def _checkpointing(model) -> bool:
    """Activation checkpointing recomputes forwards, which a cache shared across them would break."""
    on = getattr(model, "is_activation_checkpointing", None)  # transformers 5's name
    return bool(on if on is not None else getattr(model, "is_gradient_checkpointing", False))


def encode(tokenizer, prompts: Sequence[Any], completions: Sequence[str]) -> Rollout:
    """Tokenise fixed (prompt, completion) pairs into the rollout layout; EOS closes each completion."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    p_ids = [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
    c_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] + [eos] for c in completions]
    T = max(map(len, c_ids))
    prompt_ids, prompt_mask = left_pad(p_ids, pad), left_pad_mask(p_ids, 0)
    comp_ids = torch.tensor([x + [pad] * (T - len(x)) for x in c_ids])
    comp_mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in c_ids])
    return Rollout(prompt_ids, prompt_mask, comp_ids, comp_mask, list(completions),
                   torch.zeros(len(c_ids), dtype=torch.bool))


def width(ro: Rollout) -> int:
    """Padded tokens per row of a forward over ``ro``: prompt width + completion width."""
    return ro.prompt_ids.shape[1] + ro.completion_ids.shape[1]


def chunks(idx: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """Split indices into consecutive chunks of at most ``size`` (None = one chunk)."""
    if size is None or size >= len(idx):
        return [idx]
    return list(idx.split(size))
