"""The Hugging Face Hub: ``source`` (a Hub id → a cached snapshot that opens like a local folder, and
the one mapping of huggingface_hub's errors), ``check`` (the pre-check from remote headers before a
download) and ``publish`` (uploading a merged folder)."""
