"""What a step reports about its policy: entropy over every sampled row (the rows the update skips too),
maxima as maxima, clip statistics null where no clip can bind, and how far multi-pass updates move."""
from __future__ import annotations

import json

import pytest
import torch

from tests import scripted_engine
from trainer import engines
from trainer.config import JobSpec
from trainer.diagnostics import merge, policy_stats, ratio_stats
from trainer.loop import train

pytestmark = pytest.mark.slow


def test_merge_weights_means_by_tokens_and_keeps_maxima_and_minima():
    records = [{"entropy": (3.0, 3.0), "x_max": 1.0, "x_min": -1.0, "loss": 2.0},
               {"entropy": (300.0, 100.0), "x_max": 5.0, "x_min": -4.0, "loss": 4.0}]
    assert merge(records) == {"entropy": pytest.approx(303 / 103), "x_max": 5.0, "x_min": -4.0, "loss": 3.0}
    assert merge([{"clip_frac": None}, {"clip_frac": (1.0, 2.0)}]) == {"clip_frac": None}


def test_policy_and_ratio_stats_hand_computed():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    engine = torch.log(torch.tensor([[0.25, 0.25, 0.1]]))
    st = merge([policy_stats(logp, torch.tensor([[1.0, 3.0, 100.0]]), engine, mask)])
    assert st["entropy"] == pytest.approx(2.0)
    assert st["rollout/logp_abs_diff_max"] == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert st["rollout/is_ratio_mean"] == pytest.approx(1.5)  # ratios 2 and 1
    old = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))  # ratios new/old: 2 and 0.5
    clipped = torch.tensor([[1.0, 1.0, 1.0]])
    r = merge([ratio_stats(logp, old, clipped, mask, epoch=2)])
    assert r["update/ratio_max"] == pytest.approx(2.0) and r["update/ratio_min"] == pytest.approx(0.5)
    kl = ((2 - 1 - torch.log(torch.tensor(2.0))) + (0.5 - 1 - torch.log(torch.tensor(0.5)))) / 2
    assert r["update/approx_kl_epoch_2"] == pytest.approx(kl.item())
    assert (r["clip_frac"], r["clip_frac_low"], r["clip_frac_high"]) == (1.0, 0.5, 0.5)


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "hf", scripted_engine.ScriptedEngine)


def _rows(tmp_path, models_dir, **patch) -> list[dict]:
    spec = {"data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 12},
            "optim": {"lr": 1e-3}, "train": {"steps": 2, "prompts_per_step": 8, "eval_every": 0, "threads": 1}}
    for k, v in patch.items():
        spec[k] = {**spec.get(k, {}), **v}
    train(JobSpec.model_validate(spec), tmp_path, models_dir=models_dir, log=lambda m: None)
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]


def test_entropy_covers_the_rows_the_update_skips(tmp_path, models_dir, scripted):
    """Scripted groups are often all-wrong; with nothing but the policy term those rows skip the update,
    yet the reported entropy is over every sampled token of step 1, recomputed here with the starting model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.batch import forward
    from trainer.data import PromptStream
    from trainer.splits import load_splits

    rows = _rows(tmp_path, models_dir, train={"steps": 1})
    assert 0 < rows[0]["update/skipped_row_frac"] < 1
    job = JobSpec.model_validate({"data": {"eval_size": 8}})
    prompts = [p["prompt"] for p in PromptStream(load_splits(job.data)[0], seed=0).next_batch(8)]
    tok = AutoTokenizer.from_pretrained(models_dir / "tiny-arith")
    ro = scripted_engine.ScriptedEngine(None, tok).generate(prompts, 4, None)
    with torch.no_grad():
        fwd = forward(AutoModelForCausalLM.from_pretrained(models_dir / "tiny-arith"), ro, 1.0)
    m = ro.completion_mask.bool()
    assert rows[0]["entropy"] == pytest.approx(float(fwd.entropy[m].mean()), rel=1e-5)



def test_skipped_rows_take_the_samplers_entropy_without_a_forward(tmp_path, models_dir, monkeypatch):
    """Our sampler is the policy (synchronous, float32): it returns each position's entropy, so the rows the
    update skips need no forward of their own (the rollout browser shows their sampler log-probs), and the reported
    entropy is still over every sampled token — recomputed here with the starting model over the very rows
    step 1 sampled."""
    from transformers import AutoModelForCausalLM

    from trainer import online
    from trainer.batch import forward

    sampled, forwards = [], []

    class Recording(engines.HFEngine):
        def generate(self, prompts, n, params):
            ro = super().generate(prompts, n, params)
            if params.entropy:  # the training rollout's call (evaluation's do not ask)
                sampled.append(ro)
            return ro

    no_grad_forward = online._no_grad_forward
    monkeypatch.setitem(engines.ENGINES, "hf", Recording)
    monkeypatch.setattr(online, "_no_grad_forward", lambda *a, **kw: forwards.append(a) or no_grad_forward(*a, **kw))
    rows = _rows(tmp_path, models_dir, train={"steps": 1})
    skipped = round(rows[0]["update/skipped_row_frac"] * 8 * 4)
    assert forwards == [] and 0 < skipped < 8 * 4  # rows were skipped, and none of them ran forward
    assert len(sampled) == 1
    ro = sampled[0]
    with torch.no_grad():
        fwd = forward(AutoModelForCausalLM.from_pretrained(models_dir / "tiny-arith"), ro, 1.0)
    m = ro.completion_mask.bool()
    assert rows[0]["entropy"] == pytest.approx(float(fwd.entropy[m].mean()), rel=1e-5)


def test_sharded_updates_report_the_skipped_rows_once(tmp_path, models_dir, scripted, monkeypatch):
    """Sharded (FSDP) ranks skip no row in the update (every rank must run the same forwards: context.optimize),
    so the micro-batches report every row's entropy; a diagnostics forward of the skipped rows on top would
    count them twice (and run on some ranks only). One process flagged sharded reports what it reports
    unflagged."""
    from trainer import distributed

    plain = _rows(tmp_path / "plain", models_dir, train={"steps": 1})
    assert 0 < plain[0]["update/skipped_row_frac"] < 1
    init = distributed.Dist.__init__

    def sharded(self, *a, **kw):
        init(self, *a, **kw)
        self.sharded = True

    monkeypatch.setattr(distributed.Dist, "__init__", sharded)
    flagged = _rows(tmp_path / "sharded", models_dir, train={"steps": 1})
    assert flagged[0]["entropy"] == pytest.approx(plain[0]["entropy"], rel=1e-5)

def test_clip_statistics_are_null_in_a_single_pass_and_measured_in_several(tmp_path, models_dir, scripted):
    single = _rows(tmp_path / "one", models_dir)
    assert all(r["clip_frac"] is None and r["clip_frac_high"] is None for r in single)
    assert not any(k.startswith("update/approx_kl") for r in single for k in r)
    multi = _rows(tmp_path / "many", models_dir,
                  algo={"ppo_epochs": 3, "minibatch_size": 8, "clip_eps_low": 0.05, "clip_eps_high": 0.05})
    for r in multi:  # each epoch's drift from the sampling policy (the first minibatch alone is still at it)
        assert all(r[f"update/approx_kl_epoch_{e}"] > 0 for e in (1, 2, 3)) and "update/approx_kl_epoch_4" not in r
        assert r["update/ratio_min"] < 1 < r["update/ratio_max"]
        assert r["clip_frac"] > 0 and r["clip_frac"] == pytest.approx(r["clip_frac_low"] + r["clip_frac_high"])


def test_the_multipass_recipe_leaves_ratio_one_and_its_clip_binds(tmp_path, models_dir):
    """examples/jobs/demo-math-multipass.yaml (our own sampler, the tiny model): the ratio leaves 1 and the
    clip binds on both sides within two steps — clipping and clip-higher act there, as nowhere in one pass."""
    from service.cli.recipes import recipe

    spec = recipe("demo-math-multipass")
    spec["data"]["eval_size"] = 8
    spec["train"].update({"steps": 2, "eval_every": 0, "threads": 1})
    train(JobSpec.model_validate(spec), tmp_path, models_dir=models_dir, log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    for r in rows:
        assert r["update/ratio_min"] < 1 < r["update/ratio_max"] and r["update/approx_kl_epoch_2"] > 0
    assert any(r["clip_frac_low"] > 0 for r in rows) and any(r["clip_frac_high"] > 0 for r in rows)
