"""Text: tokenizers, chat templates, incremental detokenization and stop strings (per request, on the
CPU)."""
