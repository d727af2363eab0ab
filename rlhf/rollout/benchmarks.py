"""Public benchmarks answered by a policy: IFEval and XSTest (rlhf/benchmarks/), each prompt a single user turn in
the run's prompt format (the model's chat template under data.chat_template, else HH text), decoded greedily (the
benchmarks' authors' setting, and no sampling noise between two models), then scored by the benchmark's own rules.

    answered = answer_benchmark("ifeval", path, engine, policy, tokenizer, ...)   # rows, prompts, responses
    summary = answered.summary()                                                  # its accuracies, with intervals
    change = paired_benchmark_change("ifeval", sft_answered, answered)            # against another model
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.benchmarks import ifeval, locate, xstest
from rlhf.chat import render_prompt
from rlhf.core.batching import encode_texts
from rlhf.core.errors import UserError
from rlhf.data import hh_prompt
from rlhf.models.modeling import context_length
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.evaluation import sample_for_eval

BENCHMARKS = ("ifeval", "xstest")
BENCHMARK_STREAM = -2  # seeds of their own (unused by greedy decoding, but kept apart from the eval's streams)


def load_benchmark(name: str, path: str) -> list:
    """The benchmark's prompts as its loader reads them (IFEval's InstructionPrompt, XSTest's XSTestPrompt); a
    relative path from the working folder, or else from the checkout (`rlhf.benchmarks.locate`)."""
    if name == "ifeval":
        return ifeval.load_ifeval(locate(path))
    if name == "xstest":
        return xstest.load_xstest(locate(path))
    raise UserError(f"unknown benchmark '{name}'; choose from {', '.join(BENCHMARKS)}")


def render_user_prompt(tokenizer, text: str, chat_template: bool) -> str:
    """One user turn, as the run renders its prompts: the model's chat template, or HH's "Human:/Assistant:" text."""
    prompt = hh_prompt(text)
    return render_prompt(tokenizer, prompt) if chat_template else prompt


@dataclass
class Answered:
    """One model's responses to one benchmark, and their per-prompt verdicts."""

    name: str
    rows: list  # the benchmark's prompt rows
    responses: list[str]
    lengths: list[int]
    finished: list[bool]
    verdicts: list[dict]  # per prompt: IFEval's per-instruction strict/loose, or XSTest's class

    def summary(self) -> dict:
        result = ifeval.summarize(self.verdicts) if self.name == "ifeval" else xstest.summarize_xstest(self.verdicts)
        result["length_mean"] = sum(self.lengths) / len(self.lengths)
        result["eos_rate"] = sum(self.finished) / len(self.finished)
        return result

    def records(self, model: str) -> list[dict]:
        """JSONL rows: the prompt, the response and its verdict, per prompt."""
        return [
            {"model": model, "prompt": row.prompt, "response": response, "length": n, "finished": f, **verdict}
            for row, response, n, f, verdict in zip(
                self.rows, self.responses, self.lengths, self.finished, self.verdicts
            )
        ]


def answer_benchmark(
    name: str,
    rows: list,
    engine,
    policy,
    tokenizer,
    chat_template: bool,
    max_new_tokens: int,
    batch_size: int,
    accelerator,
    max_prompt_tokens: int | None = None,
) -> Answered:
    """`policy` answers every prompt of `rows` greedily (sharded over processes by `sample_for_eval`), scored by the
    benchmark. A prompt longer than `max_prompt_tokens` (default: what the policy's positions leave beside the
    answer) keeps its last tokens (the end is where the answer starts)."""
    texts = [render_user_prompt(tokenizer, row.prompt, chat_template) for row in rows]
    prompt_ids = encode_texts(tokenizer, texts)
    if max_prompt_tokens is None and (positions := context_length(getattr(policy, "config", None))):
        if positions <= max_new_tokens:
            raise UserError(
                f"{name}: the model attends over {positions} positions, no more than the {max_new_tokens} new tokens "
                "asked for; ask for fewer"
            )
        max_prompt_tokens = positions - max_new_tokens
    if max_prompt_tokens:
        prompt_ids = [ids[-max_prompt_tokens:] for ids in prompt_ids]
    sampling = SamplingConfig(max_new_tokens, temperature=0.0)
    samples = sample_for_eval(
        engine, policy, tokenizer, prompt_ids, sampling, 0, batch_size, None, accelerator, stream=BENCHMARK_STREAM
    )
    responses = [text.strip() for text in samples["responses"]]
    verdicts = ifeval.score_rows(rows, responses) if name == "ifeval" else xstest.score_xstest(rows, responses)["rows"]
    return Answered(name, rows, responses, samples["lengths"], samples["finished"], verdicts)


def paired_benchmark_change(before: Answered, after: Answered) -> dict:
    """`after` minus `before` on the same prompts: IFEval's accuracies, or XSTest's compliance and refusal rates."""
    if before.name == "ifeval":
        return ifeval.paired_change(before.verdicts, after.verdicts)
    return xstest.paired_xstest_change(before.verdicts, after.verdicts)


# The numbers a benchmark is read by: IFEval's prompt- and instruction-level strict accuracy; XSTest's compliance on
# safe prompts and refusal of unsafe ones. Their changes against SFT are Holm-adjusted over the models (eval).
HEADLINE_BENCHMARK_METRICS = {
    "ifeval": ("prompt_strict", "instruction_strict"),
    "xstest": ("safe_compliance", "unsafe_refusal"),
}


def summary_line(name: str, summary: dict) -> str:
    """One model's headline numbers on one benchmark, with their 95% intervals."""
    value = "accuracy" if name == "ifeval" else "rate"
    return "  ".join(
        f"{key} {summary[key][value]:.3f} [{summary[key]['ci95_low']:.3f}, {summary[key]['ci95_high']:.3f}]"
        for key in HEADLINE_BENCHMARK_METRICS[name]
    )


def benchmark_line(name: str, by_model: dict[str, dict]) -> str:
    """Every model's first headline number on one benchmark, for the eval's log."""
    key = HEADLINE_BENCHMARK_METRICS[name][0]
    value = "accuracy" if name == "ifeval" else "rate"
    return f"{key}: " + ", ".join(f"{model} {summary[key][value]:.3f}" for model, summary in by_model.items())
