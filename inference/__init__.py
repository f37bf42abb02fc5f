"""Sampling text from a trained run: ``engine``, the one decoder behind generate.py, the chat,
training's samples and the server, and the modules around it (README's layout table). Nothing is
imported here, so ``import inference`` (and ``generate.py --help``) stays instant."""
