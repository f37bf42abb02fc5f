"""Direct preference optimisation (``data.format: preference``). It imports nothing, so that a config
section loads alone."""
