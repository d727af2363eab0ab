"""A launcher that runs a stage script while recording dtypes, for tests/test_bf16_e2e.py:

    RLHF_LAUNCH="python tests/dtype_probe.py" RLHF_DTYPE_PROBE_DIR=DIR python -m rlhf.pipeline ...
    python tests/dtype_probe.py part1_reward/train_sft.py --preset tiny ...   (one stage)

It records, and writes to DIR/<script>-<pid>.json when the stage exits:
- `linear`: the output dtype of every torch.nn.functional.linear call (every nn.Linear: the LM head, the reward,
  value and token heads, LoRA adapters), with `autocast` whether CPU or CUDA autocast was on at the call. Under
  run.mixed_precision=bf16 every one should be bfloat16: a forward pass outside autocast shows up as float32.
- `calls`: for every function of rlhf.core.ops and rlhf.core.losses, the log-prob and reward helpers of
  rlhf.models.modeling and rlhf.methods.passes, and the forward of the value and pair-reward modules: the floating
  dtypes of its tensor inputs and outputs, the outputs of a tuple as "position:dtype" (the math library's contract:
  outputs in float32, whatever the forward's dtype).

Only observes: every wrapped function is called as it was and returns what it returned.
"""

from __future__ import annotations

import atexit
import collections
import functools
import importlib
import inspect
import json
import os
import runpy
import sys
from pathlib import Path

import torch

PROBE_DIR_ENV = "RLHF_DTYPE_PROBE_DIR"
REPO = Path(__file__).resolve().parent.parent
# Modules whose public functions are wrapped, and the helpers of rlhf.models.modeling / the modules' forwards.
LIBRARIES = ("rlhf.core.ops", "rlhf.core.losses", "rlhf.methods.passes")
MODEL_FUNCTIONS = ("token_logprobs", "reward_scores", "shared_prompt_response_logprobs")
MODEL_CLASSES = ("ValueModel", "PolicyAndValue", "SharedPromptPairRewards", "MeanPoolRewardModel")

linear_dtypes: collections.Counter = collections.Counter()  # "dtype autocast=bool" -> calls
linear_outside: collections.Counter = collections.Counter()  # "file:line" of the repo code calling a float32 linear
calls: dict[str, dict[str, collections.Counter]] = collections.defaultdict(
    lambda: {"in": collections.Counter(), "out": collections.Counter()}
)


def floating_dtypes(value) -> list[str]:
    """The dtypes of the floating tensors in `value` (a tensor, or tuples, lists, dicts and NamedTuples of them)."""
    if isinstance(value, torch.Tensor):
        return [str(value.dtype).removeprefix("torch.")] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [d for item in value for d in floating_dtypes(item)]
    if isinstance(value, dict):
        return [d for item in value.values() for d in floating_dtypes(item)]
    if hasattr(value, "logits"):  # a transformers ModelOutput or _RewardOutput
        return floating_dtypes(value.logits)
    return []


def repo_caller() -> str:
    """file:line of the innermost frame of this repository's code (not a library's, not this file's)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if REPO in path.parents and ".venv" not in path.parts and path.name != Path(__file__).name:
            return f"{path.relative_to(REPO)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def recorded(name: str, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        out = function(*args, **kwargs)
        calls[name]["in"].update(floating_dtypes([*args, *kwargs.values()]))
        if isinstance(out, tuple):  # per position: PolicyAndValue's (logits, values), PairRewards' fields
            calls[name]["out"].update(f"{i}:{d}" for i, item in enumerate(out) for d in floating_dtypes(item))
        else:
            calls[name]["out"].update(floating_dtypes(out))
        return out

    wrapper.__probe_original__ = function
    return wrapper


def install() -> None:
    original_linear = torch.nn.functional.linear

    def linear(input, weight, bias=None):
        out = original_linear(input, weight, bias)
        autocast = torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
        linear_dtypes[f"{str(out.dtype).removeprefix('torch.')} autocast={autocast}"] += 1
        if out.dtype == torch.float32:
            linear_outside[repo_caller()] += 1
        return out

    torch.nn.functional.linear = linear

    replaced = {}  # id(original) -> wrapper
    for module_name in LIBRARIES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module_name and not name.startswith("_"):
                replaced[id(value)] = recorded(f"{module_name}.{name}", value)
    models = importlib.import_module("rlhf.models.modeling")
    for name in MODEL_FUNCTIONS:
        replaced[id(getattr(models, name))] = recorded(f"rlhf.models.modeling.{name}", getattr(models, name))
    for name in MODEL_CLASSES:
        cls = getattr(models, name)
        cls.forward = recorded(f"rlhf.models.modeling.{name}.forward", cls.forward)
    # Rebind every name already imported (`from rlhf.core.ops import masked_mean`) in every loaded rlhf module, and the
    # functions in its tables (rlhf.core.losses.DPO_LOSSES); modules imported later (the stage script, lazily imported
    # helpers) bind the wrappers from these attributes.
    for module in [m for name, m in sys.modules.items() if name == "rlhf" or name.startswith("rlhf.")]:
        for name, value in list(vars(module).items()):
            if id(value) in replaced:
                setattr(module, name, replaced[id(value)])
            elif isinstance(value, dict):
                value.update({key: replaced[id(f)] for key, f in value.items() if id(f) in replaced})


def dump(directory: Path, script: str) -> None:
    report = {
        "script": script,
        "linear": dict(linear_dtypes),
        "linear_float32_callers": dict(linear_outside),
        "calls": {name: {k: dict(v) for k, v in entry.items()} for name, entry in sorted(calls.items())},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{Path(script).stem}-{os.getpid()}.json").write_text(json.dumps(report, indent=1))


# ----------------------------------------------------------------------------- reading the records (the tests)

# Calls whose outputs are the forward pass's own: PolicyAndValue's logits (position 0) come out in bf16 by design.
FORWARD_OUTPUTS = {
    "rlhf.models.modeling.PolicyAndValue.forward": "0:",
    "rlhf.models.modeling.MeanPoolRewardModel.forward": "",
}


def load_records(directory: Path) -> dict[str, list[dict]]:
    """Stage name -> the records of its processes (one per process: two under a 2-process launcher); the
    pipeline's launcher probe (rlhf/pipeline/launch_probe.py) runs no stage."""
    from rlhf.stage.run import STAGE_SCRIPTS

    stages = {Path(script).stem: stage for stage, script in STAGE_SCRIPTS.items()}
    records: dict[str, list[dict]] = collections.defaultdict(list)
    for path in sorted(directory.glob("*.json")):
        record = json.loads(path.read_text())
        if Path(record["script"]).stem in stages:
            records[stages[Path(record["script"]).stem]].append(record)
    return dict(records)


def non_bf16_forwards(record: dict) -> dict:
    """The linear calls that did not run in bf16 under autocast, with the repo code that made the float32 ones."""
    other = {key: n for key, n in record["linear"].items() if key != "bfloat16 autocast=True"}
    return {**other, **{f"float32 from {where}": n for where, n in record["linear_float32_callers"].items()}}


def half_precision_results(record: dict) -> dict[str, list[str]]:
    """Function -> its output dtypes that are not float32/float64 (a bf16 log-prob, value, reward, KL or loss),
    the forward passes' own outputs (FORWARD_OUTPUTS) left out."""
    found = {}
    for name, entry in record["calls"].items():
        bad = [
            key
            for key in entry["out"]
            if key.rpartition(":")[2] not in ("float32", "float64")
            and not (name in FORWARD_OUTPUTS and key.startswith(FORWARD_OUTPUTS[name]))
        ]
        if bad:
            found[name] = bad
    return found


def main() -> None:
    script, args = sys.argv[1], sys.argv[2:]
    install()
    atexit.register(dump, Path(os.environ[PROBE_DIR_ENV]), script)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python script` would have it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
