"""Derived sizes and data order of the shared training loop, and reward diagnostics."""

import re
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlhf.analysis.reward_analysis import accuracy_by_group, error_categories, pearson
from rlhf.core.errors import UserError
from rlhf.loop.step import (
    MicroBatch,
    accumulation_weights,
    equal_micro_batches,
    optimizer_step,
    train_step,
    unit_weighted_micro_batches,
)
from rlhf.models.training import budget_micro_rows, build_optimizer, epoch_order, forward_map, plan_steps
from rlhf.stage.run import RunDir
from rlhf.stage.schema import TrainConfig


def test_plan_steps_derives_accumulation_and_total():
    plan = plan_steps("sft", TrainConfig(batch_size=32, micro_batch_size=8, epochs=2.5), n_examples=100, world_size=2)
    # 100 // 32 = 3 steps per epoch; ceil(2.5 * 3) = 8; 32 / 2 processes = 16 each = 2 micro-batches of 8.
    assert (plan.steps_per_epoch, plan.total_steps, plan.per_process, plan.accumulation) == (3, 8, 16, 2)
    assert plan_steps("sft", TrainConfig(batch_size=32, micro_batch_size=8, max_steps=5), 1000, 1).total_steps == 5


@pytest.mark.parametrize("world, micro", [(1, 32), (2, 16), (4, 8)])
def test_a_micro_batch_larger_than_a_process_share_is_that_share_and_the_processes_split_the_global_batch(world, micro):
    """The tiny preset's micro_batch_size = batch_size: one process runs as configured, more take their share."""
    plan = plan_steps("sft", TrainConfig(batch_size=32, micro_batch_size=32), n_examples=100, world_size=world)
    assert (plan.per_process, plan.micro_batch_size, plan.accumulation) == (micro, micro, 1)
    order = epoch_order(list(range(100)), seed=0, epoch=0, batch_size=32, group_by_length=False)
    split = [row for rank in range(world) for rows in plan.micro_rows(order, 2, rank) for row in rows]
    assert split == order[64:96]


@pytest.mark.parametrize(
    "tcfg, n, world, message",
    [
        (
            TrainConfig(batch_size=30, micro_batch_size=8),
            100,
            1,
            "sft: a batch of 30 per process (sft.batch_size=30 / 1) is not divisible by sft.micro_batch_size=8",
        ),
        (TrainConfig(batch_size=30, micro_batch_size=5), 100, 4, "sft.batch_size=30 is not divisible by 4 processes"),
        (TrainConfig(batch_size=64, micro_batch_size=8), 10, 1, "fewer than one batch"),
    ],
)
def test_plan_steps_rejects_bad_sizes(tcfg, n, world, message):
    with pytest.raises(UserError) as info:
        plan_steps("sft", tcfg, n, world)
    assert message in str(info.value)


@pytest.mark.parametrize("group", [False, True])
def test_epoch_order_is_a_deterministic_permutation(group):
    lengths = [i % 17 for i in range(256)]
    order = epoch_order(lengths, seed=0, epoch=0, batch_size=8, group_by_length=group)
    assert sorted(order) == list(range(256))
    assert order == epoch_order(lengths, seed=0, epoch=0, batch_size=8, group_by_length=group)
    assert order != epoch_order(lengths, seed=0, epoch=1, batch_size=8, group_by_length=group)


def test_grouping_by_length_cuts_padding():
    lengths = [(i * 37) % 100 + 1 for i in range(2048)]

    def padded(order):
        return sum(max(lengths[i] for i in order[s : s + 16]) * 16 for s in range(0, len(order), 16))

    plain = padded(epoch_order(lengths, 0, 0, 16, False))
    grouped = padded(epoch_order(lengths, 0, 0, 16, True))
    assert grouped < 0.7 * plain


class OneProcess:
    process_index, num_processes = 0, 1


def test_forward_map_batches_longest_first_and_returns_the_original_order():
    items = ["bb", "a", "dddd", "ccc", "e"]
    batches = []

    def fn(batch):
        batches.append(batch)
        return [item.upper() for item in batch]

    assert forward_map(fn, items, 2, OneProcess(), lengths=[len(i) for i in items]) == ["BB", "A", "DDDD", "CCC", "E"]
    assert batches == [["dddd", "ccc"], ["bb", "a"], ["e"]]  # ties keep input order
    batches.clear()
    assert forward_map(fn, items, 2, OneProcess()) == ["BB", "A", "DDDD", "CCC", "E"]
    assert batches == [["bb", "a"], ["dddd", "ccc"], ["e"]]


def test_accuracy_by_group_by_hand():
    groups = ["fact", "arith", "fact", "fact", "arith"]
    correct = [True, False, False, True, True]
    assert accuracy_by_group(groups, correct) == {"arith": 1 / 2, "fact": 2 / 3}
    assert accuracy_by_group([], []) == {}


def test_pearson_by_hand():
    # x = (1, 2, 3), y = (2, 4, 7): means 2 and 13/3; cov = (-1)(-7/3) + 0 + (1)(8/3) = 5; var_x = 2;
    # var_y = 49/9 + 1/9 + 64/9 = 114/9; r = 5 / sqrt(2 * 114 / 9) = 0.99340.
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / (2 * 114 / 9) ** 0.5)
    assert pearson([1, 1, 1], [2, 4, 7]) == 0.0


def test_error_categories_by_hand():
    # margin -0.1 with margin std 1.0: small (< 0.25); rejected longer; chosen has 2 tokens (very short).
    assert error_categories(2, 10, -0.1, 1.0) == ["longer_rejected_preferred", "small_margin", "very_short"]
    assert error_categories(10, 5, -1.5, 1.0) == ["confident_wrong"]
    assert error_categories(10, 5, -0.5, 1.0) == []


def test_optimizer_step_clips_steps_and_clears_the_gradients():
    accelerator = SimpleNamespace(clip_grad_norm_=torch.nn.utils.clip_grad_norm_)
    for max_grad_norm, expected_step in [(1.0, [0.6, 0.8]), (0.0, [3.0, 4.0])]:
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[1.0, 1.0]]))
        model.weight.grad = torch.tensor([[3.0, 4.0]])  # norm 5: clipped to norm 1 it is (0.6, 0.8)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        grad_norm = optimizer_step(accelerator, model, optimizer, scheduler, max_grad_norm)
        assert model.weight.detach()[0].tolist() == pytest.approx([1.0 - expected_step[0], 1.0 - expected_step[1]])
        assert model.weight.grad is None and scheduler.last_epoch == 1
        assert grad_norm is None if max_grad_norm == 0 else grad_norm.item() == pytest.approx(5.0)  # before clipping


class OneCPUProcess:
    """The part of an Accelerator that train_step uses, for one process on the CPU."""

    device = torch.device("cpu")
    num_processes = 1
    clip_grad_norm_ = staticmethod(torch.nn.utils.clip_grad_norm_)

    def no_sync(self, model):
        return nullcontext()

    def backward(self, loss):
        loss.backward()


def test_train_step_averages_the_micro_batches_then_steps_once():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def loss_fn(model, batch):  # mean (w x)^2: loss w^2 mean(x^2), gradient 2 w mean(x^2)
        loss = model(batch["x"]).square().mean()
        return loss, {"train/x_mean": batch["x"].mean()}

    micro_batches = equal_micro_batches(
        [{"x": torch.tensor([[1.0], [1.0]])}, {"x": torch.tensor([[2.0], [2.0]])}], "cpu"
    )
    totals = train_step(
        "sft", RunDir("run"), "step 1", OneCPUProcess(), model, optimizer, scheduler, micro_batches, loss_fn, 0.0
    )
    # losses 1 and 4, gradients 2 and 8: their means 2.5 and 5; one SGD step w = 1 - 0.1 * 5 = 0.5
    assert model.weight.item() == pytest.approx(0.5) and model.weight.grad is None
    values = {key: value.item() for key, value in totals.items()}
    assert values == pytest.approx({"train/loss": 2.5, "train/x_mean": 1.5})


def test_train_step_weighs_the_loss_and_the_metrics_each_by_its_own_weight():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def loss_fn(model, batch):
        loss = model(batch["x"]).square().mean()
        return loss, {"objective/x": batch["x"].mean()}

    micro_batches = [
        MicroBatch({"x": torch.tensor([[1.0]])}, loss_weight=0.25, metric_weight=0.5),
        MicroBatch({"x": torch.tensor([[2.0]])}, loss_weight=0.75, metric_weight=0.5),
    ]
    totals = train_step(
        "grpo", RunDir("run"), "iteration 1", OneCPUProcess(), model, optimizer, scheduler, micro_batches, loss_fn,
        10.0,
    )  # fmt: skip
    # loss 0.25 x 1 + 0.75 x 4 = 3.25; gradient 0.25 x 2 + 0.75 x 8 = 6.5, w = 1 - 0.65; x's mean 0.5 x 1 + 0.5 x 2
    assert model.weight.item() == pytest.approx(0.35)
    values = {key: value.item() for key, value in totals.items()}
    assert values == pytest.approx({"train/loss": 3.25, "objective/x": 1.5, "train/grad_norm": 6.5})


def test_accumulation_weights_by_hand():
    # micro-batches of 4 and 6 units (tokens, rows or pairs) of 10 on one process
    assert accumulation_weights([4.0, 6.0], 10.0) == pytest.approx([0.4, 0.6])
    assert accumulation_weights([1.0, 1.0, 1.0], 3.0) == pytest.approx([1 / 3] * 3)
    # one of two processes holding 4 of the step's 10 units (5 per process): its weights sum to 4/5
    assert accumulation_weights([3.0, 1.0], 5.0) == pytest.approx([0.6, 0.2])
    assert accumulation_weights([0.0, 0.0], 0.0) == [0.5, 0.5]  # no units at all: equal weights
    micro = equal_micro_batches([{"x": torch.ones(2)}, {"x": torch.ones(3)}], "cpu")
    assert [(m.loss_weight, m.metric_weight) for m in micro] == [(0.5, 0.5), (0.5, 0.5)]


def test_budget_micro_rows_by_hand():
    lengths = [5, 9, 3, 9, 4, 2]  # rows 1 and 3 the longest, then 0, 4, 2, 5
    # a budget of 18 positions: [1, 3] (2 x 9), [0, 4, 2] (3 x 5 = 15; a fourth would be 20), [5]
    assert budget_micro_rows([0, 1, 2, 3, 4, 5], lengths, 18) == [[1, 3], [0, 4, 2], [5]]
    assert budget_micro_rows([0, 1, 2, 3, 4, 5], lengths, 8) == [[1], [3], [0], [4, 2], [5]]  # 9 > 8: alone
    assert budget_micro_rows([2, 5], lengths, 100) == [[2, 5]]
    # as many as another process needs: the micro-batch with the most rows is halved until there are 4
    assert budget_micro_rows([0, 1, 2, 3, 4, 5], lengths, 18, count=4) == [[1, 3], [0], [4, 2], [5]]
    with pytest.raises(ValueError, match="2 rows cannot make 3 micro-batches"):
        budget_micro_rows([2, 5], lengths, 100, count=3)


NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # as every stage loads its models


def test_a_token_budget_gives_the_gradient_of_one_pass_over_the_batch():
    """The SFT loss averages over response tokens; micro-batches of unequal size weighted by their response tokens
    (`unit_weighted_micro_batches`) step the weights as one pass over the whole batch does, to fp32 rounding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf.core.batching import collate_sequences
    from rlhf.models.training import sft_batch_loss

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16]]
    responses = [[20, 21], [22, 23, 24, 25, 26], [27], [28, 29, 30], [31, 32, 33, 34]]
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]  # 5, 7, 5, 4, 6

    def stepped(groups):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=40,
                n_positions=16,
                n_embd=16,
                n_layer=1,
                n_head=2,
                bos_token_id=1,
                eos_token_id=1,
                **NO_DROPOUT,
            )
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        batches = [collate_sequences([prompts[i] for i in g], [responses[i] for i in g], 0) for g in groups]
        units = [float(b["response_mask"].sum()) for b in batches]
        micro = unit_weighted_micro_batches(batches, units, OneCPUProcess())
        train_step(
            "sft", RunDir("run"), "step 1", OneCPUProcess(), model, optimizer, scheduler, micro, sft_batch_loss, 0
        )
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    whole = stepped([[0, 1, 2, 3, 4]])
    budget = budget_micro_rows([0, 1, 2, 3, 4], lengths, 12)
    assert budget == [[1], [4, 0], [2, 3]]  # 7; 2 x 6 = 12; 2 x 5 = 10 positions
    torch.testing.assert_close(stepped(budget), whole, atol=1e-6, rtol=1e-5)
    # weighted equally instead, the same micro-batches give another step: the weighting is what makes it the same
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=1, eos_token_id=1, **NO_DROPOUT
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    batches = [collate_sequences([prompts[i] for i in g], [responses[i] for i in g], 0) for g in budget]
    micro = equal_micro_batches(batches, "cpu")
    train_step("sft", RunDir("run"), "step 1", OneCPUProcess(), model, optimizer, scheduler, micro, sft_batch_loss, 0)
    equal = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.allclose(equal, whole, atol=1e-6, rtol=1e-5)


def test_train_step_stops_on_a_non_finite_loss_in_one_line_before_stepping():
    model = torch.nn.Linear(1, 1)
    weight = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    finite_then_inf = iter([1.0, float("inf")])
    with pytest.raises(UserError) as info:
        train_step(
            "sft",
            RunDir("run"),
            "step 4",
            OneCPUProcess(),
            model,
            optimizer,
            None,
            equal_micro_batches([{"x": torch.ones(1, 1)}] * 2, "cpu"),
            lambda model, batch: (model(batch["x"]).sum() * 0.0 + next(finite_then_inf), {}),
            1.0,
        )
    checkpoint = Path("run") / "sft" / "checkpoint"
    assert str(info.value) == (
        f"sft: non-finite loss (inf) at step 4; the last good checkpoint is kept in {checkpoint}; "
        "lower sft.lr or check the data"
    )
    assert torch.equal(model.weight, weight)  # the optimizer never stepped


def test_a_checkpoint_of_another_config_is_an_error_for_every_stage(tmp_path):
    from rlhf.models.checkpoint import check_checkpoint_config, save_training_state

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    final = tmp_path / "sft" / "checkpoint"
    check_checkpoint_config(final, "abc")  # none yet
    save_training_state(final, model, optimizer, scheduler, {"step": 1, "fingerprint": "abc"})
    check_checkpoint_config(final, "abc")
    with pytest.raises(UserError, match=re.escape(f"{final} belongs to a different config; delete it or pass --force")):
        check_checkpoint_config(final, "xyz")


def test_a_parameter_with_optim_settings_gets_its_own_group():
    model = torch.nn.Linear(3, 2)
    model.register_parameter("scale", torch.nn.Parameter(torch.zeros(())))
    model.scale._optim = {"lr": 0.05, "weight_decay": 0.0}
    groups = build_optimizer(model, TrainConfig(lr=1e-4, weight_decay=0.1)).param_groups
    assert [(len(g["params"]), g["lr"], g["weight_decay"]) for g in groups] == [
        (1, 1e-4, 0.1),
        (1, 1e-4, 0.0),
        (1, 0.05, 0.0),
    ]
    assert groups[2]["params"][0] is model.scale


AVX2_EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma bmi2 sha_ni\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    "cpuinfo, expected", [(AVX2_EPYC, False), (SAPPHIRE_RAPIDS, True), (GRAVITON3, True), ("processor : 0\n", None)]
)
def test_bf16_arithmetic_is_read_from_the_cpu_flags(cpuinfo, expected):
    from rlhf.models.training import cpu_computes_bf16

    assert cpu_computes_bf16(cpuinfo) is expected


@pytest.mark.parametrize("cpuinfo", [AVX2_EPYC, SAPPHIRE_RAPIDS])
@pytest.mark.parametrize("mixed_precision", ["bf16", "no"])
def test_bf16_without_bf16_arithmetic_is_one_line_at_start_up(monkeypatch, cpuinfo, mixed_precision):
    import rlhf.models.training as training

    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda p, *a, **k: cpuinfo if str(p) == "/proc/cpuinfo" else real_read(p))
    printed = []
    accelerator = SimpleNamespace(device=torch.device("cpu"), print=printed.append)
    training.warn_if_bf16_is_emulated(accelerator, mixed_precision)
    if cpuinfo is AVX2_EPYC and mixed_precision == "bf16":
        [line] = printed
        assert "without bf16 arithmetic" in line and "avx512_bf16, amx_bf16" in line
        assert line.endswith("pass run.mixed_precision=no") and "\n" not in line
    else:
        assert printed == []


def test_a_shared_cpu_gets_advice_only_while_idle_threads_spin(monkeypatch):
    import rlhf.models.training as training

    printed = []
    accelerator = SimpleNamespace(device=torch.device("cpu"), print=printed.append)
    monkeypatch.setattr(training, "idle_cores", lambda: 0.4)  # another job holds most of the cores
    monkeypatch.setattr(training.torch, "get_num_threads", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    training.warn_if_cpu_shared(accelerator)
    assert len(printed) == 1 and "only 0.4 of" in printed[0] and "GOMP_SPINCOUNT=1000" in printed[0]
    for key, value in (("GOMP_SPINCOUNT", "1000"), ("OMP_WAIT_POLICY", "PASSIVE")):  # the wait was chosen
        monkeypatch.setenv(key, value)  # (run_all.sh sets the first)
        training.warn_if_cpu_shared(accelerator)
        monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user chose the threads
    training.warn_if_cpu_shared(accelerator)
    assert len(printed) == 1
