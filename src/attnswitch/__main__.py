"""The ``attnswitch`` command's first lines (``python -m attnswitch``, and the console script's
``attnswitch.__main__:main``): SIGTERM is raised as ``errors.Terminated`` and an interrupt is answered in one
line from here on, while the command imports what it needs, as once it runs (``cli.run``)."""

from __future__ import annotations

import signal
import sys

from .errors import Terminated, sigterm_as_interrupt

__all__ = ["main"]


def main() -> None:
    with sigterm_as_interrupt():
        try:
            from .cli import run
        except KeyboardInterrupt as e:  # (exit codes as a shell reports a process ended by the signal)
            sig = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
            sys.stderr.write(("terminated" if sig == signal.SIGTERM else "interrupted") + "\n")
            sys.exit(128 + sig)
        run()


if __name__ == "__main__":
    main()
