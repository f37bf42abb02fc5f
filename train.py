#!/usr/bin/env python
"""Train a GPT: python train.py --config configs/tiny.yaml [--set section.key=value ...] (see --help)."""

import sys

from common.threads import calm_openmp_workers

calm_openmp_workers()  # before torch loads: OpenMP reads its wait policy once, at load

from training.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
