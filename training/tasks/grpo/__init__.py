"""GRPO with verifiable rewards (``data.format: rl``). It imports nothing, so that the config section
loads alone.
"""
