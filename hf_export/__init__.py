"""Export a trained run as a Hugging Face transformers folder (``python export.py``).

The modeling code that the folder ships lives in ``hf_export/shipped`` and imports nothing from
this repository; the rest of the package maps a run onto it.
"""

from hf_export.writer import ExportResult, export_run

__all__ = ["ExportResult", "export_run"]
