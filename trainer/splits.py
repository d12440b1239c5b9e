"""A job's (train, held-out) samples, from whatever its ``data`` section names: a built-in task
(trainer.tasks) or a dataset file (trainer.tasks.files), with every question already in the form the
model sees (trainer.prompts)."""
from __future__ import annotations

from .data import DatasetError, Sample, _stable_key
from .tasks import task_for


def _source(ref: str, cfg, eval_only: bool = False) -> tuple[list[Sample], list[Sample]]:
    task = task_for(ref)
    if task is not None:
        return task.load(cfg)
    from .tasks.files import load_rows

    if eval_only:
        return [], load_rows(ref, cfg.fields, limit=cfg.eval_size)
    return load_rows_split(ref, cfg)


def load_rows_split(ref: str, cfg) -> tuple[list[Sample], list[Sample]]:
    """A file's (train, held-out): held-out by a hash of the prompt, stable across seeds and file order."""
    from .tasks.files import hash_split, load_rows, streamed

    if streamed(ref):  # parquet / arrow / CSV: read row by row, never the whole file
        return hash_split(ref, cfg)
    rows = sorted(load_rows(ref, cfg.fields), key=_stable_key)
    n = min(cfg.eval_size, max(1, len(rows) // 5))
    held, train = rows[:n], rows[n:]
    if not train:
        raise DatasetError(f"{ref}: too few samples to hold {n} out for eval")
    return (train[: cfg.train_size] if cfg.train_size else train), held


def load_splits(cfg) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out) for a job's ``data`` section (trainer.config.DataConfig), each question already
    in the form the model sees (system prompt, few-shot examples, answer-format instruction)."""
    from .prompts import format_prompts

    train, held = _source(cfg.dataset, cfg)
    if cfg.eval_dataset is not None:
        held = _source(cfg.eval_dataset, cfg, eval_only=True)[1][: cfg.eval_size]
    return format_prompts(train, held, task_for(cfg.dataset), cfg)
