"""The chaos command line: presets, overrides, refusals, and a replay command that gives back the
campaign it was printed for (no cluster needed)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from chaos.cli import parse_args
from chaos.nemesis import NEMESES
from chaos.runner import FULL, SHORT, replay_command


def test_the_full_preset_is_half_an_hour_of_every_nemesis_on_three_brokers():
    options = parse_args([])
    assert (options.duration_s, options.brokers, options.short) == (1800.0, 3, False)
    assert options.nemeses == tuple(NEMESES)
    assert options.out.parent == Path("chaos-results")


def test_options_given_with_short_override_the_preset():
    options = parse_args(["--short", "--seed", "5", "--brokers", "4", "--nemeses", "kill,split",
                          "--out", "x"])
    assert options.short and options.seed == 5 and options.brokers == 4
    assert options.nemeses == ("kill", "split")
    assert (options.duration_s, options.session_timeout_ms, options.partitions) == (
        SHORT.duration_s, SHORT.session_timeout_ms, SHORT.partitions)
    assert options.out == Path("x")


@pytest.mark.parametrize("argv", [["--brokers", "2"], ["--brokers", "6"], ["--nemeses", "kill,bogus"],
                                  ["--duration", "0"], ["--rate", "-1"]])
def test_bad_options_are_refused_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert "python -m chaos: error:" in capsys.readouterr().err


@pytest.mark.parametrize("preset", [FULL, SHORT])
def test_the_replay_command_gives_back_the_same_campaign(preset):
    options = preset.replace(nemeses=("pause", "clock"), brokers=5, seed=None)
    command = replay_command(options, 1234)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "chaos"]
    replayed = parse_args(argv[3:])
    assert replayed.seed == 1234
    assert replayed.replace(out=options.out, argv=(), seed=None) == options
