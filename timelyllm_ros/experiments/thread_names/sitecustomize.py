"""Loaded by Python at start-up in the node processes the fault runner starts (their PYTHONPATH
names this folder first; experiments/fault_rig.py): every Python thread also gets its name in
the OS (/proc/PID/task/TID/comm, 15 characters), so that the runner can tell a thread pool's
workers, which start on first use up to the pool's size, from threads that should never grow
(robot workers, the engine thread, DDS's own). Nothing else changes; any failure leaves the
names as they were."""

import ctypes
import threading

PR_SET_NAME = 15

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _bootstrap_inner = threading.Thread._bootstrap_inner

    def _bootstrap_named(self):
        try:
            _prctl(PR_SET_NAME, ctypes.c_char_p(self.name.encode()[:15]), 0, 0, 0)
        except Exception:  # noqa: BLE001 - a name is never worth a thread
            pass
        _bootstrap_inner(self)

    threading.Thread._bootstrap_inner = _bootstrap_named
except Exception:  # noqa: BLE001
    pass
