"""Every `blink serve` flag has help text that states its default (issue 18 item 6)."""
from __future__ import annotations

import argparse

from blink.entrypoints.serve import add_serve_args
from blink.frontend.api_server import add_frontend_args


def test_every_serve_flag_has_help_with_its_default():
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    text = " ".join(parser.format_help().split())  # argparse wraps lines anywhere
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        assert action.help, action.option_strings
        assert "default" in action.help, action.option_strings
        if action.default not in (None, False) and "%(default)s" in action.help:
            assert f"(default: {action.default})" in text, action.option_strings
    host = next(a for a in parser._actions if "--host" in a.option_strings)
    assert host.default == "127.0.0.1" and "0.0.0.0" in host.help and "safer" in host.help


def test_frontend_flags_have_help():
    parser = argparse.ArgumentParser()
    add_frontend_args(parser)
    for action in parser._actions:
        assert action.help, action.option_strings
