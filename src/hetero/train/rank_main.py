"""``python -m hetero.train.rank_main SCRIPT ARGS...``: how ``hetero launch`` starts a rank when
it watches for hung ones: the rank's heartbeat thread (``heartbeat_sender.py``) first, then
SCRIPT, run as ``python SCRIPT ARGS...`` would run it (``__name__`` is ``"__main__"``,
``sys.argv`` and ``sys.path[0]`` are the script's; an uncaught error's traceback starts in
the script, and the status is 1), in this same process."""

from __future__ import annotations

import os
import runpy
import sys

from hetero.train.heartbeat_sender import start_from_env


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m hetero.train.rank_main SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # As for `python SCRIPT`: the script's own folder, not the working directory, is first.
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    start_from_env()
    try:
        runpy.run_path(script, run_name="__main__")
    except Exception as exc:
        # Printed as `python SCRIPT` prints it: from the script's first frame, not from here.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        if tb is not None:
            exc.with_traceback(tb)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
