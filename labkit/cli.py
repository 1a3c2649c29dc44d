"""The ``labkit`` command: instructor tools and cache housekeeping.

    labkit build [--execute] [NAME ...]   learner notebooks from notebooks/solutions (optionally executed)
    labkit grade NOTEBOOK [--json F]      run a submission headless and score each exercise
    labkit cache                          where the model cache lives and how big it is
    labkit clear-cache                    delete it (the next load converts again)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit", description="labkit workbook tools")
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="make learner notebooks from notebooks/solutions")
    build.add_argument("names", nargs="*", help="notebook file names (default: all)")
    build.add_argument("--execute", action="store_true", help="run solution and learner notebooks to store outputs")
    build.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: current directory)")

    grade = commands.add_parser("grade", help="run a submitted notebook and score its exercises")
    grade.add_argument("notebook", type=Path)
    grade.add_argument("--json", type=Path, help="also write the report to this JSON file")
    grade.add_argument("--cell-timeout", type=int, default=120, help="seconds each cell may run (default 120)")

    commands.add_parser("cache", help="show the model cache location and size")
    commands.add_parser("clear-cache", help="delete the model cache")

    args = parser.parse_args(argv)
    if args.command == "build":
        from labkit.authoring import build as build_notebooks

        if not (args.root / "notebooks" / "solutions").is_dir():
            parser.error(f"--root {args.root} has no notebooks/solutions directory")
        for path in build_notebooks(args.root, execute_notebooks=args.execute, only=args.names or None):
            print(f"wrote {path}")
    elif args.command == "grade":
        import json

        from labkit.grading import format_report, grade_notebook

        if args.cell_timeout < 1:
            parser.error(f"--cell-timeout must be at least 1 second, got {args.cell_timeout}")
        try:
            report = grade_notebook(args.notebook, cell_timeout_s=args.cell_timeout)
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
        print(format_report(report))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
            print(f"wrote {args.json}")
    elif args.command == "cache":
        from labkit.resources import cache_root

        models = cache_root() / "models"
        size = sum(p.stat().st_size for p in models.rglob("*") if p.is_file()) if models.exists() else 0
        print(f"model cache: {models} ({size / 2**20:,.0f} MiB)")
    elif args.command == "clear-cache":
        from labkit.models import clear_cache

        print(f"removed {clear_cache()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
