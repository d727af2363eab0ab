"""The frame every online stage (PPO, GRPO, RAFT, online DPO) runs its algorithm in.

What the four share lives here, so that a stage script holds its algorithm alone, top to bottom:

    stage = OnlineStage("grpo", cfg, run, eval_batch_size=...)   1. reward source, prompts, context checks
    ... load the stage's roles ...                                2. (the stage's own)
    model, optimizer, scheduler = stage.prepare(...)              2. accelerate, schedule, rollout engine
    stage.resume(iterations)                                      3. checkpoint of this config, metric logger,
                                                                     the SFT policy's held-out check
    while stage.iteration < iterations:
        rows, rollout = stage.sample(...)                          4a. the stage's samples
        scored = stage.score(rollout, rows, ...)                   4b. the training score
        ... the stage's update ...                                 4c-d.
        iteration = stage.advance()
        stage.end_iteration(stage.metrics(...), ...)               4e. log, held-out check, samples, checkpoint
    stage.finish(...)                                             5-6. final check against SFT, publish

Metric keys: rlhf/online/__init__.py. The three calls before the loop go in this order, each once: a call out of
order stops at once, naming the call it needs (`OnlineStage._enter`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhf.methods.shaping import apply_missing_eos_penalty
from rlhf.models.lora import reference_policy
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import check_context, context_size, load_tokenizer
from rlhf.models.roles import check_frozen, frozen_digests
from rlhf.models.sharding import prepare_trained_model
from rlhf.models.training import build_scheduler, make_accelerator, set_cpu_threads
from rlhf.online.checkpoints import load_rl_checkpoint, open_rl_logger, save_rl_checkpoint
from rlhf.online.held_out import HeldOut, append_samples, eval_due, eval_metrics
from rlhf.online.prompts import load_rl_prompts, row_columns
from rlhf.online.publish import publish_rl
from rlhf.online.sampling import sample_train_batch
from rlhf.online.stats import gold_metrics, loop_costs, response_metrics
from rlhf.rollout.batch import Rollout, SamplingConfig, eval_sampling
from rlhf.rollout.engines import build_engine, check_engine
from rlhf.rollout.forward import score_rollout
from rlhf.rollout.layout import ROWS, RowLayout
from rlhf.rollout.rewards import load_reward_source
from rlhf.stage.run import RunDir, stage_seed
from rlhf.stage.schema import Config, RAFTConfig, RLConfig
from rlhf.stage.signals import checkpoint_due


@dataclass
class Scored:
    """One iteration's samples as text and their training score (after the missing-EOS penalty)."""

    prompts: list[str]  # (N,) each row's prompt
    responses: list[str]  # (N,) decoded without EOS
    scores: torch.Tensor  # (N,)
    terms: dict[str, torch.Tensor]  # {term of `<stage>.reward`: (N,) unweighted score}


class OnlineStage:
    """Set-up, held-out checks, checkpoints, metrics and publishing of one online stage (module docstring).

    `eval_batch_size` rows per no-grad pass of the rollout engine and the held-out checks. What it holds, by the
    call that sets it (`phase` says which calls have run: "created", "prepared", then "running"):"""

    phase: str  # "created" by __init__, "prepared" by prepare(), "running" from resume() on
    # __init__: the stage, its settings and the checks that need no model
    stage: str
    cfg: Config
    run: RunDir
    rcfg: RLConfig | RAFTConfig  # the stage's own section (ppo, grpo, online_dpo; raft)
    seed: int
    gold: bool
    t_start: float
    eval_batch_size: int
    reward_source: object  # rlhf.rollout.rewards.RewardSource
    accelerator: object
    device: torch.device
    tokenizer: object
    prompts: object  # rlhf.online.prompts.RLPrompts
    validation: SamplingConfig  # the held-out checks' decoding
    # prepare(): the trained model and its optimizer, the frozen roles, the engine and the held-out check
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    whole: object  # gathers the whole model from its shards (rlhf.models.sharding)
    policy_of: Callable[[torch.nn.Module], torch.nn.Module]
    reward_model: torch.nn.Module
    sft_policy: torch.nn.Module | None
    frozen_roles: dict[str, torch.nn.Module | None]
    frozen_before: dict
    engine: object
    held_out: HeldOut
    # resume(): where the loop stands, its logger and its clock
    iterations: int
    iteration: int
    resumed_from: int
    logger: object  # rlhf.stage.tracking.MetricLogger
    eval_s: float  # seconds of held-out checks inside the loop, left out of its per-sample cost
    loop_start: float

    def __init__(self, stage: str, cfg: Config, run: RunDir, eval_batch_size: int):
        self.phase = "created"
        self.stage, self.cfg, self.run = stage, cfg, run
        self.rcfg = getattr(cfg, stage)
        if not isinstance(self.rcfg, (RLConfig, RAFTConfig)):
            raise TypeError(f"OnlineStage runs the online stages; {stage}'s section is a {type(self.rcfg).__name__}")
        self.seed = stage_seed(cfg, stage)  # run.method_seed when set (part4_eval/seeds.py)
        self.gold = cfg.data.path == "embedded"  # the embedded task has a gold judge: logging and evaluation only
        self.t_start = time.perf_counter()
        self.eval_batch_size = eval_batch_size

        # 1. Reward source, prompts and context, checked before any model is loaded (the stage's batch plan too).
        self.reward_source = load_reward_source(stage, self.rcfg.reward)
        self.accelerator = make_accelerator(cfg, stage)
        self.device = self.accelerator.device
        self.tokenizer = load_tokenizer(run.model_dir("sft"))
        self.prompts = load_rl_prompts(stage, run, cfg, self.tokenizer, self.rcfg.eval_prompts)
        self.reward_source.check_columns(
            set(self.prompts.train_fields[0]) if self.prompts.train_fields else set(),
            "set data.instructions.n_train > 0 for the verifiable instruction prompts (and re-run the data stage)",
        )
        context = context_size(run.model_dir("sft"))
        check_context(stage, self.prompts.longest, self.rcfg.max_new_tokens, context)
        self.validation = eval_sampling(cfg)  # held-out checks decode as the test does
        check_context("eval", self.prompts.longest, self.validation.max_new_tokens, context)
        set_cpu_threads(stage, self.rcfg.cpu_threads, self.device)
        check_engine(cfg.rollout, stage)

    def _enter(self, call: str, needs: str, becomes: str | None = None) -> None:
        """Stop a call made out of order: `call` runs in the phase `needs` only, and moves the stage to `becomes`."""
        if self.phase != needs:
            after = {"created": "OnlineStage(...)", "prepared": "prepare()", "running": "resume()"}[needs]
            once = ", once" if becomes else ""
            raise RuntimeError(f"{self.stage}: OnlineStage.{call} runs after {after}{once} (the stage is {self.phase})")
        if becomes is not None:
            self.phase = becomes

    # ------------------------------------------------------------------------------------------ 2-3. set-up

    def prepare(
        self,
        model: torch.nn.Module,
        make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
        optimizer_steps: int,
        reward_model: torch.nn.Module,
        frozen_roles: dict[str, torch.nn.Module | None],
        sft_policy: torch.nn.Module | None,
        policy_of: Callable[[torch.nn.Module], torch.nn.Module] = lambda model: model,
    ):
        """The trained `model` prepared for the launcher with its optimizer and schedule, and the rollout engine.
        `frozen_roles` are checked unchanged at the end; `sft_policy`, the KL anchor of the held-out checks, is
        loaded at the end when None; `policy_of(model)` is the policy inside the trained module. -> (model,
        optimizer, scheduler)."""
        self._enter("prepare()", "created", "prepared")
        self.frozen_roles, self.frozen_before = frozen_roles, frozen_digests(frozen_roles)
        self.reward_model, self.sft_policy, self.policy_of = reward_model, sft_policy, policy_of
        model, optimizer, self.whole = prepare_trained_model(self.accelerator, model, make_optimizer)
        scheduler = build_scheduler(optimizer, self.rcfg, optimizer_steps)
        self.engine = build_engine(
            self.cfg.rollout,
            self.stage,
            self.run.model_dir("sft"),
            self.tokenizer,
            self.accelerator,
            self.eval_batch_size,
        )
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.held_out = HeldOut(
            self.engine,
            reward_model,
            self.tokenizer,
            self.prompts,
            self.validation,
            self.seed,
            self.eval_batch_size,
            self.accelerator,
            self.gold,
        )
        return model, optimizer, scheduler

    def policy(self) -> torch.nn.Module:
        """The policy's current weights, whole and unwrapped (what the engine samples and the checks evaluate)."""
        return self.policy_of(self.whole.of(self.model))

    def resume(self, iterations: int) -> dict | None:
        """Resume from the last checkpoint written for this same config, if any; open the metric logger; start the
        loop's clock, and before training the SFT policy's held-out check (the reward-vs-KL origin).
        -> the checkpoint's state (None when starting afresh)."""
        self._enter("resume()", "prepared", "running")
        self.iterations = iterations
        state = load_rl_checkpoint(
            self.stage, self.run, self.cfg, self.accelerator, self.model, self.optimizer, self.scheduler, iterations
        )
        self.iteration = self.resumed_from = 0 if state is None else state["iteration"]
        self.logger = open_rl_logger(self.stage, self.run, self.cfg, self.accelerator, self.iteration, iterations)
        self.eval_s = 0.0
        self.loop_start = time.perf_counter()
        if self.iteration == 0 and eval_due(0, self.rcfg.eval_every, self.iterations):
            self.log_held_out()
        return state

    # ------------------------------------------------------------------------------------------ 4. the loop

    def log_held_out(self) -> None:
        """The current policy on the held-out prompts (RM score, gold score, KL to SFT), logged as `<stage>/eval/*`."""
        started = time.perf_counter()
        measured = self.held_out.metrics(self.stage, self.policy(), self.sft_policy)
        seconds = time.perf_counter() - started
        self.eval_s += seconds
        self.logger.log(self.iteration, {**measured, f"{self.stage}/time/eval_s": seconds})

    def sample(self, per_iteration: int, sampling: SamplingConfig, group_size: int = 1) -> tuple[list[int], Rollout]:
        """This process's share of the iteration's samples from the current policy (`sample_train_batch`): each of
        `per_iteration` prompts `group_size` times, a prompt's rows consecutive. -> (prompt index per row, rollout)."""
        self._enter("sample()", "running")
        return sample_train_batch(
            self.engine,
            self.policy(),
            self.prompts,
            per_iteration,
            self.iteration,
            self.seed,
            self.accelerator,
            sampling,
            group_size,
        )

    def texts(self, rollout: Rollout, rows: list[int]) -> tuple[list[str], list[str]]:
        """(each row's prompt, its response decoded without EOS)."""
        return [self.prompts.train_texts[i] for i in rows], rollout.texts(self.tokenizer)

    def score(self, rollout: Rollout, rows: list[int], batch_size: int, layout: RowLayout = ROWS) -> Scored:
        """The training score of each sample: `<stage>.reward` (the reward model, in `layout`'s forward rows, only
        when the spec uses it; functions score the decoded text), less `<stage>.missing_eos_penalty` for a
        response without EOS."""
        prompts, responses = self.texts(rollout, rows)
        with self.accelerator.autocast():
            model_scores = (
                score_rollout(self.reward_model, rollout, batch_size, layout=layout)
                if self.reward_source.uses_model
                else None
            )  # (N,)
        columns = row_columns([self.prompts.train_fields[i] for i in rows])  # the prompts' other fields, for functions
        raw_scores, terms = self.reward_source.score(prompts, responses, model_scores, columns)  # (N,), {term: (N,)}
        scores = apply_missing_eos_penalty(raw_scores.to(self.device), rollout.finished, self.rcfg.missing_eos_penalty)
        return Scored(prompts, responses, scores, terms)

    def advance(self) -> int:
        """One more iteration done -> how many are."""
        self.iteration += 1
        self.logger.advance()
        return self.iteration

    def sample_metrics(
        self, rollout: Rollout, scores: torch.Tensor, generate_s: float, prompts: list[str], responses: list[str]
    ) -> dict[str, torch.Tensor]:
        """Response statistics over every process's samples (`response_metrics`), and on the embedded task the gold
        judge on this process's (over-optimisation shows there first; logged, never trained on)."""
        gathered = self.accelerator.gather((rollout.response_lengths, rollout.finished, scores))
        metrics = response_metrics(*gathered, generate_s)
        if self.gold:
            metrics.update(gold_metrics(prompts, responses))
        return metrics

    def metrics(
        self, local: dict[str, torch.Tensor], seconds: dict[str, float], episodes: int, values: dict | None = None
    ) -> dict[str, float]:
        """One iteration's row under `<stage>/`: `local` tensors averaged over processes, then `values` as they are,
        the learning rate, each phase's wall seconds (`time/<phase>_s`), peak memory and the episodes so far."""
        reduce = self.accelerator.reduce
        row = {
            f"{self.stage}/{k}": reduce(v.float().to(self.device), reduction="mean").item() for k, v in local.items()
        }
        row.update({f"{self.stage}/{key}": value for key, value in (values or {}).items()})
        row[f"{self.stage}/train/lr"] = self.scheduler.get_last_lr()[0]
        row.update({f"{self.stage}/time/{phase}_s": s for phase, s in seconds.items()})
        row[f"{self.stage}/memory/peak_mb"] = peak_memory_mb(self.device)[0]
        row[f"{self.stage}/train/episodes"] = episodes
        return row

    def end_iteration(
        self,
        metrics: dict[str, float],
        postfix: tuple[str, ...],
        samples: tuple[list, list, list, list],
        rows_per_sample: int = 1,
        **checkpoint_state,
    ) -> None:
        """Log the iteration's row; a held-out check when due (before the checkpoint, so a resumed run has its row);
        every `samples_every` iterations (and the first) the first `num_samples` of `samples` (prompts, responses,
        scores, finished; a sample `rows_per_sample` rows, e.g. a pair) appended to samples.jsonl; a checkpoint when
        due, with `checkpoint_state` (e.g. PPO's kl_coef)."""
        iteration = self.iteration
        self.logger.log(iteration, metrics, postfix=postfix)
        if eval_due(iteration, self.rcfg.eval_every, self.iterations):
            self.log_held_out()
        every = self.rcfg.samples_every
        if self.accelerator.is_main_process and every and (iteration % every == 0 or iteration == 1):
            path = self.run.stage(self.stage) / "samples.jsonl"
            shown = [column[: rows_per_sample * self.rcfg.num_samples] for column in samples]
            append_samples(path, iteration, *shown, self.gold)
        if checkpoint_due(self.accelerator, self.rcfg.save_every, iteration, self.iterations):
            save_rl_checkpoint(
                self.stage,
                self.run,
                self.cfg,
                self.accelerator,
                self.model,
                self.optimizer,
                self.scheduler,
                iteration,
                **checkpoint_state,
            )

    @property
    def trained(self) -> bool:
        """Whether this run trained at all (a run resumed at its end did not)."""
        return self.resumed_from < self.iteration

    # ------------------------------------------------------------------------------------------ 5-6. the end

    def finish(self, episodes_per_iteration: int, summary: dict, curves: list[str], counter: str = "iterations"):
        """The loop's costs; the frozen roles checked unchanged; the final policy against the SFT policy on the
        held-out prompts (the test's decoding, the same seeds for both; the SFT policy is loaded now if nothing
        loaded it, after peak memory was read); the stage's `summary` keys; then publish the policy, evaluation
        samples, curves (`curves`) and summary.json, and mark the stage complete at `{counter: iterations}`."""
        trained_model = self.whole.of(self.model)
        policy = self.policy_of(trained_model)
        loaded = [trained_model, *(m for m in self.frozen_roles.values() if m is not None)]
        costs = loop_costs(
            time.perf_counter() - self.loop_start - self.eval_s,
            (self.iteration - self.resumed_from) * episodes_per_iteration,
            self.device,
            loaded,
            [self.optimizer],
        )
        check_frozen(self.stage, self.frozen_roles, self.frozen_before)
        sft_policy = self.sft_policy
        if sft_policy is None:
            sft_policy = reference_policy(policy, self.run.model_dir("sft"), self.device)
        if self.accelerator.is_main_process and (n_held_out := len(self.held_out.prompts.eval_ids)):
            print(
                f"[{self.stage}] held-out check: {n_held_out} validation prompts answered by the final policy and by "
                f"SFT ({self.stage}.eval_prompts)",
                flush=True,
            )
        results, eval_samples = self.held_out.against_sft(policy, sft_policy, self.stage)
        results.update({**summary, **costs, "frozen_roles_unchanged": True})
        self.logger.log(self.iteration, eval_metrics(self.stage, results))
        publish_rl(
            self.stage,
            self.run,
            self.cfg,
            self.accelerator,
            self.logger,
            policy,
            self.tokenizer,
            results,
            eval_samples,
            curves,
            self.t_start,
            {counter: self.iteration},
        )
