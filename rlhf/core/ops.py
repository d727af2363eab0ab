"""Tensor operations shared by every stage: masked statistics, log-prob gathering,
KL estimators and advantage estimation.

Conventions
- Pure functions: tensors in, tensors out; nothing here touches a model or an optimizer.
- Masks are boolean and named for what True means (`response_mask`: True on response tokens).
  Masked-out entries never influence a result, even if they hold NaN or inf, because
  they are removed with `torch.where`, not multiplied by 0.
- Half-precision inputs are computed in float32 (float64 stays float64), see `upcast`.
- Shapes: B batch, T tokens, V vocabulary, N = n_groups * group_size completions.
"""

import torch
from torch import Tensor


def upcast(x: Tensor) -> Tensor:
    """Promote bf16/fp16 to float32 so reductions and exp/log are accurate; float64 is kept."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# ---------------------------------------------------------------- masked statistics


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is True, over all entries (dim=None) or along `dim`.

    values: any shape; mask: bool, same shape (or broadcastable).
    """
    kept = torch.where(mask, upcast(values), 0.0)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` over the True entries of `mask`; a slice with no True entry gives 0, not NaN."""
    count = masked_sum(torch.ones_like(values), mask, dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `values` over all True entries of `mask` (a scalar).

    unbiased=True applies Bessel's correction n/(n−1). Fewer entries than needed
    (n = 0, or n = 1 when unbiased) gives 0.
    """
    mean = masked_mean(values, mask)
    sq_dev_sum = masked_sum((upcast(values) - mean) ** 2, mask)
    n = masked_sum(torch.ones_like(values), mask)
    dof = n - 1 if unbiased else n
    return sq_dev_sum / dof.clamp(min=1)


def masked_moments(values: Tensor, mask: Tensor) -> Tensor:
    """(3,) float64 [n, sum x, sum x^2] over the True entries of `mask`.

    Moments add: the sum of every process's moments (an all-reduce) is the moments of the whole
    batch, which is how `masked_whiten` and `explained_variance` take statistics over all processes.
    float64 keeps the one-pass variance (sum x^2 − n mean^2) free of cancellation at these sizes.
    """
    values = torch.where(mask, values.double(), 0.0)
    return torch.stack([mask.sum().double(), values.sum(), values.square().sum()])


def moments_mean_var(moments: Tensor, unbiased: bool = True) -> tuple[Tensor, Tensor]:
    """(mean, var) float64 scalars from `masked_moments` [n, sum, sum of squares]. Too few
    entries (n = 0, or n = 1 when unbiased) give var 0, as `masked_var`."""
    n, total, total_sq = moments.unbind(-1)
    mean = total / n.clamp(min=1)
    dof = n - 1 if unbiased else n
    return mean, ((total_sq - n * mean.square()) / dof.clamp(min=1)).clamp(min=0)


def masked_whiten(
    values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8, moments: Tensor | None = None
) -> Tensor:
    """(x − mean) / sqrt(var + eps) with mean and (unbiased) var taken over masked entries only.

    shift_mean=False adds the mean back (only rescales), as in Huang et al. 2024 `whiten`.
    Entries where `mask` is False are 0 in the output.
    values, mask: same shape -> same shape. moments: the statistics to use, `masked_moments`
    summed over every process's batch (default: this batch's own), so a batch split across
    processes is whitened as one.
    """
    values = upcast(values)
    mean, var = moments_mean_var(masked_moments(values, mask) if moments is None else moments)
    mean, var = mean.to(values.dtype), var.to(values.dtype)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, 0.0)


def explained_variance_moments(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """(2, 3) float64: `masked_moments` of the returns R and of the residuals R − V; sum them over
    processes for the `explained_variance` of the whole batch."""
    return torch.stack([masked_moments(returns, mask), masked_moments(upcast(returns) - upcast(values), mask)])


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, moments: Tensor | None = None) -> Tensor:
    """1 − Var[R − V] / Var[R] over masked entries (CleanRL's diagnostic for the critic).

    1 = perfect value predictions, 0 = no better than predicting the mean return, < 0 = worse.
    NaN when Var[R] = 0 (undefined, as in CleanRL). values, returns, mask: same shape -> scalar
    (float64). moments: `explained_variance_moments` summed over processes (default: this batch's).
    """
    if moments is None:
        moments = explained_variance_moments(values, returns, mask)
    var_returns, var_residual = moments_mean_var(moments)[1]
    return torch.where(var_returns > 0, 1 - var_residual / var_returns, torch.nan)


# ---------------------------------------------------------------- log-probs and entropy


def gather_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[token_id] per position, in float32.

    logits: (B, T, V), token_ids: (B, T) -> (B, T).
    Computed as logit[token] − logsumexp(logits), one batch row at a time, so the float32
    temporaries are (T, V) rather than a full (B, T, V) log_softmax copy (the approach
    of TRL's `selective_log_softmax`). Under autograd each row's float32 copy is still
    saved for backward. `temperature` is the sampling temperature (Huang et al. 2024), for the
    policy and the reference alike. It divides the logits after the upcast: bf16 logits divided
    in bf16 are rounded again, while a model prepared by accelerate returns its bf16 logits as
    float32, so a policy and its identical reference would disagree by ~1e-3 per token.
    """
    rows = []
    for row_logits, row_ids in zip(logits, token_ids):  # (T, V), (T,)
        row_logits = upcast(row_logits)
        if temperature != 1.0:
            row_logits = row_logits / temperature
        chosen = row_logits.gather(-1, row_ids.long().unsqueeze(-1)).squeeze(-1)  # (T,)
        rows.append(chosen - torch.logsumexp(row_logits, dim=-1))  # (T,)
    if not rows:
        return upcast(logits.new_zeros(logits.shape[:-1]))
    return torch.stack(rows)  # (B, T)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy H = −Σ_v p_v log p_v of the next-token distribution p = softmax(logits / temperature).

    logits: (B, T, V) -> (B, T), float32, one batch row at a time, tempered after the upcast (see
    `gather_logprobs`). Uses log_softmax rather than logsumexp(l) − Σ p·l, which cancels badly for large logits.
    """
    rows = []
    for row_logits in logits:  # (T, V)
        row_logits = upcast(row_logits)
        row_logprobs = torch.log_softmax(row_logits / temperature if temperature != 1.0 else row_logits, dim=-1)
        rows.append(-(row_logprobs.exp() * row_logprobs).sum(-1))  # (T,)
    if not rows:
        return upcast(logits.new_zeros(logits.shape[:-1]))
    return torch.stack(rows)  # (B, T)


def sequence_logps(token_logprobs: Tensor, response_mask: Tensor, average: bool = False) -> Tensor:
    """Per-sequence log-prob: sum (average=False) or mean (average=True, used by IPO) over response tokens.

    token_logprobs: (B, T), response_mask: (B, T) bool -> (B,). A row with no response token gives 0.
    """
    if average:
        return masked_mean(token_logprobs, response_mask, dim=-1)
    return masked_sum(token_logprobs, response_mask, dim=-1)


def last_true_index(mask: Tensor) -> Tensor:
    """Index of the last True in each row, e.g. the last real token where the reward is read
    (Huang et al. 2024). Rows with no True give 0.

    mask: (B, T) bool -> (B,) int64.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    return torch.where(mask, positions, -1).amax(dim=-1).clamp(min=0)  # (B,)


# ---------------------------------------------------------------- KL estimators
# Per-token estimators of KL(π ‖ π_ref) from samples x ~ π (Schulman 2020, "Approximating
# KL divergence", http://joschu.net/blog/kl-approx.html). With r = π_ref(x)/π(x):
#   k1 = −log r            unbiased, high variance, can be negative
#   k2 = ½ (log r)²        biased, low variance, ≥ 0
#   k3 = (r − 1) − log r   unbiased, low variance, ≥ 0 (DeepSeekMath GRPO eq. 4)
# Inputs (B, T) each -> (B, T).


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log π − log π_ref."""
    return upcast(logprobs) - upcast(ref_logprobs)


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = ½ (log π − log π_ref)²."""
    return 0.5 * (upcast(logprobs) - upcast(ref_logprobs)) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1 (DeepSeekMath eq. 4)."""
    log_r = upcast(ref_logprobs) - upcast(logprobs)
    return torch.exp(log_r) - log_r - 1


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# ---------------------------------------------------------------- a sampling engine's log-probs vs the trainer's


def logprob_mismatch(trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far an engine's log-probs of its own samples are from the trainer's for the same weights, over the
    response tokens (`mask`): abs_diff, the mean |log π_trainer − log π_engine|; abs_diff_max; and kl, the
    k3 estimate of KL(π_engine ‖ π_trainer) per token, whose samples come from the engine (Schulman 2020's
    k3 with r = π_trainer / π_engine: r − 1 − log r ≥ 0). All (B, T) in, scalars out (float64).

    The k3 term is expm1(log r) − log r in float64: for the ~1e-5 differences of an engine in float32,
    exp(x) − 1 − x in float32 is rounding noise of either sign (~1e-9) around the true x²/2 (~1e-11)."""
    log_r = trainer_logprobs.double() - engine_logprobs.double()  # (B, T)
    return {
        "abs_diff": masked_mean(log_r.abs(), mask),
        "abs_diff_max": log_r.abs().masked_fill(~mask, 0).max(),
        "kl": masked_mean(torch.expm1(log_r) - log_r, mask),
    }


def truncated_importance_weights(trainer_logprobs: Tensor, engine_logprobs: Tensor, cap: float) -> Tensor:
    """min(π_trainer / π_engine, cap) per token, detached (Yao et al. 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training", truncated importance sampling): the samples came from the engine's
    distribution, the policy gradient wants the trainer's; capping bounds the variance. (B, T) -> (B, T)."""
    log_r = upcast(trainer_logprobs).detach() - upcast(engine_logprobs).detach()
    return torch.exp(log_r).clamp(max=cap)


# ---------------------------------------------------------------- advantages


def gae_advantages(
    rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16).

        δ_t = r_t + γ V_{t+1} − V_t,    A_t = δ_t + γλ A_{t+1},    R_t = A_t + V_t

    rewards, values: (B, T) float; response_mask: (B, T) bool -> (advantages, returns), each (B, T).
    Response tokens must form one contiguous run per row; it may start anywhere (left-padded
    prompt) and end before T (right padding). The episode ends after the last response token,
    so V_{t+1} = 0 and A_{t+1} = 0 there. Rewards and values outside the mask are ignored:
    put the score on a response token (e.g. `last_true_index(response_mask)`).
    Both outputs are 0 outside the mask. Vectorised over B, reverse loop over T.
    Call under torch.no_grad(): advantages and returns are targets, not differentiable outputs.
    """
    rewards, values = upcast(rewards), upcast(values)
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    next_advantage = torch.zeros_like(values[:, 0])  # (B,)
    advantages_reversed = []
    for t in reversed(range(rewards.shape[1])):
        in_response = response_mask[:, t]  # (B,)
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        # Outside the response both carries reset to 0, so the last response token sees V = A = 0.
        next_advantage = torch.where(in_response, delta + gamma * lam * next_advantage, 0.0)
        next_value = torch.where(in_response, values[:, t], 0.0)
        advantages_reversed.append(next_advantage)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)  # (B, T)
    returns = torch.where(response_mask, advantages + values, 0.0)  # (B, T)
    return advantages, returns


def group_advantages(
    rewards: Tensor, group_size: int, scale: bool = True, eps: float = 1e-4, leave_one_out: bool = False
) -> tuple[Tensor, Tensor]:
    """Group-relative advantages for GRPO-style training.

    scale=True:  A_i = (r_i − mean_g) / (std_g + eps)  (DeepSeekMath, arXiv 2402.03300, §4.1.2;
                 unbiased std as torch.std in their code and TRL)
    scale=False: A_i = r_i − mean_g                    (Dr. GRPO, arXiv 2503.20783)
    leave_one_out=True: the baseline is the mean of the group's other G − 1 rewards, r_i − mean_{j≠i} r_j
                 = G/(G − 1) · (r_i − mean_g) (RLOO, Ahmadian et al. 2024, arXiv 2402.14740, eq. 5), then scaled
                 by the group's std when scale=True.

    rewards: (N,) with N = n_groups * group_size, consecutive rows forming one group
    -> (advantages (N,), zero_std_group_mask (n_groups,) bool).
    zero_std_group_mask is True for groups whose rewards are all equal; their advantages are
    exactly 0 and they carry no learning signal (DAPO, arXiv 2503.14476, drops them).
    """
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"group_advantages: {rewards.numel()} rewards do not split into groups of {group_size}; "
            "pass rewards for whole groups, consecutive rows per prompt"
        )
    if (scale or leave_one_out) and group_size < 2:
        raise ValueError("group_advantages: scale=True or leave_one_out=True needs group_size >= 2")
    grouped = upcast(rewards).reshape(-1, group_size)  # (n_groups, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (n_groups, G)
    zero_std_group_mask = (grouped == grouped[:, :1]).all(dim=1)  # (n_groups,)
    if leave_one_out:
        centred = centred * (group_size / (group_size - 1))
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    # Rounding in the mean can leave ~1e-17 in an all-equal group; make it exactly 0.
    advantages = torch.where(zero_std_group_mask[:, None], 0.0, centred)  # (n_groups, G)
    return advantages.reshape(-1), zero_std_group_mask


def shifted_logprobs(logits: Tensor, input_ids: Tensor, temperature: float) -> Tensor:
    """Log-prob of each token under the distribution that produced it, at the sampling temperature.

    logits: (B, T, V) from a forward pass over input_ids (B, T) -> (B, T), aligned with the tokens:
    column t uses the logits at t - 1; column 0 is 0. The same as `rlhf.models.modeling.token_logprobs`.
    """
    return torch.nn.functional.pad(gather_logprobs(logits[:, :-1], input_ids[:, 1:], temperature), (1, 0))


def shifted_entropy(logits: Tensor, temperature: float) -> Tensor:
    """Entropy of the next-token distribution that produced each token, at the temperature;
    (B, T, V) -> (B, T), column 0 is 0."""
    return torch.nn.functional.pad(entropy_from_logits(logits[:, :-1], temperature), (1, 0))
