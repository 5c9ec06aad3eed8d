"""posenc inside other libraries' models: :mod:`.transformers` (Hugging Face).

Each integration is an extra (``pip install "posenc[transformers]"``) and imports its
library only when it is imported; the core never imports them.
"""
