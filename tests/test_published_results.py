"""The real-model numbers README and ANALYSIS print, recomputed from the answers and labels committed in results/
(issue 51: a number a reader cannot recompute is a claim, not a result). A test fails when a file shows a number
the data no longer gives."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from conftest import REPO

RESULTS = REPO / "results"
ANALYSIS = (REPO / "ANALYSIS.md").read_text()
README = (REPO / "README.md").read_text()


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "part4_eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interval(entry: dict, value: str) -> str:
    return f"{entry[value]:.3f} [{entry['ci95_low']:.3f}, {entry['ci95_high']:.3f}]"


def change(entry: dict) -> str:
    return f"{entry['change']:+.3f} [{entry['ci95_low']:+.3f}, {entry['ci95_high']:+.3f}]"


@pytest.fixture(scope="module")
def raft_vs_sft():
    compare = script("compare_benchmarks").compare
    folders = RESULTS / "smollm2-ifeval" / "sft", RESULTS / "smollm2-ifeval" / "raft"
    return {bench: compare(*folders, bench) for bench in ("ifeval", "xstest")}


def test_raft_on_ifeval_as_published(raft_vs_sft):
    result = raft_vs_sft["ifeval"]
    (sft, raft), delta = result["summaries"], result["change"]
    for key in ("prompt_strict", "instruction_strict", "prompt_loose", "instruction_loose"):
        row = f"| {interval(sft[key], 'accuracy')} | {interval(raft[key], 'accuracy')} | "
        assert row in ANALYSIS, key
        assert f"{change(delta[key])}" in ANALYSIS and f"| {delta[key]['p']:.2g} |" in ANALYSIS, key
    for key in ("prompt_strict", "instruction_strict"):
        assert change(delta[key]) in README and f"p = {delta[key]['p']:.2g}" in README, key
    assert (delta["prompt_strict"]["only_after"], delta["prompt_strict"]["only_before"]) == (36, 20)  # as ANALYSIS says
    assert f"| {sft['eos_rate']:.3f} | {raft['eos_rate']:.3f} |" in ANALYSIS
    for key in ("distinct_2_words", "repetition_4_words"):
        assert f"(words) | {sft[key]:.3f} | {raft[key]:.3f} |" in ANALYSIS, key
    assert result["second_degenerate"] == []
    xs = raft_vs_sft["xstest"]["summaries"]
    words = f"(distinct-2 {xs[0]['distinct_2_words']:.3f} → {xs[1]['distinct_2_words']:.3f}, repetition"
    assert words in ANALYSIS and f"{xs[0]['repetition_4_words']:.3f} → {xs[1]['repetition_4_words']:.3f})" in ANALYSIS
    postscript = [s["by_instruction_strict"]["detectable_content:postscript"]["accuracy"] for s in (sft, raft)]
    assert f"the P.S. {postscript[0]:.3f} → {postscript[1]:.3f}" in ANALYSIS


def test_xstest_as_published(raft_vs_sft):
    result = raft_vs_sft["xstest"]
    (sft, raft), delta = result["summaries"], result["change"]
    for key in ("safe_compliance", "unsafe_refusal"):
        row = f"| {interval(sft[key], 'rate')} | {interval(raft[key], 'rate')} | {change(delta[key])} |"
        assert row in ANALYSIS, key
    readme = f"{sft['safe_compliance']['rate']:.3f} → {raft['safe_compliance']['rate']:.3f}"
    assert f"({readme}, {change(delta['safe_compliance'])})" in README


def test_the_refusal_judges_agreement_with_the_hand_labels_as_published(tmp_path):
    labels = tmp_path / "labels"
    shutil.copytree(RESULTS / "refusal-labels", labels)
    held_out = script("refusal_labels").score_sheet(labels)["held_out"]
    recall, precision = held_out["refusal"]["recall"], held_out["refusal"]["precision"]
    published = (
        f"agreement {interval(held_out['agreement'], 'rate')}, kappa {held_out['kappa']:.3f}, refusal recall "
        f"{recall['hits']}/{recall['n']}"
    )
    assert published in ANALYSIS and f"and precision {precision['hits']}/{precision['n']}" in ANALYSIS
    before = script("refusal_labels").score_sheet(labels)["as_scored"]  # the judge that scored the answers, 39fe8d4
    assert before["refusal"]["recall"]["hits"] == 0 and before["refusal"]["recall"]["n"] == 18
    assert f"**none of\nthe 18 refusals** (agreement {before['agreement']['rate']:.3f}, " in ANALYSIS
    assert f"kappa {before['kappa']:.3f};" in ANALYSIS
    assert (RESULTS / "refusal-labels" / "agreement.json").read_text() == (labels / "agreement.json").read_text()


def test_the_tiny_headline_tables_as_published():
    """README's Results table and ANALYSIS's headline tables are part4_eval/seed_tables.py's output, recomputed from
    the four pipeline seeds' and four methods seeds' answers in results/tiny (it fails itself when a committed
    summary.json no longer matches its answers)."""
    tables = script("seed_tables").tables(RESULTS / "tiny")
    assert set(tables) == {"pipeline", "methods"}
    assert tables["pipeline"][0] in README
    for table in [*tables["pipeline"], *tables["methods"]]:
        assert table in ANALYSIS, table.splitlines()[0]


def test_where_the_reward_model_is_wrong_as_published():
    """ANALYSIS's breakdown of the reward model's agreement with gold on the sealed run's answers, by what separates
    the two responses in gold, is the committed summary's."""
    summary = json.loads((RESULTS / "tiny" / "summary.json").read_text())
    agreement = summary["eval"]["judge_agreement"]["reward_vs_gold"]
    assert f"0.643 of the {agreement['n_decisive']:,} decisive comparisons" in ANALYSIS
    assert f"{agreement['agreement_decisive']:.3f}" == "0.643"
    text = " ".join(ANALYSIS.split())
    words = {"capability": "capability differences (a right against a wrong answer)", "verbosity": "verbosity alone"}
    words |= {"content": "other content", "flags": "flagged mistakes"}
    for key, said in words.items():
        entry = agreement["by_gold_difference"][key]
        assert f"{said} {entry['agreement_decisive']:.3f}" in text and f"(n = {entry['n_decisive']})" in text, key


def test_the_over_optimisation_curves_as_published():
    """ANALYSIS's reading of the over-optimisation figure is the committed curves' (results/tiny/overopt/curves.json,
    part4_eval/overoptimization.py's output)."""
    published = json.loads((RESULTS / "tiny" / "overopt" / "curves.json").read_text())
    curves = {curve["label"]: curve["points"] for curve in published["curves"]}
    text = " ".join(ANALYSIS.split())
    best_of = {p["n"]: p for p in curves["best-of-N (RM picks)"]}
    assert max(best_of.values(), key=lambda p: p["gold_score"])["n"] == 2
    assert f"peaks in gold at N = 2 (mean gold score {best_of[2]['gold_score']:.3f} against SFT's" in text
    assert f"SFT's {best_of[1]['gold_score']:.3f} at N = 1) and falls back to {best_of[16]['gold_score']:.3f}" in text
    assert f"({best_of[2]['proxy_score']:.3f} → {best_of[16]['proxy_score']:.3f})" in text
    grpo = curves["GRPO vs RM"]
    peak = max(grpo, key=lambda p: p["gold_score"])
    assert (
        f"peaks at {peak['gold_score']:.3f} (KL {peak['kl']:.2f} nats) and ends at {grpo[-1]['gold_score']:.3f}" in text
    )


def test_the_sealed_split_check_as_published():
    """ANALYSIS's "How the test was sealed", items 3 and 4: part4_eval/split_overlap.py's counts and digests."""
    counts = json.loads((RESULTS / "tiny" / "split-overlap.json").read_text())
    overlap = (
        f"{counts['in_other_test']} of {counts['evaluated_prompts']}, {counts['in_train']} in train, "
        f"{counts['in_val']} in val, {counts['distinct_test_prompts']} distinct test prompts"
    )
    assert overlap in ANALYSIS.replace("\n   ", " ")
    assert list(counts["weights"]) == ["sft", "reward", "ppo", "dpo"]
    assert all(entry["identical"] for entry in counts["weights"].values())


def test_the_grpo_ifeval_run_as_published():
    """ANALYSIS's GRPO-on-IFEval paragraph: its last iteration and its time, from the run's published results."""
    run = RESULTS / "smollm2-ifeval" / "grpo-run"
    grpo = json.loads((run / "grpo" / "results.json").read_text())
    text = ANALYSIS.replace("\n  ", " ")
    assert f"the training reward was {grpo['train_score_mean']:.3f} and {grpo['train_zero_std_groups']:.1%}" in text
    seconds = json.loads((run / "summary.json").read_text())["timing_s"]["grpo"]
    assert f"GRPO took {seconds:,.0f} s ({grpo['time_per_sample_ms'] / 1000:.1f} s per sample" in text


def test_the_length_heuristic_on_validation_as_published():
    """ANALYSIS: reward.length_heuristic on and off, the reward stage alone on the sealed run's data and SFT."""
    on, off = (
        json.loads((RESULTS / run / "summary.json").read_text())["reward_model"] for run in ("tiny", "tiny-lh-off")
    )
    text = ANALYSIS.replace("\n", " ")
    accuracy = f"validation pairs {on['val_accuracy']:.3f} with it and {off['val_accuracy']:.3f} without"
    assert accuracy in text
    assert f"validation pairs {on['val_gold_accuracy']:.3f} and {off['val_gold_accuracy']:.3f}" in text


def test_the_hh_run_on_xstest_as_published():
    """ANALYSIS's "XSTest, re-read" and README's bullet: compare_benchmarks.py on results/smollm2-hh's answers."""
    compare = script("compare_benchmarks").compare
    folders = {m: RESULTS / "smollm2-hh" / f"xstest-{m}" for m in ("base", "sft", "dpo")}
    sft_vs_base = compare(folders["base"], folders["sft"], "xstest")
    dpo_vs_sft = compare(folders["sft"], folders["dpo"], "xstest")
    (base, sft), (_, dpo) = sft_vs_base["summaries"], dpo_vs_sft["summaries"]
    for key in ("safe_compliance", "unsafe_refusal"):
        assert (
            f"| {interval(base[key], 'rate')} | {interval(sft[key], 'rate')} | {interval(dpo[key], 'rate')} |"
            in ANALYSIS
        )
    for key in ("distinct_2_words", "repetition_4_words"):
        assert f"(words) | {base[key]:.3f} | {sft[key]:.3f} | {dpo[key]:.3f} |" in ANALYSIS, key
    text = ANALYSIS.replace("\n  ", " ")
    for result, keys in (
        (sft_vs_base, ("unsafe_refusal", "safe_compliance")),
        (dpo_vs_sft, ("safe_compliance", "unsafe_refusal")),
    ):
        for key in keys:
            assert change(result["change"][key]).replace("-", "−") in text, key
    for key in ("unsafe_refusal", "safe_compliance"):
        assert change(sft_vs_base["change"][key]).replace("-", "−") in README.replace("\n  ", " "), key
    assert dpo_vs_sft["second_degenerate"] and not sft_vs_base["second_degenerate"]
    (first, n1), (second, n2) = dpo["top_openings_2_words"][:2]
    assert (first, second) == ("I'm not", "I'm sorry,")
    assert f"{n1 + n2} of its 450 answers open" in text and f"answers {n1 + n2} of XSTest's 450" in README.replace(
        "\n  ", " "
    )


def test_the_hh_dpo_rate_chosen_again_as_published():
    """ANALYSIS's "DPO's learning rate, chosen again": the guard's table from degeneration.py's JSON and each run's
    summary, the rule's pick, the preset's rate, and the chosen model's one XSTest reading (compare_benchmarks.py)."""
    import yaml

    hh = RESULTS / "smollm2-hh"
    guard = {entry["run"].split("/")[-1]: entry for entry in json.loads((hh / "dpo-lr-guard.json").read_text())}
    runs = {  # run folder: (its published results, the table's label)
        "smollm2-hh-dpo-1e-4": (hh / "dpo-lr1e-4", "1e-4"),
        "smollm2-hh-dpo-2e-4": (hh / "dpo-lr2e-4", "**2e-4**"),
        "smollm2-hh": (hh, "5e-4 (the preset until now)"),
    }
    validation = {}
    for run, (folder, label) in runs.items():
        m, dpo = guard[run], json.loads((folder / "summary.json").read_text())["dpo"]
        assert m["validation"]["val_accuracy"] == pytest.approx(dpo["val_accuracy"])
        validation[run] = (round(dpo["val_accuracy"], 6), -dpo["val_loss"])
        bold = "**" if label.startswith("**") else ""
        policy, sft = m["policy"], m["sft"]
        row = (
            f"| {label} | {bold}{dpo['val_accuracy']:.3f}{bold} | {bold}{dpo['val_loss']:.3f}{bold} | "
            f"{policy['distinct_2']:.3f} ({sft['distinct_2']:.3f}) | "
            f"{policy['repetition_4']:.3f} ({sft['repetition_4']:.3f}) | {'yes' if m['degenerate'] else 'no'} |"
        )
        assert row in ANALYSIS, run
    # the rule: the best validation accuracy among the unflagged, a tie to the lower validation loss
    chosen = max((run for run in runs if not guard[run]["degenerate"]), key=validation.get)
    assert chosen == "smollm2-hh-dpo-2e-4"
    assert yaml.safe_load((REPO / "configs" / "smollm2-hh.yaml").read_text())["dpo"]["lr"] == 2.0e-4

    result = script("compare_benchmarks").compare(hh / "xstest-sft", hh / "xstest-dpo-lr2e-4", "xstest")
    text, readme = ANALYSIS.replace("\n", " "), README.replace("\n  ", " ")
    for key in ("unsafe_refusal", "safe_compliance"):
        assert change(result["change"][key]).replace("-", "−") in text, key
        assert change(result["change"][key]).replace("-", "−") in readme, key
    (_, first), (_, second) = result["summaries"][1]["top_openings_2_words"][:2]
    assert f'{first + second} of its 450 answers open "I\'m sorry," or "I\'m sorry"' in text
    assert f"distinct-2 {result['summaries'][1]['distinct_2_words']:.3f} against SFT's" in text
    assert result["second_degenerate"]
