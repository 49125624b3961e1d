# The source projects here are fixtures with unittest suites of their own (tests/test_task_mutations.py runs
# them in sandboxes); pytest must not collect them as agentrl's tests.
collect_ignore = ["listkit"]
