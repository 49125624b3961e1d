"""A task's Dockerfile, the logic around its build (no builder runs here: test_environment_builds.py):
read before building (what it starts from, where the agent starts, what needs the network, a key
naming the build by its content), the build's log read for steps that could not reach the network,
and the image config that travels with the rootfs into the sandbox's environment."""

import pytest

from hpc.images.dockerfile import DockerfileError, build_key, plan_dockerfile

SWEBENCH = """FROM swebench/sweb.eval.x86_64.django__django-11099:latest
WORKDIR /testbed
RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
RUN mkdir -p /logs
"""


def test_the_swebench_template_needs_a_build_whose_run_steps_need_the_network():
    plan = plan_dockerfile(SWEBENCH)
    assert plan.bases == ("swebench/sweb.eval.x86_64.django__django-11099:latest",)
    assert plan.workdir == "/testbed" and plan.needs_build
    assert [(s.line, s.op) for s in plan.network_steps] == [(3, "RUN"), (4, "RUN")]
    assert str(plan.network_steps[0]) == "line 3: RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh"


def test_from_workdir_and_metadata_alone_name_a_prebuilt_image():
    plan = plan_dockerfile("# a comment\nFROM --platform=linux/amd64 python:3.11\nWORKDIR /app\nLABEL a=b\n"
                           'CMD ["bash"]\n')
    assert (plan.bases, plan.workdir, plan.needs_build) == (("python:3.11",), "/app", False)


def test_continuations_args_stages_and_relative_workdirs():
    text = ("ARG PY=3.11\nFROM python:${PY}-slim AS build\nRUN make \\\n    && make install\n"
            "FROM debian:12\nCOPY --from=build /out /opt/out\nCOPY a.txt dir/ /etc/x/\nADD https://e.org/f /f\n"
            "ENV HOME=/home/u\nWORKDIR $HOME\nWORKDIR src\nUSER 1000\n")
    plan = plan_dockerfile(text, ["a.txt", "dir/b", "Dockerfile"])
    assert plan.bases == ("python:3.11-slim", "debian:12")
    assert plan.workdir == "/home/u/src"
    assert plan_dockerfile("FROM a\nWORKDIR ${ROOT:-/srv}/${SUB:+x}y\n").workdir == "/srv/y"
    assert [s.line for s in plan.network_steps] == [3, 8]        # the RUN (two lines) and the ADD of a URL
    assert {s.op for s in plan.changes} >= {"RUN", "FROM", "COPY", "ADD", "ENV", "USER"}
    # a stage may start from an earlier one: that is no base image to pull
    assert plan_dockerfile("FROM a AS one\nRUN x\nFROM one\nRUN y\n").bases == ("a",)


@pytest.mark.parametrize("text, files, says", [
    ("RUN x\n", [], "RUN before the first FROM"),
    ("WORKDIR /x\n", [], "WORKDIR before the first FROM"),
    ("", [], "no FROM line"),
    ("FROM $BASE\n", [], "uses a variable that no ARG before the first FROM gives a default"),
    ("ARG BASE\nFROM ${BASE}:1\n", [], "no ARG before the first FROM"),
    ("FROM a b c d\n", [], "expected FROM IMAGE [AS NAME]"),
    ("FROM a\nFROBNICATE x\n", [], "line 2: FROBNICATE x: unknown instruction FROBNICATE"),
    ("FROM a\nCOPY ../secret /x\n", ["Dockerfile"], "outside the build context"),
    ("FROM a\nCOPY /../../etc/passwd /x\n", ["Dockerfile"], "outside the build context"),
    ("FROM a\nCOPY req.txt /x\n", ["Dockerfile", "reqs.txt"], "'req.txt' is not in the build context"),
    ("FROM a\nCOPY only-one\n", ["only-one"], "needs a source and a destination"),
    ("FROM a\nWORKDIR $HOME/src\n", [], "set [environment] workdir"),   # HOME is the base image's
])
def test_what_cannot_be_built_is_refused_naming_the_line_and_the_fix(text, files, says):
    with pytest.raises(DockerfileError) as e:
        plan_dockerfile(text, files)
    assert says in str(e.value), str(e.value)


def test_copy_sources_may_be_files_directories_globs_and_the_whole_context():
    files = ["Dockerfile", "src/app.py", "src/lib/x.py", "req-dev.txt"]
    text = ("FROM a\nCOPY src /src\nCOPY src/lib/ /lib\nCOPY req-*.txt ./ /r/\nCOPY . /all\n"
            'COPY ["src/app.py", "/b"]\n')
    assert len(plan_dockerfile(text, files).changes) == 5


def test_the_key_is_the_content_of_the_context_and_nothing_else():
    files = {"Dockerfile": SWEBENCH.encode(), "setup.sh": b"echo hi\n"}
    key = build_key(files, ["setup.sh"])
    assert key.startswith("sha256:") and len(key) == 7 + 64
    assert build_key(dict(reversed(list(files.items()))), ["setup.sh"]) == key      # order does not matter
    assert build_key(files, []) != key                                              # the executable bit does
    assert build_key({**files, "setup.sh": b"echo ho\n"}, ["setup.sh"]) != key
    assert build_key({**files, "extra": b""}, ["setup.sh"]) != key
    assert build_key(files, ["setup.sh"], {"V": "1"}) != key
    with pytest.raises(DockerfileError, match="no Dockerfile"):
        build_key({"setup.sh": b""})


LOG = """STEP 1/4: FROM swebench/sweb.eval.x86_64.demo:latest
STEP 2/4: WORKDIR /testbed
STEP 3/4: RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
curl: (6) Could not resolve host: astral.sh
STEP 4/4: RUN pip install requests
WARNING: Retrying ... Failed to establish a new connection: [Errno 101] Network is unreachable
WARNING: Retrying ... Failed to establish a new connection: [Errno 101] Network is unreachable
error building at STEP "RUN pip install requests": exit status 1
"""


def test_a_build_log_names_each_step_that_could_not_reach_the_network_once():
    from hpc.images.buildah import failed_step, network_failures

    assert network_failures(LOG) == [
        ("step 3/4 (RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh)",
         "curl: (6) Could not resolve host: astral.sh"),
        ("step 4/4 (RUN pip install requests)",
         "WARNING: Retrying ... Failed to establish a new connection: [Errno 101] Network is unreachable")]
    assert failed_step(LOG) == "step 4/4 (RUN pip install requests)"
    assert network_failures("STEP 1/1: RUN echo resolved\nresolved\n") == [] and failed_step("no steps") is None


def test_the_image_config_that_travels_with_a_rootfs():
    from hpc.images.oci import ImageError, runtime_config

    config = {"config": {"Env": ["PATH=/opt/uv/bin:/usr/bin", "EMPTY=", "EQ=a=b"], "WorkingDir": "/testbed",
                         "User": "1000:1000"}}
    assert runtime_config(config, "img") == {"env": {"PATH": "/opt/uv/bin:/usr/bin", "EMPTY": "", "EQ": "a=b"},
                                             "workdir": "/testbed", "user": "1000:1000"}
    assert runtime_config({}, "img") == {"env": {}, "workdir": None, "user": None}
    for bad in ({"Env": ["NOEQUALS"]}, {"Env": ["1BAD=x"]}, {"Env": [3]}, {"WorkingDir": "relative"}):
        with pytest.raises(ImageError, match="img: config"):
            runtime_config({"config": bad}, "img")


def test_the_image_env_comes_under_the_sandboxs_identity_and_its_own_variables():
    from hpc.sandbox.base import DEFAULT_PATH, SandboxSpec, sandbox_env

    spec = SandboxSpec(image_env={"PATH": "/opt/uv/bin:/usr/bin", "HOME": "/root", "USER": "x", "TOOL": "1",
                                  "KEEP": "image"}, env={"KEEP": "sandbox"})
    env = sandbox_env(spec, {"EXTRA": "2"}, "agent")
    assert env["PATH"] == "/opt/uv/bin:/usr/bin" and env["TOOL"] == "1" and env["EXTRA"] == "2"
    assert (env["HOME"], env["USER"], env["KEEP"]) == ("/home/agent", "agent", "sandbox")
    assert sandbox_env(SandboxSpec(), None, "root")["PATH"] == DEFAULT_PATH
