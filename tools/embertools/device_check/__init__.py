"""The GPU check's parts (tools/dev/device_check.py is its command line): common (paths, budgets,
results, Check), goals (the rows' registry and the goals), cases (GoogleTest cases and the checks
beside them), benches, long_rows (call 3), schedule (the plan of calls) and jpeg_set (the data rows'
JPEG shards: made by device_pack.py with PIL, read by the rows). Standard library only (jpeg_set's
maker imports PIL and numpy when called, on the machine that packs): torch is used in child processes."""
