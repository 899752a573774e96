"""The base of every failure that is the user's to act on: the CLI prints it as one message, no traceback."""


class Failure(Exception):
    pass
