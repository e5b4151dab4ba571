"""The one base class of every error a user can cause and fix.

A :class:`UserError` carries a message that names the item (key path, file, flag) and the
fix; the CLI prints it as ``error: <message>`` and exits with code 2, never a traceback.
Everything else that escapes is a shardsmith bug.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake or a condition the user can fix: one clear message, exit code 2."""

    exit_code = 2
