"""The front end (the SmartNIC role): the OpenAI-compatible HTTP API; it talks to the engine only through the rings."""
