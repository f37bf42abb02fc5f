"""Direct preference optimisation (``data.format: preference``): the reply pairs as rows
(``pairs.py``), rendered and cached (``prepared.py``) and batched (``batches.py``); the loss
(``loss.py``), the task that runs it (``task.py``), and the command that makes the built-in set
from a chat run's own replies (``preference_set.py``).

It imports nothing, so that a config section loads alone.
"""
