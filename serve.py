#!/usr/bin/env python
"""Serve a trained run through an OpenAI-compatible API: python serve.py --run runs/tiny (see --help)."""

import sys

from common.threads import calm_openmp_workers

calm_openmp_workers()  # before torch loads: OpenMP reads its wait policy once, at load

from serving.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
