"""Tools a chat model may call: plain Python functions with OpenAI's ``function`` description
(``tools.registry``), run apart from the caller by a ``tools.toolbox.Toolbox``. The built-in
``calculator`` is ``tools.calculator``. Imports nothing else of the project."""

from tools.registry import BUILT_IN, Tool, ToolError
from tools.toolbox import Toolbox, ToolResult, load_tool, load_tools

__all__ = ["BUILT_IN", "Tool", "ToolError", "ToolResult", "Toolbox", "load_tool", "load_tools"]
