"""Orchestration: running the stages in order, each its own process, under a launcher or forked.

driver         `bash run_all.sh` / `python -m rlhf.pipeline`: which stages run, in order
stage_process  a stage as its own process: forked from a preloaded parent where safe
launch         RLHF_LAUNCH (accelerate, torchrun): batch arithmetic checked per process count
launch_probe   what a launcher gives each process (run under the launcher)
faults         `python -m rlhf.pipeline.faults`: kill each stage mid-run, resume, compare with a clean run
"""
