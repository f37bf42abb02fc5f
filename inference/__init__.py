"""Sampling text from a trained run (loaded by ``rundir.loading``): ``engine``, the one decoder (every
token of generate.py, the chat, training's samples and the server) with its ``prefix_cache``,
``compiled_step`` (on the CPU built ahead of time: ``aot_step``) and ``batch_invariant`` rows;
``sampling`` (the settings every decode shares, the sampler and the window slide), ``settings``,
``streaming`` (ids to printable text), ``completion`` and ``chat``, and ``cli``, which ``generate.py``
is a thin line over.

Nothing is imported here, so ``import inference`` (and ``generate.py --help``) stays instant.
"""
