"""What a training run learns from: one task per ``data.format``, each beside its own arithmetic.

- ``text`` (``text.py``, ``TextTask``): pretraining on documents, every target counts;
- ``chat`` (``chat.py``, ``ChatTask``): supervised fine-tuning on conversations, the loss on the
  assistant's replies alone;
- ``preference`` (``dpo/``, ``PreferenceTask``): direct preference optimisation on reply pairs,
  against the frozen parent (``reference.py``);
- ``rl`` (``grpo/``, ``RLTask``): GRPO on questions whose answers a program checks, sampled
  through the inference engine.

The training loop (``training/trainer.py``) is one loop for all four: it calls the ``Task``
interface (``task.py``), and a task owns what differs: its prepared data and batches, how one
optimizer step's micro-batches make a loss, its validation score, its samples and what the metrics
file keeps of them. ``prepare.prepare_task`` is the one place that reads ``data.format``. A
post-training method's folder holds its config section, its data, its loss and its task; each
method's refusals (parallelism, compilation) are in its config section or its task's builder.

This file imports nothing, so that ``training.config`` can read a method's config section without
loading every task.
"""
