"""How the command line ends when nothing it ran could say why (cli.main): into a closed pipe quietly with exit 141,
on an unexpected error with one line and exit 1 (``--debug`` shows the traceback), on Ctrl-C outside a training
loop with exit 130. The other exit codes (2 for bad input, 128 + a signal) are tested with the commands that give
them."""
import io
import subprocess
import sys

import pytest

from helpers.processes import cli_process
from interlayer.cli import main


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("args", [["tables"], ["compare", "--list-variants"], ["models", "transformer_small"]])
def test_a_closed_stdout_ends_quietly(monkeypatch, capsys, args):
    import interlayer.papers as papers  # the tables command imports paper_tables when it runs

    monkeypatch.setattr(papers, "paper_tables", lambda: "| table |\n" * 100)  # what is printed does not matter
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(args) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_listing_into_a_pipe_closed_early_ends_quietly(tmp_path):
    process = cli_process(["compare", "--list-variants"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The reader goes away before the listing is written (the interpreter takes a second to start): reading part of
    # it first would race with a listing that fits in the pipe's buffer, written whole before the reader closes.
    process.stdout.close()
    process.wait(timeout=60)
    assert process.stderr.read() == b"" and process.returncode == 141


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    import interlayer.papers as papers  # the tables command imports paper_tables when it runs

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(papers, "paper_tables", broken)
    assert main(["tables"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and "--debug" in err and "Traceback" not in err
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "tables"])

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(papers, "paper_tables", interrupted)  # Ctrl-C outside a training loop (reading data, ...)
    assert main(["tables"]) == 130 and capsys.readouterr().err == "interlayer: interrupted\n"

