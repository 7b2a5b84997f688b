"""KTAE, key-token advantage estimation (Sun et al. 2025, "KTAE: A Model-Free Algorithm to Key-Tokens Advantage
Estimation in Mathematical Reasoning"; code: github.com/xiaolizh1/KTAE), a group method: each token id's
association with a correct outcome, measured over its prompt's group of rollouts, is added to the rollout's
advantage.

For a group with correct rollouts C = {i: r_i > 0} and wrong ones W = {i: r_i <= 0} (an unscored, NaN reward is in
neither), and a token id v of the group's valid tokens, the 2x2 table of rollouts holding v is

    a = |{i in C: v in y_i}|,  b = |{i in W: v in y_i}|,  c = |C| - a,  d = |W| - b,   n = a + b + c + d

and, with p_C = a / |C| and p_W = b / |W| the shares of correct and wrong rollouts that hold v,

    F_v  = exp(-2 p_v)  (0 where p_v = 1),   p_v Fisher's exact two-sided p-value of the table
    IG_v = H(Y) - H(Y | X)                    (bits; Y correct or wrong, X holds v or not)
    h_v  = asin(sqrt(p_C)) - asin(sqrt(p_W))  (Cohen's h)
    t_v  = tf_C / (tf_W + 1e-5) - tf_W / (tf_C + 1e-5),   tf_S = f (k1 + 1) / (f + k1 (1 - b' + b' L_S / L̄))
           f = the share of the set's valid tokens that are v, L_S its valid-token count, L̄ = (L_C + L_W) / 2,
           k1 = 2, b' = 0.5 (BM25's saturation; only with ``ktae_gamma_tf`` > 0)
    s_v  = (alpha F_v + beta IG_v) (h_v + [gamma > 0] t_v) / (alpha + beta)
    k_v  = top (2 sigmoid(s_v) - 1)           in (-top, top)

    Â_{i,t} = A_i + k_{y_{i,t}} m_{i,t}       (additive: a key token moves the advantage of every rollout holding it)

A group without a correct or without a wrong rollout has no keys (k = 0), nor does the end-of-text token
(``ktae_skip_token_id``: upstream zeroes Qwen's 151643). Kept as upstream: p is summed in float32, where a table
whose p is 1 in exact arithmetic mostly sums to just above or below it (1.0000007 for [[1, 1], [2, 4]]), so F is
then exp(-2 p) ≈ 0.135 rather than the 0 the formula reserves for p = 1; only a sum that lands on 1.0 exactly gets 0. A_i is TRL's group-normalised advantage, (r - mean) /
(std + 1e-4); upstream normalises with 1e-6 instead, which differs only for groups whose rewards barely vary.
tests/credit/test_ktae.py checks the keys against upstream's ``ComputeKeyTokens`` on a fixed batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit.method import CreditMethod, CreditResult, GroupInputs, Range

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")

BM25_K1, BM25_B = 2.0, 0.5  # upstream's saturation constants
RATIO_FLOOR = 1e-5  # upstream's guard in the ratio of the two saturated frequencies


@dataclass
class KtaeOptions:
    ktae_alpha: float = field(
        default=1.0, metadata={"help": "Weight of the Fisher-test term F (upstream 1).", "range": Range(minimum=0)}
    )
    ktae_beta: float = field(
        default=1.0,
        metadata={"help": "Weight of the information-gain term IG (upstream 1).", "range": Range(minimum=0)},
    )
    ktae_gamma_tf: float = field(
        default=1.0,
        metadata={
            "help": "> 0 adds the BM25 frequency contrast t to Cohen's h (upstream 1).",
            "range": Range(minimum=0),
        },
    )
    ktae_top: float = field(
        default=1.0, metadata={"help": "The key's bound: k in (-top, top) (upstream 1).", "range": Range(minimum=0)}
    )
    ktae_skip_token_id: int = field(
        default=151643,
        metadata={"help": "A token id whose key is 0: the end-of-text token (upstream Qwen's 151643); -1: none."},
    )

    def check_values(self) -> None:
        from pipeline.core.io import InputError

        if self.ktae_alpha + self.ktae_beta <= 0:
            raise InputError("ktae_alpha + ktae_beta must be > 0")


def log_binomial(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """log C(n, k) by lgamma."""
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def fisher_two_sided(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Fisher's exact two-sided p-value of each table [[a, b], [c, d]]: the hypergeometric probability, given the
    margins, of every table at most as likely as the observed one, summed in float32 as upstream sums it (the
    precision decides ``F``'s p = 1 case: module docstring)."""
    a, b, c, d = (x.float() for x in (a, b, c, d))
    holding, correct, n = a + b, a + c, a + b + c + d
    low, high = torch.clamp(holding + correct - n, min=0), torch.minimum(holding, correct)
    k = torch.arange(int(high.max().item()) + 1, dtype=a.dtype, device=a.device)[None, :].expand(a.size(0), -1)
    inside = (k >= low[:, None]) & (k <= high[:, None])

    def probability(x: torch.Tensor) -> torch.Tensor:
        rows = x.dim() - 1
        expand = (lambda t: t[:, None]) if rows else (lambda t: t)
        log_p = log_binomial(expand(correct), x) + log_binomial(expand(n - correct), expand(holding) - x)
        return torch.exp(log_p - expand(log_binomial(n, holding)))

    each, observed = probability(k) * inside, probability(a)
    return torch.where((each <= observed[:, None]) & inside, each, 0).sum(dim=1)


def information_gain(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """H(Y) - H(Y | X) in bits for each table (Y: correct a + c vs wrong b + d; X: holds a + b vs not c + d)."""

    def entropy(*counts: torch.Tensor) -> torch.Tensor:
        total = sum(counts)
        shares = [torch.where(total > 0, count / total.clamp(min=1e-300), 0) for count in counts]
        return -sum(torch.where(share > 0, share * torch.log2(share.clamp(min=1e-300)), 0) for share in shares)

    n = a + b + c + d
    conditional = ((a + b) * entropy(a, b) + (c + d) * entropy(c, d)) / n
    return entropy(a + c, b + d) - conditional


def saturated_frequency(count: torch.Tensor, length: float, mean_length: float) -> torch.Tensor:
    """BM25's tf_S = f (k1 + 1) / (f + k1 (1 - b + b L_S / L̄)) of each token's share f = count / L_S."""
    share = count / length
    return share * (BM25_K1 + 1) / (share + BM25_K1 * (1 - BM25_B + BM25_B * length / mean_length))


def group_keys(ids: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, options: KtaeOptions) -> torch.Tensor:
    """(V,) float64 keys k_v of one group's tokens (module docstring), V = the largest id + 1; 0 for ids the group
    does not hold, and for all ids when the group lacks a correct or a wrong rollout."""
    vocabulary = int(ids.max().item()) + 1
    keys = torch.zeros(vocabulary, dtype=torch.float64, device=ids.device)
    correct, wrong = rewards > 0, rewards <= 0
    if not correct.any() or not wrong.any():
        return keys
    valid = mask.bool()
    holds = torch.zeros(ids.size(0), vocabulary, dtype=torch.float64, device=ids.device)
    holds.scatter_reduce_(1, ids, valid.double(), reduce="amax")
    a, b = holds[correct].sum(dim=0), holds[wrong].sum(dim=0)
    c, d = correct.sum() - a, wrong.sum() - b
    held = (a + b) > 0
    a, b, c, d = (x[held] for x in (a, b, c, d))
    p = fisher_two_sided(a, b, c, d).double()
    fisher = torch.where(p != 1.0, torch.exp(-2 * p), 0)
    gain = information_gain(a, b, c, d)
    contrast = torch.asin(torch.sqrt(a / (a + c))) - torch.asin(torch.sqrt(b / (b + d)))
    if options.ktae_gamma_tf > 0:
        counts_c = torch.bincount(ids[correct][valid[correct]], minlength=vocabulary).double()[held]
        counts_w = torch.bincount(ids[wrong][valid[wrong]], minlength=vocabulary).double()[held]
        length_c, length_w = float(valid[correct].sum()), float(valid[wrong].sum())
        mean_length = (length_c + length_w) / 2
        tf_c = saturated_frequency(counts_c, length_c, mean_length)
        tf_w = saturated_frequency(counts_w, length_w, mean_length)
        contrast = contrast + tf_c / (tf_w + RATIO_FLOOR) - tf_w / (tf_c + RATIO_FLOOR)
    alpha, beta = options.ktae_alpha, options.ktae_beta
    score = (alpha * fisher + beta * gain) * contrast / (alpha + beta)
    keys[held] = options.ktae_top * (2 * torch.sigmoid(score) - 1)
    if 0 <= options.ktae_skip_token_id < vocabulary:
        keys[options.ktae_skip_token_id] = 0
    return keys


def ktae_keys(inputs: GroupInputs, options: KtaeOptions) -> torch.Tensor:
    """(N, T) float32 k_{y_{i,t}} m_{i,t}: each token's key in its group, 0 on padding."""
    keyed = torch.zeros(inputs.completion_ids.shape, dtype=torch.float64, device=inputs.completion_ids.device)
    for group in range(inputs.groups):
        rows = slice(group * inputs.group_size, (group + 1) * inputs.group_size)
        ids, mask = inputs.completion_ids[rows], inputs.completion_mask[rows]
        keys = group_keys(ids, mask, inputs.rewards[rows].double(), options)
        keyed[rows] = keys[ids] * mask
    return keyed.float()


class Ktae(CreditMethod):
    name = "ktae"
    options = KtaeOptions
    needs_spans = False
    groups = True
    headline = ("key_abs_mean", "keyed_token_frac")

    def group_advantages(self, inputs: GroupInputs) -> CreditResult:
        keys = ktae_keys(inputs, self.opts)
        mask = inputs.completion_mask.bool()
        advantages = (inputs.advantages[:, None] + keys) * mask
        valid = keys[mask]
        stats = {
            "key_abs_mean": valid.abs().mean().item() if valid.numel() else float("nan"),
            "keyed_token_frac": (valid != 0).float().mean().item() if valid.numel() else float("nan"),
        }
        return CreditResult(advantages, None, stats)


METHOD = Ktae
