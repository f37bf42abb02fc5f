"""Export a trained run as a Hugging Face transformers folder (``python export.py``).

The modeling code that the folder ships lives in ``exporting/hf/shipped`` and imports nothing from
this repository; the rest of the package maps a run onto it."""

from exporting.hf.writer import ExportResult, export_run

__all__ = ["ExportResult", "export_run"]
