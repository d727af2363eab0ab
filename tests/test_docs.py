"""The commands and links of README.md and docs/*.md point at real things: every script and repository path a
command names exists, every `--preset NAME` is a configs/NAME.yaml, every `section.key=value` override loads
through rlhf.stage.config (key, type and the checks every stage shares), and every relative link reaches an existing
file and, with `#anchor`, one of its headings. docs/configuration.md lists every config key.

Commands are the lines of ```bash blocks and the inline code spans that start like one (`bash ...`,
`python ...`, `pytest ...`, an environment assignment before either, or a script path). Unmarked blocks are
transcripts and listings (the unknown-key error example among them) and are not checked."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO

from rlhf.core.errors import UserError
from rlhf.stage.config import all_keys, load_config, preset_path, set_key
from rlhf.stage.schema import Config

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
OVERRIDE = re.compile(r"^([a-z_]+(?:\.[a-z_0-9]+)+)=(.*)$", re.S)
# Repository paths a command may name: the stage scripts' folders and the files at the root.
REPO_PATH = re.compile(
    r"^(?:(?:part\d_\w+|bench|scripts|rlhf|tests|configs|docs)/[\w./-]*|run_all\.sh|run_tests\.sh"
    r"|requirements[\w-]*\.txt|pyproject\.toml|Dockerfile)$"
)
# First words that make an inline code span a command (after environment assignments).
COMMAND_WORDS = {"bash", "python", "python3", "pytest", "accelerate", "torchrun", "nice", "docker", "tensorboard"} | {
    "ruff"
}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The text outside fenced blocks."""
    return FENCE.sub("", text)


def shell_lines(block: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments dropped, split at ;, && and ||."""
    joined = re.sub(r"\\\n", " ", block)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True  # `;`, `&&` and `|` still split, attached or not
        try:
            words = list(lexer)
        except ValueError:
            words = line.split()
        command: list[str] = []
        for word in words:
            if word in {";", "&&", "||", "|"}:
                commands.append(shlex.join(command))
                command = []
            else:
                command.append(word)
        commands.append(shlex.join(command))
    return [c for c in commands if c]


def is_inline_command(span: str) -> bool:
    words = span.split()
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    return bool(words) and (words[0] in COMMAND_WORDS or bool(REPO_PATH.match(words[0]) and "." in words[0]))


def commands_in(text: str) -> list[str]:
    """Every command of a markdown text: the lines of its bash blocks and its inline commands."""
    commands = [c for lang, body in code_blocks(text) if lang in {"bash", "sh", "shell"} for c in shell_lines(body)]
    for span in INLINE.findall(prose(text)):
        span = " ".join(span.split())
        if is_inline_command(span):
            commands += shell_lines(span.replace(" ... ", " ").removesuffix(" ..."))
    return commands


def words_of(command: str) -> list[str]:
    """The command's words, with the value of an assignment such as RLHF_LAUNCH="accelerate ..." split too."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out = []
    for word in words:
        out.append(word)
        _, sep, value = word.partition("=")
        if sep and ASSIGNMENT.match(word) and " " in value:
            out += value.split()
    return out


def command_problems(command: str) -> list[str]:
    """What in one command names something that does not exist."""
    problems = []
    words = words_of(command)
    preset, overrides = "tiny", []
    for i, word in enumerate(words):
        if REPO_PATH.match(word) and not (REPO / word).exists():
            problems.append(f"{word} does not exist")
        if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("rlhf."):
            module = REPO / (words[i + 1].replace(".", "/") + ".py")
            if not module.is_file():
                problems.append(f"module {words[i + 1]} does not exist")
        if word == "--preset" and i + 1 < len(words):
            preset = words[i + 1]
            if not (REPO / "configs" / f"{preset}.yaml").is_file():
                problems.append(f"--preset {preset}: no configs/{preset}.yaml")
        if OVERRIDE.match(word) and not ASSIGNMENT.match(word):
            overrides.append(word)
    if overrides and not any(p.startswith("--preset") for p in problems):
        try:
            load_config(preset_path(preset), overrides)
        except UserError as exc:
            problems.append(f"{' '.join(overrides)}: {exc}")
    return problems


def override_problems(span: str) -> list[str]:
    """An inline `section.key=value` outside a command: the key exists and the value has its type."""
    match = OVERRIDE.match(span)
    if not match or match.group(1).split(".")[0] not in vars(Config()):
        return []
    try:
        set_key(Config(), match.group(1), match.group(2))
    except UserError as exc:
        return [f"{span}: {exc}"]
    return []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(text: str, where: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (where.parent / file).resolve() if file else where
        if not path.exists():
            problems.append(f"link {target}: {file} does not exist")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"link {target}: no heading #{anchor} in {path.name}")
    return problems


def doc_problems(text: str, where: Path) -> list[str]:
    problems = [p for command in commands_in(text) for p in command_problems(command)]
    problems += [p for span in INLINE.findall(prose(text)) for p in override_problems(" ".join(span.split()))]
    return problems + link_problems(text, where)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_path_preset_override_and_link_in_the_docs_is_real(doc):
    text = doc.read_text()
    assert commands_in(text) or doc.name in {"design.md", "task.md", "metrics.md"}, "no command found: parser broken?"
    assert doc_problems(text, doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_python_commands_follow_the_activated_environment_convention(doc):
    """One convention: `source .venv/bin/activate` once, then `python ...`; never a bare python on a page that
    does not say so, and never `.venv/bin/python`, which would be a second convention."""
    commands = commands_in(doc.read_text())
    assert not [c for c in commands if ".venv/bin/python" in c]
    if any(re.search(r"(^|\s)python\s", c) for c in commands):
        assert "source .venv/bin/activate" in doc.read_text()


def test_configuration_page_lists_every_config_key_and_only_real_ones():
    text = (REPO / "docs" / "configuration.md").read_text()
    reference = text.split("## Every key", 1)[1]
    listed = set(re.findall(r"^\| `([a-z_0-9.]+)` \|", reference, re.M))
    keys = set(all_keys(Config()))
    assert keys - listed == set(), "keys missing from docs/configuration.md: add a row to its 'Every key' tables"
    assert listed - keys == set(), "docs/configuration.md lists keys rlhf/stage/schema.py does not have"


def test_the_checks_catch_a_made_up_script_preset_key_module_and_link(tmp_path):
    where = tmp_path / "page.md"
    (tmp_path / "real.md").write_text("# A heading\n")
    text = (
        "```bash\n"
        "bash run_all.sh --preset no-such-preset\n"
        "python part9_nothing/train.py --preset tiny\n"
        "python part1_reward/train_sft.py --preset tiny sft.learnig_rate=1e-4\n"
        "python -m rlhf.no_such_module --preset tiny\n"
        "```\n"
        "Inline: `python bench/no_such_bench.py --run outputs/tiny`, `ppo.kl_coef=lots`, and\n"
        "`bash run_all.sh --preset tiny grpo.no_such_key=1`. Links: [a](missing.md), [b](real.md#no-such-heading),\n"
        "[c](real.md#a-heading).\n"
    )
    problems = doc_problems(text, where)
    expected = [
        "--preset no-such-preset",
        "part9_nothing/train.py does not exist",
        "sft.learnig_rate",
        "module rlhf.no_such_module",
        "bench/no_such_bench.py does not exist",
        "ppo.kl_coef=lots",
        "grpo.no_such_key",
        "link missing.md",
        "link real.md#no-such-heading",
    ]
    for needle in expected:
        assert any(needle in p for p in problems), (needle, problems)
    assert len(problems) == len(expected), problems  # the real link and the real paths pass
    # The same commands, spelled right, pass.
    good = (
        "```bash\nbash run_all.sh --preset tiny --only data,sft sft.lr=1e-4\n"
        "python -m rlhf.pipeline.faults --trials 1\n```\n"
    )
    assert doc_problems(good, where) == []


def test_the_command_parser_reads_continuations_chains_and_launcher_variables():
    block = (
        'RLHF_LAUNCH="accelerate launch --config_file configs/accelerate/nope.yaml" \\\n'
        "  bash run_all.sh --preset gpt2-hh   # a comment\n"
        "mkdir -p /tmp/x && python part1_reward/train_sft.py --preset tiny --output-dir /tmp/x sft.lr=1e-4\n"
    )
    commands = shell_lines(block)
    assert len(commands) == 3 and commands[1] == "mkdir -p /tmp/x"
    assert shell_lines("DIR=/tmp/g; mkdir -p $DIR") == ["DIR=/tmp/g", "mkdir -p '$DIR'"]
    assert command_problems(commands[0]) == ["configs/accelerate/nope.yaml does not exist"]
    assert command_problems(commands[2]) == []
    assert slug("Re-running, `--force` and resuming") == "re-running---force-and-resuming"
    assert slug("1B TL;DR presets") == "1b-tldr-presets"


IMPORT_LINE = re.compile(r"^\s*(from rlhf[\w.]* import [\w, ]+)", re.M)


def test_every_rlhf_import_in_the_docs_scripts_imports():
    """The scripts written into the docs (python heredocs, one-liners) import names that exist: one imported
    `sample_responses` from a module it had left, another `picks_better`, removed in a rename."""
    lines = sorted({m.group(1) for doc in [*DOCS, REPO / "ANALYSIS.md"] for m in IMPORT_LINE.finditer(doc.read_text())})
    assert len(lines) >= 5, lines
    exec(compile("\n".join(lines), "<the docs' imports>", "exec"), {})  # an ImportError fails the test, naming it
