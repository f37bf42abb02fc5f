"""Export a trained run as an ONNX decoder with a KV cache (``python export.py --format onnx``).

``decoder`` wraps the model with explicit cache tensors, ``graph`` exports and checks it, ``writer``
builds the folder, and ``readme`` writes the folder's README, whose decoding loop imports only
numpy, onnxruntime and tokenizers."""

from exporting.onnx.writer import OnnxExportResult, export_onnx

__all__ = ["OnnxExportResult", "export_onnx"]
