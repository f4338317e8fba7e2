"""The process's environment variables as they were when attnswitch was first imported: before the command line
sets its own (``TORCHINDUCTOR_COMPILE_THREADS``) and before torch's inductor sets its cache folder, so that a
report's "Measured with" names what the user ran with, not what attnswitch or a library chose for itself."""

from __future__ import annotations

import os

__all__ = ["ENVIRON"]

ENVIRON = dict(os.environ)
