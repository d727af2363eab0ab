"""The config contract: presets, overrides, types, and one-line errors."""

import subprocess
import sys

import pytest
from conftest import REPO

from rlhf.core.errors import UserError
from rlhf.stage.config import available_presets, coerce, load_config, preset_path


def test_presets_exist_and_load():
    assert {"tiny", "gpt2-hh"} <= set(available_presets())
    for name in ("tiny", "gpt2-hh"):
        load_config(preset_path(name))


def test_overrides_are_coerced_to_the_declared_type():
    cfg = load_config(
        preset_path("tiny"),
        [
            "sft.lr=1e-4",
            "sft.max_steps=7",
            "reward.normalize=false",
            "data.max_train_pairs=null",
            "data.embedded.length_bias=0.3",
            "model.config_overrides={n_layer: 2}",
        ],
    )
    assert cfg.sft.lr == 1e-4 and isinstance(cfg.sft.lr, float)
    assert cfg.sft.max_steps == 7
    assert cfg.reward.normalize is False
    assert cfg.data.max_train_pairs is None
    assert cfg.data.embedded.length_bias == 0.3
    assert cfg.model.config_overrides == {"n_layer": 2}


def test_yaml_scientific_notation_is_a_float():
    # PyYAML reads "3e-6" (no dot) as a string; the declared type decides.
    assert coerce("3e-6", float, "sft.lr") == 3e-6


@pytest.mark.parametrize(
    "override, expected",
    [
        ("sft.learning_rate=1", "did you mean 'sft.lr'"),
        ("sft.lrr=1", "did you mean 'sft.lr'"),
        ("sfft.lr=1", "did you mean 'sft.lr'"),
        ("sft.lr=abc", "'sft.lr' expects float, got 'abc'"),
        ("sft.max_steps=2.5", "'sft.max_steps' expects int"),
        ("reward.normalize=maybe", "'reward.normalize' expects bool"),
        ("sft=3", "'sft' is a section"),
        ("sft.lr", "expected section.key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, expected):
    with pytest.raises(UserError, match=None) as info:
        load_config(preset_path("tiny"), [override])
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UserError) as info:
        preset_path("tiy")
    assert "gpt2-hh" in str(info.value) and "tiny" in str(info.value)


def test_unknown_key_in_a_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("sft:\n  epocs: 2\n")
    with pytest.raises(UserError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "did you mean 'sft.epochs'" in str(info.value)


def test_one_entry_of_a_mapping_is_set_by_its_dotted_name_and_the_rest_kept():
    """`model.config_overrides={n_layer: 2}` replaces the whole mapping (the tiny model lost its width and heads);
    `model.config_overrides.n_layer=2` sets one entry."""
    preset = load_config(preset_path("tiny")).model.config_overrides
    one = load_config(preset_path("tiny"), ["model.config_overrides.n_layer=2"]).model.config_overrides
    assert one == {**preset, "n_layer": 2} and preset["n_layer"] != 2
    assert load_config(preset_path("tiny"), ["model.config_overrides={n_layer: 2}"]).model.config_overrides == {
        "n_layer": 2
    }


def test_the_example_in_a_type_error_pastes_into_a_shell():
    import shlex

    with pytest.raises(UserError) as info:
        load_config(preset_path("tiny"), ["model.config_overrides=12"])
    example = str(info.value).split("; e.g. ", 1)[1]
    [override] = shlex.split(example)  # one shell word, braces and spaces quoted
    assert load_config(preset_path("tiny"), [override]).model.config_overrides["n_layer"] == 4


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("grpo.lr=-1e-4", "grpo.lr=-0.0001 must be > 0"),
        ("sft.lr=-1e-4", "sft.lr=-0.0001 must be > 0"),
        ("ppo.value_lr=0", "ppo.value_lr=0.0 must be > 0"),
        ("sft.warmup_ratio=2", "sft.warmup_ratio=2.0 must be in [0, 1]"),
        ("sft.weight_decay=-0.1", "sft.weight_decay=-0.1 must be >= 0"),
        ("ppo.gamma=1.5", "ppo.gamma=1.5 must be in [0, 1]"),
        ("eval.top_p=0", "eval.top_p=0.0 must be in (0, 1]"),
        ("grpo.kl_coef=-0.1", "grpo.kl_coef=-0.1 must be >= 0"),
        ("grpo.temperature=nan", "grpo.temperature=nan must be >= 0"),
        ("reward.head_dropout=1", "reward.head_dropout=1.0 must be in [0, 1)"),
    ],
)
def test_a_number_outside_its_natural_range_is_one_line_at_load(override, expected):
    with pytest.raises(UserError) as caught:
        load_config(REPO / "configs" / "tiny.yaml", [override])
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_a_negative_learning_rate_leaves_the_previous_result_intact(tmp_path):
    """Issue 55: `grpo.lr=-1e-4` used to pass validation, delete grpo/complete.json, then crash in the optimizer."""
    complete = tmp_path / "grpo" / "complete.json"
    complete.parent.mkdir()
    complete.write_text('{"fingerprint": "earlier"}')
    result = subprocess.run(
        [sys.executable, str(REPO / "part2_ppo_grpo" / "train_grpo.py"), "--preset", "tiny", "--output-dir",
         str(tmp_path), "grpo.lr=-1e-4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: grpo.lr=-0.0001 must be > 0; set grpo.lr to a value in that range"
    ]
    assert complete.read_text() == '{"fingerprint": "earlier"}'


def test_a_copied_runs_saved_config_writes_into_the_copy(tmp_path):
    """Issue 55: each saved config holds the absolute run.output_dir it was written in; read from a copy of the run
    (`cp -r outputs/tiny outputs/tiny-grpo`), it must not write into, or skip for, the original."""
    from rlhf.stage.cli import parse_stage_args
    from rlhf.stage.config import dump_yaml

    original, copy = tmp_path / "tiny", tmp_path / "tiny-copy"
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    cfg.run.output_dir = str(original)
    (copy / "eval").mkdir(parents=True)
    (copy / "eval" / "config.yaml").write_text(dump_yaml(cfg))
    cfg, run, _ = parse_stage_args("report", ["--config", str(copy / "eval" / "config.yaml")])
    assert run.root.resolve() == copy.resolve()
    # --output-dir still wins, and any other config file keeps its own run.output_dir
    cfg, run, _ = parse_stage_args(
        "report", ["--config", str(copy / "eval" / "config.yaml"), "--output-dir", str(tmp_path / "x")]
    )
    assert run.root.resolve() == (tmp_path / "x").resolve()
    other = tmp_path / "mine.yaml"
    other.write_text(
        dump_yaml(load_config(REPO / "configs" / "tiny.yaml")).replace("output_dir: null", f"output_dir: {original}")
    )
    assert parse_stage_args("report", ["--config", str(other)])[1].root.resolve() == original.resolve()
