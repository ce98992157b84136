"""The `transformers-xl` command (also `python -m transformers_xl`): one subcommand per job.

Each subcommand lives with the code it drives and brings two functions: `add_arguments(parser)` and `run(args)`,
which returns the exit status.
"""

import argparse
import sys


def _subcommands():
    """Imported on use, so `transformers-xl --help` stays quick and each job imports only what it needs."""
    from .conversion import cli as convert
    from .conversion import push
    from .deployment import cli as export
    from .training import demo, evaluate, train

    return {"convert": convert, "push": push, "export": export, "demo": demo, "evaluate": evaluate, "train": train}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="transformers-xl", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = _subcommands()
    for name, module in commands.items():
        module.add_arguments(
            subparsers.add_parser(
                name,
                help=module.__doc__.splitlines()[0],
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,  # (the docstring's own lines and examples)
            )
        )
    args = parser.parse_args(argv)
    return commands[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
