"""One `ablate sweep` per study: the sweep holds a lock in the study's own storage while it plans, enqueues
and trains; a second sweep on the study is refused in one line naming the holder (host, pid) and the
`ablate worker` command that joins it instead.

Why a study of its own and not an attribute of the sweep's study: creating a study of a given name is the
one atomic test-and-set both Optuna storages offer (the journal replays under its file lock, an RDB has a
unique name), so of two sweeps started at once exactly one gets it. The lock study carries its holder's
host, pid and a heartbeat; a holder that is gone (same host and its pid dead, or no heartbeat for the
grace period; one that never wrote a heartbeat, for the grace period after a sweep was first refused
by it) does not block: its lock is deleted by id (a lock taken again meanwhile has another id, so
it survives) and taken anew.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from ablate.core.errors import UserError
from ablate.store.study import SWEEP_LOCK_SUFFIX
from ablate.sweep import queue

# A lock study without its holder's attributes is being taken right now; after this long its taker is gone.
TAKING_SECONDS = 5.0


class SweepLock:
    """The lock on study `study_name` in `storage`, held by this process until `release()`."""

    def __init__(
        self,
        storage: Any,
        study_name: str,
        grace_period: float,
        *,
        join: str = "`ablate worker` with the same recipe, --scale and stores",
        interval: float | None = None,
    ):
        """Take the lock (one line, a UserError, while another live sweep holds it); `join`: the command
        that adds workers to the study instead, for that line."""
        self.storage, self.name, self.grace_period = storage, study_name + SWEEP_LOCK_SUFFIX, grace_period
        self.join = join
        self.interval = queue.HEARTBEAT_SECONDS if interval is None else interval
        self.study_id = self._take()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _take(self) -> int:
        from optuna.exceptions import DuplicatedStudyError
        from optuna.study import StudyDirection

        started = time.time()
        while True:
            try:
                study_id = self.storage.create_new_study([StudyDirection.MINIMIZE], self.name)
            except DuplicatedStudyError:
                holder = self._holder()
                if holder is None:  # deleted meanwhile: try again
                    continue
                study_id, attrs = holder
                if not attrs and time.time() - started < TAKING_SECONDS:
                    time.sleep(0.2)  # another sweep is writing its name into the lock right now
                    continue
                if attrs and not self._gone(study_id, attrs):
                    raise self._refusal(attrs) from None
                try:
                    self.storage.delete_study(study_id)
                except KeyError:  # another sweep removed the dead holder's lock first
                    pass
                continue
            for key, value in holder_attrs().items():
                self.storage.set_study_user_attr(study_id, key, value)
            return study_id

    def _holder(self) -> tuple[int, dict[str, Any]] | None:
        try:
            study_id = self.storage.get_study_id_from_name(self.name)
            return study_id, self.storage.get_study_user_attrs(study_id)
        except KeyError:
            return None

    def _gone(self, study_id: int, attrs: dict[str, Any]) -> bool:
        if attrs.get("host") == socket.gethostname() and attrs.get("pid") == os.getpid():
            return True  # this process's own lock, left by an earlier sweep that ended without releasing it
        beat = attrs.get("heartbeat") or attrs.get("first_refused")
        if beat is None:
            # A holder that never wrote a heartbeat (killed while taking the lock): its clock starts at the
            # first refusal, written into the lock, so it goes stale a grace period later like any other.
            beat = time.time()
            try:
                self.storage.set_study_user_attr(study_id, "first_refused", beat)
            except KeyError:
                pass
            attrs["first_refused"] = beat
        return queue.worker_gone(attrs.get("host"), attrs.get("pid"), beat, self.grace_period)

    def _refusal(self, attrs: dict[str, Any]) -> UserError:
        beat = attrs.get("heartbeat")
        ago = f", heartbeat {time.time() - float(beat):.0f} s ago" if beat else ", no heartbeat written yet"
        study = self.name[: -len(SWEEP_LOCK_SUFFIX)]
        return UserError(
            f"sweep: study {study!r} is being run by another `ablate sweep` (host {attrs.get('host')}, pid "
            f"{attrs.get('pid')}{ago}); to train its trials on more workers run {self.join}, or wait until "
            f"it ends (a killed sweep elsewhere counts as ended {self.grace_period:g} s after its last heartbeat)"
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.set_study_user_attr(self.study_id, "heartbeat", time.time())
            except Exception:  # noqa: BLE001 - a storage hiccup; the next beat retries, the grace period covers it
                pass

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.storage.delete_study(self.study_id)
        except KeyError:  # already removed (taken over as stale): nothing of ours left
            pass

    def __enter__(self) -> SweepLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def holder_attrs() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}
