"""What a study shows and leaves besides its journal: the trials' table, best.toml (the best trial's
config) and study.png.
"""
import importlib.util
import json
import os
import textwrap
import tomllib
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from .common import DPI, FIG_SIZE_IN, TuneError
from .space import _is_int, override_text


def format_params(params):
    return " ".join(f"{k}={override_text(v) if not isinstance(v, float) else f'{v:.4g}'}"
                    for k, v in params.items())


def print_table(trials, space, direction, drivers=False):
    """number, state, value, seconds, notes and one column per parameter (and with drivers, the
    driver that ran it: host:pid), as plain text."""
    keys = sorted({k for t in trials for k in t.params})
    rows = []
    for t in trials:
        if t.state == TrialState.WAITING:
            continue
        a = t.user_attrs
        if t.state == TrialState.PRUNED:
            note = f"at epoch {a.get('pruned_epoch', max(t.intermediate_values, default='?'))}"
        elif t.state == TrialState.FAIL:
            note = a.get("not_run") or a.get("reason", "stale: no heartbeat from its driver (run again)")
            if _is_int(a.get("exit_status")) and a.get("reason") != "interrupted":
                note += f" (exit {a['exit_status']})"
        elif "retry_of" in a:
            note = f"rerun of {a['retry_of']}"
        else:
            note = ""
        value = t.value if t.state == TrialState.COMPLETE else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
        seconds = a.get("seconds")
        if seconds is None and t.datetime_start and t.datetime_complete:
            seconds = (t.datetime_complete - t.datetime_start).total_seconds()
        rows.append([str(t.number), t.state.name,
                     "-" if value is None else f"{value:.6g}" + ("" if t.state == TrialState.COMPLETE else "*"),
                     "-" if seconds is None else f"{seconds:.1f}",
                     *[format_value(t.params.get(k)) for k in keys],
                     *([a.get("driver", "-")] if drivers else []), note])
    header = ["#", "state", space.metric, "seconds", *keys, *(["driver"] if drivers else []), "note"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"({direction.name.lower()} {space.metric}; * = last value reported before the trial stopped)\n")


def format_value(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return override_text(v)


# --------------------------------------------------------------------------- best.toml

def toml_value(v):
    """TOML text of a value tomllib read from a recipe's config.toml."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)  # exact round trip; TOML takes 1e-08, inf and nan as Python writes them
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: the same escapes as JSON
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TuneError(f"best.toml: cannot write a {type(v).__name__} value")


def toml_text(table):
    """A nested dict as TOML: the scalars of each table, then its sub-tables."""
    out = []

    def emit(t, prefix):
        scalars = [(k, v) for k, v in t.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in t.items() if isinstance(v, dict)]
        if prefix and scalars:
            out.append(f"\n[{prefix}]")
        for k, v in scalars:
            out.append(f"{k} = {toml_value(v)}")
        for k, v in tables:
            emit(v, f"{prefix}.{k}" if prefix else k)

    emit(table, "")
    return "\n".join(out).lstrip("\n") + "\n"


def write_best_config(study_dir, best, space, recipe, where=None):
    """STUDY/best.toml: the best trial's run/config.toml without run.dir and run.overwrite (a
    run made from it picks its own folder and never moves another run aside). The file is read
    from the trial's folder, or (a shared study's trial run on another machine) from the copy
    kept in the study (user attribute "config")."""
    folder = Path(best.user_attrs.get("folder", study_dir / "trials" / f"{best.number:04d}"))
    source = folder / "run" / "config.toml"
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as e:
        text = best.user_attrs.get("config")
        if text is None:
            raise TuneError(f"{source}: cannot read the best trial's config ({e})") from None
        source = f"trial {best.number}'s copy in the study (run by {best.user_attrs.get('driver', '?')} in {folder})"
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TuneError(f"{source}: cannot read the best trial's config ({e})") from None
    run_table = config.get("run", {})
    for key in ("dir", "overwrite"):
        run_table.pop(key, None)
    if not run_table:
        config.pop("run", None)
    header = (f"# The best trial of {where or f'the study {study_dir}'}: trial {best.number}, "
              f"{space.metric} = {best.value!r}\n"
              f"# ({space.direction}). The recipe's whole resolved config from {source},\n"
              f"# without run.dir and run.overwrite. Reproduce it with\n"
              f"#   tools/ember run {recipe} --config {study_dir / 'best.toml'}\n"
              f"# Searched: {format_params(best.params)}\n\n")
    path = study_dir / "best.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(header + toml_text(config), encoding="utf-8")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- study.png

def plot_study(path, study, space):
    """Objective per trial (complete, pruned at their last value, failed as ticks), the best so
    far, and parameter importance when optuna.importance can compute it."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    trials = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
    fig = Figure(figsize=FIG_SIZE_IN, dpi=DPI)
    ax, ax_imp = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED and t.intermediate_values]
    failed = [t for t in trials if t.state == TrialState.FAIL and "not_run" not in t.user_attrs]
    if complete:
        ax.plot([t.number for t in complete], [t.value for t in complete], "o", color="tab:blue",
                label="complete")
    if pruned:
        ax.plot([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                "x", color="tab:gray", label="pruned (last value)")
    if complete:
        better = max if space.direction == "maximize" else min
        xs, ys, best = [], [], None
        for t in sorted(complete, key=lambda t: t.number):
            best = t.value if best is None else better(best, t.value)
            xs.append(t.number)
            ys.append(best)
        last = max(t.number for t in trials)
        ax.step(xs + [last], ys + [ys[-1]], where="post", color="tab:orange", label="best so far")
    if failed:
        ax.plot([t.number for t in failed], [0.02] * len(failed), "v", color="tab:red",
                transform=ax.get_xaxis_transform(), label="failed")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(space.metric)
    ax.set_title(f"{space.metric} per trial ({space.direction})")
    ax.grid(alpha=0.3)
    if trials:
        ax.legend(loc="best", fontsize="small")
    reason = None
    # Only parameters that vary across the complete trials (a constant one would get a share).
    varying = sorted(k for k in {k for t in complete for k in t.params}
                     if len({repr(t.params.get(k)) for t in complete}) > 1)
    if len(complete) < 2:
        reason = "needs >= 2 complete trials"
    elif not varying:
        reason = "no parameter varies across the complete trials"
    else:
        # fANOVA (Optuna's default) needs scikit-learn, which the venv does not pin;
        # PED-ANOVA needs numpy only (experimental in Optuna 4: its warning is muted).
        if importlib.util.find_spec("sklearn"):
            method, evaluator = "fANOVA", optuna.importance.FanovaImportanceEvaluator(seed=0)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                method, evaluator = "PED-ANOVA", optuna.importance.PedAnovaImportanceEvaluator()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importances = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varying)
        except Exception as e:  # noqa: BLE001 (a small or degenerate study: say why, plot the rest)
            importances, reason = {}, f"unavailable ({method}): {e}"
        if importances:
            names = list(importances)[::-1]
            ax_imp.barh(names, [importances[n] for n in names], color="tab:green")
            ax_imp.set_xlabel(f"{method}, {len(complete)} complete trials (sums to 1)")
    if reason:
        ax_imp.text(0.5, 0.5, textwrap.fill(reason[:300], 40), ha="center", va="center",
                    transform=ax_imp.transAxes)
        ax_imp.set_xticks([])
        ax_imp.set_yticks([])
    ax_imp.set_title("parameter importance")
    fig.tight_layout()
    fig.savefig(path)
    return path
