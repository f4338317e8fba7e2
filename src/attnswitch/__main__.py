"""The ``attnswitch`` command's first lines (``python -m attnswitch``, and the console script's
``attnswitch.__main__:main``): SIGTERM is raised as ``errors.Terminated`` and an interrupt is answered in one
line from here on, while the command imports what it needs, as once it runs (``cli.run``)."""

from __future__ import annotations

import signal
import sys

from .errors import Terminated, raised_signal, sigterm_as_interrupt

__all__ = ["main"]


def main() -> None:
    with sigterm_as_interrupt():
        try:
            from .cli import run
        except KeyboardInterrupt as e:
            _signalled(e)
        except Exception:  # a signal an import turned into another error (RuntimeError from __set_name__)
            if raised_signal() is None:
                raise
            _signalled(raised_signal()())
        run()


def _signalled(e: KeyboardInterrupt) -> None:
    """One line, and the exit code a shell reports for a process the signal ended."""
    sig = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
    sys.stderr.write(("terminated" if sig == signal.SIGTERM else "interrupted") + "\n")
    sys.exit(128 + sig)


if __name__ == "__main__":
    main()
