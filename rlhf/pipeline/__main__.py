"""`python -m rlhf.pipeline`, what run_all.sh runs: the stages in order, each its own process (driver.py)."""

from rlhf.pipeline.driver import main
from rlhf.stage.cli import run_stage

run_stage(main)
