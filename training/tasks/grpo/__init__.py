"""GRPO with verifiable rewards (``data.format: rl``): its ``rl:`` config section (``config.py``), the
built-in questions (``prompts.py``), the reward functions (``rewards.py``), sampling and scoring a
group through the engine (``rollout.py``), the loss (``loss.py``) and the task that draws the
questions and runs them (``task.py``).

It imports nothing, so that the config section loads alone.
"""
