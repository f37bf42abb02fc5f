#!/usr/bin/env python
"""Score a run with lm-evaluation-harness on its held-out plays: python evaluate.py --run runs/tiny."""

import sys

from common.threads import calm_openmp_workers

calm_openmp_workers()  # before torch loads: OpenMP reads its wait policy once, at load

from evaluation.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
