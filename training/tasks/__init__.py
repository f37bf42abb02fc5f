"""What a training run learns from: one task per ``data.format`` (``text``, ``chat``, ``preference``
in ``dpo/``, ``rl`` in ``grpo/``), all run by one loop through the ``Task`` interface (``task.py``).
This file imports nothing, so that ``training.config`` can read a method's section without loading
every task."""
