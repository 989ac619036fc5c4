"""tunix models: toy policies and value models, Hugging Face loaders and export, LoRA."""
