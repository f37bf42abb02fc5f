#!/usr/bin/env python
"""Score a run with lm-evaluation-harness on its held-out plays: python evaluate.py --run runs/tiny."""

import sys

from common.signals import quiet_while_starting

quiet_while_starting()  # a Ctrl-C during the imports below is as quiet as one later

from common.threads import calm_openmp_workers  # noqa: E402

calm_openmp_workers()  # before torch loads: OpenMP reads its wait policy once, at load

from evaluation.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
