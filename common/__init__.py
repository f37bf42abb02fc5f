"""Small pieces every package shares: user-facing errors and atomic file writes."""

from common.errors import UserError
from common.files import atomic_write_bytes, atomic_write_text, atomic_output

__all__ = ["UserError", "atomic_write_bytes", "atomic_write_text", "atomic_output"]
