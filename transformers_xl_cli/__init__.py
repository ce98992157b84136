"""The `transformers-xl` command: one subcommand per job, its options parsed before torch loads.

This is a package of its own, beside `transformers_xl`, because importing `transformers_xl` registers the models with
transformers' Auto classes, which imports torch and transformers (seconds). Here each subcommand is a module that
defines its options (`add_arguments(parser)`, its docstring is the help) and a `run(args)` that imports the code
doing the work only once the options are parsed; so `--help` and a mistyped option answer at once.

The command owns its process, which a library must not touch: before torch loads, `prepare_process` makes OpenMP's
threads sleep rather than spin while they wait (`OMP_WAIT_POLICY=PASSIVE`, unless the environment says otherwise),
so that torch's threads do not steal the cores of a busy machine from each other.
"""

import argparse
import os
import sys
from importlib import import_module

# The subcommands, each a module of this package.
COMMANDS = ("convert", "push", "export", "demo", "evaluate", "train")


def prepare_process(environment=os.environ):
    """Settings of the command's own process, made before torch loads (OpenMP reads them when it loads)."""
    environment.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv=None) -> int:
    """Parse the command line and run the subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(prog="transformers-xl", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {name: import_module(f"{__name__}.{name}") for name in COMMANDS}
    for name, module in modules.items():
        module.add_arguments(
            subparsers.add_parser(
                name,
                help=module.__doc__.splitlines()[0],
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,  # (the docstring's own lines and examples)
            )
        )
    args = parser.parse_args(argv)
    return modules[args.command].run(args)


def console_main() -> int:
    """The `transformers-xl` executable (and `python -m transformers_xl_cli`): the process prepared, then `main`."""
    prepare_process()
    return main()
