"""The study: Optuna's samplers and storage (a journal file, or --storage shared by several drivers),
and the Tuner, which runs P trials at a time, prunes, retries, beats for its running trials in a
shared study and reports.
"""
import contextlib
import copy
import json
import math
import os
import random
import signal
import socket
import subprocess
import time
import tomllib
import warnings
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from embertools.errors import UsageError
from .common import (ASHA_REDUCTION, BACKOFF_S, EXIT_MEANING, GRACE_BEATS, LOG_TAIL_CHARS, MetricError, OPEN_TRIES,
    POLL_S, SAME_FAILURE_STOP, SQLITE_BUSY_S, STOP_WAIT_S, STORAGE_POLL_S, TuneError, log, safe_url, sqlite_busy,
    wait_for_sqlite_lock)
from .output import format_params, plot_study, print_table, write_best_config
from .recipe import _die_with_driver, detect_gpus
from .space import _is_int, _is_number, override_text
from .trial import TrialRun, final_value, log_tail, number_fields, read_summary, read_val_records, set_user_attrs


# --------------------------------------------------------------------------- the study

class GridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler for ask-and-tell: its after_trial calls study.stop(), which only
    works inside study.optimize; this driver counts the grid itself (Tuner.grid_left).

    shared (--storage): Optuna gives trial number k grid point k while k < the grid's size,
    then a random unvisited point, which two drivers asking at once may both draw (and any
    trial past the end, a visited one). Here the trial takes the point numbered by the count
    of trials before it that were not given their point (--enqueue, retries: "fixed_params"),
    which every driver computes alike: trial numbers are given one at a time by the storage,
    and whether a trial has fixed params is set when it is created. So each grid point goes
    to one trial; a trial counted past the grid's end gets no point (Tuner.claim: not run)."""

    def __init__(self, search_space, seed, shared=False):
        super().__init__(search_space, seed=seed)
        self.shared = shared

    def before_trial(self, study, trial):
        if not self.shared:
            return super().before_trial(study, trial)
        if "grid_id" in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return None  # an enqueued or retried point, or a trial given back and asked again
        before = study._storage.get_all_trials(study._study_id, deepcopy=False)
        grid_id = sum(t.number < trial.number and "fixed_params" not in t.system_attrs for t in before)
        study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
        study._storage.set_trial_system_attr(trial._trial_id, "grid_id", grid_id)
        return None

    def after_trial(self, study, trial, state, values):
        pass


def counts_as_finished(t):
    """COMPLETE, PRUNED and FAIL count toward --trials; a FAIL by interruption does not, nor one a
    driver did not run (a copy of an enqueued point), nor one failed by another driver's heartbeat
    check (no "reason": its driver died; its point runs again)."""
    if t.state == TrialState.FAIL:
        return "reason" in t.user_attrs and "interrupted" not in t.user_attrs and "not_run" not in t.user_attrs
    return t.state in (TrialState.COMPLETE, TrialState.PRUNED)


class Tuner:
    """The driver: one thread, P trial processes, the study in a journal file (or, with --storage,
    in a database other drivers share)."""

    def __init__(self, args, space, fixed, fixed_args, recipe):
        self.args, self.space, self.fixed, self.fixed_args, self.recipe = args, space, fixed, fixed_args, recipe
        self.dir = args.study
        self.shared = args.storage is not None  # a study in a database, shared with other drivers
        self.driver = f"{socket.gethostname()}:{os.getpid()}"  # user attr "driver" of its trials
        self.running = {}  # slot -> TrialRun
        self.stopping = 0  # signals received (1: stop trials cleanly, 2+: kill them)
        self.signal_name = ""
        self.stop_reason = None  # why the driver stops its running trials, when not a signal
        self.outcomes = []  # (state, exit status, reason, last log line, number) of the trials finished here
        self.wanted = 0  # journal: trials this driver still starts
        self.looked = None  # --storage: the last counts() of the shared study
        self.next_look = 0.0  # --storage: monotonic time it is read again
        self.backoff_until = 0.0  # --storage: no trial starts before (a trial given back)
        self.next_beat = 0.0  # --storage: monotonic time of the next heartbeat
        self.alive_since = None  # --storage: monotonic time since which this driver has beaten on time
        self.said_waiting = False
        self.gpus = detect_gpus()
        self.threads = None
        threads_set = ("trainer.threads" in fixed or any(p.key == "trainer.threads" for p in space.params)
                       or base_config_sets(args.config, "trainer.threads"))
        if args.parallel > 1 and not threads_set:
            self.threads = max(1, len(os.sched_getaffinity(0)) // args.parallel)

    # ---- setup

    @property
    def where(self):
        """The study, as messages name it: its folder, or its name and database."""
        if self.shared:
            return f"the study {self.args.study_name} in {safe_url(self.args.storage)}"
        return str(self.dir)

    def open_storage(self):
        """The shared study's RDBStorage (SQLAlchemy), with heartbeats; sqlite made safe for
        several processes: each transaction takes the write lock first (BEGIN IMMEDIATE), so
        Optuna's read-then-write steps (a WAITING trial taken by one driver only, a stale trial
        failed once) are atomic, as SELECT ... FOR UPDATE makes them on PostgreSQL and MySQL."""
        import sqlalchemy
        url = self.args.storage
        sqlite = sqlalchemy.engine.make_url(url).get_backend_name() == "sqlite"
        # isolation_level None: the sqlite3 module's own BEGIN (deferred, and only before a
        # write) is off; the "begin" listener below starts every transaction instead.
        engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_S, "isolation_level": None}} if sqlite else {}
        if sqlite:
            wait_for_sqlite_lock(sqlalchemy.engine.make_url(url).database, SQLITE_BUSY_S)
        beat = self.args.heartbeat
        for attempt in range(1, OPEN_TRIES + 1):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    storage = optuna.storages.RDBStorage(
                        url, engine_kwargs=engine_kwargs, heartbeat_interval=beat,
                        grace_period=GRACE_BEATS * beat)
                break
            except ImportError as e:
                raise TuneError(f"--storage {safe_url(url)}: the venv lacks its database driver "
                                f"({e.__cause__ or e}); install it there: PostgreSQL .venv/bin/pip install "
                                f"'psycopg[binary]' (SQLAlchemy's default for postgresql://), MySQL PyMySQL with "
                                f"a mysql+pymysql:// URL") from None
            except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
                # Drivers started at once race to create the tables: the loser sees them made.
                # A lock held through SQLite's own wait (SQLITE_BUSY_S) is not such a race.
                cause = e.__cause__ or e
                if sqlite and sqlite_busy(cause):
                    raise TuneError(f"--storage {safe_url(url)}: the database stayed locked for {SQLITE_BUSY_S} s "
                                    f"while this driver opened it: another process holds a transaction open on "
                                    f"it; end that process, or give another database") from None
                if attempt == OPEN_TRIES:
                    raise TuneError(f"--storage {safe_url(url)}: cannot open it ({type(cause).__name__}: "
                                    f"{str(cause).splitlines()[0]}); is the database reachable, and for "
                                    f"sqlite does its folder exist?") from None
                time.sleep(random.uniform(0.2, 1.0))
        if sqlite:
            sqlalchemy.event.listen(storage.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        return storage

    def check_folder(self):
        """Trial folders are named by trial number, unique in one study: a folder holds one
        study's trials (the journal's, or this machine's of one shared study), as
        STUDY/storage.txt says for a shared one."""
        marker = self.dir / "storage.txt"
        text = marker.read_text(encoding="utf-8") if marker.exists() else None
        if self.shared:
            mine = f"{safe_url(self.args.storage)} {self.args.study_name}\n"
            journal = self.dir / "journal.log"
            if journal.exists() and journal.stat().st_size:
                raise TuneError(f"{self.dir} holds a study of its own ({journal}): give the shared study another "
                                f"--study folder")
            if text is not None and text != mine:
                raise TuneError(f"{self.dir} holds this machine's trials of another shared study "
                                f"({text.strip()}): give {self.where} another --study folder")
            if text is None:
                marker.write_text(mine, encoding="utf-8")
        elif text is not None:
            url, _, name = text.strip().rpartition(" ")
            raise TuneError(f"{self.dir} holds this machine's trials of the shared study {name} in {url}: add "
                            f"--storage URL --study-name {name} to resume it, or use another --study folder")

    def open_study(self):
        self.check_folder()
        if self.shared:
            storage, name = self.open_storage(), self.args.study_name
        else:
            storage, name = JournalStorage(JournalFileBackend(str(self.dir / "journal.log"))), "tune"
        study = optuna.create_study(study_name=name, storage=storage, direction=self.space.direction,
                                    load_if_exists=True)
        attrs = study.user_attrs
        another = "--study-name" if self.shared else "--study folder"
        if "recipe" not in attrs:  # a new study: what it optimises, for the resumes ("recipe" is set last)
            study.set_user_attr("metric", self.space.metric)
            study.set_user_attr("space", self.space.text)
            study.set_user_attr("fixed", self.fixed_args)
            study.set_user_attr("seed", self.args.seed)
            study.set_user_attr("recipe", self.recipe)
        else:
            valued = any(t.state == TrialState.COMPLETE or t.intermediate_values for t in study.trials)
            if attrs.get("metric") != self.space.metric and not valued \
                    and study.direction.name.lower() == self.space.direction:
                # No trial has a value yet (the last run stopped on a misspelt metric, say).
                log(f"note: the study's metric changes from {attrs.get('metric')} to {self.space.metric} "
                    f"(no trial has a value yet)")
                study.set_user_attr("metric", self.space.metric)
                study.set_user_attr("space", self.space.text)
            elif attrs.get("metric") != self.space.metric \
                    or study.direction.name.lower() != self.space.direction:
                raise TuneError(f"{self.where} is a study of {attrs.get('metric')} "
                                f"({study.direction.name.lower()}), the space file asks for {self.space.metric} "
                                f"({self.space.direction}): use another {another}")
            if attrs.get("recipe") != self.recipe:
                raise TuneError(f"{self.where} is a study of the recipe {attrs.get('recipe')}, not {self.recipe}: "
                                f"use another {another}")
            if study.user_attrs.get("space") != self.space.text:
                log("note: the space file differs from the one this study started with (the new one applies "
                    "to new trials)")
            if sorted(attrs.get("fixed", [])) != sorted(self.fixed_args):
                log(f"note: the fixed arguments differ from the study's first run ({attrs.get('fixed')}): "
                    f"trials may not be comparable")
        self.study = study
        if self.shared:
            self.fail_stale()
        else:
            self.mark_stale_trials()
        # A seeded sampler restarts its random stream; offsetting the seed by the trials
        # already in the study keeps a resumed study from drawing the same points again.
        # The grid's seed stays fixed: it orders the grid, whose ids the journal keeps.
        n = len(study.trials)
        seed = self.args.seed
        if self.args.sampler == "grid":
            grid = {p.key: p.grid_points() for p in self.space.params}
            if self.shared and attrs.get("seed", seed) != seed:
                # Every driver must order the grid alike: a grid id names the same point for all.
                log(f"note: the grid is ordered by the study's seed {attrs['seed']}, not --seed {seed}")
                seed = attrs["seed"]
            study.sampler = GridSampler(grid, seed=seed, shared=self.shared)
            self.grid_size = math.prod(len(v) for v in grid.values())
        elif self.args.sampler == "random":
            study.sampler = optuna.samplers.RandomSampler(seed=seed + n)
        else:
            # constant_liar: a running trial counts as a poor result, so parallel trials
            # (this driver's, and with --storage the other drivers') do not all go to the same
            # promising point (experimental in Optuna 4: muted).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.sampler = optuna.samplers.TPESampler(n_startup_trials=self.args.startup_trials, seed=seed + n,
                                                           constant_liar=self.args.parallel > 1 or self.shared)
        if self.shared:
            # Drivers started at once would draw the same points from the same seed: each draws
            # from a stream of its own (reseeded from the OS; the grid keeps its order).
            study.sampler.reseed_rng()
        warmup = self.args.pruner_warmup
        if self.args.pruner == "median":
            study.pruner = optuna.pruners.MedianPruner(n_startup_trials=self.args.pruner_startup,
                                                       n_warmup_steps=warmup + 1)
        elif self.args.pruner == "asha":
            study.pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=warmup + 1,
                                                                  reduction_factor=ASHA_REDUCTION)
        else:
            study.pruner = optuna.pruners.NopPruner()
        if self.args.pruner != "none" and self.space.val_field is None:
            log(f"note: {self.space.metric} is not a val_* metric: no value per epoch, so no pruning")

    def mark_stale_trials(self):
        """RUNNING trials in the journal belong to a driver that stopped without finishing them
        (this one holds driver.lock): FAIL, interrupted, parameters enqueued again."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            folder = self.dir / "trials" / f"{t.number:04d}"
            set_user_attrs(self.study, t._trial_id, {
                "interrupted": "left RUNNING by a driver that stopped (killed?); marked FAIL on resume",
                "reason": "interrupted"})
            self.study.tell(t.number, state=TrialState.FAIL)
            log(f"trial {t.number} was left RUNNING by a driver that stopped: marked FAIL (interrupted, "
                f"not counted); its folder {folder} is kept; its parameters run again")
            if t.params:
                self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def enqueue(self, points):
        """--enqueue: fixed points tried first, once per study (skipped when already there). Two
        drivers starting at once may both enqueue a point: the copies carry the same "enqueued"
        attribute, and only the first (lowest number) runs (claim)."""
        for params in points:
            key = json.dumps(params, sort_keys=True) if self.shared else None
            self.study.enqueue_trial(params, skip_if_exists=True, user_attrs={"enqueued": key} if key else None)

    # ---- the shared study (--storage)

    def retry_stale(self, study, t):
        """A RUNNING trial whose driver stopped beating
        (killed, its machine gone) was failed by this driver's fail_stale(): its point runs again
        (not counted: it has no "reason"; folder kept on the machine that ran it)."""
        who = t.user_attrs.get("driver", "a driver")
        log(f"trial {t.number} of {who} had no heartbeat for {GRACE_BEATS * self.args.heartbeat} s: FAIL (its "
            f"driver is gone; not counted); its folder {t.user_attrs.get('folder', '?')} is kept there"
            + ("; its parameters run again" if t.params else ""))
        if t.params:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def fail_stale(self):
        """Fails the other drivers' RUNNING trials without a heartbeat for the grace period
        (Optuna's fail_stale_trials, less two misjudgements). Never a trial running here: its
        driver is this one, alive. And nothing while this driver has not itself beaten on time
        for a whole grace period: stopped or starved (SIGSTOP, swap, a suspended VM) in the middle
        of a transaction, it held sqlite's write lock and the others could not beat either; their
        last heartbeats are old because of it, so it first beats for a grace period again."""
        storage = self.study._storage
        here = {run.trial._trial_id for run in self.running.values()}
        failed = []
        for trial_id in storage._get_stale_trial_ids(self.study._study_id):
            if trial_id in here:
                continue
            try:
                if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                    failed.append(trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another driver failed it first
        for trial_id in failed:
            self.retry_stale(self.study, copy.deepcopy(storage.get_trial(trial_id)))

    def beat(self):
        """Every --heartbeat seconds: a heartbeat for each trial running here, a check that none
        of them was failed meanwhile as stale by another driver (this one too slow), and the
        stale check over the other drivers' trials, once this driver has beaten on time for a
        grace period (fail_stale)."""
        now = time.monotonic()
        if now < self.next_beat:
            return
        interval = self.args.heartbeat
        # Stalled: held up for half the grace period or more (a busy machine's loop is late by
        # less), long enough for the others' heartbeats to age past it behind this driver's lock.
        stall = GRACE_BEATS // 2 * interval
        if self.alive_since is None:
            self.alive_since = now - GRACE_BEATS * interval  # held no lock before its first beat
        elif now - self.next_beat > stall:
            self.alive_since = now  # stalled since the last beat
        self.next_beat = now + interval
        storage = self.study._storage
        for run in self.running.values():
            storage.record_heartbeat(run.trial._trial_id)
            if not run.lost and self.taken_over(run):
                self.lose(run)
        done = time.monotonic()
        if done - now > stall:
            self.alive_since = done  # stalled inside this beat's own transactions
        if done - self.alive_since >= GRACE_BEATS * interval:
            self.fail_stale()

    def taken_over(self, run):
        """The trial is no longer RUNNING in the shared study: another driver failed it as stale."""
        return self.study._storage.get_trial(run.trial._trial_id).state != TrialState.RUNNING

    def lose(self, run):
        """Another driver failed this trial as stale (no heartbeat from here for too long) and
        queued its point again: stop it; it is not told (finished already)."""
        run.lost = True
        run.stop()
        log(f"trial {run.number} was failed by another driver (no heartbeat from here for "
            f"{GRACE_BEATS * self.args.heartbeat} s; a busy machine?): stopping it; its point runs again")

    def counts(self):
        """(finished trials that count, RUNNING trials of every driver, grid points left or None)."""
        trials = self.study.get_trials(deepcopy=False)
        counted = sum(counts_as_finished(t) for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        return counted, running, self.grid_left() if self.args.sampler == "grid" else None

    def look(self):
        """counts(), read again when this driver started or finished a trial since, or after
        STORAGE_POLL_S (other drivers' changes)."""
        now = time.monotonic()
        if self.looked is None or now >= self.next_look:
            self.looked, self.next_look = self.counts(), now + STORAGE_POLL_S
        return self.looked

    def may_start(self):
        """Whether this driver starts another trial: journal, its own count; shared, while the
        study's finished and running trials number fewer than --trials."""
        if not self.shared:
            return self.wanted > 0
        if time.monotonic() < self.backoff_until:
            return False
        counted, running, left = self.look()
        return counted + running < self.args.trials and left != 0

    def study_done(self):
        """No trial runs here: stop? Journal: when this driver started its share. Shared: when no
        driver runs a trial and --trials are finished (or the grid): a trial of another driver may
        still go stale, and then runs here."""
        if not self.shared:
            return self.wanted <= 0
        counted, running, left = self.look()
        if running == 0 and (counted >= self.args.trials or left == 0):
            return True
        if running and not self.said_waiting and (counted + running >= self.args.trials or left == 0):
            self.said_waiting = True
            log(f"{counted} trial(s) finished and {running} running in {self.where}: waiting for the other "
                f"drivers' trials (one whose driver stops beating is run again here)")
        return False

    def claim(self, trial):
        """A trial just asked for (RUNNING in the shared study): True if this driver runs it.
        Asking and counting are two steps, so two drivers may ask at once for the last slot:
        each counts after its ask, and one that finds the study over --trials gives its trial
        back (WAITING again: Optuna's queue, the next ask takes it, params and grid point kept)
        and looks again later. The last of racing drivers to count sees all their trials, so
        no more than --trials run; both may give back, and one then runs it. A copy of an
        --enqueue point that another driver enqueued at the same moment is not run (FAIL,
        "not_run", not counted)."""
        trials = self.study.get_trials(deepcopy=False)
        mine = next(t for t in trials if t.number == trial.number)
        if self.args.sampler == "grid" and mine.system_attrs.get("grid_id", 0) >= self.grid_size:
            set_user_attrs(self.study, trial._trial_id, {"reason": "not run", "not_run": "the grid is done"})
            self.study.tell(trial, state=TrialState.FAIL)
            log(f"trial {trial.number}: every grid point is taken (drivers asked at the same moment): not run")
            return False
        key = mine.user_attrs.get("enqueued")
        first = min((t.number for t in trials if key and t.user_attrs.get("enqueued") == key), default=None)
        if first is not None and first != trial.number:
            set_user_attrs(self.study, trial._trial_id, {
                "reason": "not run", "not_run": f"a copy of trial {first}'s --enqueue point"})
            self.study.tell(trial, state=TrialState.FAIL)
            log(f"trial {trial.number}: a copy of trial {first}'s --enqueue point (two drivers enqueued it): "
                f"not run")
            return False
        counted = sum(counts_as_finished(t) for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)  # this one included
        if counted + running > self.args.trials:
            self.study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
            self.backoff_until = time.monotonic() + random.uniform(*BACKOFF_S)
            log(f"trial {trial.number} given back (WAITING): {counted} finished and {running - 1} running already "
                f"make --trials {self.args.trials} (drivers asked at the same moment)")
            return False
        self.study._storage.record_heartbeat(trial._trial_id)
        return True

    # ---- trials

    def finished(self):
        return sum(counts_as_finished(t) for t in self.study.get_trials(deepcopy=False))

    def grid_left(self):
        """Grid points no trial has taken yet, plus enqueued trials (retries) waiting."""
        taken = {t.system_attrs.get("grid_id") for t in self.study.get_trials(deepcopy=False)}
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return self.grid_size - len(taken & set(range(self.grid_size))) + waiting

    def start_trial(self, slot):
        """Asks Optuna for a trial and starts it; False when the shared study gave none to run."""
        with warnings.catch_warnings():
            # With --storage: "Heartbeat of storage is supposed to be used with Study.optimize" (beat() beats).
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask()
        self.looked = None  # the study changes: look again
        try:
            if self.shared and not self.claim(trial):
                return False
            self.launch(trial, slot)
        except BaseException as e:
            # Nothing runs for this trial: FAIL, not RUNNING (a resume would call it interrupted).
            set_user_attrs(self.study, trial._trial_id, {"reason": f"not started: {e}"[:LOG_TAIL_CHARS]})
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self.wanted -= 1
        return True

    def launch(self, trial, slot):
        params = {p.key: p.suggest(trial) for p in self.space.params}
        folder = self.dir / "trials" / f"{trial.number:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        command = [str(self.args.binary)]
        if self.args.config:
            command += ["--config", str(self.args.config)]
        command += [f"{k}={override_text(v)}" for k, v in params.items()]
        command += self.fixed_args
        if self.threads is not None:
            command.append(f"trainer.threads={self.threads}")
        command.append(f"run.dir={folder / 'run'}")
        env = dict(os.environ)
        if len(self.gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot % len(self.gpus)]
        trial.set_user_attr("command", command)
        trial.set_user_attr("folder", str(folder))
        trial.set_user_attr("driver", self.driver)
        log_file = open(folder / "log.txt", "ab")
        try:
            log_file.write(f"$ {' '.join(command)}\n".encode())
            log_file.flush()
            # Own session: a Ctrl-C at the terminal reaches the driver only, which stops the
            # trials itself; PDEATHSIG stops them if the driver is killed.
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, preexec_fn=_die_with_driver)
        except BaseException:
            log_file.close()
            raise
        self.running[slot] = TrialRun(trial, params, folder, process, log_file, slot, time.monotonic())
        where = f" on GPU {env['CUDA_VISIBLE_DEVICES']}" if len(self.gpus) > 1 else ""
        log(f"trial {trial.number} started{where}: {format_params(params)} ({folder})")

    def follow(self, run):
        """Reports new validation values; asks the pruner; stops a pruned trial."""
        field_name = self.space.val_field
        if run.lost:
            return
        for record in read_val_records(run):
            if field_name and field_name not in record:
                raise self.metric_error(f"the val records of {self.recipe} have no field \"{field_name}\"",
                                        number_fields(record, "val_", skip=("epoch", "step")))
            value = record.get(field_name) if field_name else None
            epoch = record["epoch"]
            if not _is_number(value) or epoch in run.reported:
                continue
            run.reported[epoch] = float(value)
            try:
                run.trial.report(float(value), epoch)
            except optuna.exceptions.UpdateFinishedTrialError:
                if not self.shared:
                    raise
                self.lose(run)  # failed by another driver's heartbeat check since the last beat
                return
            if run.pruned_at is None and not self.stopping and run.process.poll() is None \
                    and epoch != run.last_epoch() and run.trial.should_prune():
                run.pruned_at = epoch
                run.stop()
                log(f"trial {run.number} pruned at epoch {epoch} ({self.space.metric} {value:.6g}): "
                    f"stopping it")

    def finish(self, run):
        """The trial's process exited: tell Optuna how it went."""
        rc = run.process.returncode
        seconds = time.monotonic() - run.started
        if self.shared and not run.lost and self.taken_over(run):
            run.lost = True
        if run.lost:
            run.log_file.close()
            log(f"trial {run.number} (failed by another driver) stopped, exit status {rc}")
            return
        try:
            self.follow(run)  # the records written before it exited
        except MetricError:
            run.log_file.close()
            self.interrupted(run, rc, seconds, self.stop_reason)
            raise
        run.log_file.close()
        attrs = {"exit_status": rc, "seconds": round(seconds, 3)}
        trial_id = run.trial._trial_id
        if run.pruned_at is not None:
            set_user_attrs(self.study, trial_id, {**attrs, "pruned_epoch": run.pruned_at})
            self.study.tell(run.trial, state=TrialState.PRUNED)
            log(f"trial {run.number} PRUNED at epoch {run.pruned_at} ({seconds:.1f} s)")
            self.outcome(TrialState.PRUNED, rc, "", "", run.number)
            return
        if self.stopping and (rc == 130 or rc < 0):
            self.interrupted(run, rc, seconds)
            return
        summary = read_summary(run) if rc == 0 else None
        if summary is not None and self.space.val_field is None and self.space.metric not in summary:
            self.interrupted(run, rc, seconds, "stopped: the objective metric is not in summary.json")
            raise self.metric_error(f"{run.folder / 'run' / 'summary.json'} has no \"{self.space.metric}\"",
                                    number_fields(summary))
        value = final_value(run, self.space) if rc == 0 else None
        if value is not None and math.isfinite(value):
            if self.shared:  # best.toml on another machine than this trial's folder
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    attrs["config"] = (run.folder / "run" / "config.toml").read_text(encoding="utf-8")
            set_user_attrs(self.study, trial_id, attrs)
            self.study.tell(run.trial, value)
            best = self.study.best_trial
            log(f"trial {run.number} COMPLETE: {self.space.metric} {value:.6g} ({seconds:.1f} s); "
                f"best so far: trial {best.number}, {best.value:.6g}")
            self.outcome(TrialState.COMPLETE, rc, "", "", run.number)
            return
        if rc == 0:
            reason = f"no finite {self.space.metric} in run/summary.json nor in the val records"
            if self.space.val_field:
                reason += " (does the run validate? e.g. data.val_size > 0)"
        elif rc < 0:
            reason = f"killed by signal {signal.Signals(-rc).name}"
        else:
            reason = EXIT_MEANING.get(rc, "error")
        tail = log_tail(run.folder / "log.txt")
        set_user_attrs(self.study, trial_id, {**attrs, "reason": reason, "log_tail": tail})
        self.study.tell(run.trial, state=TrialState.FAIL)
        log(f"trial {run.number} FAIL: exit status {rc} ({reason}), {seconds:.1f} s; last lines of "
            f"{run.folder / 'log.txt'}:\n" + "\n".join("    " + line for line in tail.splitlines()))
        self.outcome(TrialState.FAIL, rc, reason, tail.splitlines()[-1] if tail else "", run.number)

    def outcome(self, state, rc, reason, last_line, number):
        """Counts a trial finished by this driver; the first SAME_FAILURE_STOP all failing the
        same way (exit status and reason) stop the study: the setup is wrong, not the points."""
        self.outcomes.append((state, rc, reason, last_line, number))
        if len(self.outcomes) != SAME_FAILURE_STOP:
            return
        if any(o[0] != TrialState.FAIL or o[1:3] != self.outcomes[0][1:3] for o in self.outcomes):
            return
        lines = sorted({o[3] for o in self.outcomes if o[3]})
        numbers = ", ".join(str(o[4]) for o in self.outcomes)
        self.stop_reason = f"stopped: the first {SAME_FAILURE_STOP} trials failed the same way"
        what = f"exit status {rc} ({reason})" if _is_int(rc) else reason
        raise TuneError(f"the first {SAME_FAILURE_STOP} trials all failed with {what} (trials {numbers}): "
                        f"stopping the study, since the setup (fixed arguments, --config, the recipe) rather "
                        "than the sampled points is likely wrong. Their last log line"
                        f"{'s' if len(lines) > 1 else ''}:\n" + "\n".join("    " + line for line in lines)
                        + "\nFix it and rerun the same command (these trials count toward --trials), or use "
                          "another --study folder")

    def metric_error(self, what, fields):
        """The objective names nothing the recipe records: stop the running trials (not counted,
        their points run again) and say which names there are."""
        self.stop_reason = f"stopped: {self.space.metric} is not a metric of {self.recipe}"
        names = ", ".join(fields) or "none"
        return MetricError(f"[objective] metric = \"{self.space.metric}\": {what}; metrics there: {names}"
                           f"{'' if self.space.val_field else ' (or val_<field> of the val records)'}. Fix the "
                           f"space file and rerun the same command (the study resumes; no trial has counted)")

    def interrupted(self, run, rc, seconds, why="stopped when the driver was interrupted"):
        if run.lost or (self.shared and self.taken_over(run)):  # failed by another driver, point queued again
            return
        set_user_attrs(self.study, run.trial._trial_id, {
            "exit_status": rc, "seconds": round(seconds, 3), "reason": "interrupted", "interrupted": why})
        self.study.tell(run.trial, state=TrialState.FAIL)
        self.study.enqueue_trial(run.params, user_attrs={"retry_of": run.number})
        log(f"trial {run.number} {why} (exit status {rc}): FAIL (interrupted, not counted; its "
            f"parameters run again on resume)")

    def on_signal(self, signum, _frame):
        # Only counted here: the loop acts on it (a print or a kill from inside a signal
        # handler could re-enter the code it interrupted).
        self.stopping += 1
        self.signal_name = signal.Signals(signum).name

    def act_on_signals(self, told):
        """Stops the running trials after a first SIGINT/SIGTERM, kills them after a second;
        returns how many signals have been acted on."""
        if self.stopping == told:
            return told
        if told == 0:
            log(f"{self.signal_name}: stopping the running trials (they save a checkpoint); again to kill them")
        if self.stopping >= 2 and told < 2:
            log(f"{self.signal_name} again: killing the running trials")
        for run in self.running.values():
            if self.stopping >= 2 and run.process.poll() is None:
                run.process.kill()
            else:
                run.stop()
        return self.stopping

    def run(self):
        """Runs trials until --trials are finished (or the grid is done, or a signal). With
        --storage the count is the shared study's, across every driver."""
        if self.shared:
            counted, running, left = self.counts()
            log(f"{self.where}: {counted} trial(s) finished, {running} running; this driver ({self.driver}) "
                f"runs up to {self.args.parallel} at a time until {self.args.trials} are finished or running"
                + (f" (grid: {left} point(s) left)" if left is not None else "")
                + (f", trainer.threads={self.threads} each" if self.threads else ""))
        else:
            self.wanted = self.args.trials - self.finished()
            if self.args.sampler == "grid":
                left = self.grid_left()
                if left < self.wanted:
                    log(f"the grid has {self.grid_size} points, {left} not tried yet: running {left} trial(s)")
                    self.wanted = left
            done = self.finished()
            if self.wanted <= 0:
                log(f"{done} trial(s) finished already (--trials {self.args.trials}): nothing to run")
                return
            log(f"{done} trial(s) finished, {self.wanted} to run, {self.args.parallel} at a time"
                + (f", trainer.threads={self.threads} each" if self.threads else ""))
        told = 0  # signals acted on
        try:
            while True:
                if self.shared:
                    self.beat()
                while not self.stopping and len(self.running) < self.args.parallel and self.may_start():
                    slot = min(set(range(self.args.parallel)) - self.running.keys())
                    if not self.start_trial(slot):
                        break
                if self.stopping:
                    told = self.act_on_signals(told)
                for slot, run in list(self.running.items()):
                    self.follow(run)
                    if run.process.poll() is not None:
                        del self.running[slot]
                        self.finish(run)
                        self.looked = None
                    elif run.term_sent and time.monotonic() - run.term_sent > STOP_WAIT_S:
                        log(f"trial {run.number}: no exit {STOP_WAIT_S:.0f} s after SIGTERM: SIGKILL")
                        run.process.kill()
                if not self.running and (self.stopping or self.study_done()):
                    break
                time.sleep(POLL_S)
        finally:
            # An exception in the driver: no trial is left running nor RUNNING in the journal.
            for slot, run in list(self.running.items()):
                run.stop()
                try:
                    run.process.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    run.process.kill()
                    run.process.wait()
                run.log_file.close()
                self.interrupted(run, run.process.returncode, time.monotonic() - run.started,
                                 *([self.stop_reason] if self.stop_reason else []))
                del self.running[slot]

    # ---- results

    def results(self):
        """The table, best.toml and study.png, from every trial in the journal."""
        trials = self.study.get_trials(deepcopy=False)
        print_table(trials, self.space, self.study.direction, drivers=self.shared)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if complete:
            best = self.study.best_trial
            path = write_best_config(self.dir, best, self.space, self.recipe,
                                     self.where if self.shared else None)
            log(f"best: trial {best.number}, {self.space.metric} {best.value:.6g}: {format_params(best.params)}")
            log(f"wrote {path} (tools/ember run {self.recipe} --config {path})")
        else:
            log("no trial completed yet: no best.toml")
        log(f"wrote {plot_study(self.dir / 'study.png', self.study, self.space)}")


def parse_enqueue(texts, space, sampler):
    """--enqueue KEY=VALUE[,KEY=VALUE...] texts -> typed {key: value} dicts, checked."""
    by_key = {p.key: p for p in space.params}
    points = []
    for text in texts:
        params = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in by_key:
                raise UsageError(f"--enqueue {text!r}: expected KEY=VALUE[,KEY=VALUE...] over the searched "
                                 f"keys ({', '.join(by_key)})")
            params[key] = by_key[key].parse(value)
        if sampler == "grid" and params.keys() != by_key.keys():
            raise UsageError(f"--enqueue {text!r}: with --sampler grid give every searched key")
        points.append(params)
    return points


def base_config_sets(path, key):
    if not path:
        return False
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the recipe will say what is wrong with it
    for part in key.split("."):
        if not isinstance(table, dict) or part not in table:
            return False
        table = table[part]
    return True
