"""Built-in tasks and dataset files: deterministic, disjoint splits; the knobs a spec gives them; the
prompts the model sees; and answers judged by our verifiers the way the generator's own scorer judges them."""
from __future__ import annotations

import json

import pytest

from trainer.config import DataConfig
from trainer.data import DatasetError
from trainer.splits import load_splits
from trainer.tasks import tasks
from verifiers import get_verifier

RG = ["basic_arithmetic", "chain_sum", "gsm_symbolic", "countdown"]


def _cfg(dataset: str, **kw) -> DataConfig:
    return DataConfig.model_validate({"dataset": dataset, "eval_size": 40, "train_size": 120, **kw})


@pytest.mark.parametrize("name", RG + ["code_tiny", "arithmetic"])
def test_splits_are_deterministic_and_disjoint(name):
    train, held = load_splits(_cfg(f"builtin:{name}"))
    again = load_splits(_cfg(f"builtin:{name}"))
    assert [s["id"] for s in train] == [s["id"] for s in again[0]] and held == again[1]
    assert len(held) == 40 and (name == "arithmetic" or len(train) == 120)
    q = lambda s: json.dumps(s["prompt"])  # noqa: E731
    assert not {q(s) for s in train} & {q(s) for s in held}
    other = load_splits(_cfg(f"builtin:{name}", seed=1))[1]
    assert [s["id"] for s in other] != [s["id"] for s in held]  # data.seed picks other problems


@pytest.mark.parametrize("name", RG)
def test_gold_answers_pass_and_wrong_ones_fail_in_ours_and_reasoning_gyms_scorer(name):
    _, held = load_splits(_cfg(f"builtin:{name}", eval_size=25))
    ours = get_verifier("countdown" if name == "countdown" else "math", {})
    theirs = get_verifier("reasoning_gym", {})
    for s in held:
        ref = s["reference"]
        gold = "\\boxed{" + ref["entry"]["answer"] + "}"
        assert ours.verify(gold, ref).status.value == "correct", (s["prompt"], gold)
        assert theirs.verify(gold, ref).status.value == "correct", (s["prompt"], gold)
        wrong = "\\boxed{" + ("1+1" if name == "countdown" else "123456789") + "}"
        assert ours.verify(wrong, ref).status.value == "wrong" and theirs.verify(wrong, ref).score < 1


def test_task_params_set_difficulty_and_unknown_ones_are_refused():
    from trainer.tasks.code import params_error as code_params
    from trainer.tasks.reasoning import params_error

    train, _ = load_splits(_cfg("builtin:basic_arithmetic", params={"min_terms": 2, "max_terms": 2,
                                                                    "max_digits": 1}))
    assert all(s["reference"]["entry"]["metadata"]["num_terms"] == 2 for s in train)
    assert "unknown parameter(s) max_termz" in params_error("basic_arithmetic", {"max_termz": 3})
    assert params_error("chain_sum", {"min_terms": 5, "max_terms": 2}) is not None  # the generator's own check
    assert params_error("countdown", {"seed": 3}) is not None  # data.seed sets it, not params
    assert code_params("code_functions", {"difficulty": [4]}) is not None
    with pytest.raises(ValueError, match="unknown parameter"):
        load_splits(_cfg("builtin:gsm_symbolic", params={"hardness": 2}))


def test_prompts_system_few_shot_and_instruction():
    train, held = load_splits(_cfg("builtin:chain_sum", system_prompt="Be brief.", few_shot=2))
    p = held[0]["prompt"]
    assert [m["role"] for m in p] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p[0]["content"] == "Be brief." and p[-1]["content"].endswith("Put your final answer in \\boxed{}.")
    assert p[2]["content"].startswith("\\boxed{")
    shots = {p[1]["content"], p[3]["content"]}
    held_q = {h["prompt"][-1]["content"] for h in held}
    assert not shots & held_q  # worked examples come from the train split only
    assert all(h["prompt"][:5] == p[:5] for h in held)  # one shared prefix: prefilled once
    bare = load_splits(_cfg("builtin:arithmetic"))[1]
    assert isinstance(bare[0]["prompt"], str)  # nothing asked for: the tiny model's bare question
    custom = load_splits(_cfg("builtin:chain_sum", instruction="Answer in <answer> tags."))[1]
    assert custom[0]["prompt"][-1]["content"].endswith("Answer in <answer> tags.")


def test_humaneval_is_an_evaluation_set():
    train, held = load_splits(_cfg("builtin:code_tiny", eval_dataset="builtin:humaneval", eval_size=164))
    assert len(held) == 164 and held[0]["id"] == "HumanEval/0"
    assert held[0]["reference"]["entry_point"] == "has_close_elements" and "check" in held[0]["reference"]["test"]
    assert train and all(s["prompt"].startswith("code:") for s in train)


def test_registry_lists_every_task_once():
    names = set(tasks())
    assert set(RG) | {"arithmetic", "code_tiny", "humaneval", "code_functions", "code_stdio"} <= names


# ---------------------------------------------------------------------------------------- files
def _rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "uid": f"q{i}"} for i in range(n)]


def test_jsonl_with_a_field_mapping(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in _rows(30)) + "\n")
    fields = {"prompt": "question", "reference": "answer", "id": "uid"}
    train, held = load_splits(_cfg(str(f), fields=fields, eval_size=5, train_size=None))
    assert len(held) == 5 and len(train) == 25 and held[0]["id"].startswith("q")
    assert {s["reference"] for s in train + held} == {str(2 * i) for i in range(30)}
    with pytest.raises(DatasetError, match="no column 'answers' \\(data.fields.reference\\)"):
        load_splits(_cfg(str(f), fields={"prompt": "question", "reference": "answers"}))


@pytest.mark.parametrize("fmt", ["parquet", "csv", "arrow"])
def test_columnar_files_stream_through_datasets(tmp_path, fmt):
    import datasets

    ds = datasets.Dataset.from_list(_rows(400))
    f = tmp_path / f"qa.{fmt}"
    if fmt == "parquet":
        ds.to_parquet(str(f))
    elif fmt == "csv":
        ds.to_csv(str(f), index=False)
    else:
        import pyarrow as pa

        with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_stream(sink, ds.data.table.schema) as w:
            w.write_table(ds.data.table)
    cfg = _cfg(str(f), fields={"prompt": "question", "reference": ["answer", "uid"]}, eval_size=10, train_size=50)
    train, held = load_splits(cfg)
    assert len(held) == 10 and len(train) == 50  # read only as far as needed
    assert isinstance(train[0]["reference"], dict) and set(train[0]["reference"]) == {"answer", "uid"}
    assert not {s["prompt"] for s in train} & {s["prompt"] for s in held}
    assert load_splits(cfg) == (train, held)  # same file, same split
