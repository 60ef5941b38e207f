"""nbval settings for executing the course notebooks as tests.

nbval waits at most 5 s for a finished cell's output messages; on a busy 2-core machine (a CI
runner executing a heavy notebook) they can take longer, which fails a correct cell. Allow 60 s.
"""

import nbval.plugin

_init = nbval.plugin.IPyNbCell.__init__


def _patient_init(self, *args, **kwargs) -> None:
    _init(self, *args, **kwargs)
    self.output_timeout = 60


nbval.plugin.IPyNbCell.__init__ = _patient_init
