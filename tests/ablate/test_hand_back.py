"""A worker handing its trial back (a warning signal, Ctrl-C, a bug) on a real Optuna journal: the retry is
in the queue before the trial is failed, so another worker never sees the plan neither waiting nor
running (it would exit, leaving the retry to nobody); and a retry enqueued twice, by the owner and by a
worker that found the trial stale, trains once."""

from __future__ import annotations

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from ablate.sweep.queue import claim_waiting, fail_and_requeue, hand_back


def a_claimed_trial(tmp_path):
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "optuna.journal")))
    study = optuna.create_study(study_name="s", storage=storage)
    study.enqueue_trial({}, user_attrs={"plan": "transformer-s0"}, skip_if_exists=False)
    trial = claim_waiting(study, storage)
    return study, storage, study.get_trials(deepcopy=False)[trial.number]


def test_the_retry_waits_before_the_trial_is_failed(tmp_path):
    study, storage, frozen = a_claimed_trial(tmp_path)
    seen_at_fail = []
    set_state = storage.set_trial_state_values

    def watching(trial_id, state, values=None):
        if state == TrialState.FAIL:
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            seen_at_fail.append([t.user_attrs["plan"] for t in waiting])
        return set_state(trial_id, state, values)

    storage.set_trial_state_values = watching
    hand_back(study, storage, frozen, "preempted: warned by the scheduler")
    assert seen_at_fail == [["transformer-s0"]]
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs["failure_reason"].startswith("preempted")
    assert trials[1].user_attrs == {"plan": "transformer-s0", "retry_of": 0}


def test_a_trial_also_found_stale_is_retried_once(tmp_path):
    study, storage, frozen = a_claimed_trial(tmp_path)
    assert fail_and_requeue(study, storage, frozen, "worker died")  # another worker, first
    hand_back(study, storage, frozen, "interrupted: KeyboardInterrupt")  # then its owner
    trials = study.get_trials(deepcopy=False)
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == 0
    assert trials[0].user_attrs["failure_reason"] == "worker died"  # the first word stands
    assert [t.user_attrs.get("failure_reason") for t in trials[1:] if t.state == TrialState.FAIL] == [
        "a second retry of trial 0"
    ]
