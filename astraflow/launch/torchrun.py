"""torchrun for a trainer's ranks, stopping the way a one-process trainer stops.

Why not ``python -m torch.distributed.run`` itself: on the launcher's SIGTERM (Ctrl-C, `astraflow
stop`, a run that ends) torchrun forwards the signal to its ranks, waits for them, then raises
``SignalException`` and exits with status 1, so every stopped multi-process trainer read as
"exited with status 1". This entry point runs torchrun unchanged and, when it was stopped by a
signal, ends with that signal's status after torchrun's own shutdown of the ranks, which the
launcher reports as the clean stop it is (``astraflow.launch.exits``). A rank that fails on its
own still fails torchrun with torchrun's status.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(sys.argv[1:] if argv is None else argv)
    except SignalException as stopped:  # the ranks were already signalled and waited for
        sig = int(stopped.sigval)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


if __name__ == "__main__":
    main()
