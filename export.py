#!/usr/bin/env python
"""Export a run for Hugging Face transformers: python export.py --run runs/tiny --out exports/tiny."""

import sys

from hf_export.cli import main

if __name__ == "__main__":
    sys.exit(main())
