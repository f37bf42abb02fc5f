"""What a training run learns from: one task per ``data.format`` (``text``, ``chat``, ``preference``
in ``dpo/``, ``rl`` in ``grpo/``), each beside its own arithmetic, all run by one loop
(``training/trainer.py``) through the ``Task`` interface (``task.py``). ``task.prepare_task`` is
the one place that reads ``data.format``.

This file imports nothing, so that ``training.config`` can read a method's config section without
loading every task.
"""
