"""The batches training reads: windows of flat token files (``text``), whole conversations (``chat``)."""
