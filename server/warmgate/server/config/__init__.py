"""Configuration, the layer under every other: frozen dataclasses, their flags and
environment variables, and validation that needs no runner (see runner_config.py for what
shapes compiled code, server_config.py for the server's own settings, flags.py for how a field
declares its flag)."""
