"""The local provider: the whole environment as processes on this machine, on 127.0.0.1."""
