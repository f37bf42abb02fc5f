#!/usr/bin/env python
"""Export a run for transformers or ONNX Runtime: python export.py --run runs/tiny --out exports/tiny [--format onnx]."""

import sys

from exporting.cli import main

if __name__ == "__main__":
    sys.exit(main())
