#!/usr/bin/env python
"""Export a run for transformers or ONNX Runtime: python export.py --run runs/tiny --out exports/tiny [--format onnx]."""

import sys

from common.signals import quiet_while_starting

with quiet_while_starting():  # first: a Ctrl-C while the libraries load is as quiet as one later
    from common.threads import calm_openmp_workers

    calm_openmp_workers()  # before torch loads: OpenMP reads its wait policy once, at load
    from exporting.cli import main

if __name__ == "__main__":
    sys.exit(main())
