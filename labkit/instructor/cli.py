"""The ``labkit`` command: instructor tools and cache housekeeping.

    labkit build [--execute] [NAME ...]   learner notebooks from notebooks/solutions (optionally executed)
    labkit grade NOTEBOOK [--json F]      run a submission headless and score each exercise
    labkit grade FOLDER [--out D] [--jobs N] [--cluster slurm | --scheduler tls://HOST:8786]
                                          grade a class on Dask: a JSON per submission, a CSV gradebook, a picture,
                                          the class report
    labkit grade DOWNLOAD[.zip] --platform canvas|moodle|blackboard [--export canvas,moodle,gradescope]
                                          a platform's bulk download in, its grade import files out
    labkit report GRADES_FOLDER           the class report (HTML and CSV) again, from a class's JSON reports
    labkit cache                          where the model cache lives and how big it is
    labkit clear-cache                    delete it (the next load converts again)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

from labkit.instructor.grader.platform_grades import EXPORTS
from labkit.instructor.grader.platforms import KINDS
from labkit.instructor.grader.settings import CLUSTERS, GradingSettings
from labkit.instructor.wall.kernel_limits import Limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit", description="labkit workbook tools")
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="make learner notebooks from notebooks/solutions")
    build.add_argument("names", nargs="*", help="notebook file names (default: all)")
    build.add_argument("--execute", action="store_true", help="run solution and learner notebooks to store outputs")
    build.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: current directory)")

    default_jobs = min(4, os.cpu_count() or 1)
    grade = commands.add_parser("grade", help="run submitted notebooks and score their exercises")
    grade.add_argument("path", type=Path, help="a submitted notebook, or a folder of them (one class)")
    grade.add_argument("--json", type=Path, help="one notebook: also write the report to this JSON file")
    grade.add_argument("--out", type=Path, help="a folder: where reports and gradebook.csv go (default FOLDER-grades)")
    grade.add_argument("--jobs", type=int, default=default_jobs,
                       help=f"a folder: submissions graded at once (default {default_jobs})")
    grade.add_argument("--cluster", default="local", choices=CLUSTERS,
                       help="a folder: where the --jobs workers run: this machine (default), or that many batch jobs "
                            "of one worker each, through dask-jobqueue and its ~/.config/dask/jobqueue.yaml (slurm "
                            "is tested; pbs, sge and lsf are the same code, untested)")
    grade.add_argument("--scheduler", help="a folder: grade on the running Dask scheduler at this address "
                       "(tls://HOST:8786; tcp:// only on loopback unless --insecure-plain-tcp) instead of --jobs "
                       "local workers")
    grade.add_argument("--tls-ca-file", type=Path, help="with tls://: the certificate authority of the cluster")
    grade.add_argument("--tls-cert", type=Path, help="with tls://: this client's certificate")
    grade.add_argument("--tls-key", type=Path, help="with tls://: this client's private key")
    grade.add_argument("--insecure-plain-tcp", action="store_true",
                       help="allow a tcp:// scheduler off this machine (anyone who reaches it can run code on "
                            "every worker)")
    grade.add_argument("--worker-secret-file", type=Path,
                       help="with a tcp:// scheduler: the file holding the secret on every worker (the secret "
                            "travels only over TLS; default: --secret-file)")
    grade.add_argument("--cell-timeout", type=int, default=120, help="seconds each cell may run (default 120)")
    for item in fields(Limits):  # --memory-mb for Limits.memory_mb, and so on
        grade.add_argument(f"--{item.name.replace('_', '-')}", type=int, default=item.default,
                           help=f"{item.metadata['help']} (default {item.default})")
    grade.add_argument("--secret-file", type=Path,
                       help="a file holding the instructor's secret that salts the random cases (default: "
                            "$LABKIT_GRADING_SECRET, else one labkit keeps in the user data directory)")
    grade.add_argument("--platform", default="folder", choices=KINDS,
                       help="a class: the bulk download's naming (a folder or the zip as downloaded; default: a plain "
                            "folder, one notebook or subfolder per learner)")
    grade.add_argument("--pattern", help="a class: a regular expression over each file's path in the download, with "
                       "the named groups learner and file (and name, late), replacing the platform's")
    grade.add_argument("--export", default="", help="a class: grades written back, comma-separated among canvas, "
                       "moodle, gradescope")
    grade.add_argument("--canvas-column", default="labkit",
                       help="with --export canvas: the assignment's column as Canvas names it, e.g. 'Lab 00 (123456)'")
    grade.add_argument("--gradescope", type=Path,
                       help="one notebook: also write Gradescope's results.json here (in run_autograder: "
                            "/autograder/results/results.json)")
    grade.add_argument("--no-isolation", action="store_true",
                       help="grade without bubblewrap's wall (only for submissions you trust; reports say "
                            "'not isolated')")

    report = commands.add_parser("report", help="make a graded class's report again from its JSON reports")
    report.add_argument("grades", type=Path, help="the folder `labkit grade FOLDER` wrote (its --out)")

    commands.add_parser("cache", help="show the model cache location and size")
    commands.add_parser("clear-cache", help="delete the model cache")

    args = parser.parse_args(argv)
    if args.command == "build":
        from labkit.instructor.authoring import build as build_notebooks

        if not (args.root / "notebooks" / "solutions").is_dir():
            parser.error(f"--root {args.root} has no notebooks/solutions directory")
        for path in build_notebooks(args.root, execute_notebooks=args.execute, only=args.names or None):
            print(f"wrote {path}")
    elif args.command == "grade":
        _grade(parser, args)
    elif args.command == "report":
        from labkit.instructor.grader.class_report import rebuild

        try:
            page, sheet = rebuild(args.grades)
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
        print(f"wrote {page} and {sheet}")
    elif args.command == "cache":
        from labkit.core.resources import cache_root

        models = cache_root() / "models"
        size = sum(p.stat().st_size for p in models.rglob("*") if p.is_file()) if models.exists() else 0
        print(f"model cache: {models} ({size / 2**20:,.0f} MiB)")
    elif args.command == "clear-cache":
        from labkit.runtime.weights_cache import clear_cache

        print(f"removed {clear_cache()}")
    return 0


def _grade(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import json

    from labkit.instructor.grader.grading import IsolationUnavailable, grade_notebook
    from labkit.instructor.grader.judging import grading_secret
    from labkit.instructor.grader.reports import format_report

    is_class = args.path.is_dir() or args.path.suffix.lower() == ".zip"
    if is_class and (args.json or args.gradescope):
        parser.error("--json and --gradescope are for one notebook; a class's reports go to --out (and --export)")
    if not is_class and (args.out or args.export or args.platform != "folder" or args.pattern):
        parser.error("--out, --export, --platform and --pattern are for a class (a folder or a zip); use --json for "
                     "one notebook")
    exports = tuple(name.strip() for name in args.export.split(",") if name.strip())
    if any(name not in EXPORTS for name in exports):
        parser.error(f"--export must be a comma-separated list among {', '.join(EXPORTS)}, got {args.export!r}")
    try:
        limits = Limits(**{item.name: getattr(args, item.name) for item in fields(Limits)})
    except ValueError as error:  # "cpu_percent must be ..." names the option --cpu-percent
        parser.error("--" + str(error).replace("_", "-"))
    try:
        secret = grading_secret(args.secret_file)
    except (OSError, ValueError) as error:
        parser.error(f"--secret-file: {error}")
    try:
        settings = GradingSettings(cell_timeout_s=args.cell_timeout, limits=limits, isolate=not args.no_isolation,
                                   secret=secret, jobs=args.jobs, cluster=args.cluster, bar=True, dashboard=True,
                                   **(_cluster_settings(parser, args) if is_class else {}))
    except ValueError as error:
        parser.error(str(error).replace("cell_timeout_s", "--cell-timeout").replace("jobs must", "--jobs must"))
    if is_class:
        _grade_folder(parser, args, settings, exports)
        return
    try:
        report = grade_notebook(args.path, settings)
    except (FileNotFoundError, ValueError, IsolationUnavailable) as error:
        parser.error(str(error))
    print(format_report(report))
    if args.json:
        from labkit.instructor.grader.results import write_atomically

        write_atomically(args.json, json.dumps(report.to_json(), indent=2))
        print(f"wrote {args.json}")
    if args.gradescope:
        from labkit.instructor.grader.platform_grades import gradescope_results
        from labkit.instructor.grader.results import write_atomically

        write_atomically(args.gradescope, json.dumps(gradescope_results(report), indent=2, ensure_ascii=False))
        print(f"wrote {args.gradescope}")


def _cluster_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The settings of where a class is graded: a running scheduler and how to reach it."""
    tls = [args.tls_ca_file, args.tls_cert, args.tls_key]
    security = None
    if any(tls):
        if not all(tls) or not args.scheduler:
            parser.error("--tls-ca-file, --tls-cert and --tls-key go together, with --scheduler tls://...")
        from distributed import Security

        security = Security(tls_ca_file=str(args.tls_ca_file), tls_client_cert=str(args.tls_cert),
                            tls_client_key=str(args.tls_key), require_encryption=True)
    if args.cluster != "local" and args.scheduler:
        parser.error(f"--cluster {args.cluster} starts its own scheduler: give it or --scheduler, not both")
    return {"scheduler": args.scheduler, "security": security, "insecure_plain_tcp": args.insecure_plain_tcp,
            "worker_secret_file": args.worker_secret_file or args.secret_file or _kept_secret_file()}


def _grade_folder(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: GradingSettings,
                  exports: tuple[str, ...] = ()) -> None:
    from labkit.instructor.cluster.classroom import grade_class
    from labkit.instructor.grader.gradebook import format_class_summary
    from labkit.instructor.grader.grading import IsolationUnavailable

    resolved = args.path.resolve()
    out = args.out or resolved.with_name((resolved.stem if resolved.is_file() else resolved.name) + "-grades")
    folder, intake = args.path, None
    if args.platform != "folder" or args.pattern or args.path.is_file():
        from labkit.instructor.grader.platforms import read_download, save_intake

        folder = out / "download"
        try:
            intake = read_download(args.path, args.platform, folder, args.pattern)
        except (FileNotFoundError, ValueError, OSError) as error:
            parser.error(str(error))
        save_intake(intake, out)
        print(f"{args.platform} download: {len(intake.learners)} learners placed in {folder}")
        for path, why in intake.not_placed.items():
            print(f"  not placed: {path}: {why}")
    try:
        reports = grade_class(folder, out, settings)
    except (FileNotFoundError, ValueError, IsolationUnavailable) as error:
        parser.error(str(error))
    except KeyboardInterrupt:
        print(f"\ninterrupted: the reports of what was finished and a gradebook are in {out}; the same command "
              "grades the rest", file=sys.stderr)
        raise SystemExit(130) from None
    except RuntimeError as error:  # no usable worker: each one's reason
        print(f"labkit grade: {error}\nthe gradebook in {out} notes every submission not graded", file=sys.stderr)
        raise SystemExit(1) from None
    print()
    print(format_class_summary(reports))
    print(f"\nwrote {len(reports)} reports to {out / 'reports'}, {out / 'gradebook.csv'}, {out / 'class.png'} and "
          f"{out / 'class_report.html'} (its numbers: {out / 'class_report.csv'})")
    if exports:
        from labkit.instructor.grader.platform_grades import write_grades
        from labkit.instructor.grader.platforms import Intake, Learner

        if intake is None:  # a plain folder: the learners are its names
            intake = Intake("folder", tuple(Learner(name) for name in dict.fromkeys(str(r.learner) for r in reports)))
        for path in write_grades(reports, intake, out, exports, args.canvas_column):
            print(f"wrote {path}")


def _kept_secret_file() -> Path | None:
    """The secret file labkit keeps (when no $LABKIT_GRADING_SECRET overrides it): workers on this machine or a
    shared home read the same file."""
    from labkit.exercises.progress import progress_path
    from labkit.instructor.grader.judging import SECRET_ENV

    return None if os.environ.get(SECRET_ENV) else progress_path().with_name("grading-secret")


if __name__ == "__main__":
    sys.exit(main())
