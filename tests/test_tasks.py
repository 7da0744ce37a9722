"""The task base class (tasks/base.py), the discovery of tasks, and the command table of the CLI."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SRC
from interlayer import ConfigError
from interlayer.cli import COMMANDS, build_parser
from interlayer.config_io import dataclass_from_dict
from interlayer.tasks import TaskSpec, task_commands, task_specs
from interlayer.tasks.text_classification import SST5Spec, TextClassificationSpec
from interlayer.training.config import TrainConfig

TASKS = ["caption", "citeseer", "cora", "fashion_mnist", "image", "lm", "mrpc", "rec", "sick", "sst2", "sst5",
         "translation", "vqa"]


def test_every_named_subclass_is_a_task_and_family_bases_are_not():
    specs = task_specs()
    assert list(specs) == TASKS
    assert all(isinstance(spec, TaskSpec) and type(spec).name == name for name, spec in specs.items())
    assert "" not in specs and not any(type(spec) is TextClassificationSpec for spec in specs.values())


@pytest.mark.parametrize("name", TASKS)
def test_each_task_declares_what_the_runner_reads(name):
    """Its data settings build with their defaults, its training defaults are a valid TrainConfig, and the CLI
    builds its flags into a parser that reads them back (the options hook sees only what was given)."""
    spec = task_specs()[name]
    assert spec.description and spec.default_preset
    spec.data_class()
    dataclass_from_dict(TrainConfig, dict(spec.train_defaults), "train.").validate()
    parser = argparse.ArgumentParser()
    spec.add_arguments(parser)
    data_sets, _ = spec.options_from_args(parser.parse_args([]))
    assert data_sets == {}


class _Minimal(TaskSpec):
    name = "minimal"
    description = "a task with the two required hooks only"
    default_preset = "transformer_small"
    data_class = dict

    def make_task(self, data, train, run_dir):
        return None

    def finish(self, task, run_dir, state, options):
        return {}


def test_the_optional_hooks_have_defaults_and_the_required_ones_are_required():
    spec = _Minimal()
    assert spec.options_from_args(argparse.Namespace()) == ({}, {})
    assert spec.defaults_for({"data.x": 1}) == {} and spec.sample_input(None) is None
    assert spec.initialise(None, None) is None
    with pytest.raises(ConfigError, match="task 'minimal' has no evaluate command"):
        spec.evaluate(Path("."), argparse.Namespace())

    class NoFinish(TaskSpec):
        name = "broken"

        def make_task(self, data, train, run_dir):
            return None

    with pytest.raises(TypeError, match="finish"):
        NoFinish()


def test_a_family_member_sets_only_what_distinguishes_it():
    spec = SST5Spec()
    assert (spec.name, spec.fmt.pair, spec.f1_class) == ("sst5", False, None)
    assert spec.default_preset == TextClassificationSpec.default_preset == "transformer_text_cls"
    assert task_specs()["mrpc"].f1_class == 1 and task_specs()["sick"].train_defaults["schedule"] == "step"


def test_the_cli_dispatches_every_command_through_its_table_or_the_tasks():
    """Each command is the CLI's own (COMMANDS) or a task's (TaskSpec.commands: caption, convert-refer), not both."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    own = task_commands()
    assert {"caption", "convert-refer"} <= set(own) and not set(own) & set(COMMANDS)
    assert set(COMMANDS) | set(own) == set(commands)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["models", "transformer_small"], ["tables"]])
def test_a_listing_piped_into_head_ends_quietly(tmp_path, args):
    """``interlayer models | head -3`` through a real shell pipe: head's exit status, nothing on stderr. The
    listing's own exit code when its reader has gone is 141 (tests/test_cli_exits.py's closed-pipe tests)."""
    command = [sys.executable, "-c", "import sys; from interlayer.cli import main; sys.exit(main())", *args]
    shell = " ".join(f"'{part}'" for part in command) + " | head -3"
    done = subprocess.run(["sh", "-c", shell], capture_output=True, cwd=tmp_path, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)})
    assert done.returncode == 0 and done.stderr == b"" and len(done.stdout.splitlines()) == 3


@pytest.mark.slow
def test_a_listing_whose_reader_left_before_it_wrote_ends_quietly(tmp_path):
    """The pipe closed before the first write (the race-free case of ``| head``): exit 141, nothing on stderr."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; from interlayer.cli import main; sys.exit(main())",
                                "models", "transformer_small"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)})
    process.stdout.close()
    process.wait(timeout=300)
    assert process.stderr.read() == b"" and process.returncode == 141
