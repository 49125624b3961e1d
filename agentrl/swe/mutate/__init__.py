"""The mutations task family: bugs put into real Python projects, kept when the project's own tests catch them.

    project.py   a source (checkout, sdist, requirement) read into memory, and the layout the grader needs
    suite.py     where its tests are (pytest's testpaths, directories named tests or test), pure
    operators.py the bug operators (libcst rewrites), pure
    verdict.py   test runs -> kept (FAIL_TO_PASS, PASS_TO_PASS) or refused with a reason, pure
    runner.py    the suite run in sandboxes, one result file per run (resumable)
    issue.py     a kept mutant as a task: the instruction, the inverse patch, the Draft
    build.py     candidates, their order and split, the validation loop, the writing (`tasks generate mutations`)
    cli.py       the command's report and exit status
"""
