"""An RL stage's prompts: loading, and the order in which iterations draw them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlhf import task
from rlhf.core.batching import encode_texts
from rlhf.core.errors import UserError
from rlhf.data import read_jsonl, unique_prompts
from rlhf.stage.run import RunDir
from rlhf.stage.schema import Config


def check_gold_prompts(stage: str, prompts: list[str], source: str) -> None:
    """Every prompt must parse for the embedded task's gold judge; fail at start-up, not at the end."""
    for prompt in prompts:
        try:
            task.parse_prompt(prompt)
        except ValueError:
            raise UserError(
                f"{stage}: {source} holds a prompt the gold judge cannot parse ({prompt.strip()[:80]!r}); "
                f"it was written by another version of rlhf/task/: re-run the data stage with --force"
            ) from None


@dataclass(frozen=True)
class RLPrompts:
    """An RL stage's prompts, as text and as the token ids the policy is given."""

    train_texts: list[str]  # distinct prompts of data/train.jsonl, in first-seen order
    eval_texts: list[str]  # the first `eval_prompts` distinct prompts of data/val.jsonl
    train_ids: list[list[int]]  # token ids of each, cut to their last data.max_prompt_tokens
    eval_ids: list[list[int]]
    # each prompt's other columns, given to reward functions beside it (TRL's dataset columns): the verifiable
    # instructions' instruction_id_list and kwargs (data.instructions); empty dicts for the pairs' prompts
    train_fields: list[dict] = field(default_factory=list)
    eval_fields: list[dict] = field(default_factory=list)

    @property
    def longest(self) -> int:
        """Tokens in the longest prompt, training or held out."""
        return max(map(len, self.train_ids + self.eval_ids))


def load_rl_prompts(stage: str, run: RunDir, cfg: Config, tokenizer, n_eval: int) -> RLPrompts:
    """The data stage's training prompts and first `n_eval` validation prompts (the verifiable instruction prompts
    when data.instructions.n_train > 0, else the pairs' distinct prompts), tokenized and cut
    from the left to data.max_prompt_tokens (the end of a prompt is where the response starts).
    On the embedded task every one must parse for the gold judge."""
    if n_eval < 0:
        raise UserError(f"{stage}.eval_prompts={n_eval} must be >= 0 (0: no held-out evaluation)")
    if cfg.data.instructions.n_train:  # RL from verifiable rewards: the data stage's instruction prompts
        train_rows = read_jsonl(run.stage("data") / "instructions_train.jsonl")
        eval_rows = read_jsonl(run.stage("data") / "instructions_val.jsonl")[:n_eval]
        train_texts, eval_texts = [r["prompt"] for r in train_rows], [r["prompt"] for r in eval_rows]
        train_fields, eval_fields = (
            [instruction_fields(r) for r in train_rows],
            [instruction_fields(r) for r in eval_rows],
        )
    else:
        train_texts = unique_prompts(read_jsonl(run.stage("data") / "train.jsonl"))
        eval_texts = unique_prompts(read_jsonl(run.stage("data") / "val.jsonl"))[:n_eval]
        train_fields, eval_fields = [{} for _ in train_texts], [{} for _ in eval_texts]
    train_ids = [ids[-cfg.data.max_prompt_tokens :] for ids in encode_texts(tokenizer, train_texts)]
    eval_ids = [ids[-cfg.data.max_prompt_tokens :] for ids in encode_texts(tokenizer, eval_texts)]
    if cfg.data.path == "embedded":
        check_gold_prompts(stage, train_texts, "data/train.jsonl")
        check_gold_prompts(stage, eval_texts, "data/val.jsonl")
    return RLPrompts(train_texts, eval_texts, train_ids, eval_ids, train_fields, eval_fields)


def instruction_fields(row: dict) -> dict:
    """The columns of an instruction prompt's row that its reward function reads."""
    return {"instruction_id_list": row["instruction_id_list"], "kwargs": row["kwargs"]}


def iteration_prompts(n_prompts: int, per_iteration: int, iteration: int, seed: int) -> list[int]:
    """Prompt indices for one iteration: consecutive slices of a per-epoch permutation that
    depends on (seed, epoch) alone, so a resumed run sees the prompts an uninterrupted one would."""
    per_epoch = n_prompts // per_iteration
    epoch, position = divmod(iteration, per_epoch)
    order = torch.randperm(n_prompts, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return order[position * per_iteration : (position + 1) * per_iteration].tolist()


def local_prompt_rows(
    n_prompts: int, per_iteration: int, iteration: int, seed: int, rank: int, world_size: int, group_size: int = 1
) -> list[int]:
    """This process's prompt indices for one iteration: its contiguous slice of `iteration_prompts`
    (per_iteration // world_size prompts), each repeated group_size times, so consecutive rows form a group."""
    rows = iteration_prompts(n_prompts, per_iteration, iteration, seed)
    local = per_iteration // world_size
    return [i for i in rows[rank * local : (rank + 1) * local] for _ in range(group_size)]


def row_columns(fields: list[dict]) -> dict[str, list]:
    """Rows' fields as columns: [{"a": 1}, {"a": 2}] -> {"a": [1, 2]} (the keys of the first row; none for none)."""
    return {key: [row[key] for row in fields] for key in (fields[0] if fields else {})}
