#!/usr/bin/env python
"""Serve a trained run through an OpenAI-compatible API: python serve.py --run runs/tiny (see --help)."""

import sys

from serving.cli import main

if __name__ == "__main__":
    sys.exit(main())
