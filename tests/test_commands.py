"""The commands as the README writes them: a script runs the code of the checkout it stands in, its --help says
where every key is, and the line after a Ctrl-C names the command that resumes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from unittest import mock

import pytest
from conftest import REPO

from rlhf.stage.cli import parse_stage_args, run_stage
from rlhf.stage.run import STAGE_SCRIPTS
from rlhf.stage.signals import Interrupted

# One setting per stage that loads as a config but breaks that stage's own rules (rlhf.methods.rules), and the
# words of the error it must give.
BROKEN_RULE = {
    "data": ("model.name_or_path=./no-such-model", "model.name_or_path './no-such-model' does not exist"),
    "sft": ("model.name_or_path=./no-such-model", "model.name_or_path './no-such-model' does not exist"),
    "collect": ("collect.samples_per_prompt=1", "collect.samples_per_prompt=1 must be at least 2"),
    "reward": ("reward.label_smoothing=0.7", "reward.label_smoothing must be in [0, 0.5)"),
    "judge_rm": ("data.judge_fraction=0", "judge_rm trains on the pairs data.judge_fraction holds out"),
    "ppo": ("ppo.reward=no_such_module:score", "ppo.reward: no module named 'no_such_module'"),
    "grpo": ("grpo.batch_size=63", "grpo.batch_size=63 must be divisible by grpo.group_size=4"),
    "raft": ("raft.top_k=100", "raft.top_k=100 must be less than raft.samples_per_prompt"),
    "dpo": ("dpo.beta=0", "dpo.beta must be > 0"),
    "online_dpo": ("online_dpo.judge=gold", "online_dpo.judge='gold' is not one of"),
    "eval": ("eval.judges=gold,nosuch", "eval.judges has unknown judge(s) nosuch"),
}


def test_a_script_runs_the_code_and_folders_of_its_own_checkout(tmp_path):
    """With a .venv whose editable install points at another clone (here: this one), a script in a second checkout
    imported that clone's rlhf, and with it its default outputs/ ("already complete ... in <the other clone>")."""
    clone = tmp_path / "clone"
    for name in ("rlhf", "part4_eval", "configs"):
        shutil.copytree(REPO / name, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "rlhf" / "core" / "errors.py").write_text(
        (REPO / "rlhf" / "core" / "errors.py").read_text() + "\nCHECKOUT = 'clone'\n"
    )  # to tell whose code ran
    probe = clone / "part4_eval" / "probe.py"
    probe.write_text(
        (REPO / "part4_eval" / "make_report.py").read_text().split("\nfrom rlhf", 1)[0]  # its header, up to rlhf
        + "\nfrom rlhf.core import errors\n\nprint(getattr(errors, 'CHECKOUT', 'other'))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert ran.stdout.strip() == "clone", ran.stderr
    report = subprocess.run(
        [sys.executable, str(clone / "part4_eval" / "make_report.py"), "--preset", "tiny"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert report.returncode == 2
    assert f"have not completed in {clone / 'outputs' / 'tiny'};" in report.stderr, report.stderr


@pytest.mark.parametrize(
    "argv, again",
    [
        (["--preset", "tiny"], "re-run the same command to resume"),
        (["--preset", "tiny", "--force"], "re-run the same command without --force (which starts over) to resume"),
        (["--fo", "--preset", "tiny"], "without --force"),  # argparse takes a prefix of a flag
    ],
)
def test_the_line_after_a_stop_names_the_command_that_resumes(capsys, tmp_path, argv, again):
    """`--force` deletes the checkpoint: repeating the command after Ctrl-C restarted from iteration 0."""

    def main(_argv):
        raise Interrupted(signal.SIGINT, tmp_path / "checkpoint")

    with mock.patch.object(sys, "argv", ["train_grpo.py", *argv]), pytest.raises(SystemExit) as exit_info:
        run_stage(main)
    line = capsys.readouterr().err.strip()
    assert exit_info.value.code == 130 and "\n" not in line
    assert line.startswith("stopped by SIGINT after 0s; checkpoint saved in ") and again in line


def test_a_stage_scripts_help_names_the_script_and_where_every_key_is(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_stage_args("sft", ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0 and text.startswith("usage: python part1_reward/train_sft.py")
    assert "rlhf/stage/schema.py" in text and "section.key=value" in text


def test_every_other_part4_script_names_the_command_a_user_types_in_its_help():
    """`python part4_eval/seeds.py --help` printed `usage: seeds.py`: each tool script outside the stages now prints
    the command as typed from the repository root (one interpreter runs them all)."""
    tools = sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "part4_eval").glob("*.py")
        if path.relative_to(REPO).as_posix() not in STAGE_SCRIPTS.values()
    )
    probe = (
        "import contextlib, io, runpy, sys\n"
        f"for script in {tools!r}:\n"
        "    sys.argv = [script, '--help']\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            runpy.run_path(script, run_name='__main__')\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    print(script, '|', ' '.join(out.getvalue().split()[:3]))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    usages = dict(line.split(" | ") for line in result.stdout.splitlines() if " | " in line)
    assert len(tools) >= 7 and set(usages) == set(tools), result.stderr
    for script, usage in usages.items():
        assert usage == f"usage: python {script}", (script, usage)


def test_every_stage_script_answers_help_and_config_errors_before_it_imports_torch():
    """`--help`, a mistyped flag, a config error and a setting that breaks the stage's own rules
    (`rlhf.methods.rules`) answer before the imports that take seconds (torch, transformers): each stage script run
    as a program, in one interpreter that never loads torch."""
    broken = {stage: override for stage, (override, _) in BROKEN_RULE.items()}
    probe = (
        "import runpy, sys\n"
        "from rlhf.stage.run import STAGE_SCRIPTS\n"
        f"broken = {broken!r}\n"
        "for stage, script in STAGE_SCRIPTS.items():\n"
        "    cases = [['--help'], ['--presett', 'tiny'], ['sft.lr=abc'], ['nosuch.key=1']]\n"
        "    for args in cases + ([[broken[stage]]] if stage in broken else []):\n"
        "        sys.argv = [script, *args]\n"
        "        try:\n"
        "            runpy.run_path(script, run_name='__main__')\n"
        "        except SystemExit as exit:\n"
        "            print('exit', script, args[0], exit.code)\n"
        "print('torch loaded' if 'torch' in sys.modules else 'no torch')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.splitlines()[-1] == "no torch"
    assert set(BROKEN_RULE) == set(STAGE_SCRIPTS) - {"report"}  # every stage that has rules is tried
    exits = [line for line in result.stdout.splitlines() if line.startswith("exit ")]
    assert len(exits) == 4 * 12 + 11 and all(line.endswith((" --help 0", " 2")) for line in exits)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 * 12 + 11 and any("sft.lr" in line for line in errors)  # one line per config error
    for stage, (_, words) in BROKEN_RULE.items():
        assert any(words in line for line in errors), stage


def test_the_readme_says_to_activate_the_environment_its_python_commands_need():
    """`python part4_eval/make_report.py` failed with "No module named 'rlhf'": the README never said to activate."""
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in quickstart


def test_relative_paths_mean_what_they_do_where_run_all_was_typed(tmp_path, monkeypatch):
    """run_all.sh runs from the repository: `data.path=pairs.jsonl` typed in another folder was looked up in the
    repository. Paths are now the caller's (RLHF_CALLER_DIR); a value that is no file there (a Hub id) stays."""
    (tmp_path / "pairs.jsonl").write_text("{}\n")
    monkeypatch.setenv("RLHF_CALLER_DIR", str(tmp_path))
    typed = ["--preset", "tiny", "--output-dir", "run", "data.path=pairs.jsonl", "model.name_or_path=gpt2"]
    cfg, run, _ = parse_stage_args("data", typed)
    assert cfg.data.path == str(tmp_path / "pairs.jsonl") and run.root == tmp_path / "run"
    assert cfg.model.name_or_path == "gpt2"
    monkeypatch.setenv("RLHF_CALLER_DIR", str(REPO))  # typed in the repository: as it was
    cfg, run, _ = parse_stage_args("data", ["--preset", "tiny", "--output-dir", "run", "data.path=embedded"])
    assert cfg.data.path == "embedded" and str(run.root) == "run"


def test_a_second_process_running_a_stage_in_the_same_folder_stops_before_writing(tmp_path):
    """Two SFT runs with different lr in one folder: config.yaml said one, model/ and complete.json came from the
    other. The second now stops in one line, naming the first, and writes nothing; once the first ends, it runs."""
    from rlhf.core.errors import UserError
    from rlhf.stage.cli import hold_stage_lock
    from rlhf.stage.run import RunDir

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from rlhf.stage.cli import hold_stage_lock; from rlhf.stage.run import RunDir; "
            f"hold_stage_lock(RunDir({str(tmp_path)!r}), 'sft'); print('held', flush=True); time.sleep(60)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError) as error:
            hold_stage_lock(RunDir(tmp_path), "sft")
        assert str(error.value) == (
            f"stage 'sft' is already running in {tmp_path} (pid {holder.pid}); wait for it to finish, or give this "
            "run its own --output-dir"
        )
        assert sorted(p.name for p in tmp_path.iterdir()) == [".sft.lock"]
    finally:
        holder.kill()
        holder.wait()
    hold_stage_lock(RunDir(tmp_path), "sft")  # released when its process ended


def test_a_stage_started_by_hand_gets_run_all_shs_openmp_wait():
    """Issue 55: run_all.sh sets GOMP_SPINCOUNT=1000; a stage script started directly spun at libgomp's 300,000."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    probe = (
        "import os, sys; sys.argv = ['x', '--preset', 'tiny', 'sft.lr=abc']\n"
        "from rlhf.stage.cli import answer_early\n"
        "try:\n    answer_early('sft')\nexcept SystemExit:\n    pass\n"
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    )

    def run(extra: dict) -> list[str]:
        command = [sys.executable, "-c", probe]
        return subprocess.run(
            command, cwd=REPO, env={**env, **extra}, capture_output=True, text=True, timeout=60
        ).stdout.split()

    assert run({}) == ["1000", "False"]
    assert run({"OMP_WAIT_POLICY": "PASSIVE"}) == ["None", "False"]  # a user's own setting is kept
    assert run({"GOMP_SPINCOUNT": "5"}) == ["5", "False"]
