"""What the report reads and the fixed vocabulary it writes: `RunData` (the run's loaded files), the
stage, model and judge names, the figures it links, and the published numbers of its external section."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf.core.stages import POLICY_STAGES, STAGES, TRAINED_STAGES

NA = "n/a"


SUMMARY_SECTION = {  # trained stage -> its summary.json section, where they differ
    name: STAGES[name].summary_section for name in TRAINED_STAGES if STAGES[name].summary_section != name
}


MODEL_ORDER = ("base", *POLICY_STAGES)  # then best_of_<N>, chosen, and anything else by name


STAGE_LABELS = {name: spec.label for name, spec in STAGES.items() if spec.label is not None}


JUDGES = {
    "gold": "the embedded task's exact gold judge (`rlhf/task/gold.py`): the true quality of each response",
    "reward": "the run's own reward model, used as a judge (the proxy the RL stages optimised)",
    "independent": "a second reward model (stage `judge_rm`), trained the same way on held-out pairs that neither the "
    "training reward model nor any policy saw: optimising the proxy cannot fool it the way it fools the proxy, but it "
    "is no more accurate than a reward model of its size on so few pairs (its held-out accuracy is in the "
    "[Reward model](#reward-model) section)",
    "openai": "an OpenAI-compatible chat model, each pair judged in both orders at temperature 0",
}


ERROR_CATEGORY_ORDER = ("confident_wrong", "longer_rejected_preferred", "small_margin", "very_short")


# Published numbers (see /work/shared/REFERENCES.md), shown only in the "External reference points" section.
EXTERNAL_REFERENCES = (
    (
        "RM accuracy on HH-RLHF, sub-1B language models",
        "about 0.60–0.67",
        "OpenAssistant Pythia reward models; two GPT-2 reports give 0.628 and 0.673",
    ),
    ('RM accuracy on HH-RLHF, the "pick the longer answer" heuristic', "about 0.55", "trlx issue discussion"),
    ("RM accuracy on TL;DR, Pythia 1B / 2.8B / 6.9B", "0.629 / 0.669 / 0.689", "Huang et al. 2024 (arXiv 2403.17031)"),
    (
        "DPO implicit-reward accuracy on TL;DR, same models",
        "0.621 / 0.663 / 0.674",
        "Huang et al. 2024 (arXiv 2403.17031)",
    ),
    (
        "PPO win rate vs reference summaries (GPT-3.5 judge), Pythia 1B / 2.8B / 6.9B",
        "about 0.58 on good seeds (2 of 4 seeds collapsed) / 0.724 / 0.769",
        "Huang et al. 2024 (arXiv 2403.17031)",
    ),
    ("PPO win rate, Pythia-1B, GPT-4o-mini judge", "64.7% (SFT 33.0%)", "TRL documentation"),
    (
        "One checkpoint under three judges",
        "46.3% (Llama-3-70B), 52.5% (GPT-3.5), 63.0% (GPT-4o-mini)",
        "TRL judge script docstring",
    ),
    (
        "DPO vs chosen on HH-RLHF, Pythia-2.8B, GPT-4 judge",
        "about 0.6; PPO no better than base",
        "Rafailov et al. 2023 (arXiv 2305.18290)",
    ),
    ("Human–human agreement on preference labels", "about 0.63–0.77", "Bai et al. 2022; Stiennon et al. 2020"),
    (
        "GPT-2 124M pipeline on one RTX A6000",
        "6.5 h in total; PPO 52 min for 10k prompts; DPO 163 min per epoch",
        "one of the reports this project reproduces",
    ),
)


FIGURES = (  # key, title, what to look for
    (
        "reward_vs_kl",
        "Reward vs KL to the reference",
        "Each model is a point; best-of-N from the SFT policy is the curve (its KL is the analytic log N − (N−1)/N). "
        "Up and to the left is better. A policy far above best-of-N on reward-model score but not on gold score is "
        "over-optimising the proxy (Gao et al. 2022, arXiv 2210.10760).",
    ),
    (
        "reward_distributions",
        "Reward-model scores per model",
        "The spread of the reward-model score over the evaluation prompts, one violin per model.",
    ),
    (
        "win_rates",
        "Win rates per judge",
        "Cell (row A, column B): win rate of A against B, ties counted half. Measured pairings are shown; their mirror "
        "cells are 1 − the measured value; n/a where a pairing was not judged.",
    ),
    (
        "training_curves",
        "Training curves of every stage",
        "A fixed set of metrics per stage, against optimizer step (PPO, GRPO, online DPO: iteration; RAFT: round); "
        "absent metrics are skipped, "
        "and so are those logged once (final validation numbers such as `sft/val/loss`): their values are in the "
        "[Training](#training) table.",
    ),
    (
        "response_lengths",
        "Response lengths per model",
        "Tokens per evaluation response. A policy that drifts long (or piles up at the token budget) is a sign of "
        "length hacking or of missing EOS.",
    ),
    ("data_lengths", "Preference data: token lengths", "Chosen vs rejected response lengths, per split (data stage)."),
    ("reward_test", "Reward model on the test split", "Rewards of chosen vs rejected test responses (reward stage)."),
)


# A caption that speaks of gold is wrong for a run without the gold judge: these replace it there.
FIGURE_CAPTIONS_WITHOUT_GOLD = {
    "reward_vs_kl": "Each model is a point; best-of-N from the SFT policy is the curve (its KL is the analytic "
    "log N − (N−1)/N). Up and to the left is better on the reward model's score, the proxy the RL stages optimised: "
    "a policy far above best-of-N may be exploiting the reward model rather than answering better (Gao et al. "
    "2022, arXiv 2210.10760), which only a judge independent of training (eval.judges: openai) can tell apart.",
}


@dataclass
class RunData:
    """Everything the report reads, already loaded from the run folder."""

    summary: dict  # summary.json
    preset: str | None = None  # the preset name, when run from one
    run_dir: str = ""  # where the run folder is (shown, never read here)
    model: dict = field(default_factory=dict)  # {"name_or_path", "init", "model_type", "config_overrides", "n_params"}
    responses: dict[str, list[dict]] = field(default_factory=dict)  # eval/responses/<model>.jsonl rows
    suite_rows: dict[str, list[dict]] = field(default_factory=dict)  # eval/suites/<suite>.jsonl rows
    error_analysis: dict = field(default_factory=dict)  # reward/error_analysis.json
    seeds: dict = field(default_factory=dict)  # seeds/summary.json (part4_eval/seeds.py), when it has run
    pipeline_seeds: dict = field(default_factory=dict)  # pipeline_seeds/summary.json (seeds.py --scope pipeline)
    figures: dict[str, str] = field(
        default_factory=dict
    )  # figure key (FIGURES, or curves_<stage>) -> path relative to report.md
    prompt_families: dict[str, str] = field(default_factory=dict)  # eval prompt -> embedded task family
    # what the reader must know before any number: e.g. a model whose evaluation is of an earlier run of its stage
    warnings: list[str] = field(default_factory=list)
