"""Headless merge engine: torch, safetensors and huggingface_hub only — never Qt."""
