#!/usr/bin/env python
"""Continue a prompt with a trained model: python generate.py --prompt "ROMEO:" (see --help)."""

import sys

from inference.cli import main

if __name__ == "__main__":
    sys.exit(main())
