"""The GPU check's parts (tools/dev/device_check.py is its command line): common (paths, budgets,
results, Check), goals (the rows' registry and the goals), cases (GoogleTest cases and the checks
beside them), benches, long_rows (call 3) and schedule (the plan of calls). Standard library only:
torch is used in child processes."""
