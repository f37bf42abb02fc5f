#!/usr/bin/env python
"""Draw a trained run's attention maps or measure its heads: python attention.py --prompt "ROMEO:" (see --help)."""

import sys

from analysis.cli import main

if __name__ == "__main__":
    sys.exit(main())
