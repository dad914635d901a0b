"""Argparse ``type``s for the paths a command line takes: one check per kind of path.

Every path option of every command (the components', the pipelines', the trainer's
``make_tokens``, the local backend's) is declared with one of these, so a bad path is
refused while the arguments are parsed: argparse exits 2 with ``argument --flag:
<problem>``, before the command does any work and without writing anything (an output
path is checked, never created or probed). Standard library only, like
``kfp_sagemaker_blackwell.catalog.bounds.within`` (the numeric options' type).
"""

from __future__ import annotations

import argparse
import os


def _existing(path: str) -> str:
    """``path`` (absolute), or the nearest folder above it that exists."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def output_file(text: str) -> str:
    """An argparse ``type`` for a file a command writes: refused when it is a directory,
    when its directory does not exist (or is not a directory), or when it cannot be
    written; nothing is created."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give the file to write.")
    path = os.path.abspath(text)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(
            f"{text} is a directory; give the path of a file to write (e.g. {text.rstrip('/')}/"
            "out.<ext>).")
    above = _existing(parent)
    if not os.path.isdir(above):
        raise argparse.ArgumentTypeError(f"{text}: {above} is a file, not a directory.")
    if above != parent:
        raise argparse.ArgumentTypeError(
            f"{text}: the directory {parent} does not exist; create it (mkdir -p) or give a "
            "path in an existing directory.")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} exists and is not writable.")
    if not os.path.exists(path) and not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: the directory {parent} is not writable.")
    return text


def input_file(text: str) -> str:
    """An argparse ``type`` for a file a command reads: refused when it does not exist,
    is a directory, or cannot be read."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give the file to read.")
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text} does not exist.")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory; give the path of a file.")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} is not readable.")
    return text


def input_file_or_stdin(text: str) -> str:
    """:func:`input_file`, or ``-`` for standard input."""
    return text if text == "-" else input_file(text)


def output_dir(text: str) -> str:
    """An argparse ``type`` for a directory a command writes into (made when missing):
    refused when it is a file, or when the nearest existing folder above it is a file or
    cannot be written; nothing is created."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give the directory to write into.")
    path = os.path.abspath(text)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise argparse.ArgumentTypeError(f"{text} is a file, not a directory.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text} is not writable.")
        return text
    above = _existing(os.path.dirname(path))
    if not os.path.isdir(above):
        raise argparse.ArgumentTypeError(f"{text}: {above} is a file, not a directory.")
    if not os.access(above, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {above} is not writable.")
    return text
