"""Loss and advantage functions on hand-computed tensors."""
import math

import pytest
import torch

from trainer import algos
from trainer.datum_losses import DATUM_LOSSES

ONE = torch.ones(1, 3)  # a mask every token of the hand-made rows passes (broadcast)


def test_grpo_advantage_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = algos.adv_grpo(r, group_size=4)
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1] is sqrt(((.5^2)*4)/3)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + algos.EPS)
    assert torch.allclose(adv[:4], expected, atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4))  # a zero-variance group carries no signal


def test_dr_grpo_advantage_has_no_std():
    r = torch.tensor([3.0, 1.0, 2.0, 2.0])
    assert torch.allclose(algos.adv_grpo_no_std(r, 2), torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_clipped_loss_hand_computed():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old=0
    old = torch.zeros(1, 3)
    loss, clipped = algos.loss_clipped(logp, old, torch.tensor([2.0]), 0.2, 0.2, ONE)
    # A>0: min(r*A, clip(r)*A): 1.5 -> clip 1.2 -> 2.4; 0.5 -> 1.0 (unclipped smaller); 1.0 -> 2.0
    assert torch.allclose(loss, torch.tensor([[-2.4, -1.0, -2.0]]))
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]
    loss_neg, _ = algos.loss_clipped(logp, old, torch.tensor([-1.0]), 0.2, 0.2, ONE)
    # A<0: min(-r, -clip(r)): 1.5 -> -1.5; 0.5 -> clip 0.8 -> -0.8; 1.0 -> -1.0
    assert torch.allclose(loss_neg, torch.tensor([[1.5, 0.8, 1.0]]))


def test_clip_higher_is_asymmetric():
    logp = torch.log(torch.tensor([[1.5]]))
    loss, _ = algos.loss_clipped(logp, torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28, ONE)
    assert torch.allclose(loss, torch.tensor([[-1.28]]))


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    d = math.log(0.25) - math.log(0.5)
    assert algos.kl_k1(logp, ref).item() == pytest.approx(-d)
    assert algos.kl_k2(logp, ref).item() == pytest.approx(0.5 * d * d)
    assert algos.kl_k3(logp, ref).item() == pytest.approx(math.exp(d) - d - 1)
    assert algos.kl_k3(logp, logp).item() == 0.0


@pytest.mark.parametrize("name", sorted(algos.LOSS_AGG))
def test_microbatch_split_leaves_loss_and_grad_unchanged(name):
    torch.manual_seed(0)
    B, T = 6, 5
    x = torch.randn(B, T, requires_grad=True)
    mask = (torch.rand(B, T) > 0.3).float()
    mask[:, 0] = 1
    agg = algos.LOSS_AGG[name]
    n_tok, n_seq = int(mask.sum()), B
    full = agg(x, mask, n_tok, n_seq, T)
    (g_full,) = torch.autograd.grad(full, x)
    parts = sum(agg(x[i : i + 2], mask[i : i + 2], n_tok, n_seq, T) for i in range(0, B, 2))
    (g_parts,) = torch.autograd.grad(parts, x)
    assert torch.allclose(full, parts, atol=1e-6)
    assert torch.allclose(g_full, g_parts, atol=1e-6)


def test_token_mean_hand_computed():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert algos.agg_token_mean(x, m, 3, 2, 3).item() == pytest.approx(7 / 3)
    assert algos.agg_seq_mean_token_mean(x, m, 3, 2, 3).item() == pytest.approx((1.5 + 4) / 2)
    assert algos.agg_seq_mean_token_sum_norm(x, m, 3, 2, 3).item() == pytest.approx(7 / 6)


def test_ratio_one_no_kl_gradient_equals_reinforce_with_group_mean_baseline():
    """With one pass (ratio 1) and kl 0, GRPO's gradient is REINFORCE with a group-mean baseline
    (scaled per group by 1/std): d/dθ of -Σ A_i log π(y_i) / n_tokens."""
    torch.manual_seed(1)
    G, T = 4, 3
    theta = torch.randn(2 * G, T, requires_grad=True)  # stands in for per-token logits of the sampled tokens
    logp = torch.nn.functional.logsigmoid(theta)
    mask = torch.ones(2 * G, T)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    adv = algos.adv_grpo_no_std(rewards, G)
    pg, _ = algos.loss_clipped(logp, logp.detach(), adv, 0.2, 0.2, ONE)
    grpo = algos.agg_token_mean(pg, mask, int(mask.sum()), 2 * G, T)
    (g1,) = torch.autograd.grad(grpo, theta, retain_graph=True)
    baseline = rewards.view(-1, G).mean(1, keepdim=True).expand(-1, G).reshape(-1)
    reinforce = -((rewards - baseline).unsqueeze(-1) * logp).sum() / mask.sum()
    (g2,) = torch.autograd.grad(reinforce, theta)
    assert torch.allclose(g1, g2, atol=1e-6)


def test_registries_are_complete_and_callable():
    import typing

    from trainer.config import SEQUENCE_LOSSES, AlgoConfig

    for field, registry in (("advantage", algos.ADVANTAGES), ("policy_loss", algos.POLICY_LOSSES),
                            ("kl_estimator", algos.KL_ESTIMATORS), ("loss_agg", algos.LOSS_AGG)):
        assert set(typing.get_args(AlgoConfig.model_fields[field].annotation)) == set(registry), field
    assert set(SEQUENCE_LOSSES) <= set(algos.POLICY_LOSSES)
    assert set(algos.ADVANTAGES) == {"grpo", "grpo_batch_std", "grpo_no_std", "rloo"}
    assert set(algos.PREFERENCE_LOSSES) == {"sigmoid", "ipo"}
    assert set(algos.KL_ESTIMATORS) == {"k1", "k2", "k3"}
    assert all(callable(f) for f in algos.POLICY_LOSSES.values())


# ---------------------------------------------------------------------------------------------
# Advantage scaling variants, PPO pieces, preference losses, masks


def test_batch_std_scaling_uses_the_whole_batch():
    r = torch.tensor([1.0, 0.0, 3.0, 1.0])  # groups of 2: centred [.5, -.5, 1, -1]
    batch_std = r.std().item()  # unbiased std of [1, 0, 3, 1] = sqrt(1.5833...)
    assert batch_std == pytest.approx(math.sqrt((0.0625 + 1.5625 + 3.0625 + 0.0625) / 3))
    expected = torch.tensor([0.5, -0.5, 1.0, -1.0]) / (batch_std + algos.EPS)
    assert torch.allclose(algos.adv_grpo_batch_std(r, 2), expected, atol=1e-6)
    # per-group std would have made both groups +-0.707: batch scaling keeps the harder group's larger spread
    assert torch.allclose(algos.adv_grpo(r, 2).abs(), torch.full((4,), 1 / math.sqrt(2)), atol=1e-5)


def test_no_scaling_and_rloo_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.allclose(algos.adv_grpo_no_std(r, 4), torch.tensor([0.5, -0.5, -0.5, 0.5]))
    # leave-one-out: 1 - mean(0,0,1) = 2/3; 0 - mean(1,0,1) = -2/3
    assert torch.allclose(algos.adv_rloo(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_flat_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert algos.flat_groups(r, 2).tolist() == [True, False, True]
    # a group with one valid row has no signal; invalid rows do not count towards a spread
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    valid = torch.tensor([True, False, True, True, True, True])
    assert algos.flat_groups(r, 2, valid).tolist() == [True, False, False]
    assert algos.flat_groups(torch.tensor([0.3, 0.3, 0.7]), 3, torch.tensor([True, True, False])).tolist() == [True]


def test_final_token_rewards_land_on_the_last_completion_token():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    out = algos.final_token_rewards(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 2.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]


def test_gae_hand_computed():
    # one sequence of 3 tokens, reward 1 at the end, V = [0.5, 0.2, 0.4], gamma 0.9, lambda 0.5
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.4, 9.0]])  # the padded position's value must be ignored
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = algos.gae(r, v, m, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.4                     # last token: next value 0
    d1 = 0.0 + 0.9 * 0.4 - 0.2         # 0.16
    d0 = 0.0 + 0.9 * 0.2 - 0.5         # -0.32
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.2, a2 + 0.4, 0.0]]), atol=1e-6)
    # lambda = gamma = 1: advantage = Monte-Carlo return (the final reward) minus V
    adv1, _ = algos.gae(r, v, m, 1.0, 1.0)
    assert torch.allclose(adv1, torch.tensor([[0.5, 0.8, 0.6, 0.0]]), atol=1e-6)


def test_masked_whiten_hand_computed():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    out = algos.masked_whiten(x, m, (x * m).sum(), (x**2 * m).sum(), m.sum())
    assert torch.allclose(out, torch.tensor([[-1.0, 1.0, 0.0]]), atol=1e-4)


def test_value_clipping_hand_computed():
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.tensor([2.0, 0.0])
    # token 0: V moved +0.5, clipped to +0.2 -> 0.7: max((1-2)^2, (0.7-2)^2) = 1.69
    # token 1: V moved -0.5, clipped to 0.3: max(0, 0.09) = 0.09
    assert torch.allclose(algos.value_loss_clipped(v, old, ret, 0.2), 0.5 * torch.tensor([1.69, 0.09]))
    assert torch.allclose(algos.value_loss_clipped(v, old, ret, None), 0.5 * torch.tensor([1.0, 0.0]))


def test_dpo_loss_hand_computed_and_gradient_direction():
    pi_c = torch.tensor([-1.0], requires_grad=True)
    pi_r = torch.tensor([-2.0], requires_grad=True)
    ref_c, ref_r = torch.tensor([-1.5]), torch.tensor([-1.5])
    loss, margin = algos.pref_dpo_sigmoid(pi_c, pi_r, ref_c, ref_r, beta=0.5)
    # margin = (-1 + 1.5) - (-2 + 1.5) = 1; loss = -log sigmoid(0.5) = log(1 + e^-0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)))
    assert margin.item() == pytest.approx(0.5)
    loss.sum().backward()
    assert pi_c.grad.item() < 0 < pi_r.grad.item()  # descent raises chosen, lowers rejected
    ipo, _ = algos.pref_ipo(pi_c.detach(), pi_r.detach(), ref_c, ref_r, beta=0.5)
    assert ipo.item() == pytest.approx((1.0 - 1.0) ** 2)  # margin 1 = 1/(2 beta): IPO's target reached


def test_best_worst_pairs_skip_tied_groups():
    r = torch.tensor([0.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.2, 0.0, 0.9])
    best, worst = algos.best_worst_pairs(r, 3)
    assert best.tolist() == [1, 8] and worst.tolist() == [0, 7]


def test_overlong_filter_and_entropy():
    mask = torch.ones(2, 3)
    assert algos.overlong_filter(mask, torch.tensor([True, False])).tolist() == [[0, 0, 0], [1, 1, 1]]
    logits = torch.tensor([[[0.0, 0.0], [100.0, 0.0]]])  # uniform over 2, then near-deterministic
    ent = algos.entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(2)) and ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_bonus_raises_entropy():
    """With entropy_coef > 0 a gradient step on (loss - c * entropy) alone flattens the distribution."""
    logits = torch.tensor([[[2.0, 0.0, -1.0]]], requires_grad=True)
    mask = torch.ones(1, 1)
    ent = algos.entropy_from_logits(logits)
    loss = -0.1 * algos.agg_token_mean(ent, mask, 1, 1, 1)
    loss.backward()
    with torch.no_grad():
        after = algos.entropy_from_logits(logits - 1.0 * logits.grad)
    assert after.item() > ent.item()


def test_per_token_advantages_in_clipped_loss():
    logp = torch.zeros(1, 2)
    loss, _ = algos.loss_clipped(logp, logp, torch.tensor([[1.0, -2.0]]), 0.2, 0.2, ONE)
    assert loss.tolist() == [[-1.0, 2.0]]


def test_pass_at_k_unbiased_estimator_hand_computed():
    from trainer.evaluation import pass_at_k as _pass_at_k

    assert _pass_at_k(4, 0, 1) == 0.0 and _pass_at_k(4, 4, 2) == 1.0
    assert _pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert _pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2) / C(4,2) draws miss the one right sample
    assert _pass_at_k(16, 3, 4) == pytest.approx(1 - math.comb(13, 4) / math.comb(16, 4))


def test_grpo_gives_zero_advantage_to_equal_rewards_whatever_their_value():
    """0.1 is not exact in binary: a group of equal 0.1 rewards leaves ~1e-9 of round-off in r - mean,
    which divided by eps = 1e-6 was an advantage of ~1e-2 (a spurious push). Equal rewards mean none."""
    r = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.3, 0.1, 0.3, 0.1])
    adv = algos.ADVANTAGES["grpo"](r, 4)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert adv[4:].abs().min() > 0.5
    masked = algos.ADVANTAGES["grpo"](r, 4, torch.tensor([True] * 7 + [False]))
    assert torch.equal(masked[:4], torch.zeros(4)) and masked[7] == 0


# --------------------------------------------------------------------- every advantage, with a validity mask
def _reference_advantages(name: str, rewards: list[float], G: int, valid: list[bool]) -> list[float]:
    """Each estimator's paper formula over the VALID rows of each group, in plain Python: invalid rows
    and groups with fewer than two valid rows (or all valid rewards equal) get 0."""
    ok_all = [r for r, v in zip(rewards, valid) if v]
    mean_all = sum(ok_all) / len(ok_all) if ok_all else 0.0
    batch_std = math.sqrt(sum((x - mean_all) ** 2 for x in ok_all) / (len(ok_all) - 1)) if len(ok_all) > 1 else None
    out = []
    for g in range(len(rewards) // G):
        r, v = rewards[g * G:(g + 1) * G], valid[g * G:(g + 1) * G]
        ok = [x for x, keep in zip(r, v) if keep]
        n = len(ok)
        if n < 2:
            out += [0.0] * G
            continue
        mean = sum(ok) / n
        for x, keep in zip(r, v):
            if not keep:
                out.append(0.0)
            elif name == "grpo":
                std = math.sqrt(sum((y - mean) ** 2 for y in ok) / (n - 1))
                out.append(0.0 if max(ok) - min(ok) < algos.FLAT_EPS else (x - mean) / (std + algos.EPS))
            elif name == "grpo_no_std":
                out.append(x - mean)
            elif name == "grpo_batch_std":
                out.append((x - mean) / (batch_std + algos.EPS) if batch_std is not None else x - mean)
            elif name == "rloo":
                out.append(x - (sum(ok) - x) / (n - 1))
    return out


@pytest.mark.parametrize("name", sorted(algos.ADVANTAGES))
def test_every_advantage_equals_its_formula_over_the_valid_rows(name):
    gen = torch.Generator().manual_seed(0)
    G = 4
    for trial in range(40):
        rewards = torch.randint(0, 3, (5 * G,), generator=gen).double() / 2  # ties and flat groups are common
        valid = torch.rand(5 * G, generator=gen) > (0.0 if trial < 10 else 0.3)
        got = algos.ADVANTAGES[name](rewards, G, valid)
        want = torch.tensor(_reference_advantages(name, rewards.tolist(), G, valid.tolist()), dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-9), (name, trial, rewards, valid)
        assert torch.equal(got[~valid], torch.zeros(int((~valid).sum()), dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(algos.ADVANTAGES))
def test_all_valid_is_the_plain_formula_bit_for_bit(name):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.9, 0.4, 0.0])
    plain = algos.ADVANTAGES[name](rewards, 4)
    assert torch.equal(algos.ADVANTAGES[name](rewards, 4, None), plain)
    assert torch.equal(algos.ADVANTAGES[name](rewards, 4, torch.ones(12, dtype=torch.bool)), plain)


def test_masked_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])  # one group of 4; row 3 an infrastructure failure
    valid = torch.tensor([True, True, True, False])
    # valid rewards (1, 0, 1): mean 2/3, Bessel std sqrt(1/3)
    assert torch.allclose(algos.adv_grpo_no_std(r, 4, valid), torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0]))
    std = math.sqrt(1 / 3)
    assert torch.allclose(algos.adv_grpo(r, 4, valid),
                          torch.tensor([1 / 3 / (std + algos.EPS), -2 / 3 / (std + algos.EPS),
                                        1 / 3 / (std + algos.EPS), 0]))
    # leave-one-out over the valid rows: 1 - (0+1)/2, 0 - (1+1)/2
    assert torch.allclose(algos.adv_rloo(r, 4, valid), torch.tensor([0.5, -1.0, 0.5, 0.0]))
    assert torch.allclose(algos.adv_grpo_batch_std(r, 4, valid),
                          torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0]) / (std + algos.EPS))


# ---------------------------------------------------------------------------- per-datum losses (primitives)
def test_datum_cross_entropy_hand_computed():
    logp = torch.log(torch.tensor([0.5, 0.25, 0.125]))
    w = torch.tensor([0.0, 1.0, 2.0])
    loss = algos.datum_cross_entropy(logp, {"weights": w}, {})
    assert loss.sum().item() == pytest.approx(math.log(4) + 2 * math.log(8))


def test_datum_importance_sampling_hand_computed_and_its_gradient_is_the_policy_gradient():
    logp = torch.log(torch.tensor([0.5, 0.2])).requires_grad_()
    q = torch.log(torch.tensor([0.25, 0.2]))  # ratios 2 and 1
    adv = torch.tensor([3.0, -1.0])
    loss = algos.datum_importance_sampling(logp, {"logprobs": q, "advantages": adv}, {}).sum()
    assert loss.item() == pytest.approx(-(2 * 3.0) + 1.0)
    (g,) = torch.autograd.grad(loss, logp)  # d/dlogp of -(p/q) A = -(p/q) A
    assert torch.allclose(g, torch.tensor([-6.0, 1.0]))
    on_policy = logp.detach().clone().requires_grad_()  # q = p: -A, REINFORCE
    (g1,) = torch.autograd.grad(algos.datum_importance_sampling(
        on_policy, {"logprobs": on_policy.detach(), "advantages": adv}, {}).sum(), on_policy)
    assert torch.equal(g1, -adv)


def test_datum_ppo_hand_computed_with_default_and_custom_thresholds():
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0]))  # ratios against q = 1 (log 0)
    inputs = {"logprobs": torch.zeros(3), "advantages": torch.tensor([2.0, 2.0, -1.0])}
    cfg = DATUM_LOSSES["ppo"].config
    loss = algos.datum_ppo(logp, inputs, cfg)
    # A=2: min(1.5*2, 1.2*2) = 2.4; min(0.5*2, 0.8*2) = 1.0; A=-1, r=1: -1
    assert torch.allclose(loss, torch.tensor([-2.4, -1.0, 1.0]))
    wide = algos.datum_ppo(logp, inputs, {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    assert torch.allclose(wide, torch.tensor([-3.0, -1.0, 1.0]))


def test_every_datum_loss_names_a_function_and_tinkers_losses_are_all_served():
    import typing

    from tinker.types import LossFnType

    for name, loss in DATUM_LOSSES.items():
        assert callable(getattr(algos, loss.fn)), name
    sdk = set(typing.get_args(LossFnType))
    assert {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"} <= sdk & set(DATUM_LOSSES)
    # what the SDK names and this server does not serve (docs/tinker.md lists them): a 422 naming loss_fn
    assert sdk - set(DATUM_LOSSES) == {"gspo", "stable_reinforce", "custom"}


def test_datum_cispo_and_dro_hand_computed():
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0])).requires_grad_(True)  # ratios against q = 1 (log 0)
    inputs = {"logprobs": torch.zeros(3), "advantages": torch.tensor([2.0, 2.0, -1.0])}
    loss = algos.datum_cispo(logp, inputs, DATUM_LOSSES["cispo"].config)
    # weights clip(r, 0.8, 1.2) = 1.2, 0.8, 1.0, detached: -w * log p * A
    assert torch.allclose(loss, -torch.tensor([1.2, 0.8, 1.0]) * logp.detach() * inputs["advantages"])
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.allclose(g, -torch.tensor([1.2 * 2, 0.8 * 2, -1.0]))
    dro = algos.datum_dro(logp, inputs, {"beta": 0.5})
    # -(log p A - 0.25 (log p)^2)
    assert torch.allclose(dro, -(logp.detach() * inputs["advantages"] - 0.25 * logp.detach() ** 2))


def test_datum_loss_errors_name_each_field():
    from trainer.datum_losses import datum_loss_errors

    assert datum_loss_errors("ppo2", {}, [set()])[0] == (("loss_fn",), "loss_fn 'ppo2' is not served here; known: "
                                                         "cispo, cross_entropy, dro, importance_sampling, ppo")
    errs = datum_loss_errors("ppo", {"clip": 1.0}, [{"logprobs"}, {"logprobs", "advantages"}])
    assert [loc for loc, _ in errs] == [("loss_fn_config", "clip"), ("data", 0, "loss_fn_inputs", "advantages")]
    assert datum_loss_errors("cross_entropy", {}, [set()]) == []  # weights default to ones


# ----------------------------------------------------------------- what each KL estimator's gradient is
def _exact_expected_grad(loss_of_logp) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """E_{x ~ pi}[grad_theta loss(log pi(x), log ref(x))] exactly, over a 6-token categorical pi = softmax(theta):
    the loss is differentiated through the sampled token's log-prob, as the trainer does (x is data)."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    logp = torch.log_softmax(theta, 0)
    pi = logp.exp().detach()
    expected = sum(pi[x] * torch.autograd.grad(loss_of_logp(logp[x], ref[x]), theta, retain_graph=True)[0]
                   for x in range(6))
    reverse = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta, retain_graph=True)[0]  # KL(pi || ref)
    forward_kl = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)[0]                 # KL(ref || pi)
    return expected, reverse, forward_kl


def test_k1_in_the_loss_has_zero_gradient_in_expectation():
    g, reverse, _ = _exact_expected_grad(algos.kl_k1)
    assert g.abs().max() < 1e-12 and reverse.abs().max() > 1e-2


def test_k2_in_the_loss_gives_the_reverse_kl_gradient():
    g, reverse, forward_kl = _exact_expected_grad(algos.kl_k2)
    assert torch.allclose(g, reverse, atol=1e-12) and not torch.allclose(g, forward_kl, atol=1e-3)


def test_k3_in_the_loss_gives_the_forward_kl_gradient():
    g, reverse, forward_kl = _exact_expected_grad(algos.kl_k3)
    assert torch.allclose(g, forward_kl, atol=1e-12) and not torch.allclose(g, reverse, atol=1e-3)


def test_k1_in_the_reward_gives_reinforce_the_reverse_kl_gradient():
    """The reward r - beta * log(pi/ref) through the policy gradient: E[-(r - beta k1(x)) grad log pi(x)] with
    r = 0 is beta * grad KL(pi || ref) (the score function's expectation, k1 held as data)."""
    beta = 0.3
    g, reverse, _ = _exact_expected_grad(lambda lp, rf: -(-beta * algos.kl_k1(lp, rf).detach()) * lp)
    assert torch.allclose(g, beta * reverse, atol=1e-12)


def test_kl_in_the_reward_is_subtracted_before_the_group_baseline():
    from trainer.config import JobSpec
    from trainer.distributed import Dist
    from trainer.estimators import GroupBaseline

    spec = JobSpec.model_validate({"rollout": {"group_size": 2}, "algo": {"advantage": "grpo_no_std",
                                                                           "kl_coef": 0.5, "kl_in": "reward"}})
    est = GroupBaseline(spec, 8)
    assert est.needs_old  # the sampling policy's log-probs are needed for log(pi/ref)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kl_tok = torch.tensor([[0.2, 0.4, 9.0], [1.0, 9.0, 9.0]])  # masked entries must not count
    adv = est.prepare(None, torch.tensor([1.0, 1.0]), slice(0, 2), mask, None, kl_tok, Dist())
    # rewards 1 - 0.5 * 0.6 = 0.7 and 1 - 0.5 * 1.0 = 0.5; mean 0.6
    assert torch.allclose(adv, torch.tensor([0.1, -0.1]))
    loss_spec = JobSpec.model_validate({"rollout": {"group_size": 2}, "algo": {"kl_coef": 0.5}})
    assert GroupBaseline(loss_spec, 8).prepare(None, torch.tensor([1.0, 1.0]), slice(0, 2), mask, None, kl_tok,
                                               Dist()).abs().max() == 0  # kl_in: loss leaves the reward alone


# --------------------------------------------------------------------------- the policy losses of 2026
def _rows(ratios, old=None):
    old = torch.zeros(len(ratios), len(ratios[0]), dtype=torch.float64) if old is None else old
    logp = (torch.log(torch.tensor(ratios, dtype=torch.float64)) + old).requires_grad_(True)
    return logp, old


def test_cispo_hand_computed_keeps_every_tokens_gradient():
    logp, old = _rows([[1.5, 0.5, 1.0]])
    loss, clipped = algos.loss_cispo(logp, old, torch.tensor([2.0], dtype=torch.float64), 0.2, 0.2, torch.ones(1, 3))
    # weights sg(clip(r)): 1.2, 0.8, 1.0 times -A log pi (log pi = log r here, old = 0)
    want = -torch.tensor([1.2, 0.8, 1.0],
                         dtype=torch.float64) * 2.0 * torch.log(torch.tensor([1.5, 0.5, 1.0], dtype=torch.float64))
    assert torch.allclose(loss[0], want) and clipped.tolist() == [[1.0, 1.0, 0.0]]
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.allclose(g, -torch.tensor([[1.2, 0.8, 1.0]], dtype=torch.float64) * 2.0)  # PPO's clip would zero 1.5's


def test_gspo_hand_computed_one_ratio_per_sequence():
    logp, old = _rows([[2.0, 0.5, 7.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)  # token 3 of row 1 is padding
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, clipped = algos.loss_gspo(logp, old, adv, 0.2, 0.2, mask)
    # row 1: s = exp(mean(log 2, log 0.5)) = 1 -> -1 on every token; row 2: s = 1 -> +1
    assert torch.allclose(loss, torch.tensor([[-1.0] * 3, [1.0] * 3], dtype=torch.float64))
    logp2, _ = _rows([[2.0, 2.0, 1.0]])
    loss2, clipped2 = algos.loss_gspo(logp2, torch.zeros(1, 3, dtype=torch.float64), torch.tensor([1.0]), 0.2, 0.2,
                                      torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(loss2, torch.full((1, 3), -1.2, dtype=torch.float64)) and clipped2.all()  # s = 2 -> 1.2


def test_gspo_token_has_gspos_value_and_with_sequence_advantages_its_gradient():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=gen, dtype=torch.float64) - 2
    logp = (old + 0.05 * torch.randn(3, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.7, -1.1, 0.3], dtype=torch.float64)
    agg = lambda x: algos.agg_seq_mean_token_mean(x, mask, 0, 3, 0)  # noqa: E731
    seq, _ = algos.loss_gspo(logp, old, adv, 0.2, 0.2, mask)
    tok, _ = algos.loss_gspo_token(logp, old, adv, 0.2, 0.2, mask)
    assert torch.allclose(agg(seq), agg(tok))
    (g_seq,) = torch.autograd.grad(agg(seq), logp)
    (g_tok,) = torch.autograd.grad(agg(tok), logp)
    assert torch.allclose(g_seq, g_tok) and g_seq.abs().max() > 0


def test_gmpo_hand_computed_clips_in_log_space_on_the_binding_side():
    logp, old = _rows([[4.0, 0.25, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.float64)
    eps = math.e ** 0.4 - 1, 1 - math.e ** -0.4  # the paper's (e^-0.4, e^0.4)
    loss, clipped = algos.loss_gmpo(logp, old, torch.tensor([1.0], dtype=torch.float64), eps[1], eps[0], mask)
    # A > 0: min(log r, clip(log r)): log 4 -> 0.4, log 0.25 stays (below), 0 stays: rho = exp((0.4 + log .25) / 3)
    rho = math.exp((0.4 + math.log(0.25)) / 3)
    assert torch.allclose(loss, torch.full((1, 3), -rho, dtype=torch.float64)) and clipped.tolist() == [[1.0, 1.0, 0.0]]
    loss_neg, _ = algos.loss_gmpo(logp, old, torch.tensor([-1.0], dtype=torch.float64), eps[1], eps[0], mask)
    # A < 0: max(log r, clip(log r)): log 4 stays, log 0.25 -> -0.4, 0 stays
    assert torch.allclose(loss_neg, torch.full((1, 3), math.exp((math.log(4) - 0.4) / 3), dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(algos.POLICY_LOSSES))
def test_every_policy_loss_is_reinforce_at_ratio_one(name):
    """At pi = pi_old every loss's gradient is -A grad log pi (per token for token losses; the sequence's mean
    token for sequence losses, aggregated as they must be)."""
    gen = torch.Generator().manual_seed(1)
    logp = (torch.randn(4, 6, generator=gen, dtype=torch.float64) - 1).requires_grad_(True)
    mask = (torch.rand(4, 6, generator=gen) > 0.2).double()
    adv = torch.randn(4, generator=gen, dtype=torch.float64)
    loss, clipped = algos.POLICY_LOSSES[name](logp, logp.detach(), adv, 0.2, 0.2, mask)
    agg = lambda x: algos.agg_seq_mean_token_mean(x, mask, 0, 4, 0)  # noqa: E731
    (g,) = torch.autograd.grad(agg(loss), logp)
    (want,) = torch.autograd.grad(agg(-adv.unsqueeze(-1) * logp), logp)
    assert torch.allclose(g, want) and not (clipped * mask).any()


def test_sequence_losses_need_the_sequence_mean_aggregation():
    from pydantic import ValidationError

    from trainer.config import AlgoConfig

    with pytest.raises(ValidationError, match="needs loss_agg seq-mean-token-mean"):
        AlgoConfig(policy_loss="gspo")
    AlgoConfig(policy_loss="gspo", loss_agg="seq-mean-token-mean")
    AlgoConfig(policy_loss="gspo_token")  # per token: any aggregation


def test_mismatch_corrections_hand_computed():
    log_r = torch.log(torch.tensor([[2.0, 0.25, 1.0], [1.5, 1.5, 4.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 2's last token is padding: its ratio is not counted
    cap, low = 3.0, 0.5
    assert torch.allclose(algos.is_token_truncate(log_r, mask, cap, low),
                          torch.tensor([[2.0, 0.25, 1.0], [1.5, 1.5, 3.0]]))
    assert torch.allclose(algos.is_token_mask(log_r, mask, cap, low), torch.tensor([[2.0, 0.0, 1.0], [1.5, 1.5, 0.0]]))
    # sequence ratios: 2 * 0.25 * 1 = 0.5 and 1.5 * 1.5 = 2.25 (the padded 4 left out)
    assert torch.allclose(algos.is_sequence_truncate(log_r, mask, 2.0, low), torch.tensor([[0.5] * 3, [2.0] * 3]))
    assert torch.allclose(algos.is_sequence_mask(log_r, mask, 2.0, 0.6), torch.tensor([[0.0] * 3, [0.0] * 3]))
    assert torch.allclose(algos.is_sequence_mask(log_r, mask, cap, low), torch.tensor([[0.5] * 3, [2.25] * 3]))


def test_overlong_penalty_hand_computed():
    lengths = torch.tensor([10, 16, 20, 24, 32])
    # max 32, buffer 16: free up to 16 tokens, then -(len - 16) / 16 down to -1 at 32
    assert torch.allclose(algos.overlong_penalty(lengths, 32, 16), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))


@pytest.mark.parametrize("loss_fn", sorted(DATUM_LOSSES))
def test_every_datum_loss_runs_through_the_primitives_on_the_bundled_model(loss_fn, tiny_model):
    """What a session worker runs: TrainState.forward_backward sums the loss the record names over tokens and
    datums; its loss:sum equals the function applied to the returned log-probs (with its default config)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.primitives import Datum, TrainState

    st = TrainState(AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model))
    inputs = {"target_tokens": torch.tensor([5, 6, 7]), "weights": torch.tensor([0.0, 1.0, 1.0]),
              "logprobs": torch.tensor([-1.0, -2.0, -0.5]), "advantages": torch.tensor([0.5, -1.0, 2.0])}
    datum = Datum(torch.tensor([3, 5, 6]), {k: v for k, v in inputs.items() if k == "target_tokens"
                                            or k in DATUM_LOSSES[loss_fn].inputs})
    (lp,), m = st.forward_backward([datum], loss_fn, {}, backward=True)
    fn = getattr(algos, DATUM_LOSSES[loss_fn].fn)
    want = fn(lp, {k: v for k, v in datum.inputs.items() if k != "target_tokens"}, DATUM_LOSSES[loss_fn].config).sum()
    assert m["loss:sum"] == pytest.approx(float(want), rel=1e-5)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in st.params)
