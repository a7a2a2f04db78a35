"""Progress for long CLI work: :class:`vigil.progress.Progress` (a tqdm bar on a terminal,
a line a stage elsewhere), here for the commands that import it from ``monitor``."""

from vigil.progress import Progress

__all__ = ["Progress"]
