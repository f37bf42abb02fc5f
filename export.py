#!/usr/bin/env python
"""Export a run for transformers or ONNX Runtime: python export.py --run runs/tiny --out exports/tiny [--format onnx]."""

import sys

from common.signals import quiet_while_starting

quiet_while_starting()  # a Ctrl-C during the imports below is as quiet as one later

from exporting.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
