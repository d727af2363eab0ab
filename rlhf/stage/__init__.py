"""The stage contract: what every stage script reads, writes and promises.

schema        the config dataclasses: one per section, every field commented, and the bases sections share
config        loading a config: presets, overrides, type coercion, the checks every stage shares
run           the run folder: stage directories, inputs, completion markers, summary.json
cli           start_stage / run_stage: argument parsing, the one-line errors, skip-if-complete
tracking      the metric logger (metrics.jsonl, TensorBoard, progress bars)
signals       graceful stops (Ctrl-C, SIGTERM) and when a checkpoint is due
fault_points  named points where the fault-injection tests kill a stage
"""
