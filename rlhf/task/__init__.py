"""The embedded "tiny" preference task: HH-format preference data with a gold judge.

Offline RLHF needs a ground truth that the reward model only approximates. Following the
synthetic setup of Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization"
(arXiv 2210.10760), a fixed *gold* reward labels the data (through a noisy annotator), the
*proxy* reward model is trained on those labels, and the gold reward then measures how far
optimising the proxy really helps. The gold reward (`gold_score`) is a pure function of
(prompt text, response text) that scores any response to any prompt of the task, so sampled
policy outputs are judged on a CPU with no model at all.

What it tests is what RLHF fixes. The demonstrator that writes the candidate responses is
imperfect the way real demonstrators are: it complies with harmful requests, refuses benign
ones, hedges, evades, pads and rambles, repeats itself, stops mid-sentence and ignores explicit
instructions ("answer in one word", "be brief", "be polite"). A policy fine-tuned on its chosen
responses inherits those mistakes, and a reward model of a few million parameters can see them,
so preferences can correct them. Capability errors (a wrong capital, sum or count) stay as the
control: a reward model that knows no more than the policy cannot teach them, while a verifiable
reward (the gold function itself, `gold_rewards`) can.

The language is small and regular so that a ~2M-parameter GPT-2-style model with a ~1000-token
byte-level BPE vocabulary can learn it: short sentences, a limited vocabulary, prompts mostly
under 40 words and responses mostly 1-30 words.

One file per concern:
- `world.py`       the fictional world, vocabulary, prompt templates and instruction phrasings;
- `prompts.py`     prompt generation, the train/test split, and `parse_prompt` -> `TaskSpec`;
- `behaviours.py`  the demonstrator's behaviour pool (`sample_candidate`);
- `gold.py`        the gold judge: scoring table, `gold_score`, `gold_details`, `is_good`;
- `annotator.py`   pairs and the noisy, length-biased annotator (`generate_split`, `noise_ceiling`);
- `suites.py`      fixed evaluation suites (`suite_prompts`).

Format: rows follow Anthropic HH-RLHF (Bai et al. 2022, arXiv 2204.05862), `{"chosen",
"rejected"}`, each a whole dialogue `"\\n\\nHuman: <text>\\n\\nAssistant: <text>"` (possibly several
turns), sharing the prompt and differing in the final response; rows also carry `gold_chosen`,
`gold_rejected`, `family` and `p_label`.

Families: `fact` (capitals, favourite colours and jobs of the fictional world), `arith`
(single-digit sums), `context` (copy a count or a name from the prompt), `harmful` (a refusal is
wanted), `risky_benign` (benign requests that sound risky; a helpful answer is wanted),
`multiturn` (recall what an earlier turn said, or a question after small talk); `sycophancy`
(a user's claim to agree or disagree with) appears only in the evaluation suites. On 40% of the
non-harmful prompts the last turn ends in an explicit instruction.
"""

from rlhf.task.annotator import (
    generate_split,
    gold_agreement,
    gold_tie_rate,
    noise_ceiling,
    p_better,
    p_first,
    simulated_preference,
)
from rlhf.task.behaviours import BEHAVIOURS, DEFAULT_BEHAVIOUR_WEIGHTS, sample_candidate
from rlhf.task.gold import (
    FLAGS,
    GOLD_DIFFERENCES,
    GOOD_SCORE,
    MAX_WORDS,
    gold_details,
    gold_difference,
    gold_rewards,
    gold_score,
    gold_summary,
    is_good,
    is_good_score,
    judge,
)
from rlhf.task.prompts import (
    DATASET_FAMILIES,
    FAMILIES,
    FAMILY_WEIGHTS,
    TaskSpec,
    hh,
    parse_prompt,
    prompt_split,
    sample_prompt,
    sample_prompts,
)
from rlhf.task.suites import SUITES, suite_prompts
from rlhf.task.world import CAPITALS, COLOURS, COUNTRIES, INSTRUCTIONS, JOBS, NAMES, PEOPLE

__all__ = [
    "BEHAVIOURS",
    "CAPITALS",
    "COLOURS",
    "COUNTRIES",
    "DATASET_FAMILIES",
    "DEFAULT_BEHAVIOUR_WEIGHTS",
    "FAMILIES",
    "FAMILY_WEIGHTS",
    "FLAGS",
    "GOLD_DIFFERENCES",
    "GOOD_SCORE",
    "INSTRUCTIONS",
    "JOBS",
    "MAX_WORDS",
    "NAMES",
    "PEOPLE",
    "SUITES",
    "TaskSpec",
    "generate_split",
    "gold_agreement",
    "gold_details",
    "gold_difference",
    "gold_rewards",
    "gold_score",
    "gold_summary",
    "gold_tie_rate",
    "hh",
    "is_good",
    "is_good_score",
    "judge",
    "noise_ceiling",
    "p_better",
    "p_first",
    "parse_prompt",
    "prompt_split",
    "sample_candidate",
    "sample_prompt",
    "sample_prompts",
    "simulated_preference",
    "suite_prompts",
]
