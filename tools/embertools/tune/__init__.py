"""The tuner's parts (tools/tune.py is its command line): common (constants, errors, the log line,
SQLite's lock), space, recipe, trial, study (Optuna and the Tuner), output (table, best.toml,
study.png). Needs optuna (and matplotlib for study.png): the venv's python."""
import os

os.environ["MPLBACKEND"] = "Agg"  # headless: never look for a display (before optuna's matplotlib)
