#!/usr/bin/env python
"""Score a run with lm-evaluation-harness on its held-out plays: python evaluate.py --run runs/tiny."""

import sys

from common.signals import quiet_while_starting

with quiet_while_starting():  # first: a Ctrl-C while the libraries load is as quiet as one later
    from common.threads import calm_openmp_workers

    calm_openmp_workers()  # before torch loads: OpenMP reads its wait policy once, at load
    from evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
