"""Publishing an RL stage's outputs: the model, results, curves and summary.json."""

from __future__ import annotations

import torch

from rlhf.analysis.plots import plot_training_curves
from rlhf.core.stages import STAGES
from rlhf.data import write_jsonl
from rlhf.models.checkpoint import save_pretrained_atomic
from rlhf.online.held_out import final_line
from rlhf.stage.run import RunDir, write_json_atomic
from rlhf.stage.schema import Config
from rlhf.stage.tracking import MetricLogger


def publish_rl(
    stage: str,
    run: RunDir,
    cfg: Config,
    accelerator,
    logger: MetricLogger,
    policy: torch.nn.Module,
    tokenizer,
    results: dict,
    eval_samples: list[dict],
    curves: list[str],
    t_start: float,
    complete_info: dict[str, int],
) -> None:
    """The end of an RL stage. The main process writes `<stage>/model/` (the unwrapped policy in
    Hugging Face format), eval_samples.jsonl, curves.png (the `curves` keys), results.json and the
    stage's entries in summary.json (timing since `t_start`, and before a resume, `MetricLogger.elapsed`), then
    marks the stage complete with `complete_info` (how far its loop ran, e.g. {"iterations": 16}), which removes
    its checkpoint.
    Every process then closes the logger, waits, and prints `final_line`."""
    if accelerator.is_main_process:
        save_pretrained_atomic(policy, tokenizer, run.model_dir(stage))
        write_jsonl(run.stage(stage) / "eval_samples.jsonl", eval_samples)
        plot_training_curves(logger.history, curves, run.stage(stage) / "curves.png", STAGES[stage].label)
        write_json_atomic(run.stage(stage) / "results.json", results)
        run.update_summary({stage: results, "timing_s": {stage: logger.elapsed(t_start)}})
        run.mark_complete(stage, cfg, complete_info)
    logger.close()
    accelerator.wait_for_everyone()
    accelerator.print(final_line(stage, results))
