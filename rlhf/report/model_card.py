"""Exporting a run's model: its card (README.md of its Hugging Face folder) and its Ollama Modelfile, from the run's
own numbers (what it was trained from and on, with which method and settings, what the run measured of it), and the
report's section with the export command."""

from __future__ import annotations

import re

from rlhf.core.stages import METHOD_STAGES
from rlhf.report.contract import STAGE_LABELS, RunData
from rlhf.report.format import fmt, fmt_ci, get_path, is_number, markdown_table
from rlhf.report.training_sections import headline_judge

METHODS = {
    "sft": "supervised fine-tuning on the preferred responses",
    "ppo": "PPO against the reward model (Schulman et al. 2017; Ouyang et al. 2022; Huang et al. 2024's details)",
    "grpo": "GRPO: group-relative advantages, no critic (Shao et al. 2024)",
    "raft": "RAFT: reward-ranked fine-tuning on the best of several samples (Dong et al. 2023)",
    "dpo": "DPO on preference pairs (Rafailov et al. 2023)",
    "online_dpo": "online DPO on pairs of its own samples ranked by the reward (Guo et al. 2024)",
    "base": "none: the pretrained model the run started from",
}
# Settings worth a line in a card, by stage, when the stage's config has them.
CARD_SETTINGS = {
    "sft": ("lr", "epochs", "max_steps", "batch_size"),
    "ppo": ("lr", "total_episodes", "batch_size", "kl_coef", "max_new_tokens", "reward"),
    "grpo": ("lr", "total_episodes", "batch_size", "group_size", "kl_coef", "max_new_tokens", "reward"),
    "raft": ("lr", "rounds", "prompts_per_round", "samples_per_prompt", "max_new_tokens", "reward"),
    "dpo": ("lr", "epochs", "max_steps", "batch_size", "beta", "loss_type"),
    "online_dpo": ("lr", "total_episodes", "batch_size", "beta", "judge", "max_new_tokens"),
}
BENCHMARK_ROWS = {
    "ifeval": (
        ("prompt_strict", "IFEval prompt-level strict accuracy"),
        ("instruction_strict", "IFEval instruction-level strict accuracy"),
    ),
    "xstest": (
        ("safe_compliance", "XSTest: safe prompts complied with"),
        ("unsafe_refusal", "XSTest: unsafe prompts refused"),
    ),
}


def measured_rows(summary: dict, model: str) -> list[list[str]]:
    """The run's numbers for `model`: each judge's win rate against SFT, the public benchmarks with their change
    against SFT, KL to SFT and answer length; every row with its 95% interval where the run has one."""
    rows = []
    for judge, pairings in (get_path(summary, "eval.win_rates", {}) or {}).items():
        entry = (pairings or {}).get(f"{model}_vs_sft")
        if isinstance(entry, dict) and is_number(entry.get("win_rate")):
            interval = fmt_ci(entry.get("ci95_low"), entry.get("ci95_high"))
            rows.append(
                [f"win rate vs SFT ({judge} judge, n = {entry.get('n')})", f"{fmt(entry['win_rate'])} {interval}"]
            )
    for bench, metrics in BENCHMARK_ROWS.items():
        entry = get_path(summary, f"eval.benchmarks.{bench}.{model}")
        if not isinstance(entry, dict):
            continue
        for key, label in metrics:
            value = entry.get(key) or {}
            number = value.get("accuracy", value.get("rate"))
            if not is_number(number):
                continue
            text = f"{fmt(number)} {fmt_ci(value.get('ci95_low'), value.get('ci95_high'))}"
            change = get_path(entry, f"change_vs_sft.{key}")
            if isinstance(change, dict) and is_number(change.get("change")):
                text += f"; vs SFT {change['change']:+.3f} {fmt_ci(change.get('ci95_low'), change.get('ci95_high'))}"
            rows.append([label, text])
    metrics = get_path(summary, f"eval.models.{model}", {}) or {}
    if is_number(metrics.get("kl_to_ref")) and model != "sft":
        rows.append(["KL to SFT (nats, per answer)", fmt(metrics["kl_to_ref"])])
    if is_number(metrics.get("length_mean")):
        rows.append(["answer length (tokens)", fmt(metrics["length_mean"], 1)])
    if metrics.get("degenerate"):
        rows.append(["flagged degenerate", "; ".join(metrics["degenerate"])])
    return rows


def is_hub_id(source: str) -> bool:
    """A Hugging Face Hub repository id ("gpt2", "meta-llama/Llama-3.2-1B"), not a path, GGUF file or package."""
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?", source) is not None and not (
        source.endswith(".gguf")
    )


def model_card(model: str, stage_config: dict, summary: dict, export: dict) -> str:
    """README.md of an exported model: YAML front matter for the Hub, then what it is, how it was trained, what the
    run measured, and how to run the GGUF file. `stage_config` is the config the stage ran with (as a dict),
    `export` what the exporter wrote (`gguf`, `type`, `modelfile`, `base_model`)."""
    base = export.get("base_model")
    front = ["---", "library_name: transformers", "tags:", "- rlhf", f"- {model}"]
    if base and is_hub_id(base):  # the Hub's field takes a repository id, not a file or a package path
        front.append(f"base_model: {base}")
    front.append("---")
    data = stage_config.get("data", {})
    embedded = data.get("path") in (None, "", "embedded")
    source = "the embedded task of this repository (docs/task.md)" if embedded else f"`{data['path']}`"
    settings = stage_config.get(model, {}) if model in CARD_SETTINGS else {}
    setting_text = ", ".join(f"`{model}.{k}={settings[k]}`" for k in CARD_SETTINGS.get(model, ()) if k in settings)
    lines = [
        *front,
        "",
        f"# {STAGE_LABELS.get(model, model)} policy of an RLHF run",
        "",
        f"- **Method:** {METHODS.get(model, model)}.",
        f"- **Started from:** {base or 'a model built from its config (random initialisation)'}.",
        f"- **Data:** {source}.",
    ]
    if setting_text:
        lines.append(
            f"- **Settings:** {setting_text} (the whole config: `config.yaml` of the run's `{model}/` folder)."
        )
    rows = measured_rows(summary, model)
    lines += ["", "## What the run measured", ""]
    if rows:
        lines += [
            "One run, one seed, on the run's test prompts (intervals: 95%, from the prompts' own variance; see the "
            "run's report.md for how each judge was checked):",
            "",
            markdown_table(["measure", "value [95% CI]"], rows, "ll"),
        ]
    else:
        lines.append("The run's evaluation stage has not measured this model.")
    gguf_name = export["gguf"]
    lines += [
        "",
        "## Running it",
        "",
        "```bash",
        "python -c \"from transformers import AutoModelForCausalLM as M; M.from_pretrained('.')\"  # this folder",
        f"llama-cli -m ../{gguf_name} -cnv        # llama.cpp: the chat template is in the file",
        f"ollama create {model} -f ../{export['modelfile']} && ollama run {model}",
        "```",
        "",
        f"`{gguf_name}` is this model in GGUF ({export['type']}), written by `part4_eval/export.py`.",
    ]
    return "\n".join(lines) + "\n"


def modelfile(gguf_name: str, chat_format: str, stop: list[str], system: str | None) -> str:
    """An Ollama Modelfile for the GGUF file beside it. `chat_format` "chatml" or "hh" gives Ollama the template in
    its own (Go) syntax, the same text the model's chat template renders; any other leaves it to Ollama, which
    reads the file's chat template where it recognises it."""
    lines = [f"FROM ./{gguf_name}"]
    if chat_format == "chatml":
        lines += [  # Ollama puts the SYSTEM line among .Messages itself: the template renders every message once
            'TEMPLATE """{{- range .Messages }}<|im_start|>{{ .Role }}',
            "{{ .Content }}<|im_end|>",
            "{{ end }}<|im_start|>assistant",
            '"""',
        ]
        if system:
            lines.append(f'SYSTEM """{system}"""')
    elif chat_format == "hh":
        lines += [
            'TEMPLATE """{{- range .Messages }}{{ if eq .Role "assistant" }}',
            "",
            "Assistant: {{ .Content }}{{ else }}",
            "",
            "Human: {{ .Content }}{{ end }}{{ end }}",
            "",
            'Assistant:"""',
        ]
    lines += [f'PARAMETER stop "{token}"' for token in stop]
    return "\n".join(lines) + "\n"


def best_policy(summary: dict) -> tuple[str, dict] | None:
    """The trained policy with the highest win rate against SFT under the headline's judge, models flagged
    degenerate left out, with its entry; None without one."""
    judge = headline_judge(summary)
    pairings = (get_path(summary, "eval.win_rates", {}) or {}).get(judge) or {}
    models = get_path(summary, "eval.models", {}) or {}
    candidates = [
        (pairings[f"{m}_vs_sft"]["win_rate"], m)
        for m in METHOD_STAGES
        if isinstance(pairings.get(f"{m}_vs_sft"), dict)
        and is_number(pairings[f"{m}_vs_sft"].get("win_rate"))
        and not (models.get(m) or {}).get("degenerate")
    ]
    if not candidates:
        return None
    _, model = max(candidates)
    return model, {"judge": judge, **pairings[f"{model}_vs_sft"]}


def section_export(data: RunData) -> str:
    """The command that writes a model of this run as a GGUF file for llama.cpp and Ollama (part4_eval/export.py)."""
    best = best_policy(data.summary)
    if best is None:
        return ""
    model, entry = best
    run = data.run_dir or "<run folder>"
    lines = [
        "## Running a model of this run elsewhere",
        "",
        f"`{model}` has the highest win rate against SFT under the `{entry['judge']}` judge here "
        f"({fmt(entry['win_rate'])} {fmt_ci(entry.get('ci95_low'), entry.get('ci95_high'))}; one run, so not a "
        "ranking of the methods). As one GGUF file with its tokenizer and chat template, an Ollama Modelfile and a "
        "Hugging Face folder with a model card:",
        "",
        "```bash",
        f"python part4_eval/export.py {run} {model}              # or --type q8_0; any other model by name",
        f"llama-cli -m {run}/export/{model}.gguf -cnv",
        "```",
        "",
        "The repository's docs/export.md has Ollama's commands and the checks the file passes.",
    ]
    return "\n".join(lines)
