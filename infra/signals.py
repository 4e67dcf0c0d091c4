"""Signal dispositions that the processes a run starts inherit."""

from __future__ import annotations

import signal
import threading


def _ignore(_signo: int, _frame: object) -> None:
    """Ctrl-C does nothing here, as SIG_IGN did, but a handler is reset to the default in a started program."""


def keep_children_stoppable() -> None:
    """Replace an inherited SIG_IGN for SIGINT (a script's background job, a pytest-xdist worker) by a handler
    that does nothing. Dagster sets SIGTERM to SIGINT's handler after every in-process run; with SIGINT ignored
    that made SIGTERM ignored too, and every process started afterwards (training jobs, LLM and task servers)
    inherited it: a SIGTERM stopped none of them, only the SIGKILL after the timeout. Call it once in the
    main thread before the first Dagster run."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        signal.signal(signal.SIGINT, _ignore)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:  # already mapped by an earlier run
            signal.signal(signal.SIGTERM, _ignore)
