"""The threads and replicas torch makes to run a forward are part of it.

``torch.nn.parallel.parallel_apply`` (how ``DataParallel`` runs its replicas) starts a thread per module,
which would see none of the caller's contexts: while any switch is active its module's ``threading`` is one
whose threads carry the starting thread's selection (global or model-scoped) and the forward they are part
of, and nothing else of its context. A replica (``Module._replicate_for_data_parallel``, one per module and
device) is owned as its original is, so a switch that names a model switches its replicas. Threads anyone
else starts see only their own contexts.
"""

from __future__ import annotations

import threading

from . import dispatch, owners, record, registries

__all__ = ["ForwardThread", "replicate_for_data_parallel"]

#: what a thread torch starts for a forward carries of the starting thread's context
_CARRIED = (record.STATE, dispatch.FORWARD)


class ForwardThread(threading.Thread):
    """A thread that runs with the selection and forward of the thread that made it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._attnswitch_carried = [(var, var.get()) for var in _CARRIED]

    def run(self) -> None:
        for var, value in self._attnswitch_carried:  # (a new thread's context is its own, empty)
            var.set(value)
        super().run()


class _Threading:
    """``threading`` as torch's ``parallel_apply`` sees it while a switch is active: its threads carry the
    forward."""

    Thread = ForwardThread

    def __getattr__(self, name):
        return getattr(threading, name)


def replicate_for_data_parallel(self):
    """``Module._replicate_for_data_parallel``: the replica, owned as ``self`` is."""
    replica = registries.original_attr(registries.REPLICATE)(self)
    owners.own_replica(self, replica)
    return replica


registries.FNS.update({registries.PARALLEL_APPLY: _Threading(), registries.REPLICATE: replicate_for_data_parallel})
