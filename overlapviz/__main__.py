"""``python -m overlapviz``: the ``overlapviz`` command."""

from overlapviz.cli import main

if __name__ == "__main__":
    main(prog_name="overlapviz")
