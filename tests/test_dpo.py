"""DPO stage contracts (part3_dpo/train_dpo.py): reference log-probs precomputed == on the fly,
the response sum never sees prompt or pad tokens, the loss comes from the table, the cache is
never used stale. The loss formulas themselves are checked by hand in test_losses.py."""

from __future__ import annotations

import contextlib
import importlib.util
import types
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from rlhf.core.batching import EncodedPair, collate_shared_prompt_pairs
from rlhf.core.errors import UserError
from rlhf.core.losses import DPO_AVERAGES_LOGPS, DPO_LOSSES
from rlhf.methods import dpo, reference_cache
from rlhf.methods.rules import check_dpo_config, check_online_dpo_config
from rlhf.models.modeling import disable_dropout
from rlhf.stage.config import load_config

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("train_dpo", REPO / "part3_dpo" / "train_dpo.py")
train_dpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_dpo)

PAD, EOS = 0, 1
CPU = types.SimpleNamespace(
    device=torch.device("cpu"), process_index=0, num_processes=1, autocast=contextlib.nullcontext
)


def tiny_lm(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=64, pad_token_id=PAD))
    disable_dropout(model)
    return model.eval()


def random_pairs(n: int, seed: int) -> list[EncodedPair]:
    """Pairs of mixed lengths (so every batch is padded), responses ending in EOS."""
    g = torch.Generator().manual_seed(seed)

    def ids(low, high):
        return torch.randint(2, 32, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()

    return [EncodedPair(ids(1, 12), ids(1, 9) + [EOS], ids(1, 9) + [EOS]) for _ in range(n)]


def by_hand_response_logp(model, prompt: list[int], response: list[int], average: bool) -> float:
    """log p(response | prompt) from an unpadded single-row forward, summing only response positions."""
    ids = torch.tensor([prompt + response])
    logprobs = torch.log_softmax(model(ids).logits[0].double(), -1)  # (T, V)
    terms = [logprobs[t - 1, ids[0, t]].item() for t in range(len(prompt), len(prompt) + len(response))]
    return sum(terms) / len(terms) if average else sum(terms)


# ---------------------------------------------------------------- the response sum


@pytest.mark.parametrize("average", [False, True])
def test_pair_logps_sum_exactly_the_kept_response_tokens_under_padding_and_truncation(average):
    model = tiny_lm(0)
    max_prompt, max_response = 4, 3
    pairs = [
        EncodedPair([5, 6, 7, 8, 9, 10], [11, 12, 13, 14, EOS], [15, EOS]),  # both sides truncated
        EncodedPair([5], [16, EOS], [17, 18, 19, EOS]),  # short prompt: padded row
        EncodedPair([20, 21, 22], [23, 24, EOS], [25, 26, 27]),  # rejected without EOS, exactly max length
    ]
    batch = collate_shared_prompt_pairs(pairs, PAD, max_prompt, max_response)
    chosen, rejected = dpo.pair_logps(model, batch, average)
    for i, pair in enumerate(pairs):
        prompt = pair.prompt_ids[-max_prompt:]  # the oldest prompt tokens are cut, never the response's start
        for got, response in ((chosen[i], pair.chosen_ids), (rejected[i], pair.rejected_ids)):
            expected = by_hand_response_logp(model, prompt, response[:max_response], average)
            assert got.item() == pytest.approx(expected, abs=1e-5)


def test_shared_prompt_rows_train_as_two_rows_per_pair():
    """The gradient of a DPO loss through one `[prompt][chosen][rejected]` row per pair equals the gradient
    through separate `[prompt][chosen]` and `[prompt][rejected]` rows, computed by hand one sequence at a time."""
    policy, pairs = tiny_lm(0), random_pairs(6, seed=4)
    chosen, rejected = dpo.pair_logps(policy, collate_shared_prompt_pairs(pairs, PAD), average=False)
    shared_loss = -torch.nn.functional.logsigmoid(0.5 * (chosen - rejected)).mean()
    shared_grads = torch.autograd.grad(shared_loss, list(policy.parameters()))

    def response_logp(prompt, response):  # one unpadded row, autograd on
        ids = torch.tensor([prompt + response])
        logprobs = torch.log_softmax(policy(ids).logits[0], -1)[len(prompt) - 1 : -1]  # (R, V)
        return logprobs.gather(-1, ids[0, len(prompt) :, None]).sum()

    margins = torch.stack(
        [response_logp(p.prompt_ids, p.chosen_ids) - response_logp(p.prompt_ids, p.rejected_ids) for p in pairs]
    )
    separate_loss = -torch.nn.functional.logsigmoid(0.5 * margins).mean()
    separate_grads = torch.autograd.grad(separate_loss, list(policy.parameters()))
    torch.testing.assert_close(shared_loss, separate_loss, rtol=0, atol=1e-5)
    for shared_grad, separate_grad in zip(shared_grads, separate_grads):
        torch.testing.assert_close(shared_grad, separate_grad, rtol=1e-4, atol=1e-6)


def test_prompt_and_pad_tokens_cannot_move_the_response_sum(monkeypatch):
    """Poison every non-response position's log-prob: a correct sum does not move."""
    model = tiny_lm(0)
    pairs = random_pairs(5, seed=1)
    batch = collate_shared_prompt_pairs(pairs, PAD, 6, 5)
    clean = dpo.pair_logps(model, batch, average=False)
    original = dpo.shared_prompt_response_logprobs

    def poisoned(model, batch):
        values = original(model, batch)
        responses = batch["chosen_mask"] ^ batch["rejected_mask"]  # each response's own columns
        return torch.where(responses, values, torch.full_like(values, -1e6))

    monkeypatch.setattr(dpo, "shared_prompt_response_logprobs", poisoned)
    dirty = dpo.pair_logps(model, batch, average=False)
    for a, b in zip(clean, dirty):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------- reference: precomputed == on the fly


def collate_indexed(pairs):
    def collate(indices):
        return dpo.indexed_pairs(lambda batch: collate_shared_prompt_pairs(batch, PAD, 8, 6), pairs, indices)

    return collate


@pytest.mark.parametrize("loss_type", sorted(DPO_LOSSES))
def test_precomputed_reference_gives_the_same_losses_as_on_the_fly(loss_type):
    policy, ref = tiny_lm(0), tiny_lm(1)  # different weights: nonzero log-ratios
    pairs = random_pairs(11, seed=2)
    average = DPO_AVERAGES_LOGPS[loss_type]

    def score_split(model, split):  # eval batch 4, length-sorted: different padding from the training batches
        return dpo.split_logps(model, pairs, lambda b: collate_shared_prompt_pairs(b, PAD, 8, 6), 4, CPU, average)

    precomputed = dpo.PrecomputedReference({"train": score_split(ref, "train")})
    on_the_fly = dpo.OnTheFlyReference(ref, average, score_split, CPU)
    smoothing = 0.1 if loss_type == "cdpo" else 0.0
    collate = collate_indexed(pairs)
    for indices in ([0, 1, 2], [10, 3, 7, 5], [4, 6, 8, 9]):
        batch = collate(indices)
        losses = []
        for reference in (precomputed, on_the_fly):
            loss, stats = dpo.make_loss_fn(loss_type, 0.5, smoothing, reference)(policy, batch)
            losses.append((loss, stats))
        (loss_a, stats_a), (loss_b, stats_b) = losses
        torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=1e-6)
        for key in stats_a:
            torch.testing.assert_close(stats_a[key], stats_b[key], rtol=0, atol=1e-6)
        # The reference itself: the looked-up numbers equal a fresh no-grad forward of this batch.
        for a, b in zip(precomputed.batch(batch, "train"), on_the_fly.batch(batch, "train")):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(precomputed.split("train"), on_the_fly.split("train"))


def test_split_logps_returns_pairs_in_their_original_order():
    model = tiny_lm(0)
    pairs = random_pairs(9, seed=3)
    all_at_once = dpo.split_logps(model, pairs, lambda b: collate_shared_prompt_pairs(b, PAD), 2, CPU, False)  # (N, 2)
    for i, pair in enumerate(pairs):
        expected = [
            by_hand_response_logp(model, pair.prompt_ids, r, False) for r in (pair.chosen_ids, pair.rejected_ids)
        ]
        assert all_at_once[i].tolist() == pytest.approx(expected, abs=1e-5)


def test_a_held_out_split_is_scored_against_its_reference_and_the_gold_labels():
    """PreferenceSplits.evaluate: the objective's loss and stats on the split's log-probs against the reference's,
    as dpo/<split>/* metrics, and the share of pairs whose implicit reward (log-ratio to the reference) orders the
    two responses as the gold scores do, by hand."""
    policy, ref = tiny_lm(0), tiny_lm(1)
    pairs = random_pairs(7, seed=4)
    gold = [(1.0, 0.0), (0.0, 1.0), (2.0, 1.0), (0.5, 0.7), (1.0, 3.0), (3.0, 2.0), (0.0, 0.1)]
    rows = [{"gold_chosen": c, "gold_rejected": r} for c, r in gold]
    splits = dpo.PreferenceSplits({"val": pairs}, {"val": rows}, PAD, (8, 6), 3, CPU, False)
    reference = dpo.PrecomputedReference({"val": splits.logps(ref, "val")})
    objective = dpo.DPOObjective("sigmoid", 0.5)
    metrics = splits.evaluate(policy, "val", reference, objective)

    policy_logps, ref_logps = splits.logps(policy, "val"), reference.split("val")  # (7, 2) each
    margins = (policy_logps[:, 0] - ref_logps[:, 0]) - (policy_logps[:, 1] - ref_logps[:, 1])  # (7,)
    assert margins.abs().min() > 1e-4  # no pair whose order rounding could flip
    by_hand = sum((m > 0) == (c > r) for m, (c, r) in zip(margins.tolist(), gold)) / 7
    assert metrics["dpo/val/gold_accuracy"] == pytest.approx(by_hand)
    assert metrics["dpo/val/rewards/accuracies"] == pytest.approx(float((margins > 0).float().mean()))
    expected = -torch.nn.functional.logsigmoid(0.5 * margins).mean()
    assert metrics["dpo/val/loss"] == pytest.approx(expected.item(), rel=1e-5)
    no_gold = dpo.PreferenceSplits({"val": pairs}, {"val": [{}] * 7}, PAD, (8, 6), 3, CPU, False)
    assert "dpo/val/gold_accuracy" not in no_gold.evaluate(policy, "val", reference, objective)


@pytest.mark.parametrize("loss_type", sorted(DPO_LOSSES))
def test_loss_fn_dispatches_through_the_table_with_the_right_averaging(loss_type):
    policy, ref = tiny_lm(0), tiny_lm(1)
    pairs = random_pairs(4, seed=4)
    batch = collate_indexed(pairs)([0, 1, 2, 3])
    reference = dpo.OnTheFlyReference(ref, DPO_AVERAGES_LOGPS[loss_type], None, CPU)
    loss, stats = dpo.make_loss_fn(loss_type, 0.3, 0.0, reference)(policy, batch)
    average = DPO_AVERAGES_LOGPS[loss_type]
    logps = {}  # (policy|ref, chosen|rejected) -> (B,), each from an unpadded single-row forward
    for name, model in (("policy", policy), ("ref", ref)):
        for side in ("chosen", "rejected"):
            logps[name, side] = torch.tensor(
                [by_hand_response_logp(model, p.prompt_ids[-8:], getattr(p, f"{side}_ids")[:6], average) for p in pairs]
            )
    expected, expected_stats = DPO_LOSSES[loss_type](
        logps["policy", "chosen"],
        logps["policy", "rejected"],
        logps["ref", "chosen"],
        logps["ref", "rejected"],
        0.3,
        0.0,
    )
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert set(stats) == {f"train/{key}" for key in expected_stats}  # the train/ group of the stage's metrics
    assert stats["train/rewards/accuracies"].item() == expected_stats["rewards/accuracies"].item()
    loss.backward()  # the policy gets gradients; the reference never does
    assert any(p.grad is not None for p in policy.parameters())
    assert all(p.grad is None for p in ref.parameters())


# ---------------------------------------------------------------- the cache


def test_length_heuristic_loss_reads_the_collated_lengths():
    policy, ref = tiny_lm(0), tiny_lm(1)
    pairs = random_pairs(4, seed=4)
    batch = collate_indexed(pairs)([0, 1, 2, 3])
    reference = dpo.OnTheFlyReference(ref, False, None, CPU)
    loss, _ = dpo.make_loss_fn("sigmoid", 0.3, 0.0, reference, length_heuristic=0.2)(policy, batch)
    policy_chosen, policy_rejected = dpo.pair_logps(policy, batch, False)
    ref_chosen, ref_rejected = reference.batch(batch, "train")
    lengths = [(min(len(p.chosen_ids), 6), min(len(p.rejected_ids), 6)) for p in pairs]  # the 6-token truncation
    longer = torch.tensor([1.0 if c > r else 0.0 if c < r else 0.5 for c, r in lengths])
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    expected = -torch.log(0.2 * longer + 0.8 * torch.sigmoid(0.3 * h)).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_rpo_adds_alpha_times_the_chosen_per_token_nll_of_the_collated_tokens(loss_type):
    policy, ref = tiny_lm(0), tiny_lm(1)
    pairs = random_pairs(4, seed=4)
    batch = collate_indexed(pairs)([0, 1, 2, 3])
    average = DPO_AVERAGES_LOGPS[loss_type]
    reference = dpo.OnTheFlyReference(ref, average, None, CPU)
    plain, plain_stats = dpo.make_loss_fn(loss_type, 0.3, 0.0, reference)(policy, batch)
    rpo, rpo_stats = dpo.make_loss_fn(loss_type, 0.3, 0.0, reference, rpo_alpha=0.7)(policy, batch)
    assert "train/nll/chosen" not in plain_stats
    # −log p(chosen) per token, from unpadded single-row forwards over the 6 collated response tokens
    per_token = [by_hand_response_logp(policy, p.prompt_ids[-8:], p.chosen_ids[:6], True) for p in pairs]
    expected_nll = -sum(per_token) / len(per_token)
    assert rpo_stats["train/nll/chosen"].item() == pytest.approx(expected_nll, abs=1e-5)
    assert rpo.item() == pytest.approx(plain.item() + 0.7 * expected_nll, abs=1e-5)


@pytest.mark.parametrize("section", ["dpo", "online_dpo"])
def test_a_negative_rpo_alpha_is_refused_at_start_up(section):
    cfg = load_config(REPO / "configs" / "tiny.yaml", [f"{section}.rpo_alpha=-1"])
    check = check_dpo_config if section == "dpo" else lambda c: check_online_dpo_config(c.online_dpo)
    with pytest.raises(UserError, match=f"{section}.rpo_alpha"):
        check(cfg)


def test_online_dpo_has_no_token_budget_and_says_so_in_one_line():
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["online_dpo.micro_batch_tokens=100"])
    with pytest.raises(UserError, match=r"^online_dpo.micro_batch_tokens=100: .*set online_dpo.micro_batch_size$"):
        check_online_dpo_config(cfg.online_dpo)
    check_online_dpo_config(load_config(REPO / "configs" / "tiny.yaml", []).online_dpo)  # unset: no error


def test_reference_cache_loads_only_splits_with_their_own_fingerprint(tmp_path):
    path = tmp_path / train_dpo.REF_CACHE_FILE
    values = {"train": torch.tensor([[-1.5, -2.0]]), "val": torch.tensor([[-3.0, -0.5], [-1.0, -1.0]])}
    fingerprints = {"train": "t1", "val": "v1"}
    assert reference_cache.load_ref_cache(path, fingerprints) == {}  # absent
    reference_cache.save_ref_cache(path, fingerprints, values)
    assert not list(tmp_path.glob("*.tmp"))
    loaded = reference_cache.load_ref_cache(path, fingerprints)
    assert set(loaded) == {"train", "val"} and all(torch.equal(loaded[k], values[k]) for k in values)
    assert set(reference_cache.load_ref_cache(path, {"train": "t2", "val": "v1"})) == {"val"}  # stale train: never used
    assert reference_cache.load_ref_cache(path, {"test": "v1"}) == {}


def test_cache_fingerprints_change_with_weights_tokens_truncation_and_averaging():
    pairs = {"train": random_pairs(3, seed=5), "val": random_pairs(2, seed=6)}
    base = reference_cache.ref_cache_fingerprints("w1", pairs, (8, 6), False)
    assert base == reference_cache.ref_cache_fingerprints("w1", {k: list(v) for k, v in pairs.items()}, (8, 6), False)
    for other in (
        reference_cache.ref_cache_fingerprints("w2", pairs, (8, 6), False),
        reference_cache.ref_cache_fingerprints("w1", pairs, (8, 7), False),
        reference_cache.ref_cache_fingerprints("w1", pairs, (8, 6), True),
    ):
        assert other["train"] != base["train"] and other["val"] != base["val"]
    first = pairs["val"][0]
    edited = {
        **pairs,
        "val": [EncodedPair(first.prompt_ids + [3], first.chosen_ids, first.rejected_ids), pairs["val"][1]],
    }
    changed = reference_cache.ref_cache_fingerprints("w1", edited, (8, 6), False)
    assert changed["val"] != base["val"] and changed["train"] == base["train"]  # one edited split, one recompute


# ---------------------------------------------------------------- small pieces


@pytest.mark.parametrize(
    "override, message",
    [
        ("dpo.loss_type=kto", "dpo.loss_type='kto' is not one of: sigmoid, ipo, cdpo"),
        ("dpo.beta=0", "dpo.beta must be > 0"),
        ("dpo.label_smoothing=0.1", "only used by dpo.loss_type=cdpo"),
        ("dpo.max_train_pairs=8", "fewer than one batch"),
        ("dpo.length_heuristic=1.0", "dpo.length_heuristic must be in [0, 1)"),
        ("dpo.loss_type=ipo dpo.length_heuristic=0.2", "rater model for dpo.loss_type=sigmoid, not ipo"),
    ],
)
def test_config_errors_are_one_line_before_any_model_loads(override, message):
    cfg = load_config(REPO / "configs" / "tiny.yaml", override.split())
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as info:
        check_dpo_config(cfg)
    assert "\n" not in str(info.value)


def test_pair_tokens_counts_each_rows_tokens_once_by_hand():
    # prompt 3 + chosen 2 + rejected 4 = 9, and prompt 1 + chosen 1 + rejected 1 = 3: 12 tokens in a (2, 9) batch.
    pairs = [EncodedPair([5, 6, 7], [8, EOS], [9, 10, 11, EOS]), EncodedPair([5], [EOS], [8])]
    batch = collate_shared_prompt_pairs(pairs, PAD)
    assert dpo.pair_tokens(batch) == 12
    assert int(batch["attention_mask"].sum()) > 12 * 2  # the (B, 1, T, T) mask counts query-key entries instead
