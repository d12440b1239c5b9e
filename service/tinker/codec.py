"""The SDK's binary wire format for the two large messages: forward_backward requests in, and
ForwardBackwardOutput / SampleResponse out (protobuf; the SDK refuses these two as JSON).

The message definitions come from the ``tinker`` package itself (its generated ``tinker_public_pb2``,
Apache-2.0, installed with ``pip install rlvr[tinker]``), so the server decodes exactly what the
official SDK encodes. Everything a request carries is checked here and refused with a
:class:`WireError` naming the field: sizes, dtypes, shapes, token ids against the vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_DATUMS = 4096
MAX_TOKENS = 65_536  # per datum
LOSS_INPUT_DTYPES = {"target_tokens": "int64", "weights": "float32", "logprobs": "float32", "advantages": "float32"}


class WireError(ValueError):
    """A request the server refuses; ``loc`` names the field (a 422 like any other bad input)."""

    def __init__(self, loc: tuple, msg: str):
        super().__init__(msg)
        self.loc, self.msg = loc, msg

    def errors(self) -> list[dict[str, Any]]:
        return [{"loc": ["body", *self.loc], "type": "value_error", "msg": self.msg}]


def _pb():
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as e:  # pragma: no cover - the [tinker] extra is part of the test extra
        raise RuntimeError("the training primitives need the tinker package: pip install 'rlvr[tinker]'") from e
    return tinker_public_pb2


@dataclass
class WireDatum:
    tokens: np.ndarray                                      # (N,) int64
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N,) (target_tokens int64, rest float32)


@dataclass
class FwdBwd:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    data: list[WireDatum]


def _tensor(t, loc: tuple, n: int) -> np.ndarray:
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if t.dtype not in dtypes:
        raise WireError(loc, "dtype must be float32 or int64")
    dt = np.dtype(dtypes[t.dtype])
    shape = list(t.shape)
    if len(shape) > 1:
        raise WireError(loc, f"shape {shape}: only one value per position (N,) is supported by this server")
    which = t.WhichOneof("encoding")
    if which == "sparse_csr":  # a 1-D tensor is never sent sparse by the SDK; refuse rather than guess
        raise WireError(loc, "sparse tensors are only for 2-D inputs, which this server does not support")
    raw = t.dense if which == "dense" else b""
    if len(raw) % dt.itemsize:
        raise WireError(loc, "byte length is not a multiple of the dtype's size")
    arr = np.frombuffer(raw, dtype=dt)
    if shape and shape[0] != len(arr):
        raise WireError(loc, f"shape {shape} does not match its {len(arr)} values")
    if len(arr) != n:
        raise WireError(loc, f"has {len(arr)} values; the datum's model_input has {n} tokens (one per position)")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise WireError(loc, "values must be finite (no NaN or infinity)")
    return arr


MAX_SEQ = 2**31 - 1  # seq_id is a 32-bit column


def decode_forward_backward(body: bytes, limits_of) -> FwdBwd:
    """Parse and check a forward_backward request; ``limits_of(model_id)`` -> (vocabulary, context) bounds
    the token ids and each datum's length."""
    from google.protobuf.message import DecodeError

    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError):
        raise WireError((), "not a forward_backward request (protobuf)") from None
    if not msg.model_id:
        raise WireError(("model_id",), "required")
    if not 1 <= msg.seq_id <= MAX_SEQ:
        raise WireError(("seq_id",), f"must be 1 to {MAX_SEQ}")
    if not 1 <= len(msg.data) <= MAX_DATUMS:
        raise WireError(("data",), f"send 1 to {MAX_DATUMS} datums per request")
    cfg: dict[str, float] = {}
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") != "number":
            raise WireError(("loss_fn_config", k), "must be a number")
        cfg[k] = v.number
    if not msg.loss_fn_config_v2:
        cfg = dict(msg.loss_fn_config)
    for k, v in cfg.items():
        if not math.isfinite(v):
            raise WireError(("loss_fn_config", k), "must be finite")
    vocab, context = limits_of(msg.model_id)
    longest = min(MAX_TOKENS, context)
    data = []
    for i, d in enumerate(msg.data):
        toks = []
        for j, chunk in enumerate(d.model_input):
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise WireError(("data", i, "model_input", j), "only token chunks (EncodedTextChunk) are supported")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise WireError(("data", i, "model_input", j), "tokens must be int32")
            toks.append(np.frombuffer(raw, dtype=np.int32))
        tokens = np.concatenate(toks).astype(np.int64) if toks else np.zeros(0, dtype=np.int64)
        if not 1 <= len(tokens) <= longest:
            raise WireError(("data", i, "model_input"), f"{len(tokens)} tokens: send 1 to {longest} (the model's "
                            f"context is {context})")
        inputs = {}
        for name, t in d.loss_fn_inputs.items():
            if name not in LOSS_INPUT_DTYPES:
                raise WireError(("data", i, "loss_fn_inputs", name),
                                f"unknown loss input; known: {', '.join(sorted(LOSS_INPUT_DTYPES))}")
            arr = _tensor(t, ("data", i, "loss_fn_inputs", name), len(tokens))
            inputs[name] = arr.astype(np.int64 if LOSS_INPUT_DTYPES[name] == "int64" else np.float32)
        for name, ids in (("model_input", tokens), ("target_tokens", inputs.get("target_tokens"))):
            if ids is not None and len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                loc = ("data", i, name) if name == "model_input" else ("data", i, "loss_fn_inputs", name)
                raise WireError(loc, f"token ids must be in [0, {vocab}) (the model's vocabulary)")
        if "target_tokens" not in inputs:
            raise WireError(("data", i, "loss_fn_inputs", "target_tokens"), "required")
        data.append(WireDatum(tokens, inputs))
    return FwdBwd(msg.model_id, msg.seq_id, msg.loss_fn, cfg, msg.forward_only, data)


def encode_forward_backward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """One ArrayRecord holding each datum's ``logprobs`` (float32, (N_d,)), and the metrics."""
    pb = _pb()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    rec = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(logprobs))
    parts = [np.asarray(x, dtype=np.float32) for x in logprobs]
    offsets = np.cumsum([0] + [p.nbytes for p in parts]).astype(np.int64)
    bt = rec.fields["logprobs"]
    bt.data, bt.offsets, bt.dtype = b"".join(p.tobytes() for p in parts), offsets.tobytes(), pb.DTYPE_FLOAT32
    return out.SerializeToString()


def encode_sample_response(sequences: list[tuple[list[int], list[float], bool]],
                           prompt_logprobs: list[float] | None) -> bytes:
    """``sequences``: (tokens, their log-probs, stopped on a stop token); prompt log-probs NaN where none."""
    pb = _pb()
    out = pb.SampleResponse()
    for tokens, lps, stopped in sequences:
        out.sequences.add(stop_reason=pb.STOP_REASON_STOP if stopped else pb.STOP_REASON_LENGTH,
                          tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
                          logprobs=np.asarray(lps, dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()
