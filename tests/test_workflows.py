"""The repository's automation: GitHub workflows, pre-commit hooks and the README's promises.

The workflows only run on GitHub, so actionlint checks them here, and the tests tie them to what
they must agree with: the README's test command, `.ci/run`'s system packages, the book's output
folder and the address the book is published at.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
README = (ROOT / "README.md").read_text()


def tool(name: str) -> str:
    """A command installed from requirements.txt: beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is missing: install requirements.txt (make does) to run this test"
    return found


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def runs(wf: dict) -> list[str]:
    """Every `run:` command of every job, in order."""
    return [s["run"].strip() for job in wf["jobs"].values() for s in job["steps"] if "run" in s]


def uses(wf: dict) -> dict[str, dict]:
    """The actions a workflow uses, by name without the version, with their inputs."""
    found = {}
    for job in wf["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                found[step["uses"].split("@")[0]] = step.get("with", {})
    return found


def readme_command(target: str) -> str:
    """The README's command for `make <target>`, read from its code block."""
    match = re.search(rf"^(make {target})\b", README, re.M)
    assert match, f"the README gives no 'make {target}' command"
    return match.group(1)


def apt_packages(script: str) -> set[str]:
    return set(re.findall(r"missing\+=\((\S+)\)", script))


def test_workflows_pass_actionlint():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "pages.yml"}
    done = subprocess.run(
        [tool("actionlint"), *map(str, files)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ci_runs_the_readme_test_command_like_ci_run():
    ci = workflow("ci.yml")
    ci_run = (ROOT / ".ci" / "run").read_text()
    command = readme_command("test")
    # GitHub's YAML parser reads the bare `on:` key as the boolean True.
    assert {"push", "pull_request"} <= set(ci[True])
    assert command in runs(ci) and command in ci_run.splitlines()
    # The cluster comes up before the tests and goes down after them, also when they fail.
    steps = runs(ci)
    assert (
        steps.index("sudo make cluster")
        < steps.index(command)
        < steps.index("sudo make cluster-down")
    )
    assert [
        s.get("if") for s in ci["jobs"]["test"]["steps"] if "cluster-down" in s.get("run", "")
    ] == ["always()"]
    lines = ci_run.splitlines()
    assert lines.index("make cluster") < lines.index("trap 'make cluster-down' EXIT")
    assert lines.index("trap 'make cluster-down' EXIT") < lines.index(command)
    assert apt_packages("\n".join(runs(ci))) == apt_packages(ci_run) == {"graphviz", "chromium"}
    assert uses(ci)["actions/setup-python"]["python-version"] == "3.12"


def test_pages_publishes_the_built_book():
    pages = workflow("pages.yml")
    steps = runs(pages)
    assert steps.index("sudo make cluster") < steps.index(readme_command("book"))
    assert steps[-1] == "sudo make cluster-down"
    assert uses(pages)["actions/upload-pages-artifact"]["path"] == "_build/html"
    assert {"actions/configure-pages", "actions/deploy-pages"} <= set(uses(pages))
    assert pages["permissions"]["pages"] == pages["permissions"]["id-token"] == "write"
    assert pages["concurrency"]["group"]


def test_readme_names_the_published_address():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    owner, name = config["repository"]["url"].rstrip("/").split("/")[-2:]
    assert f"https://{owner}.github.io/{name}/" in README


def test_pre_commit_hooks_are_local():
    # A commit must not need the network: no hook repository is fetched.
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    assert all(hook["language"] == "system" for hook in config["repos"][0]["hooks"])


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="pre-commit needs a git checkout")
def test_pre_commit_passes_on_every_file(tmp_path):
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path), "SKIP": ""}
    done = subprocess.run(
        [tool("pre-commit"), "run", "--all-files", "--color", "never"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
