"""part4_eval/publish_results.py: a run's small result files copied into results/, weights never, with a manifest."""

import hashlib
import json
import subprocess
import sys

from conftest import REPO


def test_publish_copies_results_not_weights_and_names_what_it_left_out(tmp_path):
    run = tmp_path / "run"
    for relative, text in {
        "summary.json": '{"eval": {}}',
        "sft/config.yaml": "run: {}\n",
        "sft/model/model.safetensors": "weights",
        "grpo/results.json": "{}",
        "grpo/eval_samples.jsonl": "{}\n",
        "dpo/samples.jsonl": "{}\n",
        "ppo/samples.jsonl": "{}\n",  # training samples: not a published number's source
        "eval/benchmarks/ifeval.jsonl": '{"key": "1"}\n',
        "eval/responses/sft.jsonl": "{}\n",
        "eval/win_rates.json": "x" * 3000,
        "pipeline_seeds/summary.json": "{}",
        "pipeline_seeds/seed_1/eval/responses/ppo.jsonl": "{}\n",
        "pipeline_seeds/seed_1/ppo/model/model.safetensors": "weights",
        "seeds/logs/seed_1_ppo.log": "a log",
    }.items():
        (run / relative).parent.mkdir(parents=True, exist_ok=True)
        (run / relative).write_text(text)
    dest = tmp_path / "results" / "mine"
    script = REPO / "part4_eval" / "publish_results.py"
    result = subprocess.run(
        [sys.executable, str(script), str(run), str(dest), "--max-mb", "0.002"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((dest / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {
        "summary.json",
        "sft/config.yaml",
        "grpo/results.json",
        "grpo/eval_samples.jsonl",
        "dpo/samples.jsonl",
        "eval/benchmarks/ifeval.jsonl",
        "eval/responses/sft.jsonl",  # every model's answers, and the seed runs': what seed_tables.py recomputes
        "pipeline_seeds/summary.json",
        "pipeline_seeds/seed_1/eval/responses/ppo.jsonl",
    }
    assert manifest["left_out"] == ["eval/win_rates.json (0.0 MB)"]
    assert manifest["files"]["summary.json"]["sha256"] == hashlib.sha256(b'{"eval": {}}').hexdigest()
    assert not (dest / "sft" / "model").exists() and "left out (over --max-mb): eval/win_rates.json" in result.stdout
    missing = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "none"), str(dest)], capture_output=True, text=True
    )
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "is not a folder" in missing.stderr
