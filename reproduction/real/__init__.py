"""The real-model track: a real pretrained base (SmolLM2-135M-Instruct) and agents fine-tuned from it."""
