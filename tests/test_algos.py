"""Loss and advantage functions on hand-computed tensors."""
import math

import pytest
import torch

from trainer import algos


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
    loss, clipped = algos.loss_clipped(logp, old, torch.tensor([2.0]), 0.2, 0.2)
    # A>0: min(r*A, clip(r)*A): 1.5 -> clip 1.2 -> 2.4; 0.5 -> 1.0 (unclipped smaller); 1.0 -> 2.0
    assert torch.allclose(loss, torch.tensor([[-2.4, -1.0, -2.0]]))
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]
    loss_neg, _ = algos.loss_clipped(logp, old, torch.tensor([-1.0]), 0.2, 0.2)
    # A<0: min(-r, -clip(r)): 1.5 -> -1.5; 0.5 -> clip 0.8 -> -0.8; 1.0 -> -1.0
    assert torch.allclose(loss_neg, torch.tensor([[1.5, 0.8, 1.0]]))


def test_clip_higher_is_asymmetric():
    logp = torch.log(torch.tensor([[1.5]]))
    loss, _ = algos.loss_clipped(logp, torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28)
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
    pg, _ = algos.loss_clipped(logp, logp.detach(), adv, 0.2, 0.2)
    grpo = algos.agg_token_mean(pg, mask, int(mask.sum()), 2 * G, T)
    (g1,) = torch.autograd.grad(grpo, theta, retain_graph=True)
    baseline = rewards.view(-1, G).mean(1, keepdim=True).expand(-1, G).reshape(-1)
    reinforce = -((rewards - baseline).unsqueeze(-1) * logp).sum() / mask.sum()
    (g2,) = torch.autograd.grad(reinforce, theta)
    assert torch.allclose(g1, g2, atol=1e-6)


def test_registries_are_complete_and_callable():
    assert set(algos.ADVANTAGES) == {"grpo", "grpo_no_std"}
    assert set(algos.KL_ESTIMATORS) == {"k1", "k2", "k3"}
    assert all(callable(f) for f in algos.POLICY_LOSSES.values())
