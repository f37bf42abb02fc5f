"""A small decoder-only GPT in pure PyTorch: its config (``model.config``), the model (``model.gpt``),
its KV cache (``model.kv_cache``) and save/load (``model.io``).

Nothing is imported here; importing a module only defines classes and functions, nothing is built or read."""
