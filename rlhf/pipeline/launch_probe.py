"""Run by the pipeline under RLHF_LAUNCH before any stage (`rlhf.pipeline.launch.launched_processes`): the first
process prints how many processes the launcher started (WORLD_SIZE; 1 when it sets none)."""

import os

if os.environ.get("RANK", "0") == "0":
    print(os.environ.get("WORLD_SIZE", "1"))
