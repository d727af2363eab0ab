"""LoRA: the reference is the policy with its adapters disabled, only adapters (and the reward head) train,
the merged artifact loads with plain transformers, the adapters with peft, and checkpoints resume exactly."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from peft import PeftModel
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)

from rlhf.core.errors import UserError
from rlhf.models.checkpoint import load_training_state, save_pretrained_atomic, save_training_state
from rlhf.models.lora import (
    is_lora,
    load_trainable_policy,
    lora_targets,
    ppo_critic_and_reward,
    reference_policy,
    with_lora,
)
from rlhf.models.modeling import load_policy, load_reward_model, reward_scores, token_logprobs
from rlhf.models.roles import check_frozen, frozen_digests
from rlhf.models.training import build_optimizer
from rlhf.stage.config import LORA_AFTER_SFT, load_config, preset_path, to_dict
from rlhf.stage.run import LATER_KEYS, LATER_SECTIONS, STAGES, RunDir, stage_inputs, stage_sections, stage_seed
from rlhf.stage.schema import LORA_STAGES, LoRAConfig

LORA = LoRAConfig(enabled=True, r=4, alpha=8.0)
CPU = torch.device("cpu")


def tiny_config(**overrides) -> GPT2Config:
    settings = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 50, "n_positions": 32, "pad_token_id": 0}
    return GPT2Config(**{**settings, **overrides})


@pytest.fixture
def sft_dir(tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(tiny_config()).save_pretrained(tmp_path / "sft" / "model")
    return tmp_path / "sft" / "model"


@pytest.fixture
def reward_dir(tmp_path):
    torch.manual_seed(1)
    model = GPT2ForSequenceClassification(tiny_config(num_labels=1))
    model.save_pretrained(tmp_path / "reward" / "model")
    (tmp_path / "reward" / "model" / "reward_config.json").write_text('{"pooling": "last"}')
    return tmp_path / "reward" / "model"


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 50, (3, 9), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # a right-padded row
    ids[1, 6:] = 0  # the pad id: sequence classification reads the score before the first one
    return ids, mask


def train_steps(model, steps: int = 2, seed: int = 0) -> None:
    """`steps` AdamW steps of an SFT-like loss, with the stages' optimizer (trainable parameters only)."""
    optimizer = build_optimizer(model, load_config().sft)
    for param_group in optimizer.param_groups:
        param_group["lr"] = 1e-2
    for step in range(steps):
        ids, mask = batch(seed + step)
        loss = -token_logprobs(model, ids, mask).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_reference_by_disabled_adapters_equals_a_separate_frozen_copy(sft_dir):
    policy = load_trainable_policy(sft_dir, LORA)
    train_steps(policy)
    reference = reference_policy(policy, sft_dir, CPU)
    ids, mask = batch(7)
    with torch.no_grad():
        ref_logprobs = token_logprobs(reference, ids, mask)  # (B, T)
        copy_logprobs = token_logprobs(load_policy(sft_dir), ids, mask)  # (B, T)
        policy_logprobs = token_logprobs(policy, ids, mask)  # (B, T)
    assert (ref_logprobs - copy_logprobs).abs().max() <= 1e-6
    assert (policy_logprobs - copy_logprobs).abs().max() > 1e-3  # the adapters are back on after the reference pass
    assert all(p.requires_grad for n, p in policy.named_parameters() if "lora_" in n)
    # generation too: the same random numbers give the same tokens as the frozen copy
    torch.manual_seed(3)
    ours = reference.generate(input_ids=ids[:, :4], do_sample=True, max_new_tokens=5, pad_token_id=0)
    torch.manual_seed(3)
    theirs = load_policy(sft_dir).generate(input_ids=ids[:, :4], do_sample=True, max_new_tokens=5, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_without_lora_the_reference_is_a_frozen_copy(sft_dir):
    policy = load_trainable_policy(sft_dir, LoRAConfig())
    reference = reference_policy(policy, sft_dir, CPU)
    assert not is_lora(policy) and reference is not policy
    assert not any(p.requires_grad for p in reference.parameters())


def train_reward_steps(model) -> None:
    """Two AdamW steps on the squared scores: B moves on the first, A (whose gradient is B^T ...) on the second."""
    optimizer = build_optimizer(model, load_config().reward)
    for param_group in optimizer.param_groups:
        param_group["lr"] = 1e-2
    for step in range(2):
        ids, mask = batch(step)
        reward_scores(model, ids, mask).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_only_adapters_and_the_score_head_train_and_base_weights_stay_bit_identical(reward_dir):
    model = with_lora(load_reward_model(reward_dir), LORA)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "score.modules_to_save" in n for n in trainable)
    assert any("score.modules_to_save" in n for n in trainable)  # the head is trained in full
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_reward_steps(model)
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert not torch.equal(param, before[name]), f"{name} did not train"
        else:
            assert torch.equal(param, before[name]), f"base weight {name} changed"
    assert sum(not p.requires_grad for p in model.parameters()) == sum(
        1 for _ in load_reward_model(reward_dir).parameters()
    )


def test_frozen_role_digest_covers_the_base_and_catches_a_change(reward_dir):
    critic, reward_model = ppo_critic_and_reward(reward_dir, "separate", LORA, CPU)
    roles = {"reward": reward_model}
    before = frozen_digests(roles)
    train_steps_critic(critic)
    check_frozen("ppo", roles, before)  # the adapters and head copy trained; the reward model did not change
    with torch.no_grad():
        reward_model.model.get_base_model().transformer.ln_f.bias.add_(1.0)
    with pytest.raises(RuntimeError, match="a frozen role changed"):
        check_frozen("ppo", roles, before)


def train_steps_critic(critic) -> None:
    optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=1e-2)
    for step in range(2):
        ids, mask = batch(step)
        critic(ids, mask).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_lora_critic_shares_the_reward_model_which_stays_exact(reward_dir):
    critic, reward_model = ppo_critic_and_reward(reward_dir, "separate", LORA, CPU)
    plain = load_reward_model(reward_dir)
    ids, mask = batch()
    with torch.no_grad():
        values = critic(ids, mask)  # (B, T)
        expected = reward_scores(plain, ids, mask)  # (B,)
        assert torch.allclose(values[torch.arange(3), mask.sum(1) - 1], expected, atol=1e-6)  # B = 0 at the start
    train_steps_critic(critic)
    with torch.no_grad():
        assert torch.equal(reward_scores(reward_model, ids, mask), expected)
        assert not torch.allclose(critic(ids, mask)[torch.arange(3), mask.sum(1) - 1], expected, atol=1e-3)
    shared = {p.data_ptr() for p in critic.parameters()} & {p.data_ptr() for p in reward_model.parameters()}
    assert len(shared) == sum(1 for _ in reward_model.parameters())  # one copy of the reward model's weights


@pytest.mark.parametrize("role", ["policy", "reward"])
def test_merged_save_loads_with_plain_transformers_and_the_adapters_with_peft(sft_dir, reward_dir, tmp_path, role):
    source, auto = (sft_dir, AutoModelForCausalLM) if role == "policy" else (reward_dir, None)
    model = load_trainable_policy(source, LORA) if role == "policy" else with_lora(load_reward_model(source), LORA)
    train_steps(model) if role == "policy" else train_reward_steps(model)
    ids, mask = batch(5)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    final = tmp_path / "stage" / "model"
    save_pretrained_atomic(model, None, final)

    loader = auto or AutoModelForSequenceClassification
    merged = loader.from_pretrained(final, use_safetensors=True)
    assert not is_lora(merged) and not any("lora" in k for k in load_file(final / "model.safetensors"))
    base = loader.from_pretrained(source, use_safetensors=True)
    adapted = PeftModel.from_pretrained(base, tmp_path / "stage" / "adapter")
    with torch.no_grad():
        assert (merged(input_ids=ids, attention_mask=mask).logits - expected).abs().max() <= 1e-5
        assert (adapted(input_ids=ids, attention_mask=mask).logits - expected).abs().max() <= 1e-6


def test_checkpoint_holds_only_the_trainable_state_and_resumes_exactly(sft_dir, tmp_path):
    def fresh(seed: int):
        torch.manual_seed(seed)  # another seed: other adapter initial values, which the checkpoint must replace
        model = load_trainable_policy(sft_dir, LORA)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return model, optimizer

    def step(model, optimizer, seed):
        ids, mask = batch(seed)
        (-token_logprobs(model, ids, mask).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()

    straight, straight_opt = fresh(0)
    step(straight, straight_opt, 0)
    save_training_state(tmp_path / "ckpt", straight, straight_opt, None, {"step": 1})
    saved = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert saved and all("lora_" in k for k in saved)  # adapters only: the frozen base comes from sft/model
    step(straight, straight_opt, 1)

    resumed, resumed_opt = fresh(123)
    assert load_training_state(tmp_path / "ckpt", resumed, resumed_opt, None) == {"step": 1}
    step(resumed, resumed_opt, 1)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_full_checkpoint_does_not_resume_a_lora_model(sft_dir, tmp_path):
    full = load_policy(sft_dir)
    save_training_state(tmp_path / "ckpt", full, torch.optim.AdamW(full.parameters()), None, {"step": 1})
    lora = load_trainable_policy(sft_dir, LORA)
    with pytest.raises(UserError, match=r"cannot resume from .*missing .*lora_A.*; it does not fit this model"):
        load_training_state(tmp_path / "ckpt", lora, torch.optim.AdamW(lora.parameters()), None)


@pytest.mark.parametrize(
    ("model", "spec", "expected"),
    [
        (GPT2LMHeadModel(tiny_config()), "auto", ["c_attn", "c_proj", "c_fc"]),
        (GPT2LMHeadModel(tiny_config()), "all-linear", ["c_attn", "c_fc", "c_proj"]),
        (GPT2ForSequenceClassification(tiny_config(num_labels=1)), "all-linear", ["c_attn", "c_fc", "c_proj"]),
        (GPT2LMHeadModel(tiny_config()), " c_attn , c_fc", ["c_attn", "c_fc"]),
        (
            LlamaForCausalLM(
                LlamaConfig(
                    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=50
                )
            ),
            "auto",
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    ],
)
def test_target_modules_per_architecture(model, spec, expected):
    assert lora_targets(model, spec) == expected  # never a head: lm_head and score sit outside the backbone


def test_unknown_target_module_is_a_one_line_error_naming_the_choices():
    with pytest.raises(UserError, match=r"q_proj is not a linear layer of this gpt2 model; choose from c_attn, c_fc"):
        with_lora(GPT2LMHeadModel(tiny_config()), LoRAConfig(enabled=True, target_modules="c_attn,q_proj"))


def test_an_architecture_without_defaults_asks_for_target_modules():
    opt = OPTForCausalLM(
        OPTConfig(
            hidden_size=16,
            ffn_dim=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=50,
            word_embed_proj_dim=16,
        )
    )
    with pytest.raises(UserError, match="target_modules=auto has no default for model_type 'opt'; set it to some of"):
        with_lora(opt, LoRAConfig(enabled=True))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora.r=0", "model.lora.r=0 must be at least 1"),
        ("model.lora.alpha=0", "model.lora.alpha=0.0 must be > 0"),
        ("model.lora.dropout=1", r"model.lora.dropout=1.0 must lie in \[0, 1\)"),
        ("model.lora.target_modules=,", "model.lora.target_modules is empty"),
        ("model.lora.stages=,", "model.lora.stages is empty"),
        ("model.lora.stages=sft,eval", "model.lora.stages: eval is not a stage that trains; choose from sft, reward"),
    ],
)
def test_bad_lora_settings_fail_at_config_load(override, message):
    with pytest.raises(UserError, match=message):
        load_config(overrides=[override])


def tiny(*overrides: str):
    return load_config(preset_path("tiny"), list(overrides))


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_lora_on_the_sft_of_a_random_base_fails_at_start_up_naming_the_recipe_that_learns(tmp_path):
    # the command: the pipeline stops before any stage, in one line that names the fix
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", "--output-dir", str(tmp_path / "run")]
    command.append("model.lora.enabled=true")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    error = result.stderr.strip()
    assert "\n" not in error and "model.lora.enabled=true trains sft as adapters on model.init=random weights" in error
    assert f"model.lora.stages={LORA_AFTER_SFT}" in error and "name sft in model.lora.stages" in error
    assert LORA_AFTER_SFT == "reward,ppo,grpo,raft,dpo,online_dpo"
    with pytest.raises(UserError, match=r"model\.init=random"):
        tiny("model.lora.enabled=true", "model.lora.stages=all")


@pytest.mark.parametrize(
    "overrides",
    [
        (),  # LoRA off: the tiny preset as it is
        ("model.lora.enabled=true", f"model.lora.stages={LORA_AFTER_SFT}"),  # full SFT, then LoRA
        ("model.lora.enabled=true", "model.lora.stages=sft,reward"),  # sft named: adapters on random weights, chosen
        ("model.lora.enabled=true", "model.init=pretrained", "model.name_or_path=gpt2"),  # a pretrained base
        ("model.lora.stages=sft",),  # LoRA off: the stages it would use do not matter
    ],
)
def test_lora_that_can_learn_or_was_chosen_loads(overrides):
    tiny(*overrides)


def test_each_stage_applies_lora_as_model_lora_stages_says():
    after = tiny("model.lora.enabled=true", "model.lora.stages= ppo, reward,dpo")
    assert after.model.lora.stage_names() == ("reward", "ppo", "dpo")  # pipeline order, spaces ignored
    assert [stage for stage in LORA_STAGES if after.model.lora.for_stage(stage).enabled] == ["reward", "ppo", "dpo"]
    assert after.model.lora.for_stage("ppo").r == 8 and after.model.lora.enabled  # only the stage's copy changes
    everywhere = load_config(preset_path("gpt2-hh"), ["model.lora.enabled=true"])
    assert all(everywhere.model.lora.for_stage(stage).enabled for stage in LORA_STAGES)
    assert not any(tiny("model.lora.stages=ppo").model.lora.for_stage(stage).enabled for stage in LORA_STAGES)


def fingerprint_before_lora_stages(run: RunDir, stage: str, cfg) -> str:
    """RunDir.fingerprint as it was before model.lora.stages existed: every section whole, no per-stage LoRA entry
    (the sections as `stage_sections` reads them now: the judge section only for a stage that asks the LLM judge)."""
    tree = to_dict(cfg)
    del tree["model"]["lora"]["stages"]  # the key those runs did not have (nor the sections and keys added since)
    for section in tree.values():
        for key in LATER_KEYS:
            section.pop(key, None)
    payload = {
        "seed": stage_seed(cfg, stage),
        "mixed_precision": cfg.run.mixed_precision,
        "sections": {section: tree[section] for section in stage_sections(stage, cfg) if section not in LATER_SECTIONS},
        "inputs": {name: fingerprint_before_lora_stages(run, name, cfg) for name in stage_inputs(stage, cfg)},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("tiny", ()),
        ("tiny", ("model.lora.r=4", "reward.pairs=both")),
        ("tiny", ("model.lora.stages=sft",)),  # LoRA off: whatever the stages
        # (rollout.engine=hf: the preset's engine before it chose vLLM when installed, as those runs sampled)
        ("gpt2-hh", ("model.lora.enabled=true", "rollout.engine=hf")),  # LoRA on every stage, as before
        ("gpt2-hh", ("model.lora.enabled=true", f"model.lora.stages=sft,{LORA_AFTER_SFT}", "rollout.engine=hf")),
    ],
)
def test_runs_with_lora_off_or_on_every_stage_keep_the_fingerprints_they_had(tmp_path, preset, overrides):
    cfg = load_config(preset_path(preset), list(overrides))
    run = RunDir(tmp_path)
    for stage in STAGES:
        assert run.fingerprint(stage, cfg) == fingerprint_before_lora_stages(run, stage, cfg), stage


def test_full_sft_then_lora_shares_data_and_sft_with_full_fine_tuning_and_reruns_the_rest(tmp_path):
    run = RunDir(tmp_path)
    full = tiny()
    after = tiny("model.lora.enabled=true", f"model.lora.stages={LORA_AFTER_SFT}")
    some = tiny("model.lora.enabled=true", "model.lora.stages=reward,ppo")
    shared = [stage for stage in STAGES if run.fingerprint(stage, full) == run.fingerprint(stage, after)]
    assert shared == ["data", "sft", "collect"]  # collect samples the SFT policy: it trains nothing
    # which stages train adapters is each stage's own: reward (and judge_rm, trained as reward is) and ppo agree,
    # grpo (full here) does not
    assert [stage for stage in STAGES if run.fingerprint(stage, after) == run.fingerprint(stage, some)] == [
        "data",
        "sft",
        "collect",
        "reward",
        "judge_rm",
        "ppo",
    ]
    assert run.fingerprint("grpo", some) != run.fingerprint("grpo", full)  # it reads a LoRA-trained reward model
