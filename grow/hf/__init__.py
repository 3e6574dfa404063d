"""Interop with the Hugging Face ecosystem (the ``hf`` extra: transformers, safetensors): grow models as
``transformers`` models (`grow.hf.llama`) and run directories exported as model directories (`grow.hf.export`)."""
