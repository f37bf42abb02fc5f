#!/usr/bin/env python
"""Score a run with lm-evaluation-harness on its held-out plays: python evaluate.py --run runs/tiny."""

import sys

from evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
